"""The round loop under a system model (`tff_sampling.devices.SystemModel`): over-commitment,
drop-outs and a deadline keep the right clients, the simulated seconds are the hand-computed
ones, and a resumed run repeats them."""

import csv
import dataclasses
import os

import numpy as np
import pytest

from tff_sampling import devices
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.runtime import results

MODEL_BITS = 2e6
SELECTED, TARGET, DROPOUT = 8, 5, 0.2


class _Recording(samplers.UniformSampler):
  """Uniform selection of `SELECTED` clients that records each round's choice."""

  def __init__(self):
    super().__init__(SELECTED, seed=3)
    self.chosen, self.seconds, self.missed = {}, [], []

  def select(self, state, round_num, available, **kwargs):
    selection = super().select(state, round_num, available, **kwargs)
    self.chosen[round_num] = np.array(selection.clients)
    return selection

  def observe(self, state, selection, signals):
    self.seconds.append(np.asarray(signals['seconds']))
    self.missed.append(selection.missed)
    return super().observe(state, selection, signals)


def _system(task):
  n = task.num_clients
  return devices.SystemModel(
    profiles=devices.LogNormalDevices().draw(n, seed=0),
    examples_trained=np.asarray(task.client_num_examples, np.float64),
    model_bits=MODEL_BITS,
    target=TARGET,
    dropout=DROPOUT,
  )


@pytest.fixture(scope='module')
def process(small_digits_task):
  return learning.build_fed_avg(small_digits_task.model_fn, client_learning_rate=0.1)


def _by_hand(system, clients, upload=True):
  """Download + examples × seconds per example (+ upload), per selected client."""
  profiles = system.profiles
  seconds = (
    MODEL_BITS / profiles.download_bits_per_second[clients]
    + system.examples_trained[clients] * profiles.seconds_per_example[clients]
  )
  return seconds + (MODEL_BITS / profiles.upload_bits_per_second[clients] if upload else 0.0)


def _at(indices, size=SELECTED):
  """A ``bool[size]`` mask, True at `indices`."""
  mask = np.zeros(size, bool)
  mask[indices] = True
  return mask


def _run(task, process, path, rounds, system, sampler=None):
  sampler = sampler or _Recording()
  config = program.RunConfig(
    output_dir=str(path), rounds=rounds, seed=0, hparams={'seed': 0}, checkpoint_every=2
  )
  program.train_model(task, process, sampler, config, devices=system)
  with open(os.path.join(path, 'metrics.csv')) as f:
    rows = [r for r in csv.DictReader(f) if r['key'] != '0']
  return sampler, rows


def test_each_round_keeps_the_first_finishers_and_lasts_until_the_last_kept(
  small_digits_task, process, tmp_path
):
  system = _system(small_digits_task)
  sampler, rows = _run(small_digits_task, process, tmp_path / 'run', 4, system)
  elapsed, counts = 0.0, np.zeros(small_digits_task.num_clients)
  for row in rows:
    round_num = int(row['key'])
    clients = sampler.chosen[round_num]
    finish = _by_hand(system, clients)
    dropped = devices.dropped_out(0, round_num, clients, DROPOUT)
    arriving = np.sort(finish[~dropped])
    kept = arriving[:TARGET]
    expected = kept[-1] if kept.size else 0.0
    assert float(row['system/round_seconds']) == pytest.approx(expected, rel=1e-6), round_num
    elapsed += expected
    assert float(row['system/cumulative_seconds']) == pytest.approx(elapsed, rel=1e-6)
    assert int(row['system/selected']) == SELECTED
    assert int(row['system/dropped']) == SELECTED - kept.size == SELECTED - int(row['cohort_size'])
    counts[clients[~dropped][np.argsort(finish[~dropped], kind='stable')][:TARGET]] += 1
    # The sampler observes each kept client's seconds (Oort reads them), and the others
    # as missed: late ones with when they would have finished, drop-outs never.
    np.testing.assert_allclose(np.sort(sampler.seconds[round_num - 1]), kept, rtol=1e-12)
    missed = sampler.missed[round_num - 1]
    order = np.argsort(finish[~dropped], kind='stable')
    late = np.flatnonzero(~dropped)[order][TARGET:]
    np.testing.assert_array_equal(np.sort(missed.clients), np.sort(clients[dropped | _at(late)]))
    assert np.isinf(missed.seconds).sum() == dropped.sum()
    np.testing.assert_allclose(
      np.sort(missed.seconds[np.isfinite(missed.seconds)]), np.sort(finish[late]), rtol=1e-12
    )
  # Only the kept clients trained: the run's selection counts are theirs.
  np.testing.assert_array_equal(results.load_run(str(tmp_path / 'run')).selection_counts, counts)
  assert sum(int(r['system/dropped']) for r in rows) >= 4 * (SELECTED - TARGET)  # Over-commitment.


def test_a_deadline_no_client_meets_trains_nobody_and_the_run_goes_on(
  small_digits_task, process, tmp_path
):
  # 1 ms: shorter than any client's download. Every round waits out the deadline, keeps no
  # one and changes nothing; the sampler still observes it (Oort's and TiFL's state move on).
  system = dataclasses.replace(_system(small_digits_task), deadline_seconds=1e-3)
  sampler, rows = _run(small_digits_task, process, tmp_path / 'run', 3, system)
  assert [int(r['key']) for r in rows] == [1, 2, 3]
  for row in rows:
    assert int(row['system/selected']) == int(row['system/dropped']) == SELECTED
    assert float(row['system/round_seconds']) == pytest.approx(1e-3)
    assert int(row['cohort_size']) == int(row['selection/distinct_clients']) == 0
    assert int(row['uplink/round_bits']) == 0
  assert [s.size for s in sampler.seconds] == [0, 0, 0]
  assert [m.clients.size for m in sampler.missed] == [SELECTED] * 3
  run = results.load_run(str(tmp_path / 'run'))
  np.testing.assert_array_equal(run.selection_counts, 0)
  accuracy = run.column('eval/accuracy')
  assert np.all(accuracy == accuracy[0])  # The initial model, evaluated each round.


def test_a_resumed_run_repeats_the_simulated_time(small_digits_task, process, tmp_path):
  system = _system(small_digits_task)
  _, full = _run(small_digits_task, process, tmp_path / 'full', 4, system)
  _run(small_digits_task, process, tmp_path / 'part', 2, system)
  _, resumed = _run(small_digits_task, process, tmp_path / 'part', 4, system)
  columns = [c for c in full[0] if c.startswith('system/') or c.startswith('eval/')]
  assert [[r[c] for c in columns] for r in resumed] == [[r[c] for c in columns] for r in full]


def test_a_system_model_for_another_population_is_refused_before_writing(
  small_digits_task, process, tmp_path
):
  system = _system(small_digits_task)
  other = devices.SystemModel(
    profiles=devices.LogNormalDevices().draw(3, seed=0),
    examples_trained=np.ones(3),
    model_bits=MODEL_BITS,
  )
  with pytest.raises(ValueError, match='3 devices for a population of 20 clients'):
    _run(small_digits_task, process, tmp_path / 'bad', 2, other)
  assert not (tmp_path / 'bad').exists()
  with pytest.raises(ValueError, match='dropout must be a probability in \\[0, 1\\), got 1.5'):
    devices.SystemModel(system.profiles, system.examples_trained, MODEL_BITS, dropout=1.5)
  assert devices.overcommitted(10, 0.3) == 13 and devices.overcommitted(5, 0.0) == 5


def test_the_binaries_take_the_system_model_from_their_flags(tmp_path):
  from absl.testing import flagsaver

  from bin import fedavg

  with flagsaver.as_parsed(
    rounds='2',
    clients_per_round='6',
    root_output_dir=str(tmp_path),
    experiment_name='timed',
    devices='lognormal',
    device_target='4',
    dropout='0.1',
  ):
    fedavg.main(['fedavg'])
  run = results.load_run(tmp_path / 'timed')
  np.testing.assert_array_equal(run.metrics['system/selected'][1:], [6, 6])
  np.testing.assert_array_equal(
    run.metrics['cohort_size'][1:], 6 - run.metrics['system/dropped'][1:]
  )
  assert np.all(run.metrics['cohort_size'][1:] <= 4)
  seconds = run.metrics['system/round_seconds'][1:]
  assert np.all(seconds > 0)
  # The cumulative time is kept in whole microseconds (exact across a resume).
  np.testing.assert_allclose(
    run.metrics['system/cumulative_seconds'][1:], np.cumsum(seconds), rtol=0, atol=2e-6
  )
  assert run.hparams['devices'] == 'lognormal' and run.hparams['device_target'] == 4


def test_optimal_uploads_pay_upload_time_only_for_the_uploaders(small_digits_task, tmp_path):
  from tff_sampling import aggregators
  from tff_sampling.learning import signals

  process = signals.build_fed_avg_with_signals(
    small_digits_task.model_fn,
    client_learning_rate=0.1,
    sketch_size=None,
    update_fingerprints=True,
    model_aggregator=aggregators.OptimalSamplingFactory(2, report_uploaders=True),
  )
  system = _system(small_digits_task)
  sampler, rows = _run(small_digits_task, process, tmp_path / 'run', 4, system)
  profiles, uploads = system.profiles, []
  for row in rows:
    round_num = int(row['key'])
    clients = sampler.chosen[round_num]
    # Two phases: the first TARGET clients to have their update are kept (no upload yet).
    trained = _by_hand(system, clients, upload=False)
    dropped = devices.dropped_out(0, round_num, clients, DROPOUT)
    order = np.flatnonzero(~dropped)[np.argsort(trained[~dropped], kind='stable')][:TARGET]
    phase = trained[order].max() if order.size else 0.0
    # A kept client's seconds include an upload only if it uploaded.
    observed = sampler.seconds[round_num - 1]
    upload = MODEL_BITS / profiles.upload_bits_per_second[clients[np.sort(order)]]
    uploaded = ~np.isclose(observed, trained[np.sort(order)], rtol=1e-9)
    np.testing.assert_allclose(observed[uploaded], (trained[np.sort(order)] + upload)[uploaded])
    assert uploaded.sum() == int(float(row['process/aggregator/uploads']))
    expected = phase + (upload[uploaded].max() if uploaded.any() else 0.0)
    assert float(row['system/round_seconds']) == pytest.approx(expected, rel=1e-6), round_num
    uploads.append(uploaded.sum() / max(order.size, 1))
  # m = 2 of 5 kept: not every kept client uploads.
  assert min(uploads) < 1


def test_optimal_uploads_that_say_only_how_many_cannot_be_timed(small_digits_task, tmp_path):
  from tff_sampling import aggregators
  from tff_sampling.learning import signals

  process = signals.build_fed_avg_with_signals(
    small_digits_task.model_fn,
    client_learning_rate=0.1,
    sketch_size=None,
    model_aggregator=aggregators.OptimalSamplingFactory(2),
  )
  with pytest.raises(ValueError, match='report_uploaders=True'):
    _run(small_digits_task, process, tmp_path / 'bad', 2, _system(small_digits_task))
  assert not (tmp_path / 'bad').exists()
