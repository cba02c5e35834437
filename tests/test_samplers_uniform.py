"""Tests for tff_sampling/samplers/uniform.py and the sampler base."""

import numpy as np
import pytest
from scipy import stats

from tff_sampling import samplers

_POPULATION = samplers.Population(num_examples=np.arange(1, 51))


def _select(sampler, round_num, available=None):
  state = sampler.initialize(_POPULATION)
  if available is None:
    available = np.ones(_POPULATION.size, bool)
  return sampler.select(state, round_num, available)


def test_distinct_clients_of_the_requested_size():
  selection = _select(samplers.UniformSampler(10, seed=3), 1)
  assert selection.clients.shape == (10,)
  assert len(set(selection.clients.tolist())) == 10
  assert selection.weights is None


def test_deterministic_in_seed_and_round_and_restart_equivalent():
  a, b = samplers.UniformSampler(10, seed=3), samplers.UniformSampler(10, seed=3)
  # A fresh sampler ("restarted") reproduces round 7 without replaying rounds 1-6.
  for r in range(1, 7):
    _select(a, r)
  np.testing.assert_array_equal(_select(a, 7).clients, _select(b, 7).clients)
  assert not np.array_equal(_select(a, 7).clients, _select(a, 8).clients)
  assert not np.array_equal(
    _select(a, 7).clients, _select(samplers.UniformSampler(10, seed=4), 7).clients
  )


def test_only_available_clients_and_budget_capped():
  available = np.zeros(_POPULATION.size, bool)
  available[[3, 5, 8, 13]] = True
  selection = _select(samplers.UniformSampler(10, seed=0), 2, available)
  np.testing.assert_array_equal(selection.clients, [3, 5, 8, 13])
  available[:] = False
  with pytest.raises(ValueError, match='No client is available in round 2'):
    _select(samplers.UniformSampler(10, seed=0), 2, available)


def test_inclusion_frequencies_are_uniform():
  # 2,000 rounds of 10 out of 50: each client is included ~ Binomial(2000, 0.2).
  sampler = samplers.UniformSampler(10, seed=11)
  counts = np.zeros(_POPULATION.size)
  for r in range(2000):
    counts[_select(sampler, r).clients] += 1
  # Chi-square goodness of fit of the inclusion counts; 1e-3 false-alarm rate.
  _, p_value = stats.chisquare(counts)
  assert p_value > 1e-3
  # And every client inside a 99.99% binomial interval.
  low, high = stats.binom.interval(0.9999, 2000, 0.2)
  assert counts.min() >= low and counts.max() <= high


@pytest.mark.parametrize('bad', [0, -3, 2.5, '10'])
def test_rejects_bad_cohort_size(bad):
  with pytest.raises(ValueError, match='clients_per_round must be a positive integer'):
    samplers.UniformSampler(bad, seed=0)


def test_rejects_cohort_larger_than_population():
  with pytest.raises(ValueError, match='clients_per_round=51 exceeds the population of 50'):
    samplers.UniformSampler(51, seed=0).initialize(_POPULATION)


def test_round_rng_streams_are_independent():
  a = samplers.round_rng(1, 2, 0).integers(1 << 30, size=4)
  b = samplers.round_rng(1, 2, 1).integers(1 << 30, size=4)
  again = samplers.round_rng(1, 2, 0).integers(1 << 30, size=4)
  np.testing.assert_array_equal(a, again)
  assert not np.array_equal(a, b)
