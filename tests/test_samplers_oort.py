"""Oort (`samplers.oort`): scores, selection, observation and pacer against hand computations."""

import math

import numpy as np
import pytest

from tff_sampling import samplers
from tff_sampling.samplers import oort


def _state(utility, last_round, seconds=None, exploration=0.9, threshold=30.0, history=()):
  n = len(utility)
  return oort.OortState(
    utility=np.asarray(utility, np.float64),
    seconds=np.zeros(n) if seconds is None else np.asarray(seconds, np.float64),
    last_round=np.asarray(last_round, np.int64),
    selections=np.zeros(n, np.int64),
    exploration=np.array(exploration),
    threshold=np.array(threshold),
    exploited_utility=np.asarray(history, np.float64),
    rounds=np.array(0, np.int64),
    num_examples=np.full(n, 10, np.int64),
  )


def test_scores_by_hand():
  # Utilities 10, 20, 30, 40; clipped at the 95% quantile (index min(int(4 × 0.95), 3) = 3:
  # 40, no clipping); low = 0.999 × 10 = 9.99, spread 30.01; bonus sqrt(0.1 ln 3 / last round).
  state = _state([10, 20, 30, 40], [1, 1, 2, 2])
  sampler = oort.OortSampler(2, seed=0)
  expected = [
    (u - 9.99) / 30.01 + math.sqrt(0.1 * math.log(3) / r)
    for u, r in zip([10, 20, 30, 40], [1, 1, 2, 2])
  ]
  np.testing.assert_allclose(sampler.scores(state, 3, np.arange(4)), expected, rtol=1e-12)
  # Durations 1-4 s with the 50th percentile preferred: T = sorted[int(4 × 0.5)] = 3 s, so the
  # 4 s client is penalised by (3 / 4)^2.
  timed = state._replace(seconds=np.array([1.0, 2.0, 3.0, 4.0]), threshold=np.array(50.0))
  assert sampler.preferred_seconds(timed) == 3.0
  penalised = sampler.scores(timed, 3, np.arange(4))
  np.testing.assert_allclose(penalised[:3], expected[:3], rtol=1e-12)
  assert penalised[3] == pytest.approx(expected[3] * (3 / 4) ** 2)
  # At the 100th percentile nothing is penalised.
  assert sampler.preferred_seconds(timed._replace(threshold=np.array(100.0))) == math.inf


def test_a_round_explores_a_share_and_exploits_the_rest():
  # 6 explored clients (0-5), 6 never seen (6-11). ε: 0.5 × decay 1 = 0.5, so a cohort of 4
  # explores int(4 × 0.5) = 2 and exploits 2.
  config = oort.OortConfig(exploration=0.5, decay=1.0, exploration_min=0.0)
  sampler = oort.OortSampler(4, seed=3, config=config)
  state = _state([5, 6, 7, 8, 9, 10, 100, 90, 80, 70, 60, 50], [1] * 6 + [0] * 6, exploration=0.5)
  everyone = np.ones(12, bool)
  selection = sampler.select(state, 2, everyone)
  assert len(set(selection.clients)) == 4
  assert sum(c >= 6 for c in selection.clients) == 2  # Explored now.
  assert selection.diagnostics['oort_exploited'] == 2.0
  np.testing.assert_array_equal(sampler.select(state, 2, everyone).clients, selection.clients)
  # Exploration draws from the sample_window × 2 = 10 largest unexplored: with 12 unexplored
  # of sizes 1..12 and two to explore (ε = 1), the two smallest are never chosen.
  sizes = _state(list(range(1, 13)), [0] * 12)
  config = oort.OortConfig(exploration=1.0, decay=1.0, sample_window=5.0)
  single = oort.OortSampler(2, seed=1, config=config)
  picked = set()
  for round_num in range(1, 400):
    picked |= set(single.select(sizes, round_num, np.ones(12, bool)).clients)
  assert picked == set(range(2, 12))
  # Unavailable clients are never chosen.
  half = np.arange(12) % 2 == 0
  assert all(half[c] for c in sampler.select(state, 2, half).clients)


def test_the_cohort_is_full_once_few_or_no_clients_are_left_to_explore():
  # ε = 0.5 of 4 would explore 2; with 1 unexplored client, 3 are exploited, and with none
  # (every client seen) all 4: the cohort never shrinks while 4 clients are available.
  config = oort.OortConfig(exploration=0.5, decay=1.0, exploration_min=0.5)
  sampler = oort.OortSampler(4, seed=3, config=config)
  everyone = np.ones(8, bool)
  one_left = _state(range(1, 9), [1] * 7 + [0], exploration=0.5)
  selection = sampler.select(one_left, 2, everyone)
  assert len(set(selection.clients)) == 4 and 7 in selection.clients
  assert selection.diagnostics['oort_exploited'] == 3.0
  for round_num in range(2, 30):
    seen = sampler.select(_state(range(1, 9), [1] * 8, exploration=0.5), round_num, everyone)
    assert len(set(seen.clients)) == 4 and seen.diagnostics['oort_exploited'] == 4.0
  # Fewer available than the cohort: every available client, once.
  three = np.arange(8) < 3
  assert sorted(sampler.select(one_left, 2, three).clients) == [0, 1, 2]


def test_observe_records_utility_duration_round_and_moves_epsilon():
  config = oort.OortConfig(exploration=0.9, decay=0.5, exploration_min=0.3)
  sampler = oort.OortSampler(2, seed=0, config=config)
  state = sampler.initialize(samplers.Population(np.array([10, 20, 30])))
  assert list(state.utility) == [10, 20, 30]  # Before exploration: the client's size.
  selection = samplers.Selection(clients=np.array([2, 0]))
  after = sampler.observe(state, selection, {'loss': np.array([0.5, 2.0]), 'seconds': [4.0, 1.5]})
  np.testing.assert_allclose(after.utility, [20.0, 20.0, 15.0])  # 10 × 2.0, unchanged, 30 × 0.5.
  np.testing.assert_allclose(after.seconds, [1.5, 0.0, 4.0])
  np.testing.assert_array_equal(after.last_round, [1, 0, 1])
  np.testing.assert_array_equal(after.selections, [1, 0, 1])
  assert float(after.exploration) == 0.45  # 0.9 × 0.5.
  assert float(sampler.observe(after, selection, {'loss': [1.0, 1.0]}).exploration) == 0.3
  # Nobody was exploited in round 1: the pacer's history (40 rounds) ends with 0.
  assert after.exploited_utility.shape == (40,) and after.exploited_utility[-1] == 0.0
  assert np.isnan(after.exploited_utility[:-1]).all() and int(after.rounds) == 1


def test_a_straggler_is_explored_with_its_duration_and_the_kept_mean_utility():
  # Clients 2 and 0 were kept (utilities 30 × 0.5 = 15 and 10 × 2 = 20, mean 17.5); of the
  # missed, client 1 finished too late (9 s) and client 3 dropped out (inf).
  sampler = oort.OortSampler(4, seed=0)
  state = sampler.initialize(samplers.Population(np.array([10, 20, 30, 40])))
  missed = samplers.Missed(clients=np.array([1, 3]), seconds=np.array([9.0, np.inf]))
  selection = samplers.Selection(clients=np.array([2, 0]), missed=missed)
  after = sampler.observe(state, selection, {'loss': np.array([0.5, 2.0]), 'seconds': [4.0, 1.5]})
  np.testing.assert_allclose(after.utility, [20.0, 17.5, 15.0, 40.0])
  np.testing.assert_allclose(after.seconds, [1.5, 9.0, 4.0, 0.0])
  np.testing.assert_array_equal(after.last_round, [1, 1, 1, 0])  # The drop-out: unexplored.
  np.testing.assert_array_equal(after.selections, [1, 1, 1, 0])
  # Nobody kept: a straggler's utility is 0, and it is explored all the same.
  nobody = samplers.Selection(clients=np.zeros(0, np.int64), missed=missed)
  alone = sampler.observe(state, nobody, {'loss': np.zeros(0), 'seconds': np.zeros(0)})
  np.testing.assert_allclose(alone.utility, [10.0, 0.0, 30.0, 40.0])
  np.testing.assert_array_equal(alone.last_round, [0, 1, 0, 0])
  # Explored, the straggler is scored, and penalised for its 9 s: T, the 30th percentile of
  # the known durations (1.5, 4, 9 s), is sorted[int(3 × 0.3)] = 1.5 s.
  assert sampler.preferred_seconds(after) == 1.5
  unpenalised = sampler.scores(after._replace(threshold=np.array(100.0)), 2, np.arange(3))
  ratio = sampler.scores(after, 2, np.arange(3)) / unpenalised
  np.testing.assert_allclose(ratio, [1.0, (1.5 / 9.0) ** 2, (1.5 / 4.0) ** 2], rtol=1e-12)


def test_pacer_relaxes_a_flat_utility_and_tightens_a_jump():
  sampler = oort.OortSampler(2, seed=0, config=oort.OortConfig(pacer_window=2, pacer_step=5.0))
  # At the start of round 5 (every 2 rounds, from round 4 on): rounds 1-2 summed 2.0, rounds
  # 3-4 summed 2.1, within 10%: +5 points.
  assert sampler._paced(30.0, np.array([1.0, 1.0, 1.0, 1.1]), 4) == 35.0
  assert sampler._paced(30.0, np.array([1.0, 1.0, 1.0, 1.1]), 5) == 30.0  # Not a multiple of W.
  assert sampler._paced(30.0, np.array([1.0, 1.0, 1.0, 2.0]), 4) == 30.0  # Grew by 50%.
  assert sampler._paced(30.0, np.array([1.0, 1.0, 6.0, 6.0]), 4) == 25.0  # 5 × or more.
  assert sampler._paced(98.0, np.array([1.0, 1.0, 1.0, 1.0]), 4) == 100.0  # Capped at 100.


def test_the_selection_cap_leaves_out_the_most_selected():
  config = oort.OortConfig(exploration=0.0, decay=1.0, exploration_min=0.0, max_selections=3)
  sampler = oort.OortSampler(2, seed=0, config=config)
  state = _state([1, 2, 3, 4, 5], [1] * 5)._replace(selections=np.array([9, 4, 0, 0, 0]))
  # Clients 0 and 1 were kept more than 3 times, but at most int(0.3 × 5) = 1 is left out: the
  # most selected, client 0.
  for round_num in range(2, 60):
    assert 0 not in sampler.select(state, round_num, np.ones(5, bool)).clients
