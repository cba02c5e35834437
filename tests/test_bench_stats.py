"""Tests of bench/stats.py on hand-computable cases (no timing-dependent assertions)."""

import itertools
import math

import numpy as np
import pytest

from bench import stats


def test_identical_ratios_give_a_degenerate_interval():
  estimate = stats.ratio_estimate([2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 3.0, 4.0])
  assert estimate == stats.Estimate(median=2.0, low=2.0, high=2.0, pairs=4)
  assert estimate.interval == '[2, 2]'


def test_two_pairs_span_both_values():
  # Resampled medians are 1 (p = 1/4), 2 (1/2) or 3 (1/4): the 2.5% and 97.5%
  # percentiles are 1 and 3.
  assert stats.median_ci([1.0, 3.0]) == stats.Estimate(2.0, 1.0, 3.0, 2)


def test_the_median_ignores_an_outlier_but_the_interval_does_not():
  # A resample's median is the smallest value when at least 3 of its 5 draws
  # are: P = 0.2^5 + 5 * 0.2^4 * 0.8 + 10 * 0.2^3 * 0.8^2 = 0.058 > 0.025; the
  # same for the largest.
  estimate = stats.median_ci([1.0, 2.0, 3.0, 4.0, 100.0])
  assert (estimate.median, estimate.low, estimate.high) == (3.0, 1.0, 100.0)


def test_the_bootstrap_is_seeded():
  samples = np.random.default_rng(7).lognormal(size=25)
  first, second = stats.median_ci(samples), stats.median_ci(samples)
  assert first == second
  assert samples.min() <= first.low <= first.median <= first.high <= samples.max()
  assert first.median == np.median(samples) and first.pairs == 25


def test_one_pair_has_no_interval():
  estimate = stats.median_ci([1.3])
  assert estimate == stats.Estimate(1.3, -math.inf, math.inf, 1)
  assert stats.verdict(estimate, 1.2) == stats.UNRESOLVED


def test_invalid_samples_are_refused():
  with pytest.raises(ValueError, match='non-empty'):
    stats.median_ci([])
  with pytest.raises(ValueError, match='Unpaired'):
    stats.ratio_estimate([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
  'target, expected',
  [
    (1.2, stats.MET),
    (1.1, stats.MET),  # The interval's top on the target.
    (1.0, stats.UNRESOLVED),
    (0.9, stats.UNRESOLVED),  # The interval's bottom on the target.
    (0.85, stats.MISSED),
  ],
)
def test_verdict(target, expected):
  assert stats.verdict(stats.Estimate(1.0, 0.9, 1.1, 20), target) == expected


def test_block_order_rotates():
  labels = ['a', 'b', 'c']
  assert [stats.block_order(labels, block) for block in range(4)] == [
    ['a', 'b', 'c'],
    ['b', 'c', 'a'],
    ['c', 'a', 'b'],
    ['a', 'b', 'c'],
  ]


def test_interleave_alternates_and_drops_the_warmup_block():
  calls = []

  def measure(label):
    def call():
      calls.append(label)
      return len(calls)  # The call's position in the run.

    return call

  values = stats.interleave({'a': measure('a'), 'b': measure('b')}, 3, warmup=1)
  assert calls == ['a', 'b', 'b', 'a', 'a', 'b', 'b', 'a']
  np.testing.assert_array_equal(values['a'], [4.0, 5.0, 8.0])
  np.testing.assert_array_equal(values['b'], [3.0, 6.0, 7.0])


def test_interleave_keeps_tuple_measurements():
  values = stats.interleave({'x': lambda: (1.0, 2.0)}, 2, warmup=0)
  np.testing.assert_array_equal(values['x'], [[1.0, 2.0], [1.0, 2.0]])


def test_timed_and_repeat_call_once_per_measurement():
  counter = itertools.count(1)
  assert isinstance(stats.timed(lambda: next(counter))(), float)
  seconds, results = stats.repeat(lambda: next(counter), 3)
  assert len(seconds) == 3 and results == [2, 3, 4]
