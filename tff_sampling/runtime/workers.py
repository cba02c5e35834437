"""Several TFF C++ worker services for one simulation: each round's clients split over them
(`WorkerPool`, local or remote); ``docs/performance.md`` has how and what it measured."""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence
import os
import re
import signal
import socket
import subprocess
import threading
import time
from typing import Any
import weakref

import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import executor_factory
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import placements

from tff_sampling import validation
from tff_sampling.runtime import compilation
from tff_sampling.runtime import processes as processes_lib

# TFF's own channel limits for its local worker (executor_factory.py): 2 GB messages.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = [
  ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
  ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
  ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
_ADDRESS = re.compile(r'^(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$')


def worker_binary_path() -> str:
  """The ``worker_binary`` packaged with the installed TFF."""
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


def check_address(address: str) -> str:
  """Returns `address` if it is ``host:port``, else raises a ValueError saying so."""
  match = _ADDRESS.match(address.strip())
  if not match or not 0 < int(match['port']) < 65536:
    raise ValueError(
      f'Worker address {address!r} is not host:port (e.g. localhost:8000 or 10.0.0.2:8000).'
    )
  return address.strip()


class WorkersStopped(RuntimeError):
  """A TFF call needed a worker that is gone: `shut_down`, a closed pool, an exited worker.

  A RuntimeError, which TFF does not retry (it retries gRPC UNAVAILABLE without end).
  """


_SHUTTING_DOWN = threading.Event()


def check_not_shut_down() -> None:
  """Raises `WorkersStopped` after `shut_down`."""
  if _SHUTTING_DOWN.is_set():
    raise WorkersStopped('The TFF workers were stopped because the program is shutting down.')


def concurrent_calls() -> int:
  """How many calls of one computation a worker started here runs at once (a round's
  clients under ``federated_map``): one per core this process may run on.

  TFF's default runs every client of a call at once, each on threads of its own, over the
  same cores. A client's result does not depend on how many run beside it: this changes the
  time of a round (0.73-0.81 of it on the label-skewed digits where many clients train), not
  its values (docs/performance.md, "Clients at once in a worker").
  """
  return len(os.sched_getaffinity(0))


def start_worker_process(
  port: int, *args: str, stdout: Any = subprocess.DEVNULL, stderr: Any = subprocess.DEVNULL
) -> subprocess.Popen:
  """Starts ``worker_binary --port=PORT [args]``, killed by Linux when this process dies.

  The worker runs at most `concurrent_calls` clients of a call at once. See
  `tff_sampling.runtime.processes.start`. In a session of its own, so that a terminal's
  Ctrl-C (SIGINT to the whole foreground process group) does not kill the worker under a
  call in progress, which would then be retried on a new worker with a warning before this
  process's own handler stops every worker (`tff_sampling.runtime.tff_context`). Raises
  `WorkersStopped` after `shut_down`.
  """
  check_not_shut_down()
  binary = worker_binary_path()
  if not os.path.isfile(binary):
    raise FileNotFoundError(f'No TFF worker binary at {binary}; reinstall tensorflow-federated.')
  return processes_lib.start(
    [binary, f'--port={port}', f'--max_concurrent_computation_calls={concurrent_calls()}', *args],
    death_signal=signal.SIGKILL,
    stdout=stdout,
    stderr=stderr,
    start_new_session=True,
  )


class LocalWorkers:
  """``worker_binary`` processes started on this machine, on free loopback ports.

  Stopped by `stop` (idempotent, thread-safe), by `shut_down`, at interpreter
  exit, and (on Linux) by the kernel when this process dies without any of
  these (`start_worker_process`).
  """

  def __init__(self, num_workers: int):
    num_workers = validation.positive_int('num_workers', num_workers)
    self._lock = threading.Lock()
    self._processes: list[subprocess.Popen] = []
    self._stopped = False
    self.addresses: list[str] = []
    atexit.register(self.stop)
    _LIVE_LOCAL_WORKERS.add(self)
    for _ in range(num_workers):
      port = portpicker.pick_unused_port()
      process = start_worker_process(port)
      with self._lock:
        stopped = self._stopped
        if not stopped:
          self._processes.append(process)
      if stopped:  # `stop` ran while this one started (`shut_down`, from a signal's thread).
        processes_lib.stop(process, timeout_s=0)
        raise WorkersStopped('The local TFF workers were stopped while they were starting.')
      self.addresses.append(f'localhost:{port}')

  @property
  def pids(self) -> list[int]:
    with self._lock:
      return [p.pid for p in self._processes]

  def exited(self) -> list[str]:
    """The addresses of workers that are no longer running."""
    with self._lock:
      return [a for a, p in zip(self.addresses, self._processes) if p.poll() is not None]

  def stop(self, timeout_s: float = 5.0) -> None:
    """Stops the workers: SIGTERM, then SIGKILL after `timeout_s` (0: SIGKILL at once).

    A worker that finishes starting after this (`__init__` in another thread) is stopped
    then, and `__init__` raises `WorkersStopped` instead of starting the others.
    """
    with self._lock:
      self._stopped = True
      processes, self._processes = self._processes, []
    for process in processes:
      if process.poll() is None and timeout_s > 0:
        process.terminate()
    for process in processes:
      processes_lib.stop(process, timeout_s)


_LIVE_LOCAL_WORKERS: weakref.WeakSet[LocalWorkers] = weakref.WeakSet()
_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def shut_down() -> None:
  """Stops every worker this process started here, now, and fails every TFF call on a pool.

  For a program that must end quickly (SIGTERM, SIGINT): from now on starting
  a worker or an executor raises `WorkersStopped`; the local workers are
  killed and every pool's connections closed, so that a TFF call waiting on
  them fails at once instead of being retried. Workers given by address are
  not stopped (they are not ours), only disconnected. Thread-safe, idempotent.
  """
  _SHUTTING_DOWN.set()
  for pool in list(_LIVE_POOLS):
    pool._disconnect()  # pylint: disable=protected-access
  for local in list(_LIVE_LOCAL_WORKERS):
    local.stop(timeout_s=0)


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
  """Raises a one-line ValueError unless something accepts TCP connections at `address`.

  A refused connection fails at once, an unknown host or one that does not
  answer within `timeout_s` seconds soon after, instead of TFF waiting for a
  worker without limit.
  """
  match = _ADDRESS.match(check_address(address))
  assert match is not None  # `check_address` accepted it.
  host, port = match['host'].strip('[]'), int(match['port'])
  try:
    socket.create_connection((host, port), timeout=timeout_s).close()
  except OSError as e:
    reason = e.strerror or str(e) or type(e).__name__
    raise ValueError(
      f'No TFF worker reachable at {address} ({reason}). Start one there with '
      f'`{worker_binary_path()} --port={port}`, or give the host:port of a running '
      f'one.'
    ) from None


# Executors (one per number of clients) kept open on the worker at once.
EXECUTORS_KEPT = 4


class ClosingExecutorFactory(executor_factory.ExecutorFactory):
  """One executor per cardinalities, the `capacity` most recently used kept; the others closed.

  TFF's ``ResourceManagingExecutorFactory`` (executor_stacks/
  python_executor_stacks.py, TFF 0.87) drops the least recently used of its ten
  executors without closing it, so the worker keeps the executor stack of every
  number of clients a computation was ever called with: a run whose cohorts vary
  in size (power-of-choice probing the clients available this round, MMFL's
  cohorts, the last slice of a pool's round) grows the worker with every new
  size until the kernel's OOM killer stops it. Here the evicted executor is
  closed, which disposes of its stack and values on the worker. A context runs
  one call at a time (TFF's sync context; its mergeable context gives each
  worker's context one slice after another), so an evicted executor, never the
  one just requested, is not in use.

  ``generation()`` (default: always 0) changes whenever the worker the executors
  talk to is started or stopped. An executor of an earlier generation talks over
  the closed channel of a worker that is gone, so it is dropped (closing it would
  fail on that channel) and made again: without this, TFF's retry of a call that
  lost its worker succeeds on the new worker, and the next call with another
  number of clients fails with gRPC's "Cannot invoke RPC on closed channel!".
  """

  def __init__(
    self,
    executor_stack_fn: Callable[[executor_factory.CardinalitiesType], executor_base.Executor],
    capacity: int = EXECUTORS_KEPT,
    generation: Callable[[], int] = lambda: 0,
  ):
    if capacity < 1:
      raise ValueError(f'capacity={capacity}: keep at least one executor (capacity >= 1).')
    self._executor_stack_fn = executor_stack_fn
    self._capacity = capacity
    self._generation = generation
    # Least recently used first; each with the generation it was made in.
    self._executors: dict[tuple, tuple[int, executor_base.Executor]] = {}

  @staticmethod
  def _key(cardinalities: executor_factory.CardinalitiesType) -> tuple:
    return tuple(sorted((str(p), n) for p, n in cardinalities.items()))

  def create_executor(
    self, cardinalities: executor_factory.CardinalitiesType
  ) -> executor_base.Executor:
    self._drop_stale()
    key = self._key(cardinalities)
    made = self._executors.pop(key, None)
    if made is None:
      executor = self._executor_stack_fn(cardinalities)  # May start a new worker.
      self._drop_stale()
      made = (self._generation(), executor)
      while len(self._executors) >= self._capacity:
        self._executors.pop(next(iter(self._executors)))[1].close()
    self._executors[key] = made
    return made[1]

  def _drop_stale(self) -> None:
    """Forgets the executors of an earlier generation, without closing them."""
    now = self._generation()
    self._executors = {k: made for k, made in self._executors.items() if made[0] == now}

  def clean_up_executor(self, cardinalities: executor_factory.CardinalitiesType) -> None:
    made = self._executors.pop(self._key(cardinalities), None)
    if made is not None and made[0] == self._generation():
      made[1].close()


def _remote_context(address: str, connect_timeout_s: float, usable):
  """TFF's async execution context on the worker at `address` (cf. TFF's local one).

  Returns ``(context, channel)``. Waits up to `connect_timeout_s` for the
  worker's gRPC service; ``usable()`` raises if the call should fail instead
  (the pool closed, the program shutting down, a local worker that exited):
  checked while waiting and at each executor TFF creates, so that TFF's retry
  of a failed call ends with that error instead of retrying forever.
  """
  channel = grpc.insecure_channel(address, _CHANNEL_OPTIONS)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
  deadline = time.monotonic() + connect_timeout_s
  try:
    while not stub.is_ready:
      usable()
      if time.monotonic() > deadline:
        raise ValueError(
          f'No TFF worker answered at {address} within {connect_timeout_s:g} s (something '
          f"accepts connections there, but not a TFF worker's gRPC service). Start one with "
          f'`{worker_binary_path()} --port=PORT`, or check the host and port.'
        )
      time.sleep(0.05)
  except BaseException:
    channel.close()
    raise

  def executor_stack(cardinalities):
    usable()
    # Computations with no client-placed argument (e.g. the merge) carry no
    # client count; TFF's local factory defaults it the same way.
    cardinalities.setdefault(placements.CLIENTS, 0)
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
    executor_fn=ClosingExecutorFactory(executor_stack),
    compiler_fn=compilation.native_form,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  ), channel


def _num_clients(computation: tff.Computation, args: Sequence[Any]) -> int:
  """The length of the first client-placed (non-all-equal) argument, else 0."""
  parameter = computation.type_signature.parameter
  types = ([parameter] if len(args) == 1 else list(parameter)) if parameter is not None else []
  for value, value_type in zip(args, types):
    if (
      isinstance(value_type, tff.FederatedType)
      and value_type.placement is tff.CLIENTS
      and not value_type.all_equal
    ):
      return len(value)
  return 0


def check_splittable(computation: tff.Computation, name: str) -> None:
  """Raises a ValueError naming `name` if TFF cannot split `computation` over workers."""
  try:
    mergeable_comp_compiler.compile_to_mergeable_comp_form(computation)
  except (ValueError, TypeError) as e:
    raise ValueError(
      f'{name} cannot run over several TFF workers: TFF splits only rounds whose '
      f'aggregations do not depend on one another, and this one has dependent ones (e.g. '
      f"the optimal-sampling protocol's secure sums after a broadcast). Run it in one "
      f'process (no --workers / --local_workers). TFF said: {str(e)[:300]}'
    ) from e


class WorkerPool:
  """Runs federated computations with their clients split over several TFF workers.

  Example::

      pool = WorkerPool.start_local(2)          # or WorkerPool(['host1:8000', ...])
      pool.check_splittable(process.next, 'fedavg')
      output = pool.run(process.next, state, client_datasets)
      pool.close()

  Other computations (initialisation, evaluation) keep running in the default
  context.
  """

  def __init__(
    self,
    addresses: Sequence[str],
    *,
    connect_timeout_s: float = 20.0,
    clients_per_call: int | None = None,
    _local: LocalWorkers | None = None,
  ):
    """Connects to running workers.

    Args:
      addresses: ``host:port`` of each worker. Each must accept connections
        now (`check_reachable`): an unreachable one is a ValueError naming it.
      connect_timeout_s: How long to wait for each worker's gRPC service to
        answer once connected (a local worker's start included).
      clients_per_call: If set, a round is cut into slices of at most this
        many clients (``ceil(cohort / clients_per_call)`` sub-rounds, run by
        the workers in turn), which bounds what a worker holds at once: the
        memory of a large cohort. ``None``: one slice per worker.
    """
    addresses = [check_address(a) for a in addresses]
    if not addresses:
      raise ValueError('A WorkerPool needs at least one worker address.')
    if len(set(addresses)) != len(addresses):
      raise ValueError(f'Worker addresses must differ, got {addresses}.')
    clients_per_call = validation.positive_int('clients_per_call', clients_per_call, optional=True)
    self.addresses = addresses
    self.clients_per_call = clients_per_call
    self._local = _local
    self._closed = False
    self._channels = []
    self._contexts: dict[int, Any] = {}  # Mergeable contexts by number of sub-rounds.
    try:
      if _local is None:  # Local workers may still be starting: waited for below.
        for address in addresses:
          check_reachable(address)
      self._async_contexts = []
      for address in addresses:
        context, channel = _remote_context(address, connect_timeout_s, self._check_usable)
        self._async_contexts.append(context)
        self._channels.append(channel)
    except BaseException:
      self.close()
      raise
    _LIVE_POOLS.add(self)

  def _check_usable(self) -> None:
    """Raises if a TFF call on this pool must fail now rather than wait or be retried."""
    check_not_shut_down()
    if self._closed:
      raise WorkersStopped(f'The worker pool {self.addresses} was closed.')
    exited = self._local.exited() if self._local is not None else []
    if exited:
      raise WorkersStopped(f'The local TFF worker at {", ".join(exited)} exited.')

  @classmethod
  def start_local(
    cls, num_workers: int, *, connect_timeout_s: float = 60.0, clients_per_call: int | None = None
  ) -> WorkerPool:
    """Starts `num_workers` ``worker_binary`` processes here; `close` stops them."""
    local = LocalWorkers(num_workers)
    try:
      return cls(
        local.addresses,
        connect_timeout_s=connect_timeout_s,
        clients_per_call=clients_per_call,
        _local=local,
      )
    except BaseException:
      local.stop(timeout_s=0)
      raise

  @property
  def size(self) -> int:
    return len(self.addresses)

  def check_splittable(self, computation: tff.Computation, name: str) -> None:
    """See the module-level `check_splittable`."""
    check_splittable(computation, name)

  def num_subrounds(self, num_clients: int) -> int:
    """Into how many slices a round of `num_clients` is cut."""
    if self.clients_per_call is None:
      return self.size
    return max(1, -(-num_clients // self.clients_per_call))

  def run(self, computation: tff.Computation, *args: Any) -> Any:
    """``computation(*args)`` with its clients split over the workers."""
    subrounds = self.num_subrounds(_num_clients(computation, args))
    if subrounds not in self._contexts:
      self._contexts[subrounds] = tff.backends.native.create_mergeable_comp_execution_context(
        self._async_contexts, num_subrounds=subrounds
      )
    with context_stack_impl.context_stack.install(self._contexts[subrounds]):
      return computation(*args)

  def close(self) -> None:
    """Stops the workers this pool started (none if it was given addresses). Idempotent."""
    self._disconnect()
    if self._local is not None:
      self._local.stop()

  def _disconnect(self) -> None:
    """Closes the pool's connections: a TFF call running on it fails (gRPC CANCELLED)."""
    self._closed = True
    for channel in self._channels:
      channel.close()

  def __enter__(self) -> WorkerPool:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
