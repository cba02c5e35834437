"""Several TFF C++ worker services for one simulation: each round's clients split over them.

TFF's C++ runtime serves computations from a ``worker_binary`` (packaged with
TFF, `worker_binary_path`) reached over gRPC. The default context starts one
such worker per program. A `WorkerPool` instead talks to several, on this
machine or others, through TFF's own remote executor, and runs a round with
TFF's *mergeable-computation* execution context
(`tff.backends.native.create_mergeable_comp_execution_context`):

1. TFF compiles the round (``process.next``) into three parts: everything up to
   its aggregation, the aggregation's merge, and everything after it.
2. The cohort is cut into one contiguous slice per worker. Each worker runs the
   first part (broadcast, local training, partial aggregation) on its slice,
   in parallel.
3. The partial aggregates are merged, and one worker runs the server update.

The result is the single-process round up to the order of floating-point
additions: a partial sum per worker is added in whichever order the workers
finish. Per-client signals are scattered by cohort slot
(`tff_sampling.learning.signals.gather_by_slot`), so they do not depend on
that order.

**What can be split.** Rounds with one layer of aggregation: FedAvg and every
server-side sampler's process (uniform, MD, clustered, FedGS, LEFL,
power-of-choice), including those that gather per-client signals. The
optimal-sampling protocol cannot: its later secure sums depend on the first
(clients rescale with the broadcast sum), and TFF's mergeable form allows
only independent aggregations. `WorkerPool.check_splittable` says so before any
round runs.

**Starting workers by hand** (several machines)::

    # on each worker machine (TFF installed; choose any free port)
    .venv/bin/python -c "from tff_sampling import workers; print(workers.worker_binary_path())"
    <that path> --port=8000

    # on the machine that runs the program
    ./run fedavg --workers=host1:8000,host2:8000 ...

The workers need no data: each round's client datasets are sent with the
computation. Traffic is plain gRPC without authentication: use a private
network or an SSH tunnel.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler as native_compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import placements

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
    raise ValueError(f'Worker address {address!r} is not host:port (e.g. localhost:8000 or '
                     f'10.0.0.2:8000).')
  return address.strip()


def _die_with_parent() -> None:
  """In the child before exec: ask Linux to SIGTERM it when its parent dies.

  Covers a parent killed by a signal, when neither `LocalWorkers.stop` nor the
  ``atexit`` hook runs. Elsewhere than Linux, a no-op. Linux sends the signal
  when the *thread* that started the worker ends, so start workers from a
  thread that lives as long as they are needed (e.g. the main thread).
  """
  try:
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
  except (OSError, AttributeError):
    pass


_PR_SET_PDEATHSIG = 1


class LocalWorkers:
  """``worker_binary`` processes started on this machine, on free loopback ports.

  Stopped by `stop` (idempotent), at interpreter exit, and (on Linux) by the
  kernel when this process dies without either.
  """

  def __init__(self, num_workers: int):
    if not isinstance(num_workers, int) or num_workers < 1:
      raise ValueError(f'num_workers must be a positive integer, got {num_workers!r}.')
    binary = worker_binary_path()
    if not os.path.isfile(binary):
      raise FileNotFoundError(f'No TFF worker binary at {binary}; reinstall tensorflow-federated.')
    self._processes: list[subprocess.Popen] = []
    self.addresses: list[str] = []
    atexit.register(self.stop)
    for _ in range(num_workers):
      port = portpicker.pick_unused_port()
      self._processes.append(subprocess.Popen(
          [binary, f'--port={port}'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
          preexec_fn=_die_with_parent if sys.platform.startswith('linux') else None))
      self.addresses.append(f'localhost:{port}')

  @property
  def pids(self) -> list[int]:
    return [p.pid for p in self._processes]

  def stop(self, timeout_s: float = 5.0) -> None:
    """Stops the workers: SIGTERM, then SIGKILL after `timeout_s`."""
    for process in self._processes:
      if process.poll() is None:
        process.terminate()
    for process in self._processes:
      try:
        process.wait(timeout_s)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    self._processes = []


def _remote_context(address: str, connect_timeout_s: float):
  """TFF's async execution context on the worker at `address` (cf. TFF's local one)."""
  channel = grpc.insecure_channel(address, _CHANNEL_OPTIONS)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
  deadline = time.monotonic() + connect_timeout_s
  while not stub.is_ready:
    if time.monotonic() > deadline:
      raise ConnectionError(
          f'No TFF worker answered at {address} within {connect_timeout_s:g} s. Start one there '
          f'with `{worker_binary_path()} --port=PORT`, or check the host and port.')
    time.sleep(0.1)

  def executor_stack(cardinalities):
    # Computations with no client-placed argument (e.g. the merge) carry no
    # client count; TFF's local factory defaults it the same way.
    cardinalities.setdefault(placements.CLIENTS, 0)
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=executor_stack),
      compiler_fn=native_compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def _num_clients(computation: tff.Computation, args: Sequence[Any]) -> int:
  """The length of the first client-placed (non-all-equal) argument, else 0."""
  parameter = computation.type_signature.parameter
  types = ([parameter] if len(args) == 1 else list(parameter)) if parameter is not None else []
  for value, value_type in zip(args, types):
    if (isinstance(value_type, tff.FederatedType) and value_type.placement is tff.CLIENTS
        and not value_type.all_equal):
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
        f'the optimal-sampling protocol\'s secure sums after a broadcast). Run it in one '
        f'process (no --workers / --local_workers). TFF said: {str(e)[:300]}') from e


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

  def __init__(self, addresses: Sequence[str], *, connect_timeout_s: float = 60.0,
               clients_per_call: int | None = None, _local: LocalWorkers | None = None):
    """Connects to running workers.

    Args:
      addresses: ``host:port`` of each worker.
      connect_timeout_s: How long to wait for each worker to answer.
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
    if clients_per_call is not None and (not isinstance(clients_per_call, int)
                                         or clients_per_call < 1):
      raise ValueError(f'clients_per_call must be a positive integer or None, got '
                       f'{clients_per_call!r}.')
    self.addresses = addresses
    self.clients_per_call = clients_per_call
    self._local = _local
    try:
      self._async_contexts = [_remote_context(a, connect_timeout_s) for a in addresses]
    except BaseException:
      self.close()
      raise
    self._contexts = {}  # Mergeable contexts by number of sub-rounds.

  @classmethod
  def start_local(cls, num_workers: int, *, connect_timeout_s: float = 60.0,
                  clients_per_call: int | None = None) -> 'WorkerPool':
    """Starts `num_workers` ``worker_binary`` processes here; `close` stops them."""
    local = LocalWorkers(num_workers)
    return cls(local.addresses, connect_timeout_s=connect_timeout_s,
               clients_per_call=clients_per_call, _local=local)

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
          self._async_contexts, num_subrounds=subrounds)
    with context_stack_impl.context_stack.install(self._contexts[subrounds]):
      return computation(*args)

  def close(self) -> None:
    """Stops the workers this pool started (none if it was given addresses)."""
    if self._local is not None:
      self._local.stop()

  def __enter__(self) -> 'WorkerPool':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
