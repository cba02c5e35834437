"""The TFF runtime as this project uses it: its local C++ worker, cleanup and signals.

**The default context's worker.** `use_secure_sum_simulation` installs
`tff_sampling.runtime.context_worker`'s context: TFF's test C++ context on a
worker that dies with this process, restarted (a bounded number of times) if it
dies first. The program loop calls it, and so does `binary_main` before a
binary's ``main``.

**At exit** `stop_local_workers` (``atexit``) stops that worker, and also a
worker of TFF's own default context if a computation ran before (library use
without `use_secure_sum_simulation`).

**SIGTERM and SIGINT** (binaries only: they run ``app.run(binary_main(main))``;
nothing here installs a handler on import). See `_Interrupts`: the workers are stopped
at once from a thread that learns of the signal through
``signal.set_wakeup_fd`` (even while the main thread is inside a long TF or
TFF call), which makes the TFF call in progress fail; the main thread then
exits where that failure (or any exception) reaches `binary_main`, with one line on
stderr and status 128 + signal number. No write is cut: the main thread is not
interrupted in the middle of one, and the deadline exit (if the main thread
does not get there within `_EXIT_DEADLINE_S`) first lets a file write in
progress finish.

A binary's temporary files go to a directory of its own
(`files.use_private_tempdir`), removed on every exit but SIGKILL.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence
import gc
import logging as logging_lib
import os
import signal
import sys
import threading
import time
from typing import Any

from absl import logging as absl_logging
import psutil
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context

from tff_sampling.runtime import context_worker
from tff_sampling.runtime import files
from tff_sampling.runtime import workers as workers_lib

_WORKER_NAME = 'worker_binary'


class _TffNoiseFilter(logging_lib.Filter):
  """Drops two kinds of TensorFlow log records that this library's own work causes.

  * The reports of the unused bound checks of TFF's secure sums.
    `tff.aggregators.SecureSumFactory` (through TFF's
    ``primitives.secure_quantized_sum``) calls ``tf.debugging.assert_less_equal``
    on its bounds without using the result, so every graph it builds is
    followed, when garbage-collected, by a multi-line ``ERROR:tensorflow:
    Object was never used ... assert_less_equal`` report: dozens per run, none
    of them an error of the caller's.
  * ``INFO:tensorflow:Assets written to: .../checkpoints/...``, one per
    checkpoint TFF's program-state manager saves.

  Every other TensorFlow message, including "never used" reports of other ops,
  still shows.
  """

  def filter(self, record: logging_lib.LogRecord) -> bool:
    try:
      message = record.getMessage()
    except (TypeError, ValueError):
      return True
    if 'Object was never used' in message and "<tf.Operation 'assert_less_equal" in message:
      return False
    return not (record.levelno <= logging_lib.INFO and message.startswith('Assets written to:'))


_NOISE_FILTER = _TffNoiseFilter()


def quiet_tensorflow_noise() -> None:
  """Installs `_TffNoiseFilter` on TensorFlow's logger (idempotent)."""
  logger = logging_lib.getLogger('tensorflow')
  if _NOISE_FILTER not in logger.filters:
    logger.addFilter(_NOISE_FILTER)


def use_secure_sum_simulation() -> None:
  """Installs this project's default TFF context: secure sums simulated, worker ours.

  TFF 0.87's default execution context rejects ``tff.federated_secure_sum*``
  ("Cannot embed a federated value"). Its test C++ context runs the same local
  C++ runtime after compiling each secure sum into a plain sum with the same
  bound checks: the simulation of secure aggregation. This installs that
  context (`context_worker.local_context`) with a worker that dies with this process. Call it
  once before running a computation built with
  ``OptimalSamplingFactory(secure=True)`` (the program loop and `binary_main`
  do); it is harmless for computations without secure sums. Idempotent. It
  also silences the secure sums' unused-assert reports
  (`quiet_tensorflow_noise`).
  """
  global _SECURE_CONTEXT_SET
  quiet_tensorflow_noise()
  if not _SECURE_CONTEXT_SET:
    # Replacing TFF's default context stops the worker it started, if any ran
    # a computation already (e.g. a pre-processing round): bound that wait.
    with _KillWorkersAfter(_tff_started_workers(), _SHUTDOWN_TIMEOUT_S):
      context_stack_impl.context_stack.set_default_context(context_worker.local_context())
      gc.collect()
    _SECURE_CONTEXT_SET = True


_SECURE_CONTEXT_SET = False
_SHUTDOWN_TIMEOUT_S = 5.0


# --- Stopping workers --------------------------------------------------------------


def _release_execution_context() -> None:
  """Drops the default execution context, so that nothing uses a worker any more.

  Released while the interpreter is still whole, the context's stubs close
  before their worker goes away (killing a worker under a live stub crashed
  interpreter teardown about once in twelve exits, SIGSEGV), and a worker of
  TFF's own default context is stopped by TFF's manager (SIGINT, then wait).
  """
  context_stack_impl.context_stack.set_default_context(runtime_error_context.RuntimeErrorContext())
  gc.collect()


def _worker_children() -> list[psutil.Process]:
  """The ``worker_binary`` processes this process started (by whatever means)."""
  try:
    children = psutil.Process(os.getpid()).children(recursive=False)
  except psutil.Error:
    return []
  found = []
  for child in children:
    try:
      if child.status() != psutil.STATUS_ZOMBIE and (
        child.name() == _WORKER_NAME or _WORKER_NAME in ' '.join(child.cmdline()[:1])
      ):
        found.append(child)
    except psutil.Error:
      continue
  return found


def _tff_started_workers() -> list[psutil.Process]:
  """Worker children other than ours (`context_worker.CONTEXT_WORKER`): started by TFF's context."""
  ours = context_worker.CONTEXT_WORKER.pid
  return [w for w in _worker_children() if w.pid != ours]


def _kill(processes: list[psutil.Process]) -> None:
  for process in processes:
    try:
      process.kill()
    except psutil.Error:
      pass


class _KillWorkersAfter:
  """While active, kills the given TFF workers if `timeout_s` passes first.

  TFF stops a worker it no longer needs from the ``__del__`` of its execution
  context: SIGINT, then a wait with no time limit. Workers were seen ignoring
  that SIGINT (after a 35-minute run, and right after a first computation),
  which hung the program for good; this bounds the wait.
  """

  def __init__(self, workers: list[psutil.Process], timeout_s: float):
    self.fired = threading.Event()
    self._workers = workers
    self._timer = threading.Timer(timeout_s, self._fire)
    self._timer.daemon = True

  def _fire(self) -> None:
    self.fired.set()
    _kill(self._workers)

  def __enter__(self) -> _KillWorkersAfter:
    self._timer.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._timer.cancel()


def stop_local_workers(timeout_s: float = 5.0) -> int:
  """Stops every TFF worker subprocess of this process (registered with ``atexit``).

  First drops the execution context (`_release_execution_context`; a worker
  of TFF's own context is stopped by TFF, bounded by `timeout_s` through
  `_KillWorkersAfter`), then stops `use_secure_sum_simulation`'s worker; any
  worker child still running afterwards is interrupted, then killed.

  Returns:
    The number of workers that had to be stopped here (by the watchdog or
    after the release), ours included.
  """
  watched = _tff_started_workers()
  with _KillWorkersAfter(watched, timeout_s) as watchdog:
    try:
      _release_execution_context()
    except Exception:  # pylint: disable=broad-except
      pass  # Best effort: fall through to stopping the processes.
  killed_by_watchdog = len(watched) if watchdog.fired.is_set() else 0
  ours = 1 if context_worker.CONTEXT_WORKER.pid is not None else 0
  context_worker.CONTEXT_WORKER.stop(timeout_s)
  workers = _worker_children()
  for child in workers:
    try:
      child.send_signal(signal.SIGINT)  # What TFF itself sends.
    except psutil.Error:
      continue
  _, alive = psutil.wait_procs(workers, timeout=timeout_s)
  _kill(alive)
  return len(workers) + killed_by_watchdog + ours


atexit.register(stop_local_workers)


def stop_all_workers_now() -> None:
  """Kills every worker this process started and fails TFF calls from now on.

  For a program that must end quickly (SIGTERM, SIGINT): `workers_lib.shut_down`
  (local pools' workers killed, pools disconnected, no worker may start),
  `use_secure_sum_simulation`'s worker killed after its connection is closed,
  and any other worker child (TFF's own) killed. Thread-safe, idempotent.
  """
  workers_lib.shut_down()
  context_worker.CONTEXT_WORKER.stop(timeout_s=0)
  others = _worker_children()
  _kill(others)
  psutil.wait_procs(others, timeout=1.0)


# --- Logs ----------------------------------------------------------------------------


class _OwnInfoOnly(logging_lib.Filter):
  """Drops INFO (and lower) records logged from installed packages."""

  def filter(self, record: logging_lib.LogRecord) -> bool:
    if record.pathname.endswith('tf_should_use.py'):
      # "Object was never used": unused assert ops in the bodies TFF's test
      # compiler substitutes for secure sums; nothing of ours to act on.
      return False
    return record.levelno > logging_lib.INFO or 'site-packages' not in record.pathname


def quiet_library_logs() -> None:
  """Hides INFO logs of TF/TFF/Keras (checkpoint writes, asset notices, …).

  Our own INFO lines (progress, summaries) and every library warning or error
  still show. Binaries call this once in ``main``.
  """
  for name in ('absl', 'tensorflow'):
    logger = logging_lib.getLogger(name)
    if not any(isinstance(f, _OwnInfoOnly) for f in logger.filters):
      logger.addFilter(_OwnInfoOnly())


class _PlainFormatter(logging_lib.Formatter):
  """Our log lines as written (``WARNING: …`` for warnings and errors): no absl prefix."""

  def format(self, record: logging_lib.LogRecord) -> str:
    message = super().format(record)
    return message if record.levelno <= logging_lib.INFO else f'{record.levelname}: {message}'


def plain_log_lines() -> None:
  """Drops absl's prefix (level, time, thread, file:line) from the lines it writes."""
  absl_logging.get_absl_handler().setFormatter(_PlainFormatter())


# --- SIGTERM and SIGINT in binaries ---------------------------------------------------

# How long the main thread has, after a signal, to reach `binary_main` by itself before
# the process exits from the signal thread; and how much longer a file write in
# progress then gets to finish. Their sum stays under 5 s.
_EXIT_DEADLINE_S = 3.0
_WRITE_GRACE_S = 1.5

# Code that writes files: TF's file I/O (TFF's CSV and SavedModel writes and
# checkpoint removal go through it), TF's SavedModel writer, TFF's program
# package (release and program-state managers), and functions named write*/save*.
_WRITING_FILES = (
  '/tensorflow/python/lib/io/',
  '/tensorflow/python/saved_model/',
  '/tensorflow_federated/python/program/',
)
_WRITING_NAMES = ('write', '_write', 'save', '_save')

# The main thread waiting for a TFF call to finish (TFF's sync contexts run the
# call on an event-loop thread): an exception raised there interrupts no write.
_WAITING_ON_TFF = (
  '/tensorflow_federated/python/common_libs/async_utils.py',
  'run_coro_and_return_result',
)


class ProgramInterrupted(BaseException):
  """Raised in the main thread by the SIGTERM/SIGINT handler while it waits for a TFF call.

  A BaseException, like KeyboardInterrupt, so that ``except Exception`` lets
  it through to `binary_main`.
  """


def _stack(frame) -> list[Any]:
  frames = []
  while frame is not None:
    frames.append(frame)
    frame = frame.f_back
  return frames


def _in_file_write(frame) -> bool:
  return any(
    any(part in f.f_code.co_filename for part in _WRITING_FILES)
    or f.f_code.co_name.startswith(_WRITING_NAMES)
    for f in _stack(frame)
  )


def _any_thread_writing() -> bool:
  """Whether some thread is inside a file write (see `_WRITING_FILES`)."""
  return any(_in_file_write(frame) for frame in sys._current_frames().values())  # pylint: disable=protected-access


def interruption_message(signum: int) -> str:
  name = signal.Signals(signum).name
  return (
    f'Interrupted by {name}: stopped the run and its TFF workers; every file written '
    f'is complete; rerun the same command to resume from the last checkpoint.'
  )


class _Interrupts:
  """SIGTERM/SIGINT handling of a binary: workers stopped at once, a clean exit soon after.

  * The signal's number reaches `_watch`, a thread of its own, through
    ``signal.set_wakeup_fd``, written by Python's C-level handler the moment
    the signal arrives, whatever the main thread is doing (Python-level
    handlers only run when the main thread next executes Python code, which it
    does not while inside a TF op or a TFF compilation).
  * A thread started by `_watch` stops every worker (`stop_all_workers_now`),
    so that a TFF call in progress fails at once and none can start, then
    gives the main thread `_EXIT_DEADLINE_S` to reach `binary_main` by itself.
  * The main thread's handler raises `ProgramInterrupted` if the main thread
    is only waiting for a TFF call; elsewhere it returns, and the main thread
    carries on (a write in progress completes) until the failing TFF call or
    another exception reaches `binary_main`.
  * `binary_main` (or that thread at the deadline, once no file write is in
    progress, or at most `_WRITE_GRACE_S` later) prints one line and ends the
    process with ``os._exit(128 + signum)``: no interpreter teardown that could
    wait on a worker, a thread or a closed channel.

  A second signal ends the process at once (workers stopped first).
  """

  def __init__(self):
    self.signum: int | None = None  # The first SIGTERM/SIGINT, once known to either thread.
    self._received = 0  # Signals read by `_watch`.
    self._exit_lock = threading.Lock()

  def install(self) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # Required by set_wakeup_fd.
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._handle)
    threading.Thread(
      target=self._watch, args=(read_fd,), daemon=True, name='tff-sampling-signals'
    ).start()

  def _record(self, signum: int) -> None:
    if self.signum is None:  # Either thread may learn of the signal first.
      self.signum = signum

  def _handle(self, signum: int, frame) -> None:
    """The main thread's Python-level handler."""
    self._record(signum)
    if any(
      f.f_code.co_filename.endswith(_WAITING_ON_TFF[0]) and f.f_code.co_name == _WAITING_ON_TFF[1]
      for f in _stack(frame)
    ):
      raise ProgramInterrupted()

  def _watch(self, read_fd: int) -> None:
    while True:
      signum = os.read(read_fd, 1)[0]
      if signum not in (signal.SIGTERM, signal.SIGINT):
        continue  # Another signal with a Python handler.
      self._record(signum)
      self._received += 1
      if self._received > 1:
        self.exit()  # A second signal: now.
      threading.Thread(
        target=self._stop_and_exit_by_deadline,
        args=(time.monotonic() + _EXIT_DEADLINE_S,),
        daemon=True,
        name='tff-sampling-exit-deadline',
      ).start()

  def _stop_and_exit_by_deadline(self, deadline: float) -> None:
    stop_all_workers_now()
    time.sleep(max(0.0, deadline - time.monotonic()))
    while _any_thread_writing() and time.monotonic() < deadline + _WRITE_GRACE_S:
      time.sleep(0.05)
    self.exit()

  def exit(self) -> None:
    """Stops the workers, prints the one line and ends the process (128 + signum)."""
    signum = self.signum
    assert signum is not None  # Called once a signal is recorded.
    in_main = threading.current_thread() is threading.main_thread()
    # Whoever comes second waits here until the process ends; from another
    # thread only briefly, in case the first is stuck (e.g. flushing a full pipe).
    if not self._exit_lock.acquire(timeout=-1 if in_main else 1.0):
      os._exit(128 + signum)  # pylint: disable=protected-access
    stop_all_workers_now()
    if in_main:
      for stream in (sys.stdout, sys.stderr):
        try:
          stream.flush()
        except Exception:  # pylint: disable=broad-except
          pass
    os.write(2, (interruption_message(signum) + '\n').encode())
    files.remove_private_tempdir()
    os._exit(128 + signum)  # pylint: disable=protected-access


def binary_main(main: Callable[[Sequence[str]], Any]) -> Callable[[Sequence[str]], Any]:
  """A binary's ``main`` for ``absl.app.run``, with clean SIGTERM/SIGINT handling.

  Every binary ends with ``app.run(runtime.binary_main(main))``. This installs
  the signal handling now (`_Interrupts`) and returns a ``main`` that first
  installs this project's TFF context (`use_secure_sum_simulation`, so that
  every worker dies with the process). After SIGTERM or SIGINT the process ends
  within about `_EXIT_DEADLINE_S` + `_WRITE_GRACE_S` seconds with one line on
  stderr (`interruption_message`) and status 128 + signal number (143, 130),
  its workers stopped; files are complete (checkpoints and ``metrics.csv`` are
  written to a temporary name and renamed by TFF), so rerunning the command
  resumes from the last checkpoint.
  """
  interrupts = _Interrupts()
  interrupts.install()
  files.use_private_tempdir()

  def guarded_main(argv: Sequence[str]) -> Any:
    try:
      use_secure_sum_simulation()
      result = main(argv)
    except BaseException:  # ProgramInterrupted included: the handler recorded its signal.
      if interrupts.signum is not None:
        interrupts.exit()
      raise
    if interrupts.signum is not None:
      interrupts.exit()
    return result

  return guarded_main
