"""Tests for tff_sampling/program/multi_model.py, tasks/multi_model.py and bin/mmfl.py."""

import dataclasses
import os
import re

import fault_harness as fh
import numpy as np
import pytest

from tasks import multi_model as suites
from tff_sampling import program
from tff_sampling.learning import multi_model
from tff_sampling.learning import multi_model_types
from tff_sampling.program import multi_model as multi_model_program
from tff_sampling.runtime import results


@pytest.fixture(scope='module')
def suite():
  return suites.create_suite('digits_synthetic', num_clients=6, client_epochs=1)


def _process(suite, sampling='optimal_secure'):
  return multi_model.build_multi_model_process(
    [t.model_fn for t in suite],
    sampling=sampling,
    expected_clients=2,
    client_learning_rates=0.05,
    max_rescaling_steps=1,
    seed=3,
  )


def _flat(models):
  return np.concatenate([np.ravel(t) for w in models for t in w.trainable])


def test_resumed_run_reproduces_the_uninterrupted_one(suite, tmp_path):
  def config(name, rounds):
    return program.RunConfig(
      output_dir=str(tmp_path / name), rounds=rounds, seed=3, eval_every=1, hparams=dict(run=name)
    )

  process = _process(suite)
  whole = multi_model_program.train_multi_model(suite, process, config('a', 3))
  multi_model_program.train_multi_model(suite, process, config('b', 2))
  resumed = multi_model_program.train_multi_model(suite, process, config('b', 3))
  assert resumed.resumed_from == 2 and resumed.final_round == 3
  np.testing.assert_array_equal(_flat(whole.models), _flat(resumed.models))
  assert whole.cumulative_bits == resumed.cumulative_bits > 0

  run_a, run_b = results.load_run(tmp_path / 'a'), results.load_run(tmp_path / 'b')
  assert list(run_a.rounds) == list(run_b.rounds) == [0, 1, 2, 3]  # No round twice or lost.
  for column in ('eval/mean_accuracy', 'uplink/cumulative_bits', 'process/uploads/model_1'):
    np.testing.assert_array_equal(run_a.metrics[column], run_b.metrics[column])
  # The mean accuracy is the mean of the models' accuracies; bits add up.
  np.testing.assert_allclose(
    run_a.metrics['eval/mean_accuracy'],
    (run_a.metrics['eval/model_0/accuracy'] + run_a.metrics['eval/model_1/accuracy']) / 2,
  )
  np.testing.assert_allclose(
    np.cumsum(run_a.metrics['uplink/round_bits']), run_a.metrics['uplink/cumulative_bits']
  )
  parameters = [sum(np.size(t) for t in w.trainable) for w in whole.models]
  expected_bits = 32 * (
    run_a.metrics['process/uploads/model_0'][1:] * parameters[0]
    + run_a.metrics['process/uploads/model_1'][1:] * parameters[1]
    + run_a.metrics['uplink/extra_scalars'][1:]
  )
  np.testing.assert_allclose(run_a.metrics['uplink/round_bits'][1:], expected_bits)


def test_mismatched_populations_are_errors(suite):
  bigger = suites.create_suite('digits_synthetic', num_clients=9, client_epochs=1)
  with pytest.raises(ValueError, match='client counts differ: digits: 6, synthetic: 9'):
    multi_model_program.check_population([suite[0], bigger[1]])
  with pytest.raises(
    ValueError,
    match=r'task\(s\) digits \(6\), synthetic \(6\) have fewer; '
    r'lower --clients to at most 6',
  ):
    multi_model_program.align_clients(suite, 7)
  aligned = multi_model_program.align_clients([suite[0], bigger[1]])
  assert [t.num_clients for t in aligned] == [6, 6]
  assert aligned[1].client_ids == bigger[1].client_ids[:6]
  # A model with no examples on any client of the population.
  empty = dataclasses.replace(suite[1], client_num_examples=np.zeros(6, np.int64))
  with pytest.raises(ValueError, match=r'Model\(s\) \[1\] have no training examples'):
    multi_model_program.check_population([suite[0], empty])


def test_suites_and_their_errors():
  tasks = suites.create_suite('digits_noniid', num_models=3, num_clients=20)
  assert [t.options['dirichlet_alpha'] for t in tasks] == pytest.approx(
    list(np.geomspace(0.05, 10.0, 3))
  )
  assert suites.noniid_alphas(5) == suites.NONIID_ALPHAS
  assert len({t.client_num_examples.tobytes() for t in tasks}) == 3  # Different partitions.
  with pytest.raises(
    ValueError, match="Suite 'digits_synthetic' has 2-2 models, got --num_models=3"
  ):
    suites.create_suite('digits_synthetic', num_models=3)
  with pytest.raises(ValueError, match="Unknown suite 'mnist'"):
    suites.create_suite('mnist')


@pytest.mark.slow
def test_binary_runs_every_sampling_and_prints_the_report(tmp_path, capfd):
  common = dict(
    suite='digits_noniid',
    num_models=2,
    clients=10,
    expected_clients=3,
    rounds=2,
    eval_every=1,
    client_epochs=1,
    root_output_dir=tmp_path,
  )
  outcome = fh.run_binary('mmfl', sampling=','.join(multi_model_types.SAMPLINGS), **common)
  assert outcome.exit_code == 0, outcome
  table = capfd.readouterr().out.split('method')[1].splitlines()
  rows = {
    line.split()[0]: line
    for line in table[2:]
    if line.strip() and line.split()[0] in multi_model_types.SAMPLINGS
  }
  assert set(rows) == set(multi_model_types.SAMPLINGS)
  assert rows['optimal'].count('/') == 2  # Secure/exact ratios for j = 0, 1, 2.
  assert os.path.isfile(tmp_path / 'digits_noniid_mean_accuracy.png')
  run = results.load_run(tmp_path / 'digits_noniid_round_robin_seed0')
  assert run.hparams['sampling'] == 'round_robin' and list(run.rounds) == [0, 1, 2]
  # --report_only reads the runs back without training.
  again = fh.run_binary('mmfl', sampling='optimal', report_only='true', **common)
  assert again.exit_code == 0, again
  assert rows['optimal'].split()[1] in capfd.readouterr().out


# --expected_clients=0 is refused while parsing (tests/test_faults_inputs.py).
@pytest.mark.parametrize(
  'flags,message',
  [
    (dict(expected_clients=11), '--expected_clients must be in (0, --clients=10], got 11.0'),
    (dict(suite='leaf', num_models=5, expected_clients=3), "Suite 'leaf' has 2-3 models"),
  ],
)
def test_binary_bad_flags(tmp_path, flags, message):
  outcome = fh.run_binary('mmfl', clients=10, rounds=1, root_output_dir=tmp_path, **flags)
  fh.assert_one_line_error(outcome, re.escape(message))


def test_workers_are_refused_clearly_not_ignored(suite, tmp_path):
  # MMFL's rounds have dependent aggregations (shares, then assignment), which TFF
  # cannot split over workers: the loop says so before anything is written.
  config = program.RunConfig(output_dir=str(tmp_path / 'run'), rounds=1, local_workers=2)
  with pytest.raises(ValueError, match='cannot run over several TFF workers'):
    multi_model_program.train_multi_model(suite, _process(suite, 'random'), config)
  assert not os.path.exists(tmp_path / 'run')
