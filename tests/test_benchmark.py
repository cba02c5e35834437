"""Tests for tff_sampling/experiments/benchmark.py and bin/benchmark.py."""

import numpy as np
import pytest

import fault_harness as fh
from bin import experiment_config
from tff_sampling import communication
from tff_sampling import results
from tff_sampling.experiments import benchmark


def test_methods_are_samplers_alone_or_with_optimal_uploads():
  assert benchmark.parse_method('md') == ('md', False)
  assert benchmark.parse_method('clustered_similarity+optimal') == ('clustered_similarity', True)
  with pytest.raises(ValueError, match="Unknown method 'optimal'.*followed by \\+optimal"):
    benchmark.parse_method('optimal')
  methods = benchmark.all_methods()
  assert len(methods) == 2 * len(benchmark.SAMPLERS) and methods[-1] == 'full+optimal'
  assert 'benchmark' in experiment_config.BINARIES  # The driver can run a benchmark cell.


def test_cohorts_and_recorded_settings():
  settings = benchmark.BenchmarkMethods(4, 12, 0.1)
  assert settings.cohort('md') == 4 and settings.cohort('md+optimal') == 12
  assert settings.method_hparams('power_of_choice+optimal') == dict(
    sampler='power_of_choice', uploads='optimal', cohort=12, num_candidates=24)
  with pytest.raises(ValueError, match='training_cohort=4 must exceed clients_per_round=4'):
    benchmark.BenchmarkMethods(4, 4, 0.1)


def test_uplink_counts_what_each_kind_uploads():
  plain = benchmark.uplink({'aggregator': {}}, 7)
  assert plain == communication.Uplink(model_uploads=7, extra_scalars=0)
  sampled = benchmark.uplink(
    {'aggregator': {'uploads': 2, 'extra_scalars_per_client': 11}}, 7)
  assert sampled == communication.Uplink(model_uploads=2, extra_scalars=77)


def test_binary_runs_each_kind_and_uploads_about_m(tmp_path):
  outcome = fh.run_binary(
    'benchmark', task='digits', availability='LN-0.5', rounds=3, eval_every=3,
    sampling='md,md+optimal,full', clients_per_round=3, training_cohort=9, seeds=1,
    root_output_dir=tmp_path)
  assert outcome.exit_code == 0, outcome
  runs = {m: results.load_run(str(tmp_path / f'digits_LN-0.5_{m}_seed0'))
          for m in ('md', 'md+optimal', 'full')}
  md, sampled, full = runs['md'], runs['md+optimal'], runs['full']
  assert md.hparams['uploads'] == 'all' and sampled.hparams['uploads'] == 'optimal'
  # MD alone: 3 trainers, all upload. With optimal uploads: 9 train, and the
  # aggregator's upload count is what the bits count.
  np.testing.assert_array_equal(md.column('cohort_size')[1:], 3)
  np.testing.assert_array_equal(md.column('uplink/model_uploads')[1:], 3)
  np.testing.assert_array_equal(sampled.column('cohort_size')[1:], 9)
  np.testing.assert_array_equal(
    sampled.column('uplink/model_uploads')[1:],
    sampled.column('process/aggregator/uploads')[1:])
  assert np.all(sampled.column('process/aggregator/expected_uploads')[1:] <= 3 + 1e-5)
  # Full participation: every active client (LN availability: fewer than all 100).
  active = full.column('availability/active_clients')[1:]
  np.testing.assert_array_equal(full.column('cohort_size')[1:], active)
  assert np.all(active < 100)
