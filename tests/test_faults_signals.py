"""Faults: a binary stopped by SIGTERM, SIGINT or SIGKILL, and an unreachable worker.

Each case starts ``python -m bin.fedavg`` as a subprocess, waits for its first
training round's progress line (``round 1/…`` on stderr; no sleeps), records
the binary's descendants (its TFF workers) at that moment, sends the signal and
then asserts:

* the exit status (128 + signal number; -9 for SIGKILL) and, for SIGTERM and
  SIGINT, a one-line message as the last line of stderr and no traceback;
* that none of the recorded descendants is left running (only this binary's
  own descendants are tracked, never other processes on the machine);
* that nothing is left in the temporary directory after SIGTERM or SIGINT;
* that nothing under the run directory is half-written: ``metrics.csv``
  parses (`results.load_run`) with rounds 0, 1, … and none twice, every
  checkpoint present loads and holds its round, no temporary file is left
  behind, and (after the harshest case, SIGKILL with a local worker) rerunning
  the same command resumes and finishes.

Time bounds in these tests only stop a broken run from hanging the suite; the
elapsed times are reported, not asserted tightly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import fault_harness
import psutil
import pytest
import tensorflow as tf

from tff_sampling.runtime import results

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FIRST_ROUND = re.compile(r'\bround +1/\d+')
_SECOND_ROUND = re.compile(r'\bround +2/\d+')  # Printed after round 1's checkpoint.
_ROUNDS = 1000  # Far more than run before the signal: the signal lands mid-training.
_GENEROUS_S = 300  # Only bounds a hung run; a healthy one needs a small fraction.


_STARTED: list[_Binary] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
  """After each test, even a failed one: kills what its binaries left running."""
  yield
  while _STARTED:
    binary = _STARTED.pop()
    if binary.process.poll() is None:
      binary.process.kill()
    for process in list(binary.descendants.values()):
      if _alive(process):
        try:
          process.kill()
        except psutil.Error:
          pass


class _Binary:
  """``python -m bin.fedavg`` on the digits task, as a subprocess.

  Its stderr is collected by a thread (so the pipe never fills); `descendants`
  holds the `psutil.Process` of each descendant seen by `record_descendants`
  (a `psutil.Process` also remembers its start time, so a reused pid never
  counts as the old process).
  """

  def __init__(self, run_dir: str, *flags: str, rounds: int = _ROUNDS):
    root, name = os.path.split(run_dir)
    self.args = [
      sys.executable,
      '-m',
      'bin.fedavg',
      '--task=digits',
      f'--rounds={rounds}',
      '--clients_per_round=3',
      f'--root_output_dir={root}',
      f'--experiment_name={name}',
      *flags,
    ]
    self.tempdir = os.path.join(root, 'tmp')  # The system's temporary directory, to the binary.
    os.makedirs(self.tempdir, exist_ok=True)
    self.started = time.monotonic()
    self.process = subprocess.Popen(
      self.args,
      cwd=_REPO,
      env={**os.environ, 'TMPDIR': self.tempdir},
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,  # Its own process group, as a terminal's foreground job.
    )
    self.descendants: dict[int, psutil.Process] = {}
    self._names: dict[int, str] = {}
    _STARTED.append(self)
    self._lines: list[str] = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    self._watcher = threading.Thread(target=self._watch, daemon=True)
    self._watcher.start()

  def _watch(self) -> None:
    # Records descendants while the binary runs (e.g. a worker that fails fast);
    # `record_descendants` at a known moment makes sure none is missed there.
    while self.process.poll() is None:
      try:
        self.record_descendants()
      except psutil.Error:
        pass
      time.sleep(0.2)

  def _read(self) -> None:
    for line in self.process.stderr:
      with self._changed:
        self._lines.append(line.rstrip('\n'))
        self._changed.notify_all()
    with self._changed:
      self._lines.append(None)  # End of stream.
      self._changed.notify_all()

  @property
  def stderr(self) -> str:
    with self._changed:
      return '\n'.join(line for line in self._lines if line is not None)

  def wait_for_line(self, pattern: re.Pattern[str]) -> None:
    """Blocks until stderr has a line matching `pattern` (fails if the binary ends first)."""

    def seen():
      return any(line is None or pattern.search(line) for line in self._lines)

    with self._changed:
      self._changed.wait_for(seen, timeout=_GENEROUS_S)
      found = any(line is not None and pattern.search(line) for line in self._lines)
    assert found, f'no line matching {pattern.pattern!r}; stderr:\n{self.stderr[-3000:]}'

  def record_descendants(self) -> None:
    for child in psutil.Process(self.process.pid).children(recursive=True):
      try:
        name = child.name()
      except psutil.NoSuchProcess:
        continue
      with self._changed:
        self.descendants.setdefault(child.pid, child)
        self._names[child.pid] = name  # The latest: a child is 'python' until its exec.

  def workers(self) -> list[psutil.Process]:
    """The recorded descendants that were TFF workers."""
    with self._changed:
      return [p for pid, p in self.descendants.items() if self._names[pid] == 'worker_binary']

  def wait(self) -> int:
    code = self.process.wait(timeout=_GENEROUS_S)
    # A descendant left running may hold stderr open: bounded, then reported.
    self._reader.join(timeout=30)
    self._watcher.join(timeout=30)
    return code

  def last_line(self) -> str:
    lines = [line for line in self.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ''


def _alive(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _assert_no_process_left(binary: _Binary) -> None:
  """None of the binary's recorded descendants still runs.

  A process killed by the kernel on its parent's death (SIGKILL case) dies
  asynchronously, so this polls; the bound only keeps a failure from hanging.
  """
  deadline = time.monotonic() + 30
  alive = [p for p in binary.descendants.values() if _alive(p)]
  while alive and time.monotonic() < deadline:
    time.sleep(0.1)
    alive = [p for p in alive if _alive(p)]
  try:
    assert not alive, f'left running: {[(p.pid, p.name()) for p in alive]}'
  finally:
    for process in alive:  # Only if the test failed: leave no orphan behind.
      try:
        process.kill()
      except psutil.Error:
        pass


def _checkpoint_rounds(run_dir: str) -> list[int]:
  directory = os.path.join(run_dir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(
    int(name[len('program_state_') :])
    for name in os.listdir(directory)
    if re.fullmatch(r'program_state_\d+', name)
  )


def _assert_nothing_half_written(run_dir: str, *, killed: bool = False) -> None:
  """`killed`: by SIGKILL, which may land inside a write: the final files are still
  whole (TFF writes them under a temporary name and renames), a temporary one may
  remain, and round 1's row may be missing (its progress line is released
  alongside, not after, its CSV row)."""
  run = results.load_run(run_dir)  # Raises on a cut row, a bad key, a round twice.
  assert list(run.rounds) == list(range(len(run.rounds))), run.rounds
  assert len(run.rounds) >= (1 if killed else 2), run.rounds
  for round_num in _checkpoint_rounds(run_dir):
    saved = tf.saved_model.load(
      os.path.join(run_dir, 'checkpoints', f'program_state_{round_num}')
    )()
    assert int(saved['round']) == round_num
  if not killed:
    # TFF writes checkpoints and metrics.csv to a temporary name, then renames.
    leftovers = [
      os.path.join(d, n)
      for d, dirs, files in os.walk(run_dir)
      for n in dirs + files
      if '_temp' in n or n.endswith('.tmp')
    ]
    assert not leftovers, leftovers


def _interrupted(
  run_dir: str,
  signum: int,
  *flags: str,
  after: re.Pattern[str] = _FIRST_ROUND,
  to_group: bool = False,
) -> tuple[_Binary, float]:
  """Runs the binary, sends `signum` after the line `after` (to its process group, as a
  terminal's Ctrl-C does, if `to_group`); returns it and the seconds to exit."""
  binary = _Binary(run_dir, *flags)
  try:
    binary.wait_for_line(after)
    binary.record_descendants()
    sent = time.monotonic()
    if to_group:
      os.killpg(binary.process.pid, signum)
    else:
      binary.process.send_signal(signum)
    binary.wait()
    return binary, time.monotonic() - sent
  finally:
    if binary.process.poll() is None:
      binary.process.kill()


@pytest.mark.parametrize(
  'signum, flags, to_group',
  [
    (signal.SIGTERM, (), False),
    (signal.SIGINT, (), True),
    (signal.SIGINT, ('--local_workers=1',), True),
  ],
  ids=['SIGTERM-one_process', 'Ctrl-C-one_process', 'Ctrl-C-local_workers'],
)
@pytest.mark.slow
def test_sigterm_and_sigint_stop_everything_with_one_line(tmp_path, signum, flags, to_group):
  run_dir = str(tmp_path / 'run')
  binary, seconds = _interrupted(run_dir, signum, *flags, to_group=to_group)
  name = signal.Signals(signum).name
  print(f'{name} {flags}: exit after {seconds:.2f} s')

  fault_harness.assert_one_line_error(
    fault_harness.Outcome(binary.process.returncode, binary.last_line()),
    rf'^Interrupted by {name}\b.*rerun the same command to resume',
    exit_code=128 + signum,
  )
  assert 'Traceback' not in binary.stderr, binary.stderr[-3000:]
  # No worker died of the signal under a call, to be replaced before the handler stopped all.
  assert 'starting a new one' not in binary.stderr, binary.stderr[-3000:]
  # No clock bound: `wait` (bounded by _GENEROUS_S) returning shows that the exit did not hang.
  workers = binary.workers()
  assert len(workers) >= 1 + len(flags), binary.descendants  # Not vacuous.
  _assert_no_process_left(binary)
  _assert_nothing_half_written(run_dir)
  # Autograph's source files included, which TF removes only at a normal exit.
  assert not os.listdir(binary.tempdir), os.listdir(binary.tempdir)


@pytest.mark.parametrize(
  'flags', [(), ('--local_workers=1',)], ids=['one_process', 'local_workers']
)
@pytest.mark.slow
def test_sigkill_leaves_no_worker_and_the_rerun_resumes(tmp_path, flags):
  run_dir = str(tmp_path / 'run')
  binary, _ = _interrupted(run_dir, signal.SIGKILL, *flags, after=_SECOND_ROUND)

  assert binary.process.returncode == -signal.SIGKILL
  assert len(binary.workers()) >= 1 + len(flags), binary.descendants
  _assert_no_process_left(binary)
  _assert_nothing_half_written(run_dir, killed=True)
  assert _checkpoint_rounds(run_dir)  # Round 1's at least: there is something to resume.
  if not flags:
    return  # One rerun (below) is enough to show that a killed run resumes.

  last = max(_checkpoint_rounds(run_dir) + [len(results.load_run(run_dir).rounds) - 1])
  rerun = _Binary(run_dir, *flags, rounds=last + 2)
  assert rerun.wait() == 0, rerun.stderr[-3000:]
  assert re.search(r'[Rr]esum', rerun.stderr), rerun.stderr[-3000:]
  finished = results.load_run(run_dir)
  assert list(finished.rounds) == list(range(last + 3))


@pytest.mark.slow
def test_unreachable_worker_fails_fast_naming_the_address(tmp_path):
  binary = _Binary(str(tmp_path / 'run'), '--workers=127.0.0.1:1', rounds=2)
  code = binary.wait()
  seconds = time.monotonic() - binary.started  # TF's import included.
  _assert_no_process_left(binary)
  print(f'--workers=127.0.0.1:1: exit after {seconds:.1f} s')
  fault_harness.assert_one_line_error(
    fault_harness.Outcome(code, binary.last_line()),
    r'^Error: .*127\.0\.0\.1:1.*worker_binary --port=1\b',
    exit_code=1,
  )
  assert 'Traceback' not in binary.stderr, binary.stderr[-3000:]
  # Failing fast, without a clock: the refused connection is the reason given, so the
  # binary did not wait out a connection timeout first (that error says "within N s").
  assert 'Connection refused' in binary.last_line(), binary.last_line()
  assert 'within' not in binary.last_line(), binary.last_line()
