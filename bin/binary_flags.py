"""Checks command lines of a training binary without running it: absl parses them.

    echo '[["--task=digits", "--sampling=md"]]' | python -m bin.binary_flags clustered_sampling

reads a JSON list of command lines (flags only) and prints a JSON list with, for each,
``null`` if the binary would accept it, or the one line saying why not. Each command line
is parsed by the binary's own flag definitions and validators, then put through the
checks that need no data: ``check_flags()`` of the binary, if it has one, and of
`bin.experiment_flags` (which task options apply to ``--task``, the availability mode).

It runs in a process of its own (`problems`) because the binaries define their flags at
import in absl's global registry, where they would clash with the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
import importlib
import json
import subprocess
import sys

from absl import flags

import bin


def _problem(module, argv: Sequence[str]) -> str | None:
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['prog', *argv])
  except flags.Error as e:
    return str(e).splitlines()[0]
  checks = [getattr(module, 'check_flags', None)]
  experiment_flags = sys.modules.get('bin.experiment_flags')
  if experiment_flags is not None:
    checks.append(experiment_flags.check_flags)
  for check in checks:
    try:
      if check is not None:
        check()
    except ValueError as e:
      return str(e).splitlines()[0]
  return None


def problems(binary: str, argvs: Sequence[Sequence[str]]) -> list[str | None]:
  """For each command line of ``bin.<binary>`` in `argvs` (flags only), None or why the
  binary would refuse it (one line). Runs in a new process (a few seconds: it imports
  TensorFlow).

  Raises:
    RuntimeError: If the checking process fails (its last line of output says why).
  """
  done = subprocess.run(
    [sys.executable, '-m', 'bin.binary_flags', binary],
    input=json.dumps([list(a) for a in argvs]),
    capture_output=True,
    text=True,
    check=False,
  )
  if done.returncode != 0:
    last = (done.stderr.strip().splitlines() or ['no output'])[-1]
    raise RuntimeError(f'Checking the flags of bin.{binary} failed: {last}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  binary = sys.argv[1]
  argvs = json.load(sys.stdin)
  module = importlib.import_module(f'bin.{binary}')
  bin.imports_done()  # Not under absl's app.run (bin/__init__.py).
  print(json.dumps([_problem(module, argv) for argv in argvs]))


if __name__ == '__main__':
  main()
