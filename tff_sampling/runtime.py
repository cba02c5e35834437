"""The TFF runtime as this project uses it: local C++ workers and their cleanup.

TFF 0.87's default execution context starts a local C++ ``worker_binary``
subprocess and stops it from a ``__del__`` that runs during interpreter
shutdown, when the ``subprocess`` module is already torn down
("'NoneType' object has no attribute 'Popen'"), so the worker outlives the
program. Every program or test that imports this package would leave one idle
worker (100-400 MB) behind. `stop_local_workers` is registered with `atexit`
(which runs before module teardown) and stops the workers this process started.
"""

from __future__ import annotations

import atexit
import gc
import logging as logging_lib
import os
import signal
import threading

import psutil
import tensorflow_federated as tff

_WORKER_NAME = 'worker_binary'


def _release_execution_context() -> None:
  """Drops TFF's execution context so that TFF stops its own worker, now.

  The context owns the gRPC stub and the ``ServiceManager`` of the local worker;
  released while the interpreter is still whole, the manager's ``__del__``
  stops the worker the way TFF intends (SIGINT, then wait) and the stub closes
  before the worker goes away. Killing the worker under a live stub instead
  crashed interpreter teardown about once in twelve exits (SIGSEGV).
  """
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tensorflow_federated.python.core.impl.context_stack import runtime_error_context
  context_stack_impl.context_stack.set_default_context(
      runtime_error_context.RuntimeErrorContext())
  gc.collect()


def _local_workers() -> list[psutil.Process]:
  """The TFF worker subprocesses this process started."""
  try:
    children = psutil.Process(os.getpid()).children(recursive=False)
  except psutil.Error:
    return []
  workers = []
  for child in children:
    try:
      if child.name() == _WORKER_NAME or _WORKER_NAME in ' '.join(child.cmdline()[:1]):
        workers.append(child)
    except psutil.Error:
      continue
  return workers


def _kill(workers: list[psutil.Process]) -> None:
  for child in workers:
    try:
      child.kill()
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

  def __enter__(self) -> '_KillWorkersAfter':
    self._timer.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._timer.cancel()


def stop_local_workers(timeout_s: float = 5.0) -> int:
  """Stops the TFF worker subprocesses started by this process (at exit).

  First lets TFF shut its worker down itself (`_release_execution_context`),
  bounded by `timeout_s` (`_KillWorkersAfter`). Any worker still running
  afterwards is interrupted, then killed.

  Returns:
    The number of workers that had to be stopped here (by the watchdog or
    after the release).
  """
  watched = _local_workers()
  with _KillWorkersAfter(watched, timeout_s) as watchdog:
    try:
      _release_execution_context()
    except Exception:  # pylint: disable=broad-except
      pass  # Best effort: fall through to stopping the processes.
  killed_by_watchdog = len(watched) if watchdog.fired.is_set() else 0
  workers = _local_workers()
  for child in workers:
    try:
      child.send_signal(signal.SIGINT)  # What TFF itself sends.
    except psutil.Error:
      continue
  _, alive = psutil.wait_procs(workers, timeout=timeout_s)
  _kill(alive)
  return len(workers) + killed_by_watchdog


atexit.register(stop_local_workers)


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


def use_secure_sum_simulation() -> None:
  """Makes TFF run computations that contain secure sums.

  TFF 0.87's default execution context rejects ``tff.federated_secure_sum*``
  ("Cannot embed a federated value"). Its test C++ context runs the same local
  C++ runtime after compiling each secure sum into a plain sum with the same
  bound checks: the simulation of secure aggregation. Call this once before
  running a computation built with ``OptimalSamplingFactory(secure=True)`` (the
  program loop and binaries do); it is harmless for computations without secure
  sums. Idempotent.
  """
  global _SECURE_CONTEXT_SET
  if not _SECURE_CONTEXT_SET:
    # Replacing the default context stops the worker it started, if any ran
    # a computation already (e.g. a pre-processing round): bound that wait.
    with _KillWorkersAfter(_local_workers(), _SHUTDOWN_TIMEOUT_S):
      tff.backends.test.set_sync_test_cpp_execution_context()
      gc.collect()
    _SECURE_CONTEXT_SET = True


_SECURE_CONTEXT_SET = False
_SHUTDOWN_TIMEOUT_S = 5.0
