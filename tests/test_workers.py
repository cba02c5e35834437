"""Tests for tff_sampling/runtime/workers.py: rounds split over several local TFF workers.

Oracle: the same round in one process. Splitting changes only the order in
which per-worker partial sums are added, so results agree to float32 rounding
(atol 1e-6 on weights of order 0.1); the selection and every count agree exactly.

Why a tolerance and not equality for values the workers compute: float32
addition is not associative, and each worker's partial sum is merged in the
order the workers finish. One reordering changes a sum by a few units in the
last place (2**-24 ~ 6e-8 relative each); three rounds of training carry such
differences into the next rounds' weights and losses, still far below 1e-5
relative (e.g. a loss of 1.637068510055542 against 1.6370683908462524:
7e-8). A wrong merge (a client lost or counted twice out of 7, or a
mis-weighted slice) moves them by 1e-2 or more, so rtol=1e-4 tells the two
apart with a wide margin on both sides.
"""

import csv
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import tensorflow_federated as tff

from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import fedavg
from tff_sampling.learning import optimal_sampling
from tff_sampling.learning import signals
from tff_sampling.runtime import workers

_COHORT = 7  # Odd: the two workers get 4 and 3 clients.
_RTOL = 1e-4  # Float32 summation order (module docstring).
# metrics.csv columns computed by the workers (partial sums merged in any order).
_MERGED_COLUMNS = ('train/', 'eval/', 'process/')


@pytest.fixture(scope='module')
def pool():
  with workers.WorkerPool.start_local(2) as started:
    yield started


def _weights_close(a, b, atol=1e-6):
  for x, y in zip(a.trainable, b.trainable):
    np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def test_fedavg_round_split_over_two_workers_equals_one_process(small_digits_task, pool):
  task = small_digits_task
  process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  data = [task.client_dataset(c, 0) for c in range(_COHORT)]

  single = process.next(state, data)
  split = pool.run(process.next, state, data)

  _weights_close(process.get_model_weights(single.state), process.get_model_weights(split.state))
  moved = [
    np.max(np.abs(a - b))
    for a, b in zip(
      process.get_model_weights(single.state).trainable, task.initial_model_weights(0).trainable
    )
  ]
  assert max(moved) > 1e-3  # The round did train: the comparison is not of two no-ops.
  one, two = single.metrics['client_work']['train'], split.metrics['client_work']['train']
  assert (
    one['num_examples']
    == two['num_examples']
    == sum(task.client_num_examples[c] for c in range(_COHORT))
  )
  assert one['num_batches'] == two['num_batches']
  np.testing.assert_allclose(one['loss'], two['loss'], rtol=_RTOL)


def test_signals_gathered_by_slot_do_not_depend_on_the_split(small_digits_task, pool):
  # Per-client sketches are scattered by cohort slot, so the partial aggregates
  # may be merged in any order.
  task = small_digits_task
  process = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=16, client_losses=True
  )
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  clients = [5, 0, 12, 3, 19, 8, 1]
  data = signals.selection_client_data(
    [task.client_dataset(c, 0) for c in clients],
    [float(task.client_num_examples[c]) for c in clients],
  )

  single = process.next(state, data).metrics['client_work']['signals']
  split = pool.run(process.next, state, data).metrics['client_work']['signals']

  sketches = np.asarray(single['update_sketch'])
  assert sketches.shape == (len(clients), 16)
  # Rows differ between clients, so a permutation would show.
  assert (
    np.min(np.linalg.norm(sketches[:, None] - sketches[None], axis=-1) + np.eye(len(clients)))
    > 1e-4
  )
  np.testing.assert_allclose(np.asarray(split['update_sketch']), sketches, atol=1e-6)
  np.testing.assert_allclose(np.asarray(split['loss']), np.asarray(single['loss']), rtol=_RTOL)


def test_round_in_slices_of_two_clients_on_one_worker_equals_one_process(small_digits_task):
  task = small_digits_task
  process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  data = [task.client_dataset(c, 0) for c in range(_COHORT)]
  with workers.WorkerPool.start_local(1, clients_per_call=2) as sliced:
    assert sliced.num_subrounds(_COHORT) == 4
    split = sliced.run(process.next, state, data)
  single = process.next(state, data)
  _weights_close(process.get_model_weights(single.state), process.get_model_weights(split.state))
  assert (
    split.metrics['client_work']['train']['num_examples']
    == single.metrics['client_work']['train']['num_examples']
  )


def _rows(output_dir):
  with open(os.path.join(output_dir, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop('round_seconds')
  return rows


def test_program_with_two_local_workers_equals_one_process(small_digits_task, tmp_path):
  task = small_digits_task
  process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1)

  def run(name, **worker_options):
    return program.train_model(
      task,
      process,
      samplers.UniformSampler(_COHORT, seed=3),
      program.RunConfig(
        output_dir=str(tmp_path / name),
        rounds=3,
        seed=3,
        hparams={'task': 'digits'},
        **worker_options,
      ),
    )

  single = run('single')
  before = _live_workers()
  split = run('split', local_workers=2)
  assert _live_workers() <= before  # The run stopped the workers it started.

  _weights_close(single.model_weights, split.model_weights, atol=1e-5)
  assert split.cumulative_bits == single.cumulative_bits
  rows_single, rows_split = _rows(tmp_path / 'single'), _rows(tmp_path / 'split')
  assert [r.keys() for r in rows_single] == [r.keys() for r in rows_split]
  compared = 0
  for a, b in zip(rows_single, rows_split):
    for column, value in a.items():
      if column.startswith(_MERGED_COLUMNS) and value and not _is_integer(value):
        np.testing.assert_allclose(float(b[column]), float(value), rtol=_RTOL, err_msg=column)
        compared += 1
      else:  # Selection, counts, bits: exactly equal.
        assert b[column] == value, column
  assert compared >= 3 * 4  # Losses and accuracies of every round were compared.
  with (
    open(tmp_path / 'single' / 'selection_counts.csv') as f1,
    open(tmp_path / 'split' / 'selection_counts.csv') as f2,
  ):
    assert f1.read() == f2.read()


def _is_integer(text: str) -> bool:
  try:
    int(text)
  except ValueError:
    return False
  return True


def _live_workers() -> set[int]:
  """Pids of this process's running worker_binary children."""
  pids = set()
  for child in psutil.Process().children():
    try:
      if child.name() == 'worker_binary' and child.status() != psutil.STATUS_ZOMBIE:
        pids.add(child.pid)
    except psutil.NoSuchProcess:
      continue
  return pids


def test_optimal_sampling_round_cannot_be_split_and_says_why(small_digits_task, tmp_path):
  task = small_digits_task
  process = optimal_sampling.build_fed_avg_with_optimal_sampling(
    task.model_fn,
    tff.learning.optimizers.build_sgdm(0.1),
    tff.learning.optimizers.build_sgdm(1.0),
    expected_clients=2.0,
    secure=False,
  )
  with pytest.raises(ValueError, match='cannot run over several TFF workers.*one process'):
    workers.check_splittable(process.next, 'optimal sampling')
  # The program refuses before starting any worker or round.
  with pytest.raises(ValueError, match='cannot run over several TFF workers'):
    program.train_model(
      task,
      process,
      samplers.UniformSampler(_COHORT, seed=0),
      program.RunConfig(output_dir=str(tmp_path / 'os'), rounds=1, local_workers=2),
    )
  assert not (tmp_path / 'os' / 'metrics.csv').exists()
  workers.check_splittable(
    fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1).next, 'fedavg'
  )  # No error.


@pytest.mark.parametrize('address', ['localhost', 'localhost:0', 'host:99999', ':80', 'a b:1'])
def test_bad_worker_address_is_an_error_naming_it(address):
  with pytest.raises(ValueError, match='is not host:port'):
    workers.check_address(address)
  with pytest.raises(ValueError, match='is not host:port'):
    program.RunConfig(output_dir='/tmp/x', rounds=1, workers=(address,))


def test_config_rejects_both_kinds_of_workers_and_negative_counts():
  with pytest.raises(ValueError, match='not both'):
    program.RunConfig(output_dir='/tmp/x', rounds=1, workers=('localhost:8000',), local_workers=2)
  with pytest.raises(ValueError, match='local_workers must be a non-negative integer, got -1'):
    program.RunConfig(output_dir='/tmp/x', rounds=1, local_workers=-1)
  with pytest.raises(ValueError, match='clients_per_call=50 needs workers'):
    program.RunConfig(output_dir='/tmp/x', rounds=1, clients_per_call=50)
  with pytest.raises(ValueError, match='clients_per_call must be a positive integer, got 0'):
    program.RunConfig(output_dir='/tmp/x', rounds=1, local_workers=1, clients_per_call=0)


def test_unreachable_worker_is_a_value_error_naming_it_and_how_to_start_one(tmp_path):
  import portpicker

  port = portpicker.pick_unused_port()  # Nothing listens there.
  address = f'127.0.0.1:{port}'
  expected = (
    rf'^No TFF worker reachable at {re.escape(address)} \(Connection refused\)\. '
    rf'Start one there with `\S*worker_binary --port={port}`'
  )
  with pytest.raises(ValueError, match=expected) as raised:
    workers.WorkerPool([address])
  assert '\n' not in str(raised.value)
  config = program.RunConfig(output_dir=str(tmp_path / 'run'), rounds=1, workers=(address,))
  with pytest.raises(ValueError, match=expected):
    config.worker_pool()


def test_a_port_without_a_tff_worker_is_a_value_error_after_the_connect_timeout():
  with socket.create_server(('127.0.0.1', 0)) as server:  # Accepts, never speaks gRPC.
    address = f'127.0.0.1:{server.getsockname()[1]}'
    with pytest.raises(ValueError, match=f'No TFF worker answered at {address} within 0.5 s'):
      workers.WorkerPool([address], connect_timeout_s=0.5)


def test_a_closed_pool_or_an_exited_worker_fails_the_call_instead_of_retrying(small_digits_task):
  # TFF retries a call whose worker went away (gRPC UNAVAILABLE) without end;
  # the pool's executor factory ends that with WorkersStopped.
  process = fedavg.build_fed_avg(small_digits_task.model_fn, client_learning_rate=0.1)
  state = process.initialize()
  data = [small_digits_task.client_dataset(c, 0) for c in range(2)]
  pool = workers.WorkerPool.start_local(1)
  pool._local._processes[0].kill()  # pylint: disable=protected-access
  pool._local._processes[0].wait()  # pylint: disable=protected-access
  with pytest.raises(workers.WorkersStopped, match='exited'):
    pool.run(process.next, state, data)
  pool.close()
  with pytest.raises(workers.WorkersStopped, match='was closed'):
    pool.run(process.next, state, data)


def test_local_workers_stop():
  local = workers.LocalWorkers(2)
  assert len(set(local.addresses)) == 2
  processes = [psutil.Process(pid) for pid in local.pids]
  assert all(p.is_running() for p in processes)
  local.stop()
  local.stop()  # Idempotent.
  assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_local_workers_stopped_while_a_worker_starts_stop_it_too(monkeypatch):
  # `shut_down` from the signal thread (tff_context) may stop the workers between a worker's
  # start and its being recorded; that worker must not be left running.
  before = set(workers._LIVE_LOCAL_WORKERS)
  started = []

  def start_then_stop(port, *args, **kwargs):
    started.append(real_start(port, *args, **kwargs))
    for local in set(workers._LIVE_LOCAL_WORKERS) - before:  # The one being built.
      local.stop(timeout_s=0)
    return started[-1]

  real_start = workers.start_worker_process
  monkeypatch.setattr(workers, 'start_worker_process', start_then_stop)
  with pytest.raises(workers.WorkersStopped, match='stopped while they were starting'):
    workers.LocalWorkers(2)
  assert len(started) == 1  # The second worker was not started.
  assert started[0].poll() is not None


def test_a_local_worker_runs_in_a_session_of_its_own():
  # A terminal's Ctrl-C signals its foreground process group: the program's, not the
  # worker's, so the program's handler stops the worker (tests/test_faults_signals.py).
  local = workers.LocalWorkers(1)
  try:
    (pid,) = local.pids
    assert os.getsid(pid) == pid
    assert os.getpgid(pid) != os.getpgid(0)
  finally:
    local.stop()


def test_a_worker_runs_one_client_per_core_at_once(monkeypatch):
  # TFF's default (-1) runs every client of a call at once, on threads over the same cores.
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 3, 5})  # 3 cores allowed.
  assert workers.concurrent_calls() == 3
  local = workers.LocalWorkers(1)
  try:
    (pid,) = local.pids
    assert '--max_concurrent_computation_calls=3' in psutil.Process(pid).cmdline()
  finally:
    local.stop()


def test_local_workers_die_with_a_killed_parent():
  # A parent that starts a worker from a thread that then ends (as TFF's
  # event-loop threads do), shows that the worker still serves it, reports the
  # worker's pid and is then killed by SIGKILL: no `stop`, no atexit hook.
  parent = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import threading, time, numpy as np, tensorflow_federated as tff\n'
      'from tff_sampling.runtime import workers\n'
      'started = []\n'
      'start = lambda: started.append(workers.WorkerPool.start_local(1))\n'
      'thread = threading.Thread(target=start)\n'
      'thread.start(); thread.join()\n'
      'pool = started[0]\n'
      'print(pool.run(tff.tensorflow.computation(lambda: np.int32(7))),\n'
      '      pool._local.pids[0], flush=True)\n'
      'time.sleep(600)\n',
    ],
    stdout=subprocess.PIPE,
    text=True,
    cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  try:
    # Bounded: a worker killed with its starting thread leaves TFF retrying forever.
    ready, _, _ = select.select([parent.stdout], [], [], 300)
    assert ready, 'the parent never ran its computation on the worker'
    result, pid = parent.stdout.readline().split()
    assert result == '7'
    worker = psutil.Process(int(pid))
    assert worker.is_running()
  finally:
    parent.send_signal(signal.SIGKILL)
    parent.wait()
  deadline = time.monotonic() + 30  # Bounds a failure only; the kernel acts at once.
  try:
    while (
      time.monotonic() < deadline
      and worker.is_running()
      and (worker.status() != psutil.STATUS_ZOMBIE)
    ):
      time.sleep(0.05)
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
  finally:
    if worker.is_running():
      worker.kill()  # Only if the test failed: leave no orphan behind.
