"""Tests for tff_sampling/samplers/lefl.py (Abebe, Munoz, Jannesari, LEFL).

Checked: the KL matrix against a hand-computed 3-client case, a zero-probability
case, a naive double loop (also with tiny blocks), its zero diagonal and
asymmetry; k-means recovering planted groups (adjusted Rand index 1) and the
default ``⌈log2 N⌉``; canonical labels; the per-cluster and proportional
allocations by hand; availability; uniform draws within clusters (99.99%
binomial intervals and chi-square at 1e-3); the weights; determinism and
restart from a checkpoint; `label_distribution_kl`; the errors.
"""

import asyncio
import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics

from tff_sampling import samplers
from tff_sampling import selection_stats
from tff_sampling.samplers import lefl

LN2, LN3 = math.log(2.0), math.log(3.0)


def _hand_soft_labels():
  # 3 clients, 2 public examples, 2 classes.
  return np.array(
    [[[0.5, 0.5], [0.5, 0.5]], [[0.75, 0.25], [0.5, 0.5]], [[0.25, 0.75], [0.25, 0.75]]]
  )


def _naive_kl(soft_labels, floor=lefl.DEFAULT_FLOOR):
  p = np.asarray(soft_labels, np.float64)
  n, num_examples, _ = p.shape
  out = np.zeros((n, n))
  for i in range(n):
    for j in range(n):
      total = 0.0
      for x in range(num_examples):
        pi, pj = p[i, x], p[j, x]
        mask = pi > 0
        total += np.sum(
          pi[mask] * (np.log(np.maximum(pi[mask], floor)) - np.log(np.maximum(pj[mask], floor)))
        )
      out[i, j] = total / num_examples
  return out


def _planted(seed, group_sizes, num_examples=30, classes_per_group=3, noise=0.05):
  """Soft labels concentrated on disjoint class sets per group, plus noise."""
  rng = np.random.default_rng(seed)
  num_classes = classes_per_group * len(group_sizes)
  truth = np.repeat(np.arange(len(group_sizes)), group_sizes)
  rows = []
  for g in truth:
    base_mass = np.full(num_classes, noise / num_classes)
    base_mass[g * classes_per_group : (g + 1) * classes_per_group] += (
      1 - noise
    ) / classes_per_group
    rows.append(rng.dirichlet(50 * base_mass * num_classes, size=num_examples))
  return np.stack(rows), truth


# ------------------------------------------------------------------------------
# kl_matrix.


def test_kl_matrix_hand_computed():
  s = lefl.kl_matrix(_hand_soft_labels())
  # S_01 = ½[½ln(.5/.75) + ½ln(.5/.25)] = ¼ln(4/3); S_10 = ½[¾ln(3/2) + ¼ln(1/2)].
  expected = np.array(
    [
      [0.0, (2 * LN2 - LN3) / 4, (2 * LN2 - LN3) / 2],
      [(3 * LN3 - 4 * LN2) / 8, 0.0, LN2 / 2],
      [0.75 * LN3 - LN2, (5 * LN3 - 4 * LN2) / 8, 0.0],
    ]
  )
  np.testing.assert_allclose(s, expected, rtol=1e-12, atol=1e-15)
  assert s.dtype == np.float64
  assert not np.allclose(s, s.T)  # Asymmetry preserved.
  np.testing.assert_array_equal(np.diag(s), 0.0)


def test_kl_matrix_zero_probabilities_use_the_floor():
  p = np.array([[[1.0, 0.0]], [[0.5, 0.5]]])
  s = lefl.kl_matrix(p)
  # 0·log 0 = 0: KL([1, 0] ‖ [.5, .5]) = ln 2. The other way the zero is
  # clipped to 1e-12: ½ln(.5/1) + ½ln(.5/1e-12) = ln(.5) + 6 ln 10.
  np.testing.assert_allclose(s[0, 1], LN2, rtol=1e-12)
  np.testing.assert_allclose(s[1, 0], math.log(0.5) + 6 * math.log(10.0), rtol=1e-12)
  np.testing.assert_allclose(
    lefl.kl_matrix(p, floor=1e-6)[1, 0], math.log(0.5) + 3 * math.log(10.0), rtol=1e-12
  )
  assert np.all(np.isfinite(s))


@pytest.mark.parametrize('seed', [0, 1])
def test_kl_matrix_matches_a_double_loop(seed, monkeypatch):
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.full(5, 0.4), size=(9, 7)).astype(np.float32)
  p[0, 0] = [1, 0, 0, 0, 0]  # Zeros on both sides of a KL.
  p[3, 2] = [0, 0, 0.5, 0.5, 0]
  p64 = p.astype(np.float64)
  expected = np.maximum(_naive_kl(p64 / p64.sum(axis=2, keepdims=True)), 0.0)
  np.testing.assert_allclose(lefl.kl_matrix(p), expected, rtol=1e-10, atol=1e-12)
  # Blocks of one public example give the same matrix.
  monkeypatch.setattr(lefl, '_BLOCK_BYTES', 1)
  np.testing.assert_allclose(lefl.kl_matrix(p), expected, rtol=1e-10, atol=1e-12)
  s = lefl.kl_matrix(p)
  np.testing.assert_array_equal(np.diag(s), 0.0)
  assert np.all(s >= 0)


def test_identical_clients_have_zero_kl():
  p = _hand_soft_labels()[[0, 1, 0]]
  s = lefl.kl_matrix(p)
  assert s[0, 2] == 0.0 and s[2, 0] == 0.0


@pytest.mark.parametrize(
  'bad, match',
  [
    (np.ones((3, 2)), 'non-empty 3-D array'),
    (np.ones((3, 0, 2)), 'non-empty 3-D array'),
    (np.array([[[0.5, np.nan]]]), 'finite and non-negative; client 0'),
    (np.array([[[0.5, 0.5]], [[1.5, -0.5]]]), 'finite and non-negative; client 1'),
    (np.array([[[0.5, 0.5], [2.0, 3.0]]]), r'soft_labels\[0, 1\] sums to 5.*softmax outputs'),
  ],
)
def test_kl_matrix_rejects_bad_soft_labels(bad, match):
  with pytest.raises(ValueError, match=match):
    lefl.kl_matrix(bad)


def test_kl_matrix_rejects_bad_floor():
  with pytest.raises(ValueError, match=r'floor must be a number in \(0, 1\)'):
    lefl.kl_matrix(_hand_soft_labels(), floor=0.0)


# ------------------------------------------------------------------------------
# cluster_clients.


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
def test_clustering_recovers_planted_groups(seed):
  soft, truth = _planted(seed, [7, 9, 8])
  labels = lefl.cluster_clients(lefl.kl_matrix(soft), num_clusters=3, seed=seed)
  assert labels.dtype == np.int64
  assert metrics.adjusted_rand_score(truth, labels) == 1.0
  np.testing.assert_array_equal(labels, truth)  # Canonical: numbered by first member.


@pytest.mark.parametrize('seed', [0, 5])
def test_default_number_of_clusters_recovers_planted_groups(seed):
  # N = 8: ⌈log2 8⌉ = 3 clusters, the planted number; members shuffled.
  soft, truth = _planted(seed, [3, 3, 2])
  order = np.random.default_rng(seed).permutation(8)
  labels = lefl.cluster_clients(lefl.kl_matrix(soft[order]), seed=seed)
  assert metrics.adjusted_rand_score(truth[order], labels) == 1.0
  assert labels[0] == 0 and labels.max() == 2


@pytest.mark.parametrize(
  'n, k', [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (24, 5), (1000, 10), (1025, 11)]
)
def test_default_num_clusters_is_ceil_log2(n, k):
  assert lefl.default_num_clusters(n) == k


def test_default_num_clusters_used_on_distinct_rows():
  soft = np.random.default_rng(3).dirichlet(np.ones(4), size=(24, 5))
  labels = lefl.cluster_clients(lefl.kl_matrix(soft), seed=0)
  assert labels.max() + 1 == 5  # ⌈log2 24⌉.
  sampler = samplers.LeflSampler(3, soft_labels=soft, seed=0)
  assert sampler.num_clusters == 5


def test_clustering_is_deterministic_in_the_seed():
  soft = np.random.default_rng(4).dirichlet(np.ones(4), size=(40, 5))
  s = lefl.kl_matrix(soft)
  np.testing.assert_array_equal(lefl.cluster_clients(s, seed=7), lefl.cluster_clients(s, seed=7))


def test_fewer_distinct_rows_than_clusters_reduces_k():
  # Exactly two distinct rows.
  a, b = [0.0, 2.0, 0.0, 2.0, 0.0], [1.0, 0.0, 1.0, 0.0, 1.0]
  with pytest.warns(RuntimeWarning, match='only 2 non-empty clusters of the 4.*2 distinct rows'):
    labels = lefl.cluster_clients(np.array([a, b, a, b, a]), num_clusters=4, seed=0)
  np.testing.assert_array_equal(labels, [0, 1, 0, 1, 0])
  # Identical clients from soft labels (their rows may differ by rounding).
  s = lefl.kl_matrix(_hand_soft_labels()[[0, 1, 0, 1, 0]])
  with pytest.warns(RuntimeWarning, match='only 2 non-empty clusters of the 4'):
    labels = lefl.cluster_clients(s, num_clusters=4, seed=0)
  np.testing.assert_array_equal(labels, [0, 1, 0, 1, 0])


def test_canonical_labels():
  np.testing.assert_array_equal(lefl.canonical_labels([5, 5, 2, 9, 2]), [0, 0, 1, 2, 1])
  np.testing.assert_array_equal(lefl.canonical_labels(np.array([3.0, 1.0])), [0, 1])
  with pytest.raises(ValueError, match='must be integers'):
    lefl.canonical_labels([0.5, 1.0])


@pytest.mark.parametrize(
  'k, match',
  [
    (0, 'num_clusters must be a positive integer, got 0'),
    (2.0, 'num_clusters must be a positive integer'),
    (4, 'num_clusters=4 exceeds the number of clients N=3; pass num_clusters <= 3'),
  ],
)
def test_cluster_clients_rejects_bad_k(k, match):
  with pytest.raises(ValueError, match=match):
    lefl.cluster_clients(lefl.kl_matrix(_hand_soft_labels()), num_clusters=k, seed=0)


def test_cluster_clients_rejects_bad_kl():
  with pytest.raises(ValueError, match='square'):
    lefl.cluster_clients(np.zeros((2, 3)), seed=0)
  with pytest.raises(ValueError, match='finite; row 1'):
    lefl.cluster_clients(np.array([[0, 1], [np.inf, 0]]), seed=0)


# ------------------------------------------------------------------------------
# Allocations.


def test_largest_remainder_by_hand():
  # 4·[5, 3, 2]/10 = [2, 1.2, 0.8] → floors [2, 1, 0], one left → cluster 2.
  np.testing.assert_array_equal(lefl.largest_remainder_allocation([5, 3, 2], 4), [2, 1, 1])
  # 5·[3, 3, 3, 1]/10 = [1.5, 1.5, 1.5, .5]: floors [1, 1, 1, 0], two left,
  # all remainders equal → the lowest indices.
  np.testing.assert_array_equal(lefl.largest_remainder_allocation([3, 3, 3, 1], 5), [2, 2, 1, 0])
  # 7·[0, 4, 2, 1]/7 = [0, 4, 2, 1] exactly; 3·[1, 1, 1, 1]/4 → [1, 1, 1, 0].
  np.testing.assert_array_equal(lefl.largest_remainder_allocation([0, 4, 2, 1], 7), [0, 4, 2, 1])
  np.testing.assert_array_equal(lefl.largest_remainder_allocation([1, 1, 1, 1], 3), [1, 1, 1, 0])


def test_largest_remainder_sums_to_budget_and_respects_counts():
  rng = np.random.default_rng(0)
  for _ in range(500):
    counts = rng.integers(0, 6, size=rng.integers(1, 8))
    if counts.sum() == 0:
      continue
    budget = int(rng.integers(0, counts.sum() + 1))
    quota = lefl.largest_remainder_allocation(counts, budget)
    assert quota.sum() == budget
    assert np.all(quota <= counts) and np.all(quota >= 0)
    assert np.all(np.abs(quota - budget * counts / counts.sum()) < 1)


def test_per_cluster_counts_by_hand():
  sizes = np.array([10, 12, 8, 1, 25, 5])
  active = np.array([10, 2, 0, 1, 25, 5])
  # rate 1/4: 2.5 → 3 (half up), 3, 2, 0.25 → max(1, 0) = 1, 6.25 → 6, 1.25 → 1;
  # cluster 1 is capped at its 2 available members, cluster 2 has none.
  np.testing.assert_array_equal(lefl.per_cluster_counts(sizes, active, 0.25), [3, 2, 0, 1, 6, 1])
  # 0.3 is read as 3/10: 0.3·5 = 1.5 → 2 (the float 0.3 is a hair below 3/10).
  assert lefl.per_cluster_counts([5], [5], 0.3)[0] == 2
  np.testing.assert_array_equal(lefl.per_cluster_counts([4, 4], [4, 4], 1), [4, 4])


# ------------------------------------------------------------------------------
# The sampler.

# 30 clients in clusters of 10, 12 and 8 (labels given out of canonical order).
_LABELS = np.array([2] * 10 + [0] * 12 + [1] * 8)
_CANONICAL = np.array([0] * 10 + [1] * 12 + [2] * 8)
_POPULATION = samplers.Population(num_examples=np.arange(1, 31))


def _available_mask():
  available = np.ones(30, bool)
  available[[0, 1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]] = False  # Cluster 2 → 0.
  available[22:30] = False  # Cluster 2 (canonical) has no available member.
  return available


def test_per_cluster_selection():
  sampler = samplers.LeflSampler(6, clusters=_LABELS, sample_rate=0.25, seed=0)
  np.testing.assert_array_equal(sampler.cluster_labels, _CANONICAL)
  state = sampler.initialize(_POPULATION)
  everyone = np.ones(30, bool)
  # 0.25·[10, 12, 8] = [2.5, 3, 2] → [3, 3, 2]: 8 clients, not 6.
  np.testing.assert_array_equal(sampler.cluster_counts(state, everyone), [3, 3, 2])
  for round_num in range(20):
    selection = sampler.select(state, round_num, everyone)
    assert selection.clients.shape == (8,)
    np.testing.assert_array_equal(
      np.bincount(_CANONICAL[selection.clients], minlength=3), [3, 3, 2]
    )
    assert np.all(np.diff(selection.clients) > 0)  # Ascending, distinct.
  # Availability: cluster 0 keeps 7 (draws 3), cluster 1 keeps 2 of 12 (capped
  # at 2), cluster 2 none (draws nothing).
  available = _available_mask()
  np.testing.assert_array_equal(sampler.cluster_counts(state, available), [3, 2, 0])
  for round_num in range(50):
    clients = sampler.select(state, round_num, available).clients
    assert np.all(available[clients])
    np.testing.assert_array_equal(np.bincount(_CANONICAL[clients], minlength=3), [3, 2, 0])
    assert set(clients[_CANONICAL[clients] == 1]) == {20, 21}


def test_default_rate_is_budget_over_population():
  sampler = samplers.LeflSampler(6, clusters=_LABELS, seed=0)
  state = sampler.initialize(_POPULATION)
  # 6/30 · [10, 12, 8] = [2, 2.4, 1.6] → [2, 2, 2].
  np.testing.assert_array_equal(sampler.cluster_counts(state, np.ones(30, bool)), [2, 2, 2])
  # A tiny cluster still contributes one client: [1] + [29 others] at 1/30.
  sampler = samplers.LeflSampler(1, clusters=[0] + [1] * 29, seed=0)
  state = sampler.initialize(_POPULATION)
  np.testing.assert_array_equal(sampler.cluster_counts(state, np.ones(30, bool)), [1, 1])
  assert sampler.select(state, 0, np.ones(30, bool)).clients.shape == (2,)


def test_proportional_selection():
  sampler = samplers.LeflSampler(7, clusters=_LABELS, allocation='proportional', seed=0)
  state = sampler.initialize(_POPULATION)
  everyone = np.ones(30, bool)
  # 7·[10, 12, 8]/30 = [2.33, 2.8, 1.87] → floors [2, 2, 1], two left → 1, 2.
  np.testing.assert_array_equal(sampler.cluster_counts(state, everyone), [2, 3, 2])
  available = _available_mask()  # Active [7, 2, 0], 9 clients.
  # 7·[7, 2, 0]/9 = [5.44, 1.56, 0] → floors [5, 1, 0], one left → cluster 1.
  np.testing.assert_array_equal(sampler.cluster_counts(state, available), [5, 2, 0])
  for round_num in range(30):
    clients = sampler.select(state, round_num, available).clients
    assert clients.shape == (7,) and np.all(available[clients])
  # Fewer available clients than the budget: all of them.
  few = np.zeros(30, bool)
  few[[4, 20, 29]] = True
  np.testing.assert_array_equal(sampler.select(state, 3, few).clients, [4, 20, 29])


def test_weights_are_example_shares():
  sampler = samplers.LeflSampler(6, clusters=_LABELS, seed=0)
  state = sampler.initialize(_POPULATION)
  selection = sampler.select(state, 4, np.ones(30, bool))
  sizes = _POPULATION.num_examples[selection.clients]
  assert selection.weights.dtype == np.float32
  np.testing.assert_allclose(selection.weights, sizes / sizes.sum(), rtol=1e-6)
  zero = sampler.initialize(samplers.Population(np.zeros(30, np.int64)))
  np.testing.assert_allclose(sampler.select(zero, 4, np.ones(30, bool)).weights, 1 / 6)


@pytest.mark.parametrize('allocation', ['per_cluster', 'proportional'])
def test_uniform_within_clusters(allocation):
  # Each available client of cluster c is included with probability
  # counts[c] / active[c]; 3,000 rounds, every client inside its 99.99%
  # binomial interval and a chi-square per cluster at 1e-3.
  rounds = 3000
  kwargs = {'sample_rate': 0.25} if allocation == 'per_cluster' else {}
  sampler = samplers.LeflSampler(7, clusters=_LABELS, allocation=allocation, seed=11, **kwargs)
  state = sampler.initialize(_POPULATION)
  available = np.ones(30, bool)
  available[[0, 1, 25]] = False
  counts = sampler.cluster_counts(state, available)
  active = np.bincount(_CANONICAL[available], minlength=3)
  inclusions = np.zeros(30)
  for round_num in range(rounds):
    inclusions[sampler.select(state, round_num, available).clients] += 1
  assert np.all(inclusions[~available] == 0)
  for c in range(3):
    members = np.flatnonzero(available & (c == _CANONICAL))
    low, high = stats.binom.interval(0.9999, rounds, counts[c] / active[c])
    assert inclusions[members].min() >= low and inclusions[members].max() <= high
    _, p_value = stats.chisquare(inclusions[members])
    assert p_value > 1e-3


def test_determinism_and_restart(tmp_path):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  soft, _ = _planted(0, [7, 9, 8])

  def make(seed=5):
    return samplers.LeflSampler(4, soft_labels=soft, num_clusters=3, seed=seed)

  sampler = make()
  state = sampler.initialize(samplers.Population(np.arange(1, 25)))
  assert state.kl.dtype == np.float32 and state.kl.shape == (24, 24)
  np.testing.assert_allclose(state.kl, lefl.kl_matrix(soft), rtol=1e-6)
  everyone = np.ones(24, bool)
  rounds = [sampler.select(state, t, everyone).clients for t in range(10)]
  for t in range(10):
    np.testing.assert_array_equal(make().select(state, t, everyone).clients, rounds[t])
  assert any(not np.array_equal(rounds[0], other) for other in rounds[1:])
  assert any(
    not np.array_equal(make(6).select(state, t, everyone).clients, rounds[t]) for t in range(10)
  )

  manager = tff.program.FileProgramStateManager(str(tmp_path))
  for round_num in range(1, 4):
    selection = sampler.select(state, round_num, everyone)
    new_state = sampler.observe(state, selection, {})
    assert new_state is state
    asyncio.run(manager.save(state, round_num))
  expected = sampler.select(state, 4, everyone)
  restarted = make()
  loaded, version = asyncio.run(
    manager.load_latest(restarted.initialize(samplers.Population(np.arange(1, 25))))
  )
  assert version == 3 and isinstance(loaded, lefl.LeflState)
  for saved, restored in zip(state, loaded):
    np.testing.assert_array_equal(saved, restored)
    assert saved.dtype == restored.dtype
  restored_selection = restarted.select(loaded, 4, everyone)
  np.testing.assert_array_equal(restored_selection.clients, expected.clients)
  np.testing.assert_array_equal(restored_selection.weights, expected.weights)


def test_state_from_clusters_has_an_empty_kl():
  state = samplers.LeflSampler(3, clusters=_LABELS, seed=0).initialize(_POPULATION)
  assert state.kl.shape == (0, 0) and state.kl.dtype == np.float32
  np.testing.assert_array_equal(state.cluster_labels, _CANONICAL)
  assert state.num_examples.dtype == np.int64


def test_built_from_kl_equals_built_from_soft_labels():
  soft, _ = _planted(2, [4, 4, 4])
  a = samplers.LeflSampler(3, soft_labels=soft, seed=1)
  b = samplers.LeflSampler(3, kl=lefl.kl_matrix(soft), seed=1)
  np.testing.assert_array_equal(a.cluster_labels, b.cluster_labels)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    ({}, r'exactly one of soft_labels, kl and clusters, got none'),
    (
      {'clusters': _LABELS, 'kl': np.zeros((30, 30))},
      r"exactly one of soft_labels, kl and clusters, got \['kl', 'clusters'\]",
    ),
    ({'clusters': _LABELS, 'sample_rate': 0.0}, r'sample_rate must be in \(0, 1\]'),
    ({'clusters': _LABELS, 'sample_rate': 1.5}, r'sample_rate must be in \(0, 1\]'),
    ({'clusters': _LABELS, 'sample_rate': float('nan')}, 'sample_rate must be a number'),
    ({'clusters': _LABELS, 'allocation': 'greedy'}, "Unknown allocation 'greedy'"),
    (
      {'clusters': _LABELS, 'allocation': 'proportional', 'sample_rate': 0.1},
      "applies to allocation='per_cluster' only",
    ),
    ({'clusters': _LABELS, 'num_clusters': 3}, 'the given clusters fix the number'),
    ({'kl': np.zeros((4, 4)), 'num_clusters': 5}, 'num_clusters=5 exceeds the number of clients'),
    ({'kl': np.zeros((3, 4))}, 'square'),
    ({'soft_labels': np.ones((3, 2, 2))}, r'sums to 2.*softmax outputs'),
  ],
)
def test_sampler_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    samplers.LeflSampler(3, seed=0, **kwargs)


@pytest.mark.parametrize('k', [0, -1, 2.5, True])
def test_sampler_rejects_bad_cohort_size(k):
  with pytest.raises(ValueError, match='clients_per_round must be a positive integer'):
    samplers.LeflSampler(k, clusters=_LABELS, seed=0)


def test_sampler_rejects_cohort_larger_than_population():
  with pytest.raises(ValueError, match='clients_per_round=31 exceeds the N=30 clients'):
    samplers.LeflSampler(31, clusters=_LABELS, seed=0)


def test_sampler_rejects_population_and_mask_mismatch():
  sampler = samplers.LeflSampler(3, clusters=_LABELS, seed=0)
  with pytest.raises(ValueError, match='built for N=30 clients'):
    sampler.initialize(samplers.Population(np.arange(1, 11)))
  with pytest.raises(ValueError, match='non-negative integers'):
    sampler.initialize(samplers.Population(np.full(30, -1)))
  state = sampler.initialize(_POPULATION)
  with pytest.raises(ValueError, match=r'available must have shape \(30,\)'):
    sampler.select(state, 1, np.ones(10, bool))
  with pytest.raises(ValueError, match='No client is available in round 4'):
    sampler.select(state, 4, np.zeros(30, bool))


# ------------------------------------------------------------------------------
# label_distribution_kl.


def test_label_distribution_kl_by_hand():
  # q = [.5, .5, 0], g = [.25, .25, .5]: KL = ln 2; the empty class adds 0.
  kl = selection_stats.label_distribution_kl([2, 2, 0], [1, 1, 2])
  assert kl == pytest.approx(LN2, rel=1e-12)
  # Per-client histograms are pooled.
  pooled = selection_stats.label_distribution_kl([[2, 0, 0], [0, 2, 0]], [[1, 1, 2]])
  assert pooled == pytest.approx(LN2)
  assert selection_stats.label_distribution_kl([3, 1], [6, 2]) == 0.0
  # Mass where the global distribution has none (not a subset): infinity.
  assert selection_stats.label_distribution_kl([1, 1], [1, 0]) == math.inf


def test_label_distribution_kl_rejects_bad_histograms():
  with pytest.raises(ValueError, match='2 classes but global_histogram has 3'):
    selection_stats.label_distribution_kl([1, 1], [1, 1, 1])
  with pytest.raises(ValueError, match='selected_histogram has no examples'):
    selection_stats.label_distribution_kl([0, 0], [1, 1])
  with pytest.raises(ValueError, match='global_histogram must hold finite non-negative'):
    selection_stats.label_distribution_kl([1, 1], [1, -1])
