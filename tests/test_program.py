"""Tests for tff_sampling/program/: the round loop, resumption, bad input."""

import asyncio
import json
import logging
import os
import signal
import time

import fault_harness
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.runtime import context_worker
from tff_sampling.runtime import results

_COHORT = 5


def _fedavg(task, client_lr=0.1):
  return tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_lr),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )


@pytest.fixture(scope='module')
def process(small_digits_task):
  return _fedavg(small_digits_task)


def _config(output_dir, rounds, **kwargs):
  kwargs.setdefault('hparams', {'seed': 0, 'task': 'digits', 'rounds': rounds})
  return program.RunConfig(output_dir=str(output_dir), rounds=rounds, seed=0, **kwargs)


_rows = fault_harness.metrics_rows


class _CrashingSampler(samplers.UniformSampler):
  """Simulates a process killed when round `crash_round` starts."""

  def __init__(self, *args, crash_round, **kwargs):
    super().__init__(*args, **kwargs)
    self.crash_round = crash_round

  def select(self, state, round_num, available):
    if round_num == self.crash_round:
      raise KeyboardInterrupt('killed')
    return super().select(state, round_num, available)


def test_kill_and_resume_equals_uninterrupted_run(small_digits_task, process, tmp_path):
  task = small_digits_task
  full = program.train_model(
    task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'full', 5, checkpoint_every=2),
  )
  # Killed at the start of round 4: round 3's metrics are already written, the
  # last checkpoint is round 2, so rounds 3-5 are (re)computed after the restart.
  with pytest.raises(KeyboardInterrupt):
    program.train_model(
      task,
      process,
      _CrashingSampler(_COHORT, seed=0, crash_round=4),
      _config(tmp_path / 'killed', 5, checkpoint_every=2),
    )
  assert [r['key'] for r in _rows(tmp_path / 'killed')] == ['0', '1', '2', '3']
  resumed = program.train_model(
    task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'killed', 5, checkpoint_every=2),
  )

  assert resumed.resumed_from == 2 and full.resumed_from is None
  assert _rows(tmp_path / 'killed') == _rows(tmp_path / 'full')  # Every cell, bit for bit.
  for a, b in zip(full.model_weights.trainable, resumed.model_weights.trainable):
    np.testing.assert_array_equal(a, b)
  assert resumed.cumulative_bits == full.cumulative_bits
  # The selection counts survive the restart too: 5 rounds of _COHORT clients.
  full_counts = results.load_run(tmp_path / 'full').selection_counts
  np.testing.assert_array_equal(results.load_run(tmp_path / 'killed').selection_counts, full_counts)
  assert full_counts.shape == (task.num_clients,) and full_counts.sum() == 5 * _COHORT


class _WorkerKillingSampler(samplers.UniformSampler):
  """Kills the local TFF worker (as a crash of its own would) when round `kill_round` starts."""

  def __init__(self, *args, kill_round, **kwargs):
    super().__init__(*args, **kwargs)
    self.kill_round, self.killed = kill_round, None

  def select(self, state, round_num, available):
    if round_num == self.kill_round:
      worker = context_worker.CONTEXT_WORKER
      self.killed = worker.pid
      os.kill(self.killed, signal.SIGKILL)
      deadline = time.monotonic() + 30.0  # A bound against hangs only.
      while worker.pid is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return super().select(state, round_num, available)


def test_a_run_whose_worker_dies_goes_on_as_if_it_had_not(small_digits_task, process, tmp_path):
  # Round 3's computation meets a dead worker and runs on a new one; so does the evaluation
  # after it, with another number of clients.
  killing = _WorkerKillingSampler(_COHORT, seed=0, kill_round=3)
  survived = program.train_model(
    small_digits_task, process, killing, _config(tmp_path / 'killed', 4, eval_every=1)
  )
  assert killing.killed is not None and context_worker.CONTEXT_WORKER.pid not in (
    None,
    killing.killed,
  )
  full = program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'full', 4, eval_every=1),
  )
  assert survived.resumed_from is None and survived.final_round == 4
  assert _rows(tmp_path / 'killed') == _rows(tmp_path / 'full')  # Every cell, bit for bit.
  for a, b in zip(full.model_weights.trainable, survived.model_weights.trainable):
    np.testing.assert_array_equal(a, b)


def test_extending_a_finished_run_continues_it(small_digits_task, process, tmp_path):
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'run', 2),
  )
  longer = program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'run', 3),
  )  # `rounds` may change on resume.
  assert longer.resumed_from == 2 and longer.final_round == 3
  assert [r['key'] for r in _rows(tmp_path / 'run')] == ['0', '1', '2', '3']


def test_metrics_bits_and_eval_cadence(small_digits_task, process, tmp_path):
  memory = tff.program.MemoryReleaseManager()
  result = program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'run', 5, eval_every=2),
    release_managers=[memory],
  )
  rows = _rows(tmp_path / 'run')
  # A release manager given to the loop gets every round, as metrics.csv does.
  released = memory.values()
  assert sorted(released) == [0, 1, 2, 3, 4, 5]
  assert int(released[5]['uplink']['cumulative_bits']) == result.cumulative_bits
  # Evaluated initially, every 2 rounds, and at the last round.
  assert [r['key'] for r in rows if r['eval/accuracy']] == ['0', '2', '4', '5']
  # digits MLP: 64·64 + 64 + 64·10 + 10 = 4,810 parameters; 5 uploads of 32 bits each.
  round_bits = 5 * 4810 * 32
  assert [int(r['uplink/round_bits']) for r in rows] == [0] + [round_bits] * 5
  assert int(rows[-1]['uplink/cumulative_bits']) == 5 * round_bits == result.cumulative_bits
  assert all(int(r['cohort_size']) == _COHORT for r in rows[1:])
  # The released train metrics are the process's own.
  assert rows[1]['train/loss'] == rows[1]['process/client_work/train/loss']
  # The returned evaluation is the last row's.
  assert float(rows[-1]['eval/accuracy']) == pytest.approx(result.eval_metrics['accuracy'])
  with open(tmp_path / 'run' / 'hparams.json') as f:
    assert json.load(f)['task'] == 'digits'
  assert os.listdir(tmp_path / 'run' / 'tensorboard')


def test_training_improves_the_model(small_digits_task, process, tmp_path):
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(10, seed=0),
    _config(tmp_path / 'run', 8, eval_every=8),
  )
  rows = _rows(tmp_path / 'run')
  assert float(rows[-1]['eval/loss']) < float(rows[0]['eval/loss']) - 0.05


def test_resume_with_other_configuration_is_an_error(small_digits_task, process, tmp_path):
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'run', 1),
  )
  other = {'seed': 0, 'task': 'digits', 'rounds': 1, 'client_learning_rate': 0.5}
  with pytest.raises(
    ValueError,
    match=r'different configuration \(client_learning_rate: '
    r'saved None vs now 0.5\)',
  ):
    program.train_model(
      small_digits_task,
      process,
      samplers.UniformSampler(_COHORT, seed=0),
      _config(tmp_path / 'run', 2, hparams=other),
    )


def test_unwritable_output_dir_is_an_error(small_digits_task, process, tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError, match=r"Output directory .*a_file/run' is not writable"):
    program.train_model(
      small_digits_task,
      process,
      samplers.UniformSampler(_COHORT, seed=0),
      _config(blocker / 'run', 1),
    )


@pytest.mark.parametrize(
  'field,value', [('rounds', 0), ('rounds', -2), ('eval_every', 0), ('checkpoint_every', 1.5)]
)
def test_config_rejects_bad_values(field, value, tmp_path):
  kwargs = dict(output_dir=str(tmp_path), rounds=3)
  kwargs[field] = value
  with pytest.raises(ValueError, match=f'{field} must be a positive integer, got {value}'):
    program.RunConfig(**kwargs)


def test_cohort_larger_than_population_is_an_error(small_digits_task, process, tmp_path):
  with pytest.raises(ValueError, match='clients_per_round=21 exceeds the population of 20'):
    program.train_model(
      small_digits_task, process, samplers.UniformSampler(21, seed=0), _config(tmp_path / 'run', 1)
    )


def test_non_finite_model_or_loss_or_aggregate_is_divergence():
  finite = tff.learning.models.ModelWeights(trainable=[np.ones(3, np.float32)], non_trainable=[])
  nan_model = tff.learning.models.ModelWeights(
    trainable=[np.ones(3, np.float32), np.array([1.0, np.nan], np.float32)], non_trainable=[]
  )
  with pytest.raises(
    FloatingPointError,
    match='diverged in round 7: the global model has non-finite weights.*learning rate',
  ):
    program.check_diverged(7, nan_model)
  with pytest.raises(FloatingPointError, match=r'round 3: eval/loss = inf'):
    program.check_diverged(3, finite, {'eval': {'loss': np.inf, 'accuracy': 0.1}})
  with pytest.raises(
    FloatingPointError, match=r'process/finalizer/update_non_finite = 1 \(the aggregated update'
  ):
    program.check_diverged(2, finite, {'process': {'finalizer': {'update_non_finite': 1}}})
  with pytest.raises(FloatingPointError, match='global model 1 has non-finite'):
    program.check_diverged(2, [finite, nan_model])
  program.check_diverged(
    7,
    finite,
    {
      'eval': {'loss': 2.3},
      'train': {'loss': 0.0},
      'process': {'finalizer': {'update_non_finite': 0}},
    },
  )


def test_divergent_training_stops_after_releasing_the_round(small_digits_task, tmp_path):
  # A client learning rate of 1e30 makes round 1's model finite but huge, so its
  # evaluation loss is NaN; the run stops there with that round's row released
  # and no checkpoint of the diverged state.
  process = _fedavg(small_digits_task, client_lr=1e30)
  with pytest.raises(FloatingPointError, match=r'diverged in round 1: eval/loss = nan'):
    program.train_model(
      small_digits_task,
      process,
      samplers.UniformSampler(_COHORT, seed=0),
      _config(tmp_path / 'run', 3),
    )
  assert [r['key'] for r in _rows(tmp_path / 'run')] == ['0', '1']
  assert not os.path.exists(tmp_path / 'run' / 'checkpoints' / 'program_state_1')


def test_progress_line(caplog):
  manager = program.ProgressReleaseManager(total_rounds=10)
  with caplog.at_level(logging.INFO, logger='absl'):
    asyncio.run(
      manager.release(
        {
          'round_seconds': 2.0,
          'train': {'loss': 0.5, 'accuracy': 0.75},
          'eval': {'loss': 0.25, 'accuracy': 0.875},
          'uplink': {'cumulative_bits': 1.5e9},
        },
        4,
      )
    )
  line = caplog.records[-1].getMessage()
  assert line == (
    'round  4/10 |   2.00s  ETA 0:00:12 | train loss 0.5000 acc 0.7500 | '
    'eval loss 0.2500 acc 0.8750 | uploaded 1.5e+09 bits'
  )


def test_client_shuffle_seed_depends_on_seed_round_and_client():
  seeds = {program.client_shuffle_seed(s, r, c) for s in (0, 1) for r in (1, 2) for c in (0, 5)}
  assert len(seeds) == 8
  assert program.client_shuffle_seed(0, 1, 5) == program.client_shuffle_seed(0, 1, 5)


def test_selection_metrics_hand_computed():
  sizes = np.array([3, 5, 2])  # p = (0.3, 0.5, 0.2).
  histograms = np.array([[3, 0, 0], [0, 5, 0], [1, 0, 1]])
  selection = samplers.Selection(clients=np.array([0, 2, 2]), weights=np.array([0.5, 0.25, 0.25]))
  metrics = program.selection_metrics(selection, sizes, histograms)
  assert metrics['distinct_clients'] == 2
  assert metrics['distinct_labels'] == 2  # Labels 0 and 2 (client 1's label 1 is absent).
  # ω = (0.5, 0, 0.5): (0.2² + 0.5² + 0.3²) = 0.38.
  assert metrics['weight_variance'] == pytest.approx(0.38)
  fedavg = program.selection_metrics(
    samplers.Selection(clients=np.array([0, 1])), sizes, histograms
  )
  # ω = (3/8, 5/8, 0) against p = (0.3, 0.5, 0.2).
  assert fedavg['weight_variance'] == pytest.approx(0.075**2 + 0.125**2 + 0.2**2)
  # Labels: population (4, 5, 1)/10; clients {0, 2} pool (4, 0, 1)/5, so
  # KL = 0.8 ln(0.8/0.4) + 0.2 ln(0.2/0.1) = ln 2 (client 2 counted once).
  assert metrics['label_kl'] == pytest.approx(np.log(2.0))
  # Clients {0, 1}: (3, 5, 0)/8 against (0.4, 0.5, 0.1).
  assert fedavg['label_kl'] == pytest.approx(
    3 / 8 * np.log(3 / 8 / 0.4) + 5 / 8 * np.log(5 / 8 / 0.5)
  )
  everyone = samplers.Selection(clients=np.array([0, 1, 2]))
  assert program.selection_metrics(everyone, sizes, histograms)['label_kl'] == pytest.approx(0)
  # A deadline that drops every selected client leaves an empty cohort: nobody's weight,
  # no labels, and no label distribution to compare (left out, not an error).
  nobody = samplers.Selection(clients=np.array([], np.int64), weights=np.array([], np.float32))
  empty = program.selection_metrics(nobody, sizes, histograms)
  assert dict(empty) == pytest.approx(
    dict(distinct_clients=0, distinct_labels=0, weight_variance=0.3**2 + 0.5**2 + 0.2**2)
  )


def test_md_weight_variance_matches_its_expectation():
  # E Σ(ω − p)² = Σ p(1 − p)/m for MD sampling; 4,000 rounds, 5 standard errors.
  sizes = np.array([1, 2, 3, 4, 10])
  p = sizes / sizes.sum()
  sampler = samplers.MDSampler(4, seed=0)
  state = sampler.initialize(samplers.Population(sizes))
  values = [
    program.selection_metrics(sampler.select(state, r, np.ones(5, bool)), sizes, np.eye(5))[
      'weight_variance'
    ]
    for r in range(4000)
  ]
  expected = np.sum(p * (1 - p)) / 4
  assert abs(np.mean(values) - expected) <= 5 * np.std(values) / np.sqrt(len(values))


def test_client_steps_give_every_client_the_same_number_of_batches(small_digits_task, tmp_path):
  task = small_digits_task
  sizes = task.client_num_examples
  small, large = int(np.argmin(sizes)), int(np.argmax(sizes))
  for client in (small, large):
    assert sum(1 for _ in task.client_dataset(client, seed=1, steps=7)) == 7
  # Without steps a small client has fewer batches than a large one.
  batches = [sum(1 for _ in task.client_dataset(c, seed=1)) for c in (small, large)]
  assert batches[0] < batches[1]
  with pytest.raises(ValueError, match='steps must be a positive integer or None, got 0'):
    task.client_dataset(small, seed=1, steps=0)
  with pytest.raises(ValueError, match='client_steps must be a positive integer, got 0'):
    program.RunConfig(output_dir=str(tmp_path), rounds=1, client_steps=0)


def test_preprocessing_bits_start_the_cumulative_upload(small_digits_task, process, tmp_path):
  cost = communication.PreprocessingBits(upload_bits=1000, download_bits=500)
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'run', 2),
    preprocessing_bits=cost,
  )
  run = results.load_run(tmp_path / 'run')
  assert run.metrics['uplink/round_bits'][0] == 1000
  assert run.metrics['downlink/preprocessing_bits'][0] == 500
  per_round = run.metrics['uplink/round_bits'][1:]
  np.testing.assert_array_equal(
    run.metrics['uplink/cumulative_bits'], 1000 + np.concatenate([[0], np.cumsum(per_round)])
  )


def test_model_weights_read_from_the_state_equal_the_process_computation(small_digits_task):
  from tff_sampling import learning
  from tff_sampling.learning import signals as signals_lib

  task = small_digits_task
  sgd = tff.learning.optimizers.build_sgdm
  processes = {
    'tff_fedavg': _fedavg(task),
    'fedavg': learning.build_fed_avg(task.model_fn, client_learning_rate=0.1),
    'signals': signals_lib.build_fed_avg_with_signals(
      task.model_fn, client_learning_rate=0.1, sketch_size=None
    ),
    'optimal': learning.build_fed_avg_with_optimal_sampling(
      task.model_fn, sgd(0.1), sgd(1.0), expected_clients=2.0, secure=False
    ),
    'dsgd': learning.build_dsgd_with_optimal_sampling(
      task.model_fn, sgd(1.0), expected_clients=2.0, secure=False
    ),
  }
  for name, process in processes.items():
    state = process.set_model_weights(process.initialize(), task.initial_model_weights(1))
    datasets = [task.client_dataset(c, 0) for c in range(3)]
    if name == 'signals':
      datasets = signals_lib.selection_client_data(datasets, [1.0] * 3)
    state = process.next(state, datasets).state  # A trained state, not the initial one.
    fast, slow = program.model_weights_of(process, state), process.get_model_weights(state)
    assert isinstance(fast, tff.learning.models.ModelWeights), name
    for a, b in zip(fast.trainable + fast.non_trainable, slow.trainable + slow.non_trainable):
      np.testing.assert_array_equal(a, b, err_msg=name)
    assert not np.array_equal(fast.trainable[0], task.initial_model_weights(1).trainable[0])


def test_model_weights_of_falls_back_to_the_computation():
  class _Process:
    def get_model_weights(self, state):
      return ('computed', state)

  assert program.model_weights_of(_Process(), {'weights': 1}) == ('computed', {'weights': 1})


def test_client_learning_rate_decay_sets_each_rounds_rate_through_tff_hparams(
  small_digits_task, process, tmp_path
):
  # FedGS's schedule: round t trains at 0.1 · 0.5^(t−1), set with the process's own
  # set_hparams; the rate is released each round and a resumed run continues the schedule.
  decaying = _config(tmp_path / 'decay', 3, client_learning_rate_decay=0.5, checkpoint_every=1)
  result = program.train_model(
    small_digits_task, process, samplers.UniformSampler(_COHORT, seed=0), decaying
  )
  run = results.load_run(tmp_path / 'decay')
  np.testing.assert_allclose(run.column('client_learning_rate')[1:], [0.1, 0.05, 0.025])
  # Equal to setting the rate by hand before each round (same cohorts and data).
  manual = process.set_model_weights(
    process.initialize(), small_digits_task.initial_model_weights(0)
  )
  sampler = samplers.UniformSampler(_COHORT, seed=0)
  sampler_state = sampler.initialize(samplers.Population(small_digits_task.client_num_examples))
  for round_num, rate in zip((1, 2, 3), (0.1, 0.05, 0.025)):
    hparams = process.get_hparams(manual)
    hparams['client_work']['learning_rate'] = np.float32(rate)
    manual = process.set_hparams(manual, hparams)
    clients = sampler.select(sampler_state, round_num, np.ones(20, bool)).clients
    data = [
      small_digits_task.client_dataset(int(c), program.client_shuffle_seed(0, round_num, int(c)))
      for c in clients
    ]
    manual = process.next(manual, data).state
  for a, b in zip(result.model_weights.trainable, process.get_model_weights(manual).trainable):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # A constant rate (no decay) gives a different model: the schedule did act.
  constant = program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'constant', 3),
  )
  assert not np.allclose(constant.model_weights.trainable[0], result.model_weights.trainable[0])
  # Resumed after round 2, round 3 is trained at 0.025 again (η₀ from a fresh state).
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'resumed', 2, client_learning_rate_decay=0.5),
  )
  program.train_model(
    small_digits_task,
    process,
    samplers.UniformSampler(_COHORT, seed=0),
    _config(tmp_path / 'resumed', 3, client_learning_rate_decay=0.5),
  )
  assert _rows(tmp_path / 'resumed') == _rows(tmp_path / 'decay')


@pytest.mark.parametrize('decay', [0, 1.5, -0.5, True])
def test_client_learning_rate_decay_must_be_in_0_1(decay, tmp_path):
  with pytest.raises(ValueError, match='client_learning_rate_decay must be in'):
    program.RunConfig(output_dir=str(tmp_path), rounds=3, client_learning_rate_decay=decay)
