"""Tests for tff_sampling/samplers/md.py (MD sampling, the clustered-sampling baseline)."""

import numpy as np
import pytest
from scipy import stats

from tff_sampling import samplers
from tff_sampling.samplers import md

_SIZES = np.array([50, 10, 30, 5, 80, 25, 40, 60, 15, 35], np.int64)
_POPULATION = samplers.Population(num_examples=_SIZES)
_ALPHA = 1e-3  # False-alarm rate of every statistical test here.


def _sampler(num_draws=4, seed=0, population=_POPULATION):
  sampler = md.MDSampler(num_draws, seed=seed)
  state = sampler.initialize(population)
  return sampler, state


def _all(population=_POPULATION):
  return np.ones(population.size, bool)


def test_slots_weights_and_empty_state():
  sampler, state = _sampler(num_draws=6)
  assert state == ()
  selection = sampler.select(state, 1, _all())
  assert selection.clients.shape == (6,) and selection.clients.dtype == np.int64
  np.testing.assert_array_equal(selection.weights, np.full(6, 1 / 6, np.float32))
  assert sampler.observe(state, selection, {}) == ()


def test_a_client_drawn_twice_appears_twice():
  # Two clients, ten draws: some client is drawn at least five times.
  sampler, state = _sampler(
    num_draws=10, population=samplers.Population(np.array([1, 1], np.int64))
  )
  clients = sampler.select(state, 0, np.ones(2, bool)).clients
  assert clients.shape == (10,)
  assert np.bincount(clients, minlength=2).max() >= 5


def test_draw_frequencies_match_m_p():
  # Each draw is Categorical(p): over R rounds of m draws, the counts of the
  # clients are Multinomial(R m, p). Pearson chi-square at level 1e-3.
  num_draws, rounds = 4, 2000
  sampler, state = _sampler(num_draws=num_draws, seed=5)
  counts = np.zeros(_POPULATION.size)
  for r in range(rounds):
    counts += np.bincount(sampler.select(state, r, _all()).clients, minlength=_POPULATION.size)
  expected = rounds * num_draws * _SIZES / _SIZES.sum()
  _, p_value = stats.chisquare(counts, expected)
  assert p_value > _ALPHA
  # Per round the expected number of draws of client i is m p_i.
  np.testing.assert_allclose(counts / rounds, num_draws * _SIZES / _SIZES.sum(), atol=0.1)


def test_deterministic_in_seed_and_round_and_restart_equivalent():
  a, a_state = _sampler(seed=3)
  for r in range(1, 7):
    a.select(a_state, r, _all())
  # A fresh sampler (a restart: initialize, then round 7) reproduces round 7.
  b, b_state = _sampler(seed=3)
  np.testing.assert_array_equal(
    a.select(a_state, 7, _all()).clients, b.select(b_state, 7, _all()).clients
  )
  rounds = [a.select(a_state, r, _all()).clients for r in range(7, 12)]
  assert any(not np.array_equal(rounds[0], other) for other in rounds[1:])
  c, c_state = _sampler(seed=4)
  assert any(
    not np.array_equal(a.select(a_state, r, _all()).clients, c.select(c_state, r, _all()).clients)
    for r in range(5)
  )


def test_only_available_clients_renormalised():
  available = np.zeros(_POPULATION.size, bool)
  available[[1, 4, 7]] = True  # Sizes 10, 80, 60.
  sampler, state = _sampler(num_draws=5, seed=2)
  counts = np.zeros(_POPULATION.size)
  rounds = 1000
  for r in range(rounds):
    counts += np.bincount(sampler.select(state, r, available).clients, minlength=_POPULATION.size)
  assert counts[~available].sum() == 0
  expected = rounds * 5 * np.array([10, 80, 60]) / 150
  _, p_value = stats.chisquare(counts[available], expected)
  assert p_value > _ALPHA


def test_draw_categorical_is_exact_and_skips_zero_mass():
  rng = np.random.default_rng(0)
  units = np.array([[0, 3, 0, 1, 0], [0, 0, 0, 0, 7], [2, 0, 0, 0, 0]], np.int64)
  draws = np.stack([md.draw_categorical(rng, units) for _ in range(2000)])
  assert set(draws[:, 0].tolist()) == {1, 3}
  assert set(draws[:, 1].tolist()) == {4}
  assert set(draws[:, 2].tolist()) == {0}
  # Row 0 draws index 1 with probability 3/4.
  low, high = stats.binom.interval(1 - _ALPHA, 2000, 0.75)
  assert low <= np.sum(draws[:, 0] == 1) <= high


@pytest.mark.parametrize('bad', [0, -3, 2.5, '4', True, None])
def test_rejects_bad_num_draws(bad):
  with pytest.raises(ValueError, match='num_draws must be a positive integer'):
    md.MDSampler(bad, seed=0)


@pytest.mark.parametrize(
  'sizes, match',
  [
    ([3, 0, 2], r'client_sizes must be positive integers.*got 0 at index 1'),
    ([3, -1], r'client_sizes must be positive integers.*got -1 at index 1'),
    ([2.5, 3.0], r'client_sizes must be positive integers.*got 2.5 at index 0'),
    ([1.0, np.nan], r'client_sizes must be positive integers.*index 1'),
    ([], 'client_sizes must be a non-empty 1-D array'),
  ],
)
def test_rejects_bad_client_sizes(sizes, match):
  with pytest.raises(ValueError, match=match):
    md.MDSampler(2, seed=0).initialize(samplers.Population(np.array(sizes)))


def test_rejects_bad_availability_and_uninitialized_use():
  sampler, state = _sampler()
  with pytest.raises(ValueError, match='No client is available in round 3'):
    sampler.select(state, 3, np.zeros(_POPULATION.size, bool))
  with pytest.raises(ValueError, match=r'available must have shape \(10,\)'):
    sampler.select(state, 3, np.ones(4, bool))
  with pytest.raises(RuntimeError, match='before initialize'):
    md.MDSampler(2, seed=0).select((), 1, _all())
