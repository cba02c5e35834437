"""Shared checks of the bad-input and fault suite (`tests/test_faults_*.py`).

A case runs a binary's ``main`` in this process under `absl.testing.flagsaver`
(or as a subprocess where a signal or a kill is the point), then asserts:

* the exit code (``sys.exit('Error: …')`` is exit status 1);
* that the error is ONE line naming the problem;
* that no file outside the run directory was created, changed or removed
  (`TreeSnapshot` of the whole sandbox, with the run directory excluded);
* that no process was left behind (`child_pids` of this process).

The binaries define clashing flags (``--sampling`` is an enum in one and a
list in another; ``bin.mmfl`` and ``bin.report`` define their own), so a
process can normally import only some of them. `flags_of` imports a binary
with a flag registry of its own and swaps it in for a case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import contextlib
import csv
import dataclasses
import functools
import importlib
import json
import os
import re
import sys
import types

from absl import flags
from absl.testing import flagsaver
import psutil


@dataclasses.dataclass
class Outcome:
  """How a binary's ``main`` ended: its exit status and its message (if any)."""

  exit_code: int
  message: str


def run_main(main: Callable[[list[str]], object], **flag_values: str) -> Outcome:
  """Runs ``main(['prog'])`` with `flag_values` parsed; returns how it ended.

  A return is exit status 0; ``SystemExit(str)`` is status 1 with that message
  (what the interpreter does with it); ``SystemExit(int)`` is that status.
  """
  with flagsaver.as_parsed(**{k: str(v) for k, v in flag_values.items()}):
    try:
      main(['prog'])
    except SystemExit as e:
      if isinstance(e.code, int) or e.code is None:
        return Outcome(int(e.code or 0), '')
      return Outcome(1, str(e.code))
  return Outcome(0, '')


def assert_one_line_error(outcome: Outcome, pattern: str, exit_code: int = 1) -> None:
  """The run failed with `exit_code` and a one-line message matching `pattern`."""
  assert outcome.exit_code == exit_code, outcome
  assert outcome.message.strip(), f'no message for exit code {outcome.exit_code}'
  assert '\n' not in outcome.message.strip(), f'more than one line: {outcome.message!r}'
  assert 'Traceback' not in outcome.message, outcome.message
  assert re.search(pattern, outcome.message), (pattern, outcome.message)


class TreeSnapshot:
  """Every file and directory under `root` with its size and modification time."""

  def __init__(self, root: str | os.PathLike[str]):
    self.root = os.fspath(root)
    self.entries = _scan(self.root)

  def changes(self, allowed: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Paths created, changed or removed since the snapshot, outside `allowed` dirs."""
    allowed = [os.path.abspath(os.fspath(a)) for a in allowed]
    now = _scan(self.root)
    changed = [p for p in set(now) | set(self.entries) if now.get(p) != self.entries.get(p)]

    def inside(path: str) -> bool:
      path = os.path.abspath(path)
      return any(path == a or path.startswith(a + os.sep) for a in allowed)

    # A directory's mtime changes when an allowed child is created in it.
    return sorted(
      p
      for p in changed
      if not inside(p) and not any(a.startswith(os.path.abspath(p) + os.sep) for a in allowed)
    )


def _scan(root: str) -> dict[str, tuple[bool, int, int]]:
  found = {}
  for directory, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      path = os.path.join(directory, name)
      try:
        st = os.lstat(path)
      except FileNotFoundError:
        continue
      is_dir = os.path.isdir(path)
      found[path] = (is_dir, 0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns)
  return found


def metrics_rows(output_dir) -> list[dict[str, str]]:
  """The rows of a run's ``metrics.csv``, without the wall-clock ``round_seconds``."""
  with open(os.path.join(output_dir, 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop('round_seconds', None)  # Wall-clock time: the only non-reproducible value.
  return rows


def write_run(root, name, hparams, csv_text) -> str:
  """Writes a hand-made run, <root>/<name>/{hparams.json,metrics.csv}; returns its directory."""
  run_dir = os.path.join(root, name)
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, 'hparams.json'), 'w') as f:
    json.dump(dict(hparams, experiment_name=name, root_output_dir=str(root)), f)
  with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
    f.write(csv_text)
  return run_dir


def child_pids() -> set[int]:
  """Pids of this process's live descendants (zombies excluded)."""
  pids = set()
  for child in psutil.Process().children(recursive=True):
    try:
      if child.status() != psutil.STATUS_ZOMBIE:
        pids.add(child.pid)
    except psutil.NoSuchProcess:
      continue
  return pids


# --------------------------------------------------------------------------
# One flag registry per binary.


def _is_bin_module(name: str) -> bool:
  return name == 'bin' or name.startswith('bin.')


@functools.cache
def _binary(name: str) -> tuple[types.ModuleType, dict[str, flags.Flag]]:
  """``bin.<name>`` imported afresh, and the flag registry it defined its flags in.

  The process's registry and ``bin`` modules are restored afterwards, so other
  test modules keep the binaries they imported.
  """
  registry = flags.FLAGS._flags()  # The live name -> Flag dict.
  saved_flags = dict(registry)
  saved_modules = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_bin_module(k)}
  # Flags of the project's binaries and benchmarks (`bench.*` defines flags too).
  defined_by_bin = {
    flag.name
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
    if _is_bin_module(module) or module.startswith('bench.')
    for flag in module_flags
  }
  try:
    for flag_name in defined_by_bin:
      registry.pop(flag_name, None)
    module = importlib.import_module(f'bin.{name}')
    own = dict(registry)
  finally:
    registry.clear()
    registry.update(saved_flags)
    for k in [k for k in sys.modules if _is_bin_module(k)]:
      del sys.modules[k]
    sys.modules.update(saved_modules)
  return module, own


@contextlib.contextmanager
def flags_of(binary: str):
  """Makes ``bin.<binary>``'s flags the process's flags; yields its module."""
  module, own = _binary(binary)
  registry = flags.FLAGS._flags()
  saved = dict(registry)
  registry.clear()
  registry.update(own)
  try:
    yield module
  finally:
    added = {k: v for k, v in registry.items() if k not in own}
    registry.clear()
    registry.update(saved)
    registry.update(added)


def run_binary(binary: str, **flag_values: str) -> Outcome:
  """`run_main` of ``bin.<binary>`` under its own flag registry (`flags_of`)."""
  with flags_of(binary) as module:
    return run_main(module.main, **flag_values)
