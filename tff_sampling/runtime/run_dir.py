"""A run's output directory: its name, ownership, exclusive lock and resume point.

Every run writes into ONE directory of its own and nowhere else. This
module is the only place that decides what that directory may be and what may
be removed from it:

* `run_path` joins ``--root_output_dir`` and a run name, refusing names that
  could leave the root (path separators, ``..``, absolute paths, control
  characters).
* `RunDirectory` claims the directory for the run: it creates it (or adopts an
  empty one or an earlier run's), writes the ownership marker
  ``.tff_sampling_run`` and holds an exclusive ``flock`` on it for the whole
  run, so a second process on the same directory stops with the holder's pid
  instead of interleaving ``metrics.csv``. A folder that is neither empty nor a
  run directory is refused, never written into.
* `RunDirectory.resume` picks the checkpoint to resume from: the newest one
  that loads AND whose rounds ``metrics.csv`` holds. A damaged checkpoint (a
  truncated variables file, a missing ``saved_model.pb``) or one newer than the
  CSV's rows is skipped with a one-line notice, and removed so that the rounds
  after the chosen one are recomputed (identically: every random choice derives
  from the seed and the round). If checkpoints exist but none is usable, the run
  stops with an error saying why, rather than silently starting over.
* `remove_run` deletes a run directory only if it carries the marker this
  module writes, i.e. only a directory this project created for a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import csv
import errno
import fcntl
import json
import os
import shutil
from typing import Any

from absl import logging
import numpy as np
import tensorflow_federated as tff

from tff_sampling.runtime import results
from tff_sampling.runtime import sync

MARKER_FILENAME = '.tff_sampling_run'
HPARAMS_FILENAME = results.HPARAMS_FILENAME
METRICS_FILENAME = results.METRICS_FILENAME
CHECKPOINTS_DIRNAME = 'checkpoints'

# Hyper-parameters that may change between a run and its resumption without
# changing the rounds already computed.
RESUMABLE_HPARAMS = frozenset(
  {
    'rounds',
    'eval_every',
    'checkpoint_every',
    'root_output_dir',
    'experiment_name',
    'keep_checkpoints',
  }
)

_MARKER_TEXT = 'A tff_sampling run directory (this file is its marker and lock).\n'


def check_run_name(name: str) -> str:
  """Returns `name` if it is a single, plain directory name; else ValueError.

  A run name becomes one directory under the output root, so it may not hold
  a path separator, be ``.``/``..``, be absolute, or contain control characters.
  """
  if not isinstance(name, str) or not name.strip():
    raise ValueError(
      f'The run name {name!r} is empty; give a name such as my_run (--experiment_name).'
    )
  bad = [c for c in name if ord(c) < 32 or ord(c) == 127]
  if bad:
    raise ValueError(
      f'The run name {name!r} contains control characters {bad!r}; use letters, '
      'digits, "_", "-" and "." only (--experiment_name).'
    )
  if '/' in name or '\\' in name or os.sep in name or name in ('.', '..') or os.path.isabs(name):
    raise ValueError(
      f'The run name {name!r} is a path, not a name: runs live directly under '
      '--root_output_dir; give a plain name without "/" or ".." '
      '(--experiment_name), and choose the location with --root_output_dir.'
    )
  return name


def run_path(root: str, name: str) -> str:
  """``root/name`` for a valid run `name` (`check_run_name`)."""
  return os.path.join(root, check_run_name(name))


def _is_earlier_run(path: str) -> bool:
  """Whether `path` holds a run written before directories carried the marker."""
  return os.path.isfile(os.path.join(path, HPARAMS_FILENAME)) and (
    os.path.isfile(os.path.join(path, METRICS_FILENAME))
    or os.path.isdir(os.path.join(path, CHECKPOINTS_DIRNAME))
  )


def is_run_directory(path: str) -> bool:
  """Whether `path` is a real directory (no symlink) carrying this project's marker."""
  return (
    os.path.isdir(path)
    and not os.path.islink(path)
    and os.path.isfile(os.path.join(path, MARKER_FILENAME))
  )


def remove_run(path: str) -> bool:
  """Deletes the run directory `path`, if this project created it.

  Returns:
    ``True`` if it was removed, ``False`` if it did not exist.

  Raises:
    ValueError: If `path` exists but does not carry the run marker (it is not
      a directory this project created for a run), or another process holds it.
  """
  if not os.path.lexists(path):
    return False
  if not is_run_directory(path):
    raise ValueError(
      f'Refusing to delete {path!r}: it is not a run directory created by '
      f'tff_sampling (no {MARKER_FILENAME} marker). Delete it yourself if you '
      'mean to, or choose another --experiment_name.'
    )
  with RunDirectory(path):  # Not while another process runs in it.
    shutil.rmtree(path)
  return True


class RunDirectory:
  """Holds one run's output directory for the duration of a run (a context manager).

  Entering creates or adopts the directory, writes the marker and takes an
  exclusive lock; leaving releases the lock. A process that dies, even by
  SIGKILL, releases its lock with it.
  """

  def __init__(self, path: str, keep_checkpoints: int = 3):
    if not path:
      raise ValueError('output_dir must be a non-empty path.')
    self.path = os.path.abspath(path)
    self._keep_checkpoints = keep_checkpoints
    self._lock_fd: int | None = None
    self.state_manager: tff.program.FileProgramStateManager | None = None
    self._tensorboard: _FlushingTensorBoardReleaseManager | None = None

  # --- Claiming -----------------------------------------------------------------

  def __enter__(self) -> RunDirectory:
    self._claim()
    self._lock()
    self.state_manager = tff.program.FileProgramStateManager(
      os.path.join(self.path, CHECKPOINTS_DIRNAME),
      keep_total=self._keep_checkpoints,
      keep_first=True,
    )
    return self

  def __exit__(self, *exc_info) -> None:
    if self._lock_fd is not None:
      os.close(self._lock_fd)  # Releases the flock.
      self._lock_fd = None

  def _claim(self) -> None:
    marker = os.path.join(self.path, MARKER_FILENAME)
    try:
      if os.path.islink(self.path):
        raise ValueError(
          f'Output directory {self.path!r} is a symbolic link; give the real '
          'directory (or another --experiment_name).'
        )
      if os.path.exists(self.path) and not os.path.isdir(self.path):
        raise ValueError(
          f'Output directory {self.path!r} exists and is a file; choose another '
          '--experiment_name or --root_output_dir.'
        )
      if (
        os.path.isdir(self.path)
        and not os.path.isfile(marker)
        and os.listdir(self.path)
        and not _is_earlier_run(self.path)
      ):
        raise ValueError(
          f'Output directory {self.path!r} exists and is not a tff_sampling run directory '
          f'(no {MARKER_FILENAME}); refusing to write into it. Choose another '
          '--experiment_name or --root_output_dir.'
        )
      os.makedirs(self.path, exist_ok=True)
      if not os.path.isfile(marker):
        with open(marker, 'w') as f:
          f.write(_MARKER_TEXT)
    except OSError as e:
      raise ValueError(
        f'Output directory {self.path!r} is not writable ({e.strerror or e}); '
        'choose another --root_output_dir.'
      ) from e

  def _lock(self) -> None:
    marker = os.path.join(self.path, MARKER_FILENAME)
    fd = os.open(marker, os.O_RDWR)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
        raise
      raise ValueError(
        f'Output directory {self.path!r} is in use by another run ({_holder(marker)}); wait '
        'for it to finish, stop it, or choose another --experiment_name.'
      ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f'{_MARKER_TEXT}pid {os.getpid()}\n'.encode())
    self._lock_fd = fd

  # --- Hyper-parameters -----------------------------------------------------------

  def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
    path = os.path.join(self.path, HPARAMS_FILENAME)
    with open(path + '.tmp', 'w') as f:
      json.dump(json_ready(hparams), f, indent=2, sort_keys=True)
    os.replace(path + '.tmp', path)

  # --- Checkpoints ----------------------------------------------------------------

  def _checkpoints(self) -> tff.program.FileProgramStateManager:
    """The checkpoint manager, which entering the `with` block creates."""
    assert self.state_manager is not None  # Set on entering the with block.
    return self.state_manager

  def versions(self) -> list[int]:
    return sync.run(self._checkpoints().get_versions()) or []

  def resume(self, hparams: Mapping[str, Any], initial_state: Any) -> tuple[Any, int | None]:
    """``(program state, round resumed from)``; ``(initial_state, None)`` for a new run.

    Checks `hparams` against the saved ones first; (re)writes them once the
    resume point is chosen, so a refused resume changes nothing.

    Raises:
      ValueError: For checkpoints from another configuration, or when
        checkpoints exist but none is usable (damaged, or newer than the rows
        of ``metrics.csv``); the message says which and why.
    """
    versions = self.versions()
    if not versions:
      self._write_hparams(hparams)
      return initial_state, None
    check_resume_compatible(self.path, hparams)
    covered = self._last_round_in_metrics()
    skipped = []
    for version in reversed(versions):
      if version > covered:
        skipped.append(
          f'round {version} (metrics.csv '
          + ('is missing' if covered < 0 else f'ends at round {covered}')
          + ')'
        )
        continue
      try:
        state = sync.run(self._checkpoints().load(version, initial_state))
      except Exception as e:  # pylint: disable=broad-except  # Any damage: a corrupt SavedModel.
        skipped.append(f'round {version} (damaged: {_first_line(e)})')
        continue
      self._drop_versions_after(version)
      self._write_hparams(hparams)
      if skipped:
        logging.warning(
          'Resuming %s from round %d, the newest usable checkpoint; skipped %s.',
          self.path,
          version,
          '; '.join(skipped),
        )
      else:
        logging.info('Resuming %s after round %d.', self.path, version)
      return state, version
    raise ValueError(
      f'Cannot resume {self.path!r}: no usable checkpoint ({"; ".join(skipped)}). Restore '
      'the missing files, or start over with --reset or another --experiment_name.'
    )

  def release_manager(
    self, *others: tff.program.ReleaseManager
  ) -> tff.program.GroupingReleaseManager:
    """Releases each round's metrics to ``metrics.csv``, TensorBoard and `others`."""
    self._tensorboard = _FlushingTensorBoardReleaseManager(os.path.join(self.path, 'tensorboard'))
    return tff.program.GroupingReleaseManager(
      [
        tff.program.CSVFileReleaseManager(os.path.join(self.path, METRICS_FILENAME)),
        self._tensorboard,
        *others,
      ]
    )

  def save(self, state: Any, round_num: int) -> None:
    """Saves the program state of `round_num`, and flushes the TensorBoard events up to it."""
    sync.run(self._checkpoints().save(state, round_num))
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def _last_round_in_metrics(self) -> int:
    """The largest k such that ``metrics.csv`` has a row for every round 0..k; -1 if none."""
    path = os.path.join(self.path, METRICS_FILENAME)
    if not os.path.isfile(path):
      return -1
    try:
      with open(path, newline='') as f:
        keys = {int(row['key']) for row in csv.DictReader(f) if row.get('key', '').strip()}
    except (ValueError, KeyError, csv.Error, UnicodeDecodeError):
      return -1  # Unreadable rows count as missing.
    k = -1
    while k + 1 in keys:
      k += 1
    return k

  def _drop_versions_after(self, version: int) -> None:
    """Removes checkpoints newer than `version` (damaged or not covered), inside this run."""
    checkpoints = os.path.join(self.path, CHECKPOINTS_DIRNAME)
    for newer in (v for v in self.versions() if v > version):
      # The state manager's own naming: <checkpoints>/program_state_<version>.
      doomed = os.path.join(checkpoints, f'program_state_{newer}')
      if os.path.dirname(os.path.abspath(doomed)) == checkpoints and is_run_directory(self.path):
        shutil.rmtree(doomed)


class _FlushingTensorBoardReleaseManager(tff.program.TensorBoardReleaseManager):
  """TFF's TensorBoard release manager, with the flush it lacks.

  TFF's manager never flushes its summary writer, so a stopped or killed run
  would lose the events of rounds already checkpointed (which a resume does
  not release again). Its writer is private in TFF 0.87; flushing it is all
  this adds.
  """

  def flush(self) -> None:
    self._summary_writer.flush()  # pylint: disable=protected-access


def _holder(marker: str) -> str:
  try:
    with open(marker) as f:
      pids = [line.split()[1] for line in f if line.startswith('pid ')]
  except OSError:
    pids = []
  return f'pid {pids[-1]}' if pids else 'pid unknown'


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f'{type(error).__name__}: {text[0][:200]}' if text else type(error).__name__


def json_ready(hparams: Mapping[str, Any]) -> dict[str, Any]:
  """Round-trips hparams through JSON so that comparisons see stored values."""
  return json.loads(json.dumps(dict(hparams), sort_keys=True, default=str))


class HParams(dict):
  """Hyper-parameters, with the defaults of those that are flags.

  A run written before a flag was recorded lacks its key; `check_resume_compatible`
  resumes it only if the flag is at its default now. `defaults` rides along with
  the values (e.g. through `program.RunConfig`) and is not written.
  """

  def __init__(
    self,
    values: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    defaults: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
  ):
    super().__init__(values)
    self.defaults = dict(defaults)


def check_resume_compatible(
  output_dir: str, hparams: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> None:
  """Raises ValueError unless `output_dir`'s hparams.json matches `hparams` (bar resumables).

  A key that the saved hyper-parameters lack (a run written before it was
  recorded) matches only if its value now is its default in `defaults`
  (default: ``hparams.defaults`` of an `HParams`, else none).
  """
  path = os.path.join(output_dir, HPARAMS_FILENAME)
  if not os.path.exists(path):
    raise ValueError(
      f'{output_dir!r} holds checkpoints but no hparams.json, so it cannot be '
      'verified that they come from this configuration; use a new '
      '--experiment_name, or start over with --reset.'
    )
  stored = results.read_hparams(
    path, fix='restore it, or start over with --reset or another --experiment_name'
  )
  current = json_ready(hparams)
  if defaults is None:
    defaults = getattr(hparams, 'defaults', {})
  defaults = json_ready(defaults)

  def differs(key: str) -> bool:
    if key not in stored and key in current and key in defaults:
      return current[key] != defaults[key]
    return stored.get(key) != current.get(key)

  def saved(key: str) -> str:
    if key in stored or key not in defaults:
      return repr(stored.get(key))
    return f'None (written before {key} was recorded: resumable at its default {defaults[key]!r})'

  keys = (set(stored) | set(current)) - RESUMABLE_HPARAMS
  differences = sorted(k for k in keys if differs(k))
  if differences:
    details = ', '.join(f'{k}: saved {saved(k)} vs now {current.get(k)!r}' for k in differences)
    raise ValueError(
      f'Cannot resume the run in {output_dir!r}: its checkpoints were written by a '
      f'different configuration ({details}). Use a new --experiment_name, or '
      'start over with --reset.'
    )


def write_selection_counts(output_dir: str, client_ids, num_examples, counts: np.ndarray) -> None:
  """Writes how often each client was selected so far (duplicates counted).

  Rewritten at every checkpoint from the checkpointed counts, so after a
  resume it continues from the same values.
  """
  path = os.path.join(output_dir, results.SELECTION_COUNTS_FILENAME)
  with open(path + '.tmp', 'w') as f:
    f.write('client_id,num_examples,selection_count\n')
    for client_id, size, count in zip(client_ids, num_examples, counts):
      f.write(f'{client_id},{int(size)},{int(count)}\n')
  os.replace(path + '.tmp', path)
