"""The worker behind this project's TFF execution context, and that context.

TFF runs computations on a C++ ``worker_binary`` subprocess that its default
execution context starts on first use. TFF's own manager of that process
neither ties it to this process (after a SIGKILL, or a SIGTERM without a
handler, it runs on under pid 1) nor stops it reliably (from a ``__del__`` at
interpreter shutdown, when ``subprocess`` is already torn down).
`local_context` is TFF's test C++ context (secure sums compiled into plain
sums with the same bound checks) on a worker of our own, `CONTEXT_WORKER`,
started through `tff_sampling.runtime.workers.start_worker_process`, i.e. with
``PR_SET_PDEATHSIG`` from a thread that lives as long as this process, so Linux
kills it when this process dies, whatever kills it.
`tff_sampling.runtime.tff_context` installs the context and stops the worker.
"""

from __future__ import annotations

import functools
import threading
import time

from absl import logging as absl_logging
import grpc
import portpicker
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import placements

from tff_sampling.runtime import compilation
from tff_sampling.runtime import processes
from tff_sampling.runtime import workers as workers_lib

_WORKER_START_TIMEOUT_S = 60.0
_RECONNECT_TIMEOUT_S = 5.0  # For a running worker whose channel went idle.
_DEATHS_IN_A_ROW = 3  # Workers dying with no call returning in between before a call fails.


class ContextWorker:
  """The ``worker_binary`` behind `local_context`.

  Like TFF's ``ServiceManager`` (executor_factory.py): started on first use,
  restarted if it died, one at a time; unlike it, started so that it dies with
  this process (`workers_lib.start_worker_process`), never restarted after
  `workers_lib.shut_down`, and stopped by `stop` with a bounded wait.

  **A worker that dies** (TFF 0.87's ``worker_binary`` now and then segfaults in
  its gRPC server) fails the call in progress with a retryable error; TFF's
  context then calls again, from the same arguments, on a new worker started
  here (with a warning). `generation` changes with every worker started or
  stopped, which tells the executor factory to drop the executors made on an
  earlier one. Every replacement of a worker that had started counts as a death
  (one that exited or stopped answering, while running or starting), and
  `succeeded` (after each call that returned) resets the count: after
  `_DEATHS_IN_A_ROW` deaths with no call returning in between, the call fails
  with the reason, and so does every later one.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._process = None
    self._channel = None
    self._stub = None
    self.generation = 0  # Changes with each start and stop (`workers_lib.ClosingExecutorFactory`).
    self._deaths_in_a_row = 0
    self._given_up: str | None = None  # Why no worker is started any more.

  def succeeded(self) -> None:
    """Notes that a call on the current worker returned."""
    with self._lock:
      self._deaths_in_a_row = 0

  @property
  def pid(self) -> int | None:
    process = self._process
    return process.pid if process is not None and process.poll() is None else None

  def stub(self) -> remote_executor_grpc_stub.RemoteExecutorGrpcStub:
    """The running worker's stub; starts the worker first if none runs."""
    with self._lock:
      workers_lib.check_not_shut_down()
      if self._given_up is not None:
        raise RuntimeError(self._given_up)
      if self._process is not None and self._process.poll() is None and self._answers():
        return self._stub
      if self._process is not None:  # Died or unreachable: start afresh, as TFF does.
        self._count_death(self._process)
      while True:
        self._stop_locked(timeout_s=1.0)
        process = self._start_locked()
        if process is None:
          return self._stub
        self._count_death(process)

  def _answers(self) -> bool:
    """Whether the running worker's channel is ready, reconnecting first if it is not (gRPC
    lets a channel go idle after a while without calls; TFF's stub then stays not ready)."""
    assert self._stub is not None and self._channel is not None  # Set with `_process`.
    if self._stub.is_ready:
      return True
    try:
      grpc.channel_ready_future(self._channel).result(timeout=_RECONNECT_TIMEOUT_S)
    except grpc.FutureTimeoutError:
      return False
    return True

  def _start_locked(self):
    """Starts a worker and waits until it answers; returns None, or the worker if it exited
    or did not answer in time while starting."""
    port = portpicker.pick_unused_port()
    # The worker's own log lines (and a crash report) go to our stderr, as with TFF's.
    self._process = workers_lib.start_worker_process(port, stderr=None)
    self._channel = grpc.insecure_channel(f'localhost:{port}', workers_lib._CHANNEL_OPTIONS)  # pylint: disable=protected-access
    self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(self._channel)
    self.generation += 1
    deadline = time.monotonic() + _WORKER_START_TIMEOUT_S
    while not self._stub.is_ready:
      workers_lib.check_not_shut_down()
      if self._process.poll() is not None or time.monotonic() > deadline:
        return self._process
      time.sleep(0.02)
    return None

  def _count_death(self, process) -> None:
    """Warns of a worker that died or stopped answering; gives up after too many in a row."""
    self._deaths_in_a_row += 1
    status = process.poll()
    what = f'The local TFF worker (pid {process.pid}) ' + (
      'stopped answering' if status is None else f'exited with status {status}'
    )
    if self._deaths_in_a_row >= _DEATHS_IN_A_ROW:
      self._stop_locked(timeout_s=0)
      self._given_up = (
        f'{what}: {self._deaths_in_a_row} workers in a row died before a call returned, so no '
        "other is started (their own lines above, or the kernel's log, say why)."
      )
      raise RuntimeError(self._given_up)
    absl_logging.warning('%s; starting a new one for the call in progress.', what)

  def stop(self, timeout_s: float = 5.0) -> None:
    """Closes the connection, then stops the worker (SIGKILL after `timeout_s`; 0: at once)."""
    with self._lock:
      self._stop_locked(timeout_s)

  def _stop_locked(self, timeout_s: float) -> None:
    if self._channel is not None:
      self._channel.close()  # A call in progress fails (CANCELLED), not retried by TFF.
      self.generation += 1  # Executors on that channel cannot be used any more.
    process, self._process, self._channel, self._stub = self._process, None, None, None
    if process is not None:
      processes.stop(process, timeout_s)


CONTEXT_WORKER = ContextWorker()


class _LocalContext(sync_execution_context.SyncExecutionContext):
  """TFF's sync context, telling `CONTEXT_WORKER` of each call that returned."""

  def invoke(self, comp, arg):
    result = super().invoke(comp, arg)
    CONTEXT_WORKER.succeeded()
    return result


def local_context() -> sync_execution_context.SyncExecutionContext:
  """TFF's ``create_sync_test_cpp_execution_context`` on `CONTEXT_WORKER`'s worker.

  The same compilation (secure sums replaced by their test bodies, then TFF's native form),
  executors and argument/result transforms as TFF's (core/backends/test/execution_contexts.py
  and executor_stacks/executor_factory.py, TFF 0.87), but for three things: the worker process
  is ours (restarted after it died, a bounded number of times), the factory closes the
  executors it no longer keeps and drops those of a worker stopped or dead
  (`workers_lib.ClosingExecutorFactory`),
  and the compilation takes TFF's steps in one pass
  without its static Grappler pass (`compilation.native_form`).
  """

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(CONTEXT_WORKER.stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return _LocalContext(
    executor_fn=workers_lib.ClosingExecutorFactory(
      stack_fn, generation=lambda: CONTEXT_WORKER.generation
    ),
    compiler_fn=functools.partial(compilation.native_form, simulate_secure_sums=True),
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )
