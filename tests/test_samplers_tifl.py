"""TiFL (`samplers.tifl`): tiers, credits, re-ranking and selection against hand computations."""

import numpy as np
import pytest

from tff_sampling import samplers
from tff_sampling.samplers import tifl


def test_tiers_by_latency_by_hand():
  # Sorted by latency: clients 1 (1 s), 3 (2 s) | 2 (3 s), 4 (4 s) | 0 (5 s), 5 (6 s).
  np.testing.assert_array_equal(tifl.tiers_by_latency([5, 1, 3, 2, 4, 6], 3), [2, 0, 1, 0, 1, 2])
  # 7 clients in 3 tiers of ⌈7 / 3⌉ = 3: the last tier holds one.
  np.testing.assert_array_equal(tifl.tiers_by_latency(np.arange(7.0), 3), [0, 0, 0, 1, 1, 1, 2])


def test_reranking_gives_the_worst_tier_the_most():
  # Tiers 0-2 have credits (n = 3, D = 6), tier 3 none. Tier 2 was never seen (counts as the
  # worst): 3/6; tier 1 (loss 0.9): 2/6; tier 0 (0.5): 1/6; tier 3: 0.
  probability = tifl.reranked(np.array([0.5, 0.9, np.nan, 0.1]), np.array([1, 1, 1, 0]))
  np.testing.assert_allclose(probability, [1 / 6, 2 / 6, 3 / 6, 0.0])
  assert not tifl.reranked(np.ones(2), np.zeros(2, np.int64)).any()


def test_a_round_draws_one_tier_then_its_clients_and_spends_a_credit():
  latency = np.arange(12.0)  # Tiers of 4: 0-3, 4-7, 8-11.
  sampler = tifl.TiflSampler(2, latency, seed=0, rounds=6, num_tiers=3, interval=3)
  state = sampler.initialize(samplers.Population(np.full(12, 10)))
  assert list(state.credits) == [2, 2, 2]  # ⌈6 / 3⌉ each.
  available = np.ones(12, bool)
  available[[4, 5, 6]] = False
  last = [1 / 3] * 3
  for round_num in range(1, 7):
    selection = sampler.select(state, round_num, available)
    tier = int(selection.diagnostics['tifl_tier'])
    assert selection.clients.size == (1 if tier == 1 else 2)  # Tier 1 has one available.
    assert all(sampler.tier[c] == tier and available[c] for c in selection.clients)
    before = state.credits[tier]
    state = sampler.observe(state, selection, {'loss': np.full(selection.clients.size, tier)})
    assert state.credits[tier] == before - 1 and state.loss[tier] == tier
    if round_num % 3:  # Between updates the probabilities stay.
      assert state.probability.tolist() == last
    else:  # Every I = 3 rounds they are re-ranked by the losses seen (tested above).
      np.testing.assert_allclose(state.probability, tifl.reranked(state.loss, state.credits))
      last = state.probability.tolist()
  # Six rounds spent every credit (a tier without credits is never drawn).
  assert list(state.credits) == [0, 0, 0]
  assert int(state.rounds) == 6


def test_tiers_are_drawn_as_often_as_their_probabilities_say():
  # 3,000 draws with probabilities 0.5, 0.3, 0.2 and enough credits: each count within 4.5
  # standard deviations of its mean (binomial; two-sided p < 1e-5 each).
  sampler = tifl.TiflSampler(1, np.arange(6.0), seed=4, rounds=10**6, num_tiers=3)
  state = sampler.initialize(samplers.Population(np.full(6, 10)))
  state = state._replace(probability=np.array([0.5, 0.3, 0.2]))
  draws = [
    int(sampler.select(state, r, np.ones(6, bool)).diagnostics['tifl_tier']) for r in range(1, 3001)
  ]
  counts = np.bincount(draws, minlength=3)
  for count, p in zip(counts, (0.5, 0.3, 0.2)):
    assert abs(count - 3000 * p) < 4.5 * np.sqrt(3000 * p * (1 - p)), counts


def test_bad_arguments():
  with pytest.raises(ValueError, match='latency must hold a finite value'):
    tifl.TiflSampler(2, [1.0, np.nan, 2.0], seed=0, rounds=5, num_tiers=2)
  with pytest.raises(ValueError, match='3 latencies for a population of 4'):
    tifl.TiflSampler(1, [1.0, 2.0, 3.0], seed=0, rounds=5, num_tiers=2).initialize(
      samplers.Population(np.full(4, 10))
    )
