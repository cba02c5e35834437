"""Tests for tff_sampling/samplers/power_of_choice.py."""

import numpy as np
import pytest
from scipy import stats

from tff_sampling import samplers

_POPULATION = samplers.Population(num_examples=np.array([10, 20, 30, 40, 100, 200, 5, 95]))


def test_keeps_the_highest_losses_among_the_candidates():
  sampler = samplers.PowerOfChoiceSampler(2, num_candidates=5, seed=1)
  state = sampler.initialize(_POPULATION)
  candidates = sampler.candidates(state, 3, np.ones(8, bool))
  losses = {int(c): float(i) for i, c in enumerate(candidates)}  # Later draws lose more.
  selection = sampler.select(
    state, 3, np.ones(8, bool), probe=lambda cs: np.array([losses[int(c)] for c in cs])
  )
  assert set(selection.clients.tolist()) == set(candidates[-2:].tolist())
  assert selection.weights is None


def test_candidates_are_distinct_available_and_favour_large_clients():
  sampler = samplers.PowerOfChoiceSampler(1, num_candidates=1, seed=2)
  state = sampler.initialize(_POPULATION)
  available = np.ones(8, bool)
  available[5] = False  # The largest client is away.
  counts = np.zeros(8)
  for r in range(4000):
    counts[sampler.candidates(state, r, available)] += 1
  assert counts[5] == 0
  # With one candidate, the draw is Categorical(n_k / Σ n) over available clients.
  expected = (
    np.where(available, _POPULATION.num_examples, 0)
    / _POPULATION.num_examples[available].sum()
    * 4000
  )
  _, p_value = stats.chisquare(counts[available], expected[available])
  assert p_value > 1e-3
  many = samplers.PowerOfChoiceSampler(2, num_candidates=7, seed=2).candidates(state, 0, available)
  assert len(set(many.tolist())) == 7 and 5 not in many


def test_non_finite_losses_rank_last_and_probe_shape_is_checked():
  sampler = samplers.PowerOfChoiceSampler(1, num_candidates=3, seed=0)
  state = sampler.initialize(_POPULATION)
  selection = sampler.select(
    state, 0, np.ones(8, bool), probe=lambda cs: np.array([np.nan, 1.0, np.inf])
  )
  assert selection.clients.tolist() == [sampler.candidates(state, 0, np.ones(8, bool))[1]]
  with pytest.raises(ValueError, match='returned shape'):
    sampler.select(state, 0, np.ones(8, bool), probe=lambda cs: np.zeros(2))
  with pytest.raises(ValueError, match='needs the loss probe'):
    sampler.select(state, 0, np.ones(8, bool))


@pytest.mark.parametrize(
  'kwargs,match',
  [
    (dict(clients_per_round=0, num_candidates=3), 'clients_per_round must be a positive'),
    (dict(clients_per_round=4, num_candidates=3), 'num_candidates=3 must be at least'),
  ],
)
def test_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    samplers.PowerOfChoiceSampler(seed=0, **kwargs)
