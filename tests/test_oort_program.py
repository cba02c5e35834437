"""Oort and TiFL through `bin.benchmark` and the round loop: alone and with optimal uploads,
under the system model, and a resumed run repeats the uninterrupted one."""

import fault_harness as fh
import pytest

from tff_sampling.runtime import results


def _benchmark(root, rounds, sampling, devices='lognormal'):
  return fh.run_binary(
    'benchmark',
    task='digits',
    availability='IDL',
    rounds=rounds,
    eval_every=2,
    checkpoint_every=2,
    sampling=sampling,
    clients_per_round=4,
    training_cohort=8,
    seeds=1,
    devices=devices,
    root_output_dir=root,
  )


@pytest.mark.slow
def test_oort_runs_alone_and_with_optimal_uploads_and_resumes_exactly(tmp_path):
  outcome = _benchmark(tmp_path / 'full', 4, 'oort,oort+optimal,tifl')
  assert outcome.exit_code == 0, outcome
  alone = results.load_run(str(tmp_path / 'full' / 'digits_IDL_oort_seed0'))
  # ε decays from 0.9 by 0.98 a round: a cohort of 4 explores int(4 × 0.882) = 3 clients in
  # round 1 and exploits none (nobody seen yet), then int(4 × 0.864) = 3 and exploits 1.
  assert list(alone.column('selection/oort_exploited')[1:3]) == [0.0, 1.0]
  assert alone.column('selection/oort_exploration')[1] == pytest.approx(0.9 * 0.98)
  assert (alone.column('system/round_seconds')[1:] > 0).all()
  combined = results.load_run(str(tmp_path / 'full' / 'digits_IDL_oort+optimal_seed0'))
  assert list(combined.column('cohort_size')[1:]) == [8, 8, 8, 8]
  # TiFL: every round's 4 clients come from one of 5 tiers of the 20 clients by latency.
  tiered = results.load_run(str(tmp_path / 'full' / 'digits_IDL_tifl_seed0'))
  assert set(tiered.column('selection/tifl_tier')[1:]) <= {0.0, 1.0, 2.0, 3.0, 4.0}
  assert list(tiered.column('cohort_size')[1:]) == [4, 4, 4, 4]
  # Without a system model TiFL has no latencies to tier by, and says so.
  refused = _benchmark(tmp_path / 'none', 2, 'tifl', devices='none')
  assert refused.exit_code != 0 and 'give a system model (--devices)' in str(refused)
  # Stopped after round 2 and resumed: the same rounds 3 and 4 (Oort's state is checkpointed).
  assert _benchmark(tmp_path / 'part', 2, 'oort').exit_code == 0
  assert _benchmark(tmp_path / 'part', 4, 'oort').exit_code == 0
  assert fh.metrics_rows(tmp_path / 'part' / 'digits_IDL_oort_seed0') == fh.metrics_rows(
    tmp_path / 'full' / 'digits_IDL_oort_seed0'
  )
