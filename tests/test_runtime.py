"""Tests for tff_sampling/runtime/tff_context.py.

Each process-level case runs a small program as a subprocess that reports the
pids of its own TFF workers; only those processes are checked afterwards
(`psutil.Process` objects remember their start time, so a reused pid never
passes for one of them), never other processes on the machine.
"""

import logging
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import psutil
import pytest
import tensorflow_federated as tff

from tff_sampling.runtime import context_worker
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _alive(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def _wait_gone(processes, bound_s: float = 30.0) -> list[psutil.Process]:
  """The processes still alive after at most `bound_s` (a bound against hangs only)."""
  deadline = time.monotonic() + bound_s
  alive = [p for p in processes if _alive(p)]
  while alive and time.monotonic() < deadline:
    time.sleep(0.05)
    alive = [p for p in alive if _alive(p)]
  for process in alive:  # Only if the test fails: leave no orphan behind.
    try:
      process.kill()
    except psutil.Error:
      pass
  return alive


_STARTED: list['_Program'] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
  """After each test, even a failed one: kills what its programs left running."""
  yield
  while _STARTED:
    program = _STARTED.pop()
    if program.process.poll() is None:
      program.process.kill()
    _wait_gone(program.workers, bound_s=0)


class _Program:
  """``python -c code`` that prints ``workers <pid> …`` once, then waits for a line on stdin.

  `workers` are the reported processes, captured while they run; `printed` is
  what it printed before.
  """

  def __init__(self, code: str):
    self.process = subprocess.Popen(
      [sys.executable, '-c', code],
      cwd=_REPO,
      text=True,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
    )
    self.workers = []
    self.printed = ''
    _STARTED.append(self)
    for line in self.process.stdout:
      self.printed += line
      if line.startswith('workers'):
        self.workers = [psutil.Process(int(pid)) for pid in line.split()[1:]]
        break
    else:
      self.process.wait()
      raise AssertionError(f'no worker report; stderr:\n{self.process.stderr.read()[-3000:]}')

  def finish(self) -> tuple[int, str, str]:
    out, err = self.process.communicate('go\n', timeout=300)
    return self.process.returncode, out, err


_REPORT_CHILD_WORKERS = (
  'import psutil, sys\n'
  'print("workers", *[c.pid for c in psutil.Process().children()\n'
  '                   if c.name() == "worker_binary"], flush=True)\n'
  'sys.stdin.readline()\n'
)


@pytest.mark.slow
def test_no_worker_outlives_a_program():
  # Library use without `use_secure_sum_simulation`: TFF's own default context
  # starts the worker; without the atexit hook it survives its parent.
  program = _Program(
    'import numpy as np, tensorflow_federated as tff, tff_sampling\n'
    'print(tff.tensorflow.computation(lambda: np.int32(7))(), flush=True)\n' + _REPORT_CHILD_WORKERS
  )
  assert len(program.workers) == 1
  code, _, err = program.finish()
  assert code == 0 and program.printed.startswith('7\n'), err[-2000:]
  assert _wait_gone(program.workers) == []


def test_the_default_worker_dies_with_a_killed_program():
  """`use_secure_sum_simulation`'s worker is started on first use from TFF's
  event-loop thread; the program is SIGKILLed (no atexit, no handler)."""
  program = _Program(
    'import numpy as np, tensorflow_federated as tff\n'
    'from tff_sampling.runtime import tff_context\n'
    'tff_context.use_secure_sum_simulation()\n'
    'tff.tensorflow.computation(lambda: np.int32(7))()\n' + _REPORT_CHILD_WORKERS
  )
  assert len(program.workers) == 1
  program.process.kill()
  program.process.wait(timeout=300)  # Not its pipes: a worker left running holds them.
  assert _wait_gone(program.workers) == []


def test_secure_sums_run_in_the_project_context_on_its_own_worker():
  tff_context.use_secure_sum_simulation()
  tff_context.use_secure_sum_simulation()  # Idempotent.

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def secure_total(values):
    return tff.federated_secure_sum_bitwidth(values, 8)

  assert secure_total([1, 2, 3, 100]) == 106
  worker = context_worker.CONTEXT_WORKER.pid
  assert worker is not None and worker in {c.pid for c in psutil.Process().children()}


class _FakeExecutor:
  def __init__(self, cardinalities):
    self.cardinalities = cardinalities
    self.closed = False

  def close(self):
    self.closed = True


def test_the_executor_factory_closes_the_executors_it_no_longer_keeps():
  factory = workers.ClosingExecutorFactory(_FakeExecutor, capacity=3)
  made = {n: factory.create_executor({tff.CLIENTS: n}) for n in (1, 2, 3)}
  assert factory.create_executor({tff.CLIENTS: 1}) is made[1]  # Kept, and now the most recent.
  made[4] = factory.create_executor({tff.CLIENTS: 4})  # Evicts 2, the least recently used.
  assert [n for n, e in made.items() if e.closed] == [2]
  made[5] = factory.create_executor({tff.CLIENTS: 5})  # Evicts 3.
  assert [n for n, e in made.items() if e.closed] == [2, 3]
  again = factory.create_executor({tff.CLIENTS: 2})  # A new one; evicts 1.
  assert again is not made[2] and not again.closed and made[1].closed
  factory.clean_up_executor({tff.CLIENTS: 4})
  assert made[4].closed and not made[5].closed
  factory.clean_up_executor({tff.CLIENTS: 99})  # Never made: nothing to do.
  with pytest.raises(ValueError, match='capacity=0'):
    workers.ClosingExecutorFactory(_FakeExecutor, capacity=0)


def test_computations_stay_right_across_more_cohort_sizes_than_executors_kept():
  tff_context.use_secure_sum_simulation()

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)

  sizes = list(range(1, 2 * workers.EXECUTORS_KEPT + 2)) * 2  # Each size again after eviction.
  assert [total(list(range(n))) for n in sizes] == [n * (n - 1) // 2 for n in sizes]


class _StaleExecutor(_FakeExecutor):
  """An executor on a worker that is gone: closing it fails, as on a closed gRPC channel."""

  def close(self):
    raise ValueError('Cannot invoke RPC on closed channel!')


def test_the_executor_factory_drops_the_executors_of_an_earlier_worker():
  generation = [1]

  def make(cardinalities):  # A new worker replaces the dead one while the 4th is made.
    if cardinalities[tff.CLIENTS] == 4:
      generation[0] = 2
    return _FakeExecutor(cardinalities)

  factory = workers.ClosingExecutorFactory(make, capacity=3, generation=lambda: generation[0])
  old = {n: factory.create_executor({tff.CLIENTS: n}) for n in (1, 2, 3)}  # Full.
  for executor in old.values():
    executor.__class__ = _StaleExecutor
  new = factory.create_executor({tff.CLIENTS: 4})  # Evicts nothing stale: they are dropped.
  assert factory.create_executor({tff.CLIENTS: 4}) is new  # Made in this generation: kept.
  assert factory.create_executor({tff.CLIENTS: 1}) is not old[1]
  factory.clean_up_executor({tff.CLIENTS: 2})  # Dropped before: nothing to close.
  generation[0] = 3  # The worker stopped.
  factory.clean_up_executor({tff.CLIENTS: 4})  # Stale: dropped, not closed.
  assert not new.closed


def _kill_context_worker(worker=None) -> int:
  """SIGKILLs the (given or default) context worker; returns its pid once it is gone."""
  worker = worker or context_worker.CONTEXT_WORKER
  pid = worker.pid
  assert pid is not None
  os.kill(pid, signal.SIGKILL)
  deadline = time.monotonic() + 30.0  # A bound against hangs only.
  while worker.pid is not None and time.monotonic() < deadline:
    time.sleep(0.01)
  assert worker.pid is None
  return pid


def test_computations_after_the_worker_died_run_on_a_new_one(caplog):
  tff_context.use_secure_sum_simulation()

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def total(values):
    return tff.federated_sum(values)

  sizes = range(1, workers.EXECUTORS_KEPT + 1)
  assert [total(list(range(n))) for n in sizes] == [n * (n - 1) // 2 for n in sizes]  # Full.
  dead = _kill_context_worker()
  with caplog.at_level(logging.WARNING):
    # A new size (its executor made on a new worker, the dead worker's ones dropped), then
    # the old sizes again, each with an executor of its own on the new worker.
    n = workers.EXECUTORS_KEPT + 1
    assert total(list(range(n))) == n * (n - 1) // 2
    assert [total(list(range(n))) for n in sizes] == [n * (n - 1) // 2 for n in sizes]
  assert context_worker.CONTEXT_WORKER.pid is not None
  assert caplog.text.count(f'The local TFF worker (pid {dead}) exited with status -9') == 1


def test_the_worker_is_not_started_again_after_dying_three_times_in_a_row(caplog):
  worker = context_worker.ContextWorker()
  try:
    worker.stub()
    for _ in range(2):
      _kill_context_worker(worker)
      worker.stub()  # Restarted, with a warning.
    worker.succeeded()  # A call returned: the count starts again.
    for _ in range(2):
      _kill_context_worker(worker)
      worker.stub()
    last = _kill_context_worker(worker)
    message = rf'\(pid {last}\) exited .*: 3 workers in a row died'
    with pytest.raises(RuntimeError, match=message):
      worker.stub()
    assert worker.pid is None
    assert caplog.text.count('starting a new one for the call in progress') == 4
    worker.succeeded()
    with pytest.raises(RuntimeError, match=message):  # For good.
      worker.stub()
    assert worker.pid is None
  finally:
    worker.stop(timeout_s=0)


# gRPC's connectivity thread, asked to connect by the reconnection, may poll the channel once
# more after the test closes it (within its 0.2 s cycle) and report that from its thread.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_a_running_worker_whose_channel_looks_idle_is_kept(caplog):
  worker = context_worker.ContextWorker()
  try:
    stub = worker.stub()
    pid = worker.pid
    stub._channel_status = grpc.ChannelConnectivity.IDLE  # As TFF's stub sees a quiet channel.
    with caplog.at_level(logging.WARNING):
      assert worker.stub() is stub and worker.pid == pid  # Reconnected, not replaced.
    assert 'stopped answering' not in caplog.text
  finally:
    worker.stop(timeout_s=0)


def test_a_worker_that_exits_while_starting_counts_as_a_death(monkeypatch, caplog):
  real = workers.start_worker_process
  exits = [3, 4]  # The first two workers exit at once with these statuses.

  def start(port, *flags, **kwargs):
    if exits:
      return subprocess.Popen([sys.executable, '-c', f'raise SystemExit({exits.pop(0)})'])
    return real(port, *flags, **kwargs)

  monkeypatch.setattr(context_worker.workers_lib, 'start_worker_process', start)
  worker = context_worker.ContextWorker()
  try:
    with caplog.at_level(logging.WARNING):
      worker.stub()  # The third start answers.
    assert worker.pid is not None
    assert 'exited with status 3; starting a new one' in caplog.text
    assert 'exited with status 4; starting a new one' in caplog.text
    worker.succeeded()  # A call returned.
    exits.extend([5, 6])
    _kill_context_worker(worker)  # A death, then two workers that exit at the start.
    with pytest.raises(RuntimeError, match='exited with status 6: 3 workers in a row died'):
      worker.stub()
    assert exits == []
  finally:
    worker.stop(timeout_s=0)


def test_quiet_library_logs_keeps_own_info_and_library_warnings():
  tff_context.quiet_library_logs()
  tff_context.quiet_library_logs()  # Idempotent.
  logger = logging.getLogger('absl')
  assert sum(isinstance(f, tff_context._OwnInfoOnly) for f in logger.filters) == 1

  def record(level, path):
    return logging.LogRecord('absl', level, path, 1, 'message', None, None)

  library = '/x/site-packages/tensorflow_federated/program/file.py'
  assert not logger.filter(record(logging.INFO, library))
  assert logger.filter(record(logging.WARNING, library))
  assert logger.filter(record(logging.INFO, '/work/tff_sampling/program/loop.py'))


@pytest.mark.slow
def test_a_worker_that_ignores_the_shutdown_does_not_hang_the_exit():
  """TFF's own shutdown waits for its worker with no time limit; after a long
  run a worker was seen ignoring SIGINT, hanging the exit forever. Simulated
  here by a release that blocks until the worker dies: the watchdog kills it."""
  code = (
    'import time, numpy as np, tensorflow_federated as tff\n'
    'from tff_sampling.runtime import tff_context\n'
    'tff.tensorflow.computation(lambda: np.int32(7))()\n'
    'workers = tff_context._tff_started_workers()\n'
    'tff_context._release_execution_context = lambda: [w.wait() for w in workers]\n'
    'start = time.monotonic()\n'
    'stopped = tff_context.stop_local_workers(timeout_s=2.0)\n'
    'print(len(workers), stopped, round(time.monotonic() - start),\n'
    '      any(w.is_running() for w in workers))\n'
  )
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=_REPO, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  workers, stopped, seconds, running = proc.stdout.split()[-4:]
  assert int(workers) == 1 and int(stopped) == int(workers)
  # It waited the 2 s it grants, then the watchdog killed the worker: the blocked release
  # returns only once the worker is dead, so returning at all (no clock bound) shows the kill.
  assert int(seconds) >= 2 and running == 'False'


def test_switching_to_the_project_context_cannot_hang_on_tff_s_worker():
  """Replacing TFF's context after it ran a computation stops its worker the
  same blocking way (seen hanging a LEFL run after its pre-processing round);
  simulated by a switch that blocks until that worker dies."""
  code = (
    'import time, numpy as np, tensorflow_federated as tff\n'
    'from tff_sampling.runtime import tff_context\n'
    'tff.tensorflow.computation(lambda: np.int32(7))()\n'
    'workers = tff_context._tff_started_workers()\n'
    'tff_context.context_stack_impl.context_stack.set_default_context = (\n'
    '    lambda context: [w.wait() for w in workers])\n'
    'tff_context._SHUTDOWN_TIMEOUT_S = 2.0\n'
    'start = time.monotonic()\n'
    'tff_context.use_secure_sum_simulation()\n'
    'print(len(workers), round(time.monotonic() - start),\n'
    '      any(w.is_running() for w in workers))\n'
  )
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=_REPO, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  workers, seconds, running = proc.stdout.split()[-3:]
  assert int(workers) == 1 and int(seconds) >= 2 and running == 'False'  # As above.


# A binary (`binary_main`) whose main thread is stuck in plain Python code that
# neither runs TFF nor returns, after starting its TFF worker: only the deadline
# exit can end it. `writing` makes it look like a file write to the deadline.
_STUCK_BINARY = """
import sys, threading, numpy as np, psutil, tensorflow_federated as tff
from absl import app
from tff_sampling.runtime import context_worker
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers
tff_context._EXIT_DEADLINE_S = 0.5
tff_context._WRITE_GRACE_S = {grace}

def {name}():
  threading.Event().wait()  # A lock wait: the handler runs and returns; no end.

def main(argv):
  tff.tensorflow.computation(lambda: np.int32(7))()
  print('workers', context_worker.CONTEXT_WORKER.pid, flush=True)
  {name}()

app.run(tff_context.binary_main(main))
"""


def test_a_binary_stuck_outside_tff_exits_by_the_deadline():
  # SIGINT here, SIGTERM below: the same path.
  program = _Program(_STUCK_BINARY.format(name='wait_forever', grace=30.0))
  program.process.send_signal(signal.SIGINT)
  code, _, err = program.finish()
  assert code == 130, err[-2000:]
  assert err.strip().splitlines()[-1] == tff_context.interruption_message(signal.SIGINT)
  assert 'Traceback' not in err
  assert _wait_gone(program.workers) == []


def test_the_deadline_exit_lets_a_write_in_progress_finish_for_a_while():
  # The stuck function is named like a writer: the exit waits the grace time
  # (2 s here) on top of the deadline (0.5 s); without it, it would exit at once.
  program = _Program(_STUCK_BINARY.format(name='write_metrics', grace=2.0))
  start = time.monotonic()
  program.process.send_signal(signal.SIGTERM)
  code, _, err = program.finish()
  seconds = time.monotonic() - start
  assert code == 143 and err.strip().splitlines()[-1].startswith('Interrupted by SIGTERM')
  assert seconds >= 2.5
  assert _wait_gone(program.workers) == []


# A binary whose first TFF call never ends (its executor never comes), and whose
# signal-watching thread is disabled: only the main thread's handler can end it,
# which it must do without waiting for that thread to record the signal.
_WAITING_BINARY = """
import sys, threading, time, numpy as np, tensorflow_federated as tff
from absl import app
from tff_sampling.runtime import context_worker
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers
tff_context._Interrupts._watch = lambda self, read_fd: None

def stub_never_ready():
  main = sys._current_frames()[threading.main_thread().ident]
  while not any(f.f_code.co_name == 'run_coro_and_return_result' for f in tff_context._stack(main)):
    time.sleep(0.01)
    main = sys._current_frames()[threading.main_thread().ident]
  print('workers', flush=True)  # The main thread now waits for this call.
  threading.Event().wait()

context_worker.CONTEXT_WORKER.stub = stub_never_ready

def main(argv):
  tff.tensorflow.computation(lambda: np.int32(7))()

app.run(tff_context.binary_main(main))
"""


def test_the_handler_alone_ends_a_binary_waiting_on_tff():
  program = _Program(_WAITING_BINARY)
  program.process.send_signal(signal.SIGTERM)
  code, _, err = program.finish()
  assert code == 143, err[-2000:]
  assert err.strip().splitlines()[-1] == tff_context.interruption_message(signal.SIGTERM)
  assert 'Traceback' not in err


def test_no_signal_handler_is_installed_on_import():
  # Compared with the handlers before the import: a program started as a
  # background job has SIGINT ignored from the start.
  code = (
    'import signal\n'
    'before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)\n'
    'import tff_sampling, tff_sampling.program, tff_sampling.runtime.tff_context\n'
    'print(signal.getsignal(signal.SIGINT) is before[0],\n'
    '      signal.getsignal(signal.SIGTERM) is before[1])\n'
  )
  proc = subprocess.run(
    [sys.executable, '-c', code], cwd=_REPO, capture_output=True, text=True, timeout=300
  )
  assert proc.stdout.split() == ['True', 'True'], proc.stderr[-2000:]


def test_tensorflow_noise_filter_drops_only_the_secure_sum_reports_and_checkpoint_info():

  noise = tff_context._TffNoiseFilter()

  def record(level, message):
    return logging.LogRecord('tensorflow', level, __file__, 1, message, None, None)

  unused_assert = (
    '==================================\nObject was never used (type <class '
    "'tensorflow.python.framework.ops.Operation'>):\n<tf.Operation "
    "'assert_less_equal/Assert/AssertGuard/Identity' type=Identity>"
  )
  assert not noise.filter(record(logging.ERROR, unused_assert))
  assert not noise.filter(record(logging.INFO, 'Assets written to: /r/checkpoints/x/assets'))
  # Everything else passes: other unused ops, warnings, the user's own errors.
  assert noise.filter(record(logging.ERROR, unused_assert.replace('assert_less_equal', 'my_op')))
  assert noise.filter(record(logging.WARNING, 'Assets written to: /somewhere'))
  assert noise.filter(record(logging.ERROR, 'Something the user must see'))
  tff_context.quiet_tensorflow_noise()
  tff_context.quiet_tensorflow_noise()
  assert logging.getLogger('tensorflow').filters.count(tff_context._NOISE_FILTER) == 1


def test_sync_run_works_with_and_without_a_running_event_loop():
  import asyncio

  from tff_sampling.runtime import sync

  async def answer():
    await asyncio.sleep(0)
    return 42

  assert sync.run(answer()) == 42

  async def inside_a_loop():  # As in a Jupyter kernel, where asyncio.run would refuse.
    return sync.run(answer())

  assert asyncio.run(inside_a_loop()) == 42
