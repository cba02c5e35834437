"""Tests for tff_sampling/workers.py: rounds split over several local TFF workers.

Oracle: the same round in one process. Splitting changes only the order in
which per-worker partial sums are added, so results agree to float32 rounding
(atol 1e-6 on weights of order 0.1); the selection and every count agree exactly.
"""

import csv
import os

import numpy as np
import psutil
import pytest
import tensorflow_federated as tff

from tff_sampling import program
from tff_sampling import samplers
from tff_sampling import workers
from tff_sampling.learning import fedavg
from tff_sampling.learning import optimal_sampling
from tff_sampling.learning import signals

_COHORT = 7  # Odd: the two workers get 4 and 3 clients.


@pytest.fixture(scope='module')
def pool():
  with workers.WorkerPool.start_local(2) as started:
    yield started


def _weights_close(a, b, atol=1e-6):
  for x, y in zip(a.trainable, b.trainable):
    np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def test_fedavg_round_split_over_two_workers_equals_one_process(small_digits_task, pool):
  task = small_digits_task
  process = fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  data = [task.client_dataset(c, 0) for c in range(_COHORT)]

  single = process.next(state, data)
  split = pool.run(process.next, state, data)

  _weights_close(process.get_model_weights(single.state), process.get_model_weights(split.state))
  moved = [np.max(np.abs(a - b)) for a, b in zip(
      process.get_model_weights(single.state).trainable, task.initial_model_weights(0).trainable)]
  assert max(moved) > 1e-3  # The round did train: the comparison is not of two no-ops.
  one, two = single.metrics['client_work']['train'], split.metrics['client_work']['train']
  assert one['num_examples'] == two['num_examples'] == sum(
      task.client_num_examples[c] for c in range(_COHORT))
  assert one['num_batches'] == two['num_batches']
  np.testing.assert_allclose(one['loss'], two['loss'], rtol=1e-5)


def test_signals_gathered_by_slot_do_not_depend_on_the_split(small_digits_task, pool):
  # Per-client sketches are scattered by cohort slot, so the partial aggregates
  # may be merged in any order.
  task = small_digits_task
  process = signals.build_fedavg_with_signals(task.model_fn, client_learning_rate=0.1,
                                              sketch_size=16, client_losses=True)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  clients = [5, 0, 12, 3, 19, 8, 1]
  data = signals.selection_client_data([task.client_dataset(c, 0) for c in clients],
                                       [float(task.client_num_examples[c]) for c in clients])

  single = process.next(state, data).metrics['client_work']['signals']
  split = pool.run(process.next, state, data).metrics['client_work']['signals']

  sketches = np.asarray(single['update_sketch'])
  assert sketches.shape == (len(clients), 16)
  # Rows differ between clients, so a permutation would show.
  assert np.min(np.linalg.norm(sketches[:, None] - sketches[None], axis=-1)
                + np.eye(len(clients))) > 1e-4
  np.testing.assert_allclose(np.asarray(split['update_sketch']), sketches, atol=1e-6)
  np.testing.assert_allclose(np.asarray(split['loss']), np.asarray(single['loss']), rtol=1e-5)


def test_round_in_slices_of_two_clients_on_one_worker_equals_one_process(small_digits_task):
  task = small_digits_task
  process = fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  data = [task.client_dataset(c, 0) for c in range(_COHORT)]
  with workers.WorkerPool.start_local(1, clients_per_call=2) as sliced:
    assert sliced.num_subrounds(_COHORT) == 4
    split = sliced.run(process.next, state, data)
  single = process.next(state, data)
  _weights_close(process.get_model_weights(single.state), process.get_model_weights(split.state))
  assert (split.metrics['client_work']['train']['num_examples']
          == single.metrics['client_work']['train']['num_examples'])


def _rows(output_dir):
  with open(os.path.join(output_dir, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop('round_seconds')
  return rows


def test_program_with_two_local_workers_equals_one_process(small_digits_task, tmp_path):
  task = small_digits_task
  process = fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1)

  def run(name, **worker_options):
    return program.run_experiment(
        task, process, samplers.UniformSampler(_COHORT, seed=3),
        program.ProgramConfig(output_dir=str(tmp_path / name), rounds=3, seed=3,
                              hparams={'task': 'digits'}, **worker_options))

  single = run('single')
  before = _live_workers()
  split = run('split', local_workers=2)
  assert _live_workers() <= before  # The run stopped the workers it started.

  _weights_close(single.model_weights, split.model_weights, atol=1e-5)
  assert split.cumulative_bits == single.cumulative_bits
  rows_single, rows_split = _rows(tmp_path / 'single'), _rows(tmp_path / 'split')
  assert [r.keys() for r in rows_single] == [r.keys() for r in rows_split]
  for a, b in zip(rows_single, rows_split):
    for column, value in a.items():
      if column.startswith(('train/', 'eval/')) and value:
        np.testing.assert_allclose(float(b[column]), float(value), rtol=1e-4, err_msg=column)
      else:  # Selection, counts, bits: exactly equal.
        assert b[column] == value, column
  with open(tmp_path / 'single' / 'selection_counts.csv') as f1, \
      open(tmp_path / 'split' / 'selection_counts.csv') as f2:
    assert f1.read() == f2.read()


def _live_workers() -> set[int]:
  return {p.pid for p in psutil.Process().children() if p.name() == 'worker_binary'
          and p.status() != psutil.STATUS_ZOMBIE}


def test_optimal_sampling_round_cannot_be_split_and_says_why(small_digits_task, tmp_path):
  task = small_digits_task
  process = optimal_sampling.build_fed_avg_with_optimal_sampling(
      task.model_fn, tff.learning.optimizers.build_sgdm(0.1),
      tff.learning.optimizers.build_sgdm(1.0), expected_clients=2.0, secure=False)
  with pytest.raises(ValueError, match='cannot run over several TFF workers.*one process'):
    workers.check_splittable(process.next, 'optimal sampling')
  # The program refuses before starting any worker or round.
  with pytest.raises(ValueError, match='cannot run over several TFF workers'):
    program.run_experiment(
        task, process, samplers.UniformSampler(_COHORT, seed=0),
        program.ProgramConfig(output_dir=str(tmp_path / 'os'), rounds=1, local_workers=2))
  assert not (tmp_path / 'os' / 'metrics.csv').exists()
  workers.check_splittable(fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1).next,
                           'fedavg')  # No error.


@pytest.mark.parametrize('address', ['localhost', 'localhost:0', 'host:99999', ':80', 'a b:1'])
def test_bad_worker_address_is_an_error_naming_it(address):
  with pytest.raises(ValueError, match='is not host:port'):
    workers.check_address(address)
  with pytest.raises(ValueError, match='is not host:port'):
    program.ProgramConfig(output_dir='/tmp/x', rounds=1, workers=(address,))


def test_config_rejects_both_kinds_of_workers_and_negative_counts():
  with pytest.raises(ValueError, match='not both'):
    program.ProgramConfig(output_dir='/tmp/x', rounds=1, workers=('localhost:8000',),
                          local_workers=2)
  with pytest.raises(ValueError, match='local_workers must be a non-negative integer, got -1'):
    program.ProgramConfig(output_dir='/tmp/x', rounds=1, local_workers=-1)
  with pytest.raises(ValueError, match='clients_per_call=50 needs workers'):
    program.ProgramConfig(output_dir='/tmp/x', rounds=1, clients_per_call=50)
  with pytest.raises(ValueError, match='clients_per_call must be a positive integer, got 0'):
    program.ProgramConfig(output_dir='/tmp/x', rounds=1, local_workers=1, clients_per_call=0)


def test_unreachable_worker_is_a_connection_error_saying_how_to_start_one():
  import portpicker
  address = f'localhost:{portpicker.pick_unused_port()}'  # Nothing listens there.
  with pytest.raises(ConnectionError, match=f'No TFF worker answered at {address}.*--port=PORT'):
    workers.WorkerPool([address], connect_timeout_s=0.5)


def test_local_workers_stop():
  local = workers.LocalWorkers(2)
  assert len(set(local.addresses)) == 2
  processes = [psutil.Process(pid) for pid in local.pids]
  assert all(p.is_running() for p in processes)
  local.stop()
  local.stop()  # Idempotent.
  assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_local_workers_die_with_a_killed_parent():
  import signal
  import subprocess
  import sys
  import time
  # A parent that starts a worker, reports its pid, and is then killed by SIGKILL:
  # no `stop`, no atexit hook.
  parent = subprocess.Popen(
      [sys.executable, '-c', 'import time; from tff_sampling import workers; '
       'w = workers.LocalWorkers(1); print(w.pids[0], flush=True); time.sleep(600)'],
      stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  worker = psutil.Process(int(parent.stdout.readline()))
  assert worker.is_running()
  parent.send_signal(signal.SIGKILL)
  parent.wait()
  deadline = time.monotonic() + 10
  try:
    while time.monotonic() < deadline and worker.is_running() and (
        worker.status() != psutil.STATUS_ZOMBIE):
      time.sleep(0.1)
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
  finally:
    if worker.is_running():
      worker.kill()  # Only if the test failed: leave no orphan behind.
