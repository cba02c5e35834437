"""Tests for tff_sampling/samplers/target.py."""

import numpy as np
import pytest

from tff_sampling import samplers


def test_one_client_per_group_every_round_and_deterministic():
  groups = np.repeat(np.arange(10), 10)
  sampler = samplers.TargetSampler(groups, seed=1)
  state = sampler.initialize(samplers.Population(np.full(100, 14)))
  for r in range(20):
    selection = sampler.select(state, r, np.ones(100, bool))
    assert sorted(groups[selection.clients].tolist()) == list(range(10))
    np.testing.assert_allclose(selection.weights, 0.1)
  again = samplers.TargetSampler(groups, seed=1).select((), 3, np.ones(100, bool))
  np.testing.assert_array_equal(sampler.select(state, 3, np.ones(100, bool)).clients, again.clients)


def test_groups_with_nobody_available_are_skipped():
  groups = np.array([0, 0, 1, 1, 2])
  sampler = samplers.TargetSampler(groups, seed=0)
  selection = sampler.select((), 0, np.array([True, False, False, False, True]))
  assert selection.clients.tolist() == [0, 4]
  with pytest.raises(ValueError, match='No client is available'):
    sampler.select((), 0, np.zeros(5, bool))
  with pytest.raises(ValueError, match='3 group labels for 4 clients'):
    samplers.TargetSampler(np.array([0, 1, 2]), seed=0).initialize(samplers.Population(np.ones(4)))
