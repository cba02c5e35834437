"""Tests for tff_sampling/analysis/evidence.py: summaries, paired intervals and verdicts.

Every expected number is computed by hand (t quantiles from tables:
t(0.975, 4) = 2.776445, t(0.975, 2) = 4.302653).
"""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from tff_sampling.analysis import evidence
from tff_sampling.analysis import tables
from tff_sampling.runtime import results


def make_run(rounds, accuracy, bits=None, name='r'):
  rounds = np.asarray(rounds, np.int64)
  metrics = {'eval/accuracy': np.asarray(accuracy, np.float64)}
  if bits is not None:
    metrics[results.BITS_COLUMN] = np.asarray(bits, np.float64)
  return results.Run(path=name, hparams={'experiment_name': name}, metrics=metrics, rounds=rounds)


NAN = math.nan
# Evaluated at rounds 0, 5, 10 (rows 1-4 and 6-9 are training rounds without evaluation).
RUN = make_run(
  range(11),
  [0.1, NAN, NAN, NAN, NAN, 0.3, NAN, NAN, NAN, NAN, 0.5],
  bits=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100],
)


def test_final_mean_averages_the_last_k_evaluations():
  assert evidence.final_mean(RUN, 1) == pytest.approx(0.5)
  assert evidence.final_mean(RUN, 2) == pytest.approx(0.4)
  assert evidence.final_mean(RUN, 10) == pytest.approx(0.3)  # All three evaluations.
  with pytest.raises(ValueError, match='k must be >= 1'):
    evidence.final_mean(RUN, 0)


def test_curve_mean_is_the_trapezoid_area_over_the_span():
  # ((0.1 + 0.3) / 2 * 5 + (0.3 + 0.5) / 2 * 5) / 10 = (1.0 + 2.0) / 10.
  assert evidence.curve_mean(RUN) == pytest.approx(0.3)
  # Uneven spacing: rounds 0, 2, 10 with 0, 1, 1: (1 * 2 / 2 + 1 * 8) / 10 = 0.9.
  uneven = make_run([0, 2, 10], [0.0, 1.0, 1.0])
  assert evidence.curve_mean(uneven) == pytest.approx(0.9)
  with pytest.raises(ValueError, match='fewer than two'):
    evidence.curve_mean(make_run([0], [0.5]))


def test_lowest_is_the_smallest_evaluated_loss():
  run = results.Run(
    path='r',
    hparams={},
    rounds=np.arange(4, dtype=np.int64),
    metrics={'eval/loss': np.array([2.0, NAN, 0.7, 0.9])},
  )
  assert evidence.lowest(run) == pytest.approx(0.7)  # Not the last (0.9), not the gap.
  with pytest.raises(KeyError, match='no column'):
    evidence.lowest(make_run([0, 1], [0.1, 0.2]))


def test_accuracy_at_bits_is_the_last_evaluation_within_the_budget():
  # Evaluations at rounds 0, 5, 10 with 0, 50 and 100 bits spent.
  assert evidence.accuracy_at_bits(RUN, 100) == pytest.approx(0.5)
  assert evidence.accuracy_at_bits(RUN, 99) == pytest.approx(0.3)  # Round 10 cost 100.
  assert evidence.accuracy_at_bits(RUN, 50) == pytest.approx(0.3)
  assert evidence.accuracy_at_bits(RUN, 0) == pytest.approx(0.1)  # Round 0 uploads nothing.


def test_accuracy_at_work_is_the_last_evaluation_within_the_examples_trained():
  # 30 examples trained a round (none in round 0): 150 by round 5, 300 by round 10.
  run = dataclasses.replace(
    RUN, metrics={**RUN.metrics, evidence.EXAMPLES_COLUMN: np.r_[NAN, np.full(10, 30.0)]}
  )
  assert evidence.examples_trained(run)[[0, 5, 10]] == pytest.approx([0, 150, 300])
  assert evidence.accuracy_at_work(run, 300) == pytest.approx(0.5)
  assert evidence.accuracy_at_work(run, 299) == pytest.approx(0.3)
  assert evidence.accuracy_at_work(run, 149) == pytest.approx(0.1)
  # A run (or a baseline) that does not record its examples has no accuracy at a work budget.
  assert math.isnan(evidence.accuracy_at_work(run, NAN))
  no_column = dataclasses.replace(
    RUN, metrics={**RUN.metrics, evidence.EXAMPLES_COLUMN: np.full(11, NAN)}
  )
  assert math.isnan(evidence.accuracy_at_work(no_column, 300))


def test_simulated_seconds_to_target_and_its_censoring():
  # Round r ends at 1.5 r simulated seconds: 0.3 is reached at round 5 (7.5 s); 0.9 never, so
  # it is censored at the run's total, 15 s.
  seconds = np.arange(11) * 1.5
  run = dataclasses.replace(
    RUN, metrics={**RUN.metrics, evidence.SECONDS_COLUMN: np.where(seconds > 0, seconds, np.nan)}
  )
  assert evidence.seconds_to_target(run, 0.3) == 7.5
  assert math.isnan(evidence.seconds_to_target(run, 0.9))
  assert evidence.to_target(run, 0.3, seconds=True) == (7.5, False)
  assert evidence.to_target(run, 0.9, seconds=True) == (15.0, True)
  with pytest.raises(ValueError, match='bits or seconds, not both'):
    evidence.to_target(run, 0.3, bits=True, seconds=True)


def test_to_target_is_censored_at_the_end_when_never_reached():
  assert evidence.to_target(RUN, 0.3, bits=False) == (5.0, False)
  assert evidence.to_target(RUN, 0.3, bits=True) == (50.0, False)
  assert evidence.to_target(RUN, 0.9, bits=False) == (10.0, True)
  assert evidence.to_target(RUN, 0.9, bits=True) == (100.0, True)
  assert math.isnan(evidence.rounds_to_target(RUN, 0.9))


def test_t_interval_by_hand():
  # Mean 3, sample std sqrt(2.5) = 1.581139; half width 2.776445 * 1.581139 / sqrt(5).
  low, high = evidence.t_interval([1, 2, 3, 4, 5])
  assert low == pytest.approx(3 - 1.963243, abs=1e-6)
  assert high == pytest.approx(3 + 1.963243, abs=1e-6)
  assert all(math.isnan(v) for v in evidence.t_interval([1.0]))


def test_paired_difference_pairs_common_finite_seeds_only():
  method = {0: 0.5, 1: 0.6, 2: 0.7, 4: NAN}
  baseline = {0: 0.4, 1: 0.4, 2: 0.5, 3: 0.9, 4: 0.1}
  diff = evidence.paired_difference(method, baseline)
  assert diff.seeds == (0, 1, 2)
  assert diff.differences == pytest.approx((0.1, 0.2, 0.2))
  # Mean 0.166667, std 0.057735, half width 4.302653 * 0.057735 / sqrt(3) = 0.143422.
  assert diff.mean == pytest.approx(0.166667, abs=1e-6)
  assert diff.low == pytest.approx(0.023245, abs=1e-6)
  assert diff.high == pytest.approx(0.310089, abs=1e-6)
  assert diff.n == 3


def _diff(low, high):
  return evidence.PairedDifference((0, 1, 2), (0.0, 0.0, 0.0), (low + high) / 2, low, high)


@pytest.mark.parametrize(
  'low, high, direction, margin, expected',
  [
    (0.1, 0.3, evidence.Direction.HIGHER, 0.0, evidence.Verdict.REPRODUCED),
    (0.1, 0.3, evidence.Direction.LOWER, 0.0, evidence.Verdict.CONTRADICTED),
    (-0.3, -0.1, evidence.Direction.LOWER, 0.0, evidence.Verdict.REPRODUCED),
    (-0.3, -0.1, evidence.Direction.HIGHER, 0.0, evidence.Verdict.CONTRADICTED),
    (-0.1, 0.3, evidence.Direction.HIGHER, 0.0, evidence.Verdict.NO_DIFFERENCE),
    (-0.1, 0.3, evidence.Direction.LOWER, 0.0, evidence.Verdict.NO_DIFFERENCE),
    (-0.01, 0.02, evidence.Direction.EQUAL, 0.03, evidence.Verdict.REPRODUCED),
    (0.04, 0.08, evidence.Direction.EQUAL, 0.03, evidence.Verdict.CONTRADICTED),
    (-0.08, -0.04, evidence.Direction.EQUAL, 0.03, evidence.Verdict.CONTRADICTED),
    (0.01, 0.05, evidence.Direction.EQUAL, 0.03, evidence.Verdict.UNDECIDED),
    (-0.05, 0.05, evidence.Direction.EQUAL, 0.03, evidence.Verdict.UNDECIDED),
  ],
)
def test_verdicts(low, high, direction, margin, expected):
  assert evidence.verdict(_diff(low, high), direction, margin) == expected


def test_verdict_needs_two_pairs_and_a_margin_for_equality():
  one = evidence.paired_difference({0: 1.0}, {0: 0.0})
  assert evidence.verdict(one, evidence.Direction.HIGHER) == evidence.Verdict.TOO_FEW
  with pytest.raises(ValueError, match='margin'):
    evidence.verdict(_diff(0, 1), evidence.Direction.EQUAL)
  with pytest.raises(ValueError, match='direction'):
    evidence.verdict(_diff(0, 1), 'bigger')


@pytest.mark.parametrize(
  'outcome, direction, method_censored, baseline_censored, expected',
  [
    # Fewer bits claimed; the baseline never reached (its value is a lower bound): the
    # true difference is even more negative, so "reproduced" stands.
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.LOWER,
      False,
      True,
      evidence.Verdict.REPRODUCED,
    ),
    # The method never reached: its true value is larger, "reproduced" may be an artefact.
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.LOWER,
      True,
      False,
      evidence.Verdict.UNDECIDED,
    ),
    (
      evidence.Verdict.CONTRADICTED,
      evidence.Direction.LOWER,
      True,
      False,
      evidence.Verdict.CONTRADICTED,
    ),
    (
      evidence.Verdict.CONTRADICTED,
      evidence.Direction.LOWER,
      False,
      True,
      evidence.Verdict.UNDECIDED,
    ),
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.HIGHER,
      True,
      False,
      evidence.Verdict.REPRODUCED,
    ),
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.HIGHER,
      False,
      True,
      evidence.Verdict.UNDECIDED,
    ),
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.EQUAL,
      False,
      True,
      evidence.Verdict.UNDECIDED,
    ),
    # Neither reached (both lower bounds): the interval of the bounds says nothing about the
    # true difference, which a censored value may hide in either direction.
    (
      evidence.Verdict.NO_DIFFERENCE,
      evidence.Direction.LOWER,
      True,
      True,
      evidence.Verdict.UNDECIDED,
    ),
    (
      evidence.Verdict.NO_DIFFERENCE,
      evidence.Direction.LOWER,
      False,
      True,
      evidence.Verdict.UNDECIDED,
    ),
    (
      evidence.Verdict.NO_DIFFERENCE,
      evidence.Direction.HIGHER,
      False,
      False,
      evidence.Verdict.NO_DIFFERENCE,
    ),
    (
      evidence.Verdict.REPRODUCED,
      evidence.Direction.LOWER,
      False,
      False,
      evidence.Verdict.REPRODUCED,
    ),
  ],
)
def test_censored_verdicts(outcome, direction, method_censored, baseline_censored, expected):
  assert (
    evidence.censored_verdict(
      outcome, direction, method_censored=method_censored, baseline_censored=baseline_censored
    )
    == expected
  )


def test_t_interval_covers_the_mean_95_percent_of_the_time():
  # 4,000 samples of 5 normal draws (fixed generator): coverage is Binomial(4000, 0.95)/4000
  # with sd 0.0034; [0.935, 0.965] is ±4.4 sd, so this fails by chance with p < 1e-4.
  rng = np.random.default_rng([2026, 11, 24])
  covered = 0
  for _ in range(4000):
    low, high = evidence.t_interval(rng.normal(1.5, 2.0, size=5))
    covered += low <= 1.5 <= high
  assert 0.935 <= covered / 4000 <= 0.965


def test_a_paired_difference_finds_a_shift_hidden_by_the_spread_between_seeds():
  # Seeds differ a lot (sd 0.1), the method adds 0.02 to every seed: unpaired intervals
  # overlap, the paired one excludes 0.
  baseline = dict(enumerate([0.50, 0.62, 0.41, 0.70, 0.55]))
  method = {s: v + 0.02 + 0.001 * (s % 2) for s, v in baseline.items()}
  diff = evidence.paired_difference(method, baseline)
  assert evidence.verdict(diff, evidence.Direction.HIGHER) == evidence.Verdict.REPRODUCED
  low_m, high_m = evidence.t_interval(list(method.values()))
  low_b, high_b = evidence.t_interval(list(baseline.values()))
  assert low_m < high_b and low_b < high_m  # The unpaired intervals overlap.


def _difference(values):
  return evidence.paired_difference(dict(enumerate(values)), dict.fromkeys(range(len(values)), 0.0))


def test_holm_adjusted_p_values_by_hand():
  # Sorted 0.01, 0.03, 0.04 of 3: 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04).
  adjusted = evidence.holm_adjusted([0.01, 0.04, 0.03, math.nan])
  np.testing.assert_allclose(adjusted[:3], [0.03, 0.06, 0.06])
  assert math.isnan(adjusted[3])
  assert evidence.holm_adjusted([0.5, 0.9]) == [1.0, 1.0]  # Capped at 1.


def test_decisive_tests_are_scipys_t_tests():
  x = [0.01, 0.02, 0.03, 0.05, 0.02]
  p, outcome = evidence.decisive_test(_difference(x), evidence.Direction.HIGHER)
  assert p == pytest.approx(stats.ttest_1samp(x, 0.0).pvalue, rel=1e-9)
  assert outcome == evidence.Verdict.REPRODUCED
  _, outcome = evidence.decisive_test(_difference(x), evidence.Direction.LOWER)
  assert outcome == evidence.Verdict.CONTRADICTED
  # Equivalence within ±0.04: two one-sided tests, each at half the level.
  p, outcome = evidence.decisive_test(_difference(x), evidence.Direction.EQUAL, 0.04)
  one_sided = max(
    stats.ttest_1samp(x, -0.04, alternative='greater').pvalue,
    stats.ttest_1samp(x, 0.04, alternative='less').pvalue,
  )
  assert (p, outcome) == (pytest.approx(2 * one_sided, rel=1e-9), evidence.Verdict.REPRODUCED)
  assert evidence.decisive_test(_difference([0.1]), evidence.Direction.HIGHER)[1] is None


def test_a_decisive_test_decides_exactly_as_the_interval():
  rng = np.random.default_rng(5)
  for case in range(600):
    n = int(rng.integers(2, 9))
    values = rng.normal(rng.normal(0.0, 0.02), rng.uniform(0.001, 0.05), size=n)
    direction = list(evidence.Direction)[case % 3]
    margin = 0.02 if direction == evidence.Direction.EQUAL else 0.0
    difference = _difference(values)
    alone = evidence.verdict(difference, direction, margin)
    p, outcome = evidence.decisive_test(difference, direction, margin)
    decisive = alone in (evidence.Verdict.REPRODUCED, evidence.Verdict.CONTRADICTED)
    assert decisive == (p < 0.05), (case, values, direction, alone, p)
    if decisive:
      assert outcome == alone
    # A family of one is the claim alone.
    assert evidence.holm_verdicts([difference], [direction], [margin]) == [alone]


def test_holm_keeps_only_the_verdicts_the_family_supports():
  strong = _difference([0.10, 0.11, 0.09, 0.12, 0.10])  # p far below 0.05 / 3.
  weak = _difference([0.01, 0.03, 0.0, 0.02, 0.015])  # Decisive alone, p between 0.01 and 0.05.
  p_weak, _ = evidence.decisive_test(weak, evidence.Direction.HIGHER)
  assert 0.05 / 3 < p_weak < 0.05
  assert evidence.verdict(weak, evidence.Direction.HIGHER) == evidence.Verdict.REPRODUCED
  flat = _difference([0.01, -0.01, 0.02, -0.02, 0.0])
  verdicts = evidence.holm_verdicts(
    [strong, weak, flat],
    [evidence.Direction.HIGHER] * 2 + [evidence.Direction.EQUAL],
    [0, 0, 0.001],
  )
  assert verdicts == [
    evidence.Verdict.REPRODUCED,
    evidence.Verdict.NO_DIFFERENCE,
    evidence.Verdict.UNDECIDED,
  ]
  assert evidence.holm_verdicts([_difference([0.2])], [evidence.Direction.HIGHER], [0]) == [
    evidence.Verdict.TOO_FEW
  ]


def test_holm_with_censoring_leaves_out_what_censoring_could_have_caused():
  lower = evidence.Direction.LOWER
  # Rounds to a target, method − baseline. `bounded` looks sooner (sd 0, p = 0) only because the
  # method never reached the target: its values are lower bounds. `weak`, p = 0.034, uncensored.
  bounded = _difference([-10.0, -10.0, -10.0])
  weak = _difference([-10.0, -6.0, -12.0])
  assert 0.025 < evidence.decisive_test(weak, lower)[0] < 0.05
  # Without the censoring, `bounded` takes Holm's × 2 and `weak` is decided at 0.034 × 1.
  assert (
    evidence.holm_verdicts([bounded, weak], [lower] * 2, [0.0] * 2)
    == [evidence.Verdict.REPRODUCED] * 2
  )
  # With it, `bounded` cannot be decided (undecided, p = 1), and `weak` needs 0.034 × 2 < 0.05.
  censored = evidence.holm_verdicts(
    [bounded, weak], [lower] * 2, [0.0] * 2, [(True, False), (False, False)]
  )
  assert censored == [evidence.Verdict.UNDECIDED, evidence.Verdict.NO_DIFFERENCE]
  # A censored baseline cannot fake a method's being sooner: that verdict stands.
  assert evidence.holm_verdicts([bounded], [lower], [0.0], [(False, True)]) == [
    evidence.Verdict.REPRODUCED
  ]


def test_seeds_to_decide_by_hand():
  # Differences with mean 0.01 and sample sd 0.02: the half-width t(0.975, n-1) * 0.02 / sqrt(n)
  # first drops below 0.01 at n = 18 (t = 2.110: 0.00995; at n = 17, t = 2.120: 0.01028).
  x = 0.01 + 0.02 * np.array([1.0, -1.0, 1.0, -1.0]) * np.sqrt(3.0 / 4.0)
  difference = _difference(x)
  assert float(np.std(x, ddof=1)) == pytest.approx(0.02)
  assert evidence.seeds_to_decide(difference, evidence.Direction.HIGHER) == 18
  # Equivalence within ±0.03: room 0.02; the half-width is 0.0210 at n = 6 (t(0.975, 5) =
  # 2.571) and 0.0185 at n = 7 (t(0.975, 6) = 2.447).
  assert evidence.seeds_to_decide(difference, evidence.Direction.EQUAL, 0.03) == 7
  assert evidence.seeds_to_decide(difference, evidence.Direction.HIGHER, most=17) is None
  assert evidence.seeds_to_decide(_difference([0.01, -0.01]), evidence.Direction.HIGHER) is None
  # Already decided: as many seeds as it has, or fewer.
  strong = _difference([0.10, 0.11, 0.09, 0.12, 0.10])
  assert evidence.seeds_to_decide(strong, evidence.Direction.HIGHER) <= 5


def test_block_means_and_where_a_curve_flattens():
  # Evaluated every 5 rounds over 40 rounds; blocks of 10 rounds hold rounds 5 and 10, 15 and
  # 20, ...: means 0.15, 0.35, 0.42, 0.425 (gains 0.2, 0.07, 0.005).
  accuracy = np.full(41, NAN)
  accuracy[5::5] = [0.1, 0.2, 0.3, 0.4, 0.41, 0.43, 0.42, 0.43]
  run = make_run(range(41), accuracy)
  assert evidence.block_means(run, 10) == pytest.approx([0.15, 0.35, 0.42, 0.425])
  assert evidence.flattened_at(run, 10, gain=0.01) == 40
  assert evidence.flattened_at(run, 10, gain=0.1) == 30
  assert evidence.flattened_at(run, 10, gain=0.001) is None
  # Over two blocks the gains are 0.27 (to round 30) and 0.075 (to round 40).
  assert evidence.flattened_at(run, 10, gain=0.1, lookback=2) == 40
  assert evidence.flattened_at(run, 10, gain=0.01, lookback=2) is None
  text = tables.horizon_text(run, 10, 0.001)
  assert '       31-40  0.4250' in text
  assert text.endswith(
    'Not flat by round 40: it gained +0.0050 over the last 10 rounds (flat: < 0.001).'
  )
  assert tables.horizon_text(run, 10, 0.1, lookback=2).endswith(
    'Flattened at round 40: it gained less than 0.1 over 20 rounds.'
  )
  with pytest.raises(ValueError, match='block must be >= 1'):
    evidence.block_means(run, 0)
  with pytest.raises(ValueError, match='lookback must be >= 1'):
    evidence.flattened_at(run, 10, 0.01, lookback=0)
