"""Tests for tff_sampling/samplers/clustered.py (Fraboni et al., ICML 2021).

Checked for both algorithms, on hypothesis-drawn and adversarial sizes: the two
unbiasedness identities (exactly, in integer units), the two per-client
inequalities against MD sampling (exact formulas), hand-computed allocations,
the paper's one-digit-per-client example, and the sampler: empirical
frequencies against ``r`` (chi-square, level 1e-3), determinism, restart from a
checkpoint, availability, `observe`, and the errors.
"""

import asyncio
import warnings

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
from scipy import stats
from scipy.cluster import hierarchy
from scipy.spatial import distance

from tff_sampling import samplers
from tff_sampling.samplers import clustered
from tff_sampling.samplers import clustered_similarity
from tff_sampling.samplers import clustered_size
from tff_sampling.samplers import clustered_variance
from tff_sampling.samplers import sketches

_ALPHA = 1e-3  # False-alarm rate of every statistical test here.


def _check_identities(units, sizes, num_draws):
  """Both unbiasedness identities, exactly in integer units, and in floats."""
  sizes = np.asarray(sizes, np.int64)
  total = int(sizes.sum())
  assert units.dtype == np.int64 and units.shape == (num_draws, sizes.shape[0])
  assert np.all(units >= 0)
  np.testing.assert_array_equal(units.sum(axis=1), np.full(num_draws, total))  # Σ_i r_ki = 1.
  np.testing.assert_array_equal(units.sum(axis=0), num_draws * sizes)  # Σ_k r_ki = m p_i.
  r = units / total
  np.testing.assert_allclose(r.sum(axis=1), 1.0, rtol=0, atol=1e-12)
  np.testing.assert_allclose(r.sum(axis=0), num_draws * sizes / total, rtol=1e-12, atol=1e-12)


def _check_better_than_md(r, sizes):
  """Per client: weight variance ≤ MD's and inclusion probability ≥ MD's."""
  num_draws = r.shape[0]
  p = np.asarray(sizes) / np.sum(sizes)
  assert np.all(
    clustered_variance.clustered_weight_variance(r)
    <= clustered_variance.md_weight_variance(p, num_draws) + 1e-12
  )
  assert np.all(
    clustered_variance.clustered_inclusion_probability(r)
    >= clustered_variance.md_inclusion_probability(p, num_draws) - 1e-12
  )


def _updates(seed, num_clients, dim=6, zero_fraction=0.3):
  """A few directions plus noise, some zero rows (never-sampled clients), some ties."""
  rng = np.random.default_rng(seed)
  directions = rng.normal(size=(3, dim))
  updates = directions[rng.integers(0, 3, num_clients)] + 0.3 * rng.normal(size=(num_clients, dim))
  updates[rng.random(num_clients) < zero_fraction] = 0.0
  if num_clients > 2:
    updates[1] = updates[2]
  return updates


def _sizes_strategy(max_clients=40):
  # Small sizes make exact fills and near-full bins common; large ones test
  # the integer range.
  size = st.one_of(st.integers(1, 5), st.integers(1, 10**6))
  return st.lists(size, min_size=1, max_size=max_clients)


# ------------------------------------------------------------------------------
# Algorithm 1.


def test_algorithm1_hand_computed():
  # Sizes [5, 3, 2], m = 2: M = 10, units m n_i = [10, 6, 4]. By size: client 0
  # fills bin 0 (10/10); client 1 puts 6 in bin 1, client 2 its 4 after it.
  np.testing.assert_array_equal(
    clustered_size.size_based_units([5, 3, 2], 2), [[10, 0, 0], [0, 6, 4]]
  )
  np.testing.assert_allclose(
    clustered_size.size_based_distributions([5, 3, 2], 2), [[1, 0, 0], [0, 0.6, 0.4]]
  )
  # Sizes [3, 5, 2], m = 3: M = 10, units [9, 15, 6]; order 1, 0, 2. Client 1
  # fills bin 0 (10) and spills 5 into bin 1; client 0 fills bin 1 (5) and
  # spills 4 into bin 2; client 2 puts its 6 in bin 2.
  np.testing.assert_allclose(
    clustered_size.size_based_distributions([3, 5, 2], 3), [[0, 1, 0], [0.5, 0.5, 0], [0.4, 0, 0.6]]
  )
  # Ties keep index order: sizes [2, 2, 1], m = 2: M = 5, units [4, 4, 2].
  # Client 0: 4 in bin 0; client 1: 1 in bin 0, 3 in bin 1; client 2: 2 in bin 1.
  np.testing.assert_allclose(
    clustered_size.size_based_distributions([2, 2, 1], 2), [[0.8, 0.2, 0], [0, 0.6, 0.4]]
  )


def test_algorithm1_one_digit_per_client_equal_sizes():
  # 100 clients of 500 examples, m = 10: every distribution holds exactly 10
  # clients with probability 1/10, and every client is in exactly one.
  r = clustered_size.size_based_distributions(np.full(100, 500), 10)
  assert np.all(np.count_nonzero(r, axis=1) == 10)
  assert np.all(np.count_nonzero(r, axis=0) == 1)
  np.testing.assert_array_equal(r[r > 0], 0.1)
  np.testing.assert_allclose(
    clustered_variance.clustered_weight_variance(r), 0.09 / 100, rtol=1e-12
  )
  np.testing.assert_allclose(clustered_variance.clustered_inclusion_probability(r), 0.1, rtol=1e-12)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(sizes=_sizes_strategy(), num_draws=st.integers(1, 15))
def test_algorithm1_identities_and_inequalities_random(sizes, num_draws):
  units = clustered_size.size_based_units(sizes, num_draws)
  _check_identities(units, sizes, num_draws)
  r = clustered_size.size_based_distributions(sizes, num_draws)
  _check_better_than_md(r, sizes)
  # A client spans at most ⌊m p_i⌋ + 2 distributions (the paper, Section 4).
  bound = num_draws * np.asarray(sizes, np.int64) // np.sum(sizes) + 2
  assert np.all(np.count_nonzero(units, axis=0) <= bound)


_ADVERSARIAL = {
  'one_huge_client': ([10**6, 3, 1, 7, 2, 9], 5),  # m n_0 ≥ 4 M.
  'two_large_clients': ([40, 35, 5, 5, 5, 5, 5], 7),
  'equal_sizes': ([7] * 12, 5),
  'n_equals_m': ([3, 9, 1, 4, 4, 8], 6),
  'single_client': ([13], 4),
  'more_draws_than_clients': ([2, 5, 1], 8),
  'one_draw': ([4, 4, 1, 9], 1),
  'multiple_of_capacity': ([2, 1, 1], 4),  # m n_0 = 2 M exactly: no remainder.
}


@pytest.mark.parametrize('name', sorted(_ADVERSARIAL))
def test_both_algorithms_on_adversarial_sizes(name):
  sizes, num_draws = _ADVERSARIAL[name]
  updates = _updates(len(name), len(sizes))
  for units in (
    clustered_size.size_based_units(sizes, num_draws),
    *(
      clustered_similarity.similarity_based_units(sizes, updates, num_draws, similarity=s)
      for s in clustered_similarity.SIMILARITIES
    ),
  ):
    _check_identities(units, sizes, num_draws)
    _check_better_than_md(units / np.sum(sizes), sizes)


@pytest.mark.parametrize('similarity', clustered_similarity.SIMILARITIES)
def test_algorithm2_is_scale_free_and_survives_huge_updates(similarity):
  sizes = [3, 1, 4, 1, 5, 9, 2, 6]
  updates = _updates(0, 8, zero_fraction=0.2)
  units = clustered_similarity.similarity_based_units(sizes, updates, 3, similarity=similarity)
  for scale in (1e-300, 1e300):
    np.testing.assert_array_equal(
      clustered_similarity.similarity_based_units(sizes, updates * scale, 3, similarity=similarity),
      units,
    )


def test_single_client_and_huge_client_get_dedicated_distributions():
  np.testing.assert_array_equal(clustered_size.size_based_distributions([13], 4), np.ones((4, 1)))
  np.testing.assert_array_equal(
    clustered_similarity.similarity_based_distributions([13], np.zeros((1, 3)), 4), np.ones((4, 1))
  )
  # Sizes [6, 1, 1, 1, 1], m = 2: M = 10, client 0 owns 12 units: one dedicated
  # distribution (10) and a remainder of 2, which with the four others' 2 each
  # forms one group of exactly M = 10 (the root of the tree).
  r = clustered_similarity.similarity_based_distributions(
    [6, 1, 1, 1, 1], np.random.default_rng(0).normal(size=(5, 3)), 2
  )
  np.testing.assert_allclose(r, [[1, 0, 0, 0, 0], [0.2] * 5])


# ------------------------------------------------------------------------------
# Algorithm 2.


def test_algorithm2_hand_computed_two_directions():
  # Four clients of one example, m = 2: M = 4, 2 units each. Clients 0 and 2
  # point along e0, 1 and 3 along e1: the groups {0, 2} and {1, 3} weigh 4 = M
  # each, so each seeds one distribution and nothing is poured.
  updates = np.zeros((4, 2))
  updates[[0, 2], 0] = [1.0, 2.0]
  updates[[1, 3], 1] = [3.0, 0.5]
  for similarity in ('arccos',):  # L2/L1 would see the different lengths.
    r = clustered_similarity.similarity_based_distributions(
      [1, 1, 1, 1], updates, 2, similarity=similarity
    )
    assert sorted(map(tuple, r.tolist())) == [(0, 0.5, 0, 0.5), (0.5, 0, 0.5, 0)]


def test_algorithm2_hand_computed_pouring():
  # Sizes [2, 2, 1, 1, 1, 1], m = 2: M = 8, units [4, 4, 2, 2, 2, 2]. Directions:
  # {0, 2} along e0, {1, 3} along e1, {4, 5} along e2 (equal within a pair), so
  # Ward merges the pairs first. The pairs weigh 6, 6, 4 and any two more than
  # 8: the cut gives these three groups. The two of weight 6 seed the two
  # distributions (6 units each, 2 free); the clients of {4, 5} are poured in
  # turn: the first fills distribution 0 with its 2 units, the second
  # distribution 1.
  updates = np.zeros((6, 3))
  updates[[0, 2], 0] = 1.0
  updates[[1, 3], 1] = 1.0
  updates[[4, 5], 2] = 1.0
  sizes = [2, 2, 1, 1, 1, 1]
  labels = clustered_similarity.similarity_groups(sizes, updates, 2)
  assert sorted(map(sorted, ([0, 2], [1, 3]))) == sorted(
    sorted(np.flatnonzero(labels == g).tolist()) for g in (0, 1)
  )
  np.testing.assert_array_equal(np.flatnonzero(labels == 2), [4, 5])
  units = clustered_similarity.similarity_based_units(sizes, updates, 2)
  _check_identities(units, sizes, 2)
  for k in range(2):
    np.testing.assert_array_equal(units[k, np.flatnonzero(labels == k)], [4, 2])
  assert sorted(units[:, [4, 5]].tolist()) == [[0, 2], [2, 0]]


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(
  sizes=_sizes_strategy(30),
  num_draws=st.integers(1, 12),
  seed=st.integers(0, 2**16),
  similarity=st.sampled_from(clustered_similarity.SIMILARITIES),
  zero_fraction=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_algorithm2_identities_and_inequalities_random(
  sizes, num_draws, seed, similarity, zero_fraction
):
  updates = _updates(seed, len(sizes), zero_fraction=zero_fraction)
  units = clustered_similarity.similarity_based_units(
    sizes, updates, num_draws, similarity=similarity
  )
  _check_identities(units, sizes, num_draws)
  _check_better_than_md(units / np.sum(sizes), sizes)
  # Every group weighs at most M, and there are at least as many as the
  # distributions left after the dedicated ones.
  sizes = np.asarray(sizes, np.int64)
  labels = clustered_similarity.similarity_groups(sizes, updates, num_draws, similarity=similarity)
  remainder = num_draws * sizes % sizes.sum()
  dedicated = int(np.sum(num_draws * sizes // sizes.sum()))
  weights = np.bincount(labels[labels >= 0], weights=remainder[labels >= 0])
  assert np.all(weights <= sizes.sum())
  assert np.all(np.diff(weights) <= 0)  # Numbered by descending weight.
  assert weights.shape[0] >= num_draws - dedicated
  np.testing.assert_array_equal(labels < 0, remainder == 0)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
  sizes=st.lists(st.integers(1, 4), min_size=2, max_size=12),
  num_draws=st.integers(2, 6),
  seed=st.integers(0, 2**16),
)
def test_algorithm2_identities_small_sizes(sizes, num_draws, seed):
  # Few units per client: many groups, exact and near-full bins while pouring.
  units = clustered_similarity.similarity_based_units(sizes, _updates(seed, len(sizes)), num_draws)
  _check_identities(units, sizes, num_draws)
  _check_better_than_md(units / np.sum(sizes), sizes)


def _digits_population():
  """100 clients of 500 examples; client i holds digit i % 10 (one-hot updates)."""
  digits = np.arange(100) % 10
  return digits, samplers.Population(np.full(100, 500, np.int64)), np.eye(10)[digits]


def test_algorithm2_one_hot_digits_one_distribution_per_digit():
  digits, population, updates = _digits_population()
  r = clustered_similarity.similarity_based_distributions(population.num_examples, updates, 10)
  for row in r:
    assert np.unique(digits[row > 0]).shape[0] == 1
    np.testing.assert_array_equal(row[row > 0], np.full(10, 0.1))
  assert sorted(digits[np.argmax(r, axis=1)].tolist()) == list(range(10))
  # Every round of the sampler takes one client per digit.
  sampler = clustered.ClusteredSampler(10, seed=1, method='similarity', sketch_size=10)
  state = sampler.observe(
    sampler.initialize(population),
    samplers.Selection(clients=np.arange(100)),
    {'update_sketch': updates},
  )
  for round_num in range(30):
    selection = sampler.select(state, round_num, np.ones(100, bool))
    assert sorted(digits[selection.clients].tolist()) == list(range(10))


def test_algorithm2_learns_the_digits_from_zero_updates():
  # Start with zero updates, report (noisy) one-hot sketches of the selected
  # clients: once every client has been seen, every round covers all digits.
  digits, population, updates = _digits_population()
  sampler = clustered.ClusteredSampler(10, seed=4, method='similarity', sketch_size=10)
  state = sampler.initialize(population)
  seen = np.zeros(100, bool)
  rng = np.random.default_rng(0)
  round_num = 0
  while not np.all(seen):
    round_num += 1
    assert round_num < 300, 'some client was never selected'
    selection = sampler.select(state, round_num, np.ones(100, bool))
    seen[selection.clients] = True
    sketch = updates[selection.clients] + 0.05 * rng.normal(size=(10, 10))
    state = sampler.observe(state, selection, {'update_sketch': sketch})
  for later in range(round_num + 1, round_num + 11):
    selection = sampler.select(state, later, np.ones(100, bool))
    assert np.unique(digits[selection.clients]).shape[0] == 10


def test_similarity_matrix_values_and_zero_vector_convention():
  updates = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
  angle = clustered_similarity.similarity_matrix(updates, 'arccos')
  np.testing.assert_allclose(
    angle[0], [0, np.pi / 2, np.pi, np.pi / 2, np.pi / 2, np.pi / 4], atol=1e-7
  )
  # Zero vectors: angle 0 to each other, π/2 to everybody else.
  np.testing.assert_array_equal(angle[3, [3, 4]], [0, 0])
  np.testing.assert_allclose(angle[3, [0, 1, 2, 5]], np.pi / 2)
  np.testing.assert_array_equal(np.diag(angle), 0)
  np.testing.assert_allclose(
    clustered_similarity.similarity_matrix(updates, 'L2'),
    distance.cdist(updates, updates),
    atol=1e-12,
  )
  np.testing.assert_allclose(
    clustered_similarity.similarity_matrix(updates, 'L1'),
    distance.cdist(updates, updates, 'cityblock'),
    atol=1e-12,
  )
  # Arccos is scale-free per row, even for tiny or huge rows.
  np.testing.assert_allclose(
    clustered_similarity.similarity_matrix(updates * 1e-200, 'arccos'), angle
  )
  np.testing.assert_allclose(
    clustered_similarity.similarity_matrix(updates * 1e200, 'arccos'), angle
  )


@pytest.mark.parametrize('similarity', clustered_similarity.SIMILARITIES)
def test_ward_linkage_of_rows_is_scipys_ward_on_the_rows(similarity):
  matrix = clustered_similarity.similarity_matrix(
    _updates(3, 40, dim=8, zero_fraction=0.0), similarity
  )
  with warnings.catch_warnings():
    # scipy warns that a symmetric hollow observation matrix looks like a
    # distance matrix: that is the authors' usage and the point of the test.
    warnings.simplefilter('ignore', hierarchy.ClusterWarning)
    expected = hierarchy.linkage(matrix, 'ward')
  ours = clustered_similarity.ward_linkage_of_rows(matrix)
  # The same merges; heights agree up to the cancellation error of the
  # distance expansion (our _updates has two identical clients: height ~1e-7).
  np.testing.assert_array_equal(ours[:, [0, 1, 3]], expected[:, [0, 1, 3]])
  np.testing.assert_allclose(ours[:, 2], expected[:, 2], rtol=1e-9, atol=1e-6)


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(
  seed=st.integers(0, 2**16), num_leaves=st.integers(2, 40), capacity=st.integers(10, 200)
)
def test_cut_by_weight_matches_the_authors_fcluster_cut(seed, num_leaves, capacity):
  # Oracle (the authors' code): replace every merge height by the merged weight
  # and cut with fcluster(criterion='distance') at the capacity.
  rng = np.random.default_rng(seed)
  linkage = hierarchy.linkage(rng.normal(size=(num_leaves, 3)), 'ward')
  weights = rng.integers(0, capacity + 1, num_leaves)
  groups = clustered_similarity.cut_by_weight(linkage, weights, capacity)
  node_weight = list(weights)
  heights = linkage.copy()
  for merge, (left, right) in enumerate(linkage[:, :2].astype(int)):
    node_weight.append(node_weight[left] + node_weight[right])
    heights[merge, 2] = node_weight[-1]
  oracle = hierarchy.fcluster(heights, capacity, criterion='distance')
  ours = np.empty(num_leaves, int)
  for label, group in enumerate(groups):
    ours[group] = label
  assert sorted(np.concatenate(groups).tolist()) == list(range(num_leaves))
  assert _same_partition(ours, oracle)
  assert all(weights[group].sum() <= capacity for group in groups)


def _same_partition(a, b):
  pairs = set(zip(a.tolist(), b.tolist()))
  return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_cut_by_weight_hand_computed_and_leaf_too_heavy():
  # Leaves 0..3 with weights [3, 3, 4, 5]; merges: (0,1)->4 [6], (2,3)->5 [9],
  # (4,5)->6 [15]. Capacity 8: root 15 > 8 splits; node 4 (6) is a group;
  # node 5 (9) splits into {2} and {3}.
  linkage = np.array([[0, 1, 1.0, 2], [2, 3, 2.0, 2], [4, 5, 3.0, 4]])
  groups = clustered_similarity.cut_by_weight(linkage, np.array([3, 3, 4, 5]), 8)
  assert [g.tolist() for g in groups] == [[0, 1], [2], [3]]
  assert [
    g.tolist() for g in clustered_similarity.cut_by_weight(linkage, np.array([3, 3, 4, 5]), 15)
  ] == [[0, 1, 2, 3]]
  with pytest.raises(ValueError, match='Leaf 3 weighs 5 > capacity 4'):
    clustered_similarity.cut_by_weight(linkage, np.array([3, 3, 4, 5]), 4)


# ------------------------------------------------------------------------------
# The faster Algorithm 2 against the implementation it replaced.
#
# `_oracle_*` is the previous implementation, as it was but for the names and
# the input validation (products over all N rows, the cut walking every
# subtree in Python). It stays here, not in the library, while the optimised
# code settles. Exact equality is expected, not a tolerance: for every value
# that reaches the tree, the new code performs the same floating-point
# operations on the same operands. Its products run over the nonzero /
# distinct rows only, and a BLAS computes each entry of a product from its two
# rows alone (OpenBLAS in numpy's wheels: checked here), so nothing changes,
# not even how the exact ties between never-sampled clients (identical rows of
# ρ, distances 0 or ~1e-7) are broken. A BLAS whose entries depended on their
# position in the product would make these tests fail; the distances would
# then differ in their last bits, the trees only at exact or near ties.


def _oracle_similarity_matrix(updates, similarity):
  updates = np.asarray(updates, np.float64)
  if similarity == 'L1':
    matrix = distance.squareform(distance.pdist(updates, 'cityblock'))
  elif similarity == 'L2':
    updates = updates - updates.mean(axis=0)
    squared_norms = np.einsum('ij,ij->i', updates, updates)
    squared = squared_norms[:, None] + squared_norms[None, :] - 2.0 * (updates @ updates.T)
    matrix = np.sqrt(np.maximum(squared, 0.0))
  else:
    largest = np.max(np.abs(updates), axis=1, initial=0.0)
    nonzero = largest > 0
    unit = np.zeros_like(updates)
    unit[nonzero] = updates[nonzero] / largest[nonzero, None]
    unit[nonzero] /= np.linalg.norm(unit[nonzero], axis=1)[:, None]
    cosine = unit @ unit.T
    cosine[np.ix_(~nonzero, ~nonzero)] = 1.0
    np.clip(cosine, -1.0, 1.0, out=cosine)
    matrix = np.arccos(cosine)
  matrix = 0.5 * (matrix + matrix.T)
  np.fill_diagonal(matrix, 0.0)
  return matrix


def _oracle_ward_linkage_of_rows(matrix):
  rows = np.asarray(matrix, np.float64)
  rows = rows - rows.mean(axis=0)
  squared_norms = np.einsum('ij,ij->i', rows, rows)
  squared = squared_norms[:, None] + squared_norms[None, :] - 2.0 * (rows @ rows.T)
  np.maximum(squared, 0.0, out=squared)
  distances = np.sqrt(squared, out=squared)
  np.fill_diagonal(distances, 0.0)
  return hierarchy.linkage(distance.squareform(distances, checks=False), 'ward')


def _oracle_cut_by_weight(linkage_matrix, weights, capacity):
  weights = np.asarray(weights, np.int64)
  num_leaves = weights.shape[0]
  children = np.asarray(linkage_matrix[:, :2], np.int64)
  node_weight = np.concatenate([weights, np.zeros(num_leaves - 1, np.int64)])
  for merge, (left, right) in enumerate(children.tolist()):
    node_weight[num_leaves + merge] = node_weight[left] + node_weight[right]

  def leaves(node):
    found, stack = [], [node]
    while stack:
      current = stack.pop()
      if current < num_leaves:
        found.append(current)
      else:
        left, right = children[current - num_leaves]
        stack.extend((right, left))
    return np.array(found, np.int64)

  groups, stack = [], [2 * num_leaves - 2]
  while stack:
    node = stack.pop()
    if node_weight[node] <= capacity:
      groups.append(leaves(node))
    else:
      left, right = children[node - num_leaves]
      stack.extend((right, left))
  return groups


def _oracle_similarity_allocation(sizes, updates, num_draws, similarity):
  """Units and step-4 groups (in the order used), as the previous code computed them."""
  sizes = np.asarray(sizes, np.int64)
  updates = np.asarray(updates, np.float64)
  capacity = int(sizes.sum())
  num_clients = sizes.shape[0]
  units = np.zeros((num_draws, num_clients), np.int64)
  dedicated, remainder = np.divmod(num_draws * sizes, capacity)
  row = 0
  for client in np.argsort(-sizes, kind='stable'):
    units[row : row + dedicated[client], client] = capacity
    row += int(dedicated[client])
  if row == num_draws:
    return units, []
  clustered_clients = np.flatnonzero(remainder > 0)
  updates = updates[clustered_clients]
  largest = np.max(np.abs(updates))
  if similarity != 'arccos' and largest > 0:
    updates = updates / largest
  matrix = _oracle_similarity_matrix(updates, similarity)
  groups = _oracle_cut_by_weight(
    _oracle_ward_linkage_of_rows(matrix), remainder[clustered_clients], capacity
  )
  groups = [clustered_clients[group] for group in groups]
  weights = np.array([remainder[group].sum() for group in groups], np.int64)
  groups = [groups[g] for g in np.argsort(-weights, kind='stable')]
  fill = np.zeros(num_draws, np.int64)
  num_seeded = num_draws - row
  for k, group in enumerate(groups[:num_seeded]):
    units[row + k, group] = remainder[group]
    fill[row + k] = remainder[group].sum()
  fill[:row] = capacity
  k = row
  for group in groups[num_seeded:]:
    for client in group.tolist():
      left = int(remainder[client])
      while left > 0:
        while fill[k] == capacity:
          k += 1
        placed = min(capacity - int(fill[k]), left)
        units[k, client] += placed
        fill[k] += placed
        left -= placed
  return units, groups


def _assert_same_tree(linkage, oracle):
  """Ward trees equal up to float rounding: the same merge heights, in order.

  The heights come from sums whose order the BLAS kernels choose (they differ
  in the last bit between the two ways of computing them on some CPUs), and
  merges at exactly tied heights may then come in another order, with other
  labels; the sequence of heights is what both must share.
  """
  assert linkage.shape == oracle.shape
  # ρ is O(1); between rows equal up to rounding (never-sampled clients) the
  # arccos distance turns a last-bit difference into up to ~1e-5.
  np.testing.assert_allclose(np.sort(linkage[:, 2]), np.sort(oracle[:, 2]), rtol=1e-9, atol=1e-4)
  assert linkage[-1, 3] == oracle[-1, 3]  # One tree over every leaf.


@pytest.mark.parametrize('similarity', clustered_similarity.SIMILARITIES)
@pytest.mark.parametrize(
  'num_clients,dim,zero_fraction',
  [(60, 6, 0.0), (60, 6, 0.3), (60, 6, 1.0), (300, 16, 0.3), (300, 64, 0.9)],
)
@pytest.mark.parametrize('seed', range(3))
def test_algorithm2_equals_the_previous_implementation(
  similarity, num_clients, dim, zero_fraction, seed, monkeypatch
):
  # The matrix and the tree equal the previous code's up to float rounding, and
  # given the same matrix and tree, the groups and the units are exactly equal.
  # (The BLAS kernels of some CPUs round the two matrix products differently in
  # the last bit, which can flip exact ties of Ward's merges; so the allocation
  # is compared on shared intermediates.) The updates have planted directions,
  # never-sampled clients (identical rows of ρ: exact ties for Ward) and two
  # equal clients.
  rng = np.random.default_rng([seed, num_clients])
  sizes = np.ceil(rng.lognormal(np.log(20.0), 1.0, num_clients)).astype(np.int64)
  updates = _updates(seed, num_clients, dim=dim, zero_fraction=zero_fraction)
  updates[3:6] = updates[7]  # Identical nonzero clients too (identical rows of ρ for L1).
  matrix = clustered_similarity.similarity_matrix(updates, similarity)
  np.testing.assert_allclose(
    matrix, _oracle_similarity_matrix(updates, similarity), rtol=1e-12, atol=1e-14
  )
  _assert_same_tree(
    clustered_similarity.ward_linkage_of_rows(matrix), _oracle_ward_linkage_of_rows(matrix)
  )
  monkeypatch.setitem(
    globals(), '_oracle_similarity_matrix', clustered_similarity._similarity_matrix
  )  # pylint: disable=protected-access
  monkeypatch.setitem(
    globals(), '_oracle_ward_linkage_of_rows', clustered_similarity.ward_linkage_of_rows
  )
  for num_draws in (3, 10):
    units, groups = _oracle_similarity_allocation(sizes, updates, num_draws, similarity)
    allocation = clustered_similarity._similarity_allocation(  # pylint: disable=protected-access
      sizes, updates, num_draws, similarity
    )
    np.testing.assert_array_equal(allocation.units, units)
    assert [g.tolist() for g in allocation.groups] == [g.tolist() for g in groups]


def test_algorithm2_equals_the_previous_implementation_on_the_benchmark_workload():
  # The benchmark's updates (five directions, 20% never-sampled clients, float32
  # sketches), at a smaller N.
  from bench import clustered as bench_clustered  # pylint: disable=g-import-not-at-top

  for num_clients in (100, 400):
    sizes = bench_clustered.client_sizes(num_clients, 1.0, 0)
    updates, _ = bench_clustered.mixture_updates(num_clients, 128, 5, 1.0, 0.2, 0)
    units, _ = _oracle_similarity_allocation(sizes, updates, 10, 'arccos')
    np.testing.assert_array_equal(
      clustered_similarity.similarity_based_units(sizes, updates, 10), units
    )


@pytest.mark.parametrize(
  'rows',
  [
    np.zeros((5, 5)),  # One distinct row: two are kept (a matrix product).
    np.tile(np.arange(4.0), (6, 1)),
    np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [3.0, 1.0, 0.0], [0.0, 1.0, 2.0]]),
    np.random.default_rng(5).normal(size=(7, 3))[[0, 1, 0, 2, 1, 3, 4, 0, 6, 5]],
  ],
)
def test_ward_linkage_of_rows_with_identical_rows_equals_the_full_product(rows):
  np.testing.assert_array_equal(
    clustered_similarity.ward_linkage_of_rows(rows), _oracle_ward_linkage_of_rows(rows)
  )


def test_first_identical_row_needs_identical_bits():
  first_identical_row = clustered_similarity._first_identical_row  # pylint: disable=protected-access
  rows = np.array(
    [[1.0, 0.0, 2.0], [1.0, -0.0, 2.0], [1.0, 0.0, 2.0], [2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]
  )
  # Rows 0 and 1 compare equal and project alike, but differ in the sign of a zero.
  np.testing.assert_array_equal(first_identical_row(rows), [0, 1, 0, 3, 3])
  # All rows identical: the second stays distinct.
  np.testing.assert_array_equal(first_identical_row(np.ones((3, 2))), [0, 1, 0])
  np.testing.assert_array_equal(first_identical_row(np.ones((1, 2))), [0])


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(
  seed=st.integers(0, 2**16), num_leaves=st.integers(1, 60), capacity=st.integers(10, 200)
)
def test_cut_by_weight_equals_the_previous_implementation(seed, num_leaves, capacity):
  rng = np.random.default_rng(seed)
  weights = rng.integers(0, capacity + 1, num_leaves)
  points = rng.normal(size=(num_leaves, 2))
  if seed % 2:
    points = np.round(points)  # Exact ties.
  linkage = hierarchy.linkage(points, 'ward') if num_leaves > 1 else np.zeros((0, 4))
  groups = clustered_similarity.cut_by_weight(linkage, weights, capacity)
  expected = _oracle_cut_by_weight(linkage, weights, capacity)
  assert [g.tolist() for g in groups] == [g.tolist() for g in expected]


# ------------------------------------------------------------------------------
# Statistics and helpers.


def test_statistics_hand_computed():
  p = np.array([0.5, 0.25, 0.25])
  np.testing.assert_allclose(
    clustered_variance.md_inclusion_probability(p, 2), [0.75, 0.4375, 0.4375]
  )
  np.testing.assert_allclose(
    clustered_variance.md_weight_variance(p, 2), [2 * 0.25 / 4, 2 * 0.1875 / 4, 2 * 0.1875 / 4]
  )
  r = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
  np.testing.assert_allclose(clustered_variance.clustered_inclusion_probability(r), [1.0, 0.5, 0.5])
  np.testing.assert_allclose(
    clustered_variance.clustered_weight_variance(r), [0.0, 0.25 / 4, 0.25 / 4]
  )
  assert clustered_variance.expected_distinct_clients(r) == pytest.approx(2.0)
  # MD is the clustered sampling with every r_k = p: equality in both.
  md_as_clustered = np.tile(p, (2, 1))
  np.testing.assert_allclose(
    clustered_variance.clustered_weight_variance(md_as_clustered),
    clustered_variance.md_weight_variance(p, 2),
  )
  np.testing.assert_allclose(
    clustered_variance.clustered_inclusion_probability(md_as_clustered),
    clustered_variance.md_inclusion_probability(p, 2),
  )
  assert clustered_variance.distinct_clients(samplers.Selection(np.array([3, 1, 3, 2]))) == 3
  with pytest.raises(ValueError, match=r'r must be probabilities in \[0, 1\]'):
    clustered_variance.clustered_weight_variance(np.array([[1.5]]))


def test_count_sketch_definition_determinism_and_inner_products():
  vectors = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [0.0, -1.0, 0.0, 2.0, 0.5]])
  buckets, signs = sketches.count_sketch_hashes(5, 3, seed=7)
  expected = np.zeros((2, 3))
  for j in range(5):
    expected[:, buckets[j]] += signs[j] * vectors[:, j]
  np.testing.assert_allclose(sketches.count_sketch(vectors, 3, seed=7), expected)
  np.testing.assert_allclose(sketches.count_sketch(vectors[0], 3, seed=7), expected[0])
  assert not np.array_equal(
    sketches.count_sketch_hashes(5, 3, seed=8)[0], buckets
  ) or not np.array_equal(sketches.count_sketch_hashes(5, 3, seed=8)[1], signs)
  # Inner products are preserved in expectation: averaged over 200 seeds, the
  # sketched inner product of two 2,000-dim vectors is within 4 standard errors.
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(2, 2000))
  y += 0.5 * x
  estimates = np.array(
    [np.dot(*sketches.count_sketch(np.stack([x, y]), 64, seed=s)) for s in range(200)]
  )
  standard_error = estimates.std(ddof=1) / np.sqrt(len(estimates))
  assert abs(estimates.mean() - np.dot(x, y)) < 4 * standard_error
  with pytest.raises(ValueError, match='sketch_size must be a positive integer'):
    sketches.count_sketch(vectors, 0, seed=0)


# ------------------------------------------------------------------------------
# The sampler.


_SIZES = np.array([50, 10, 30, 5, 80, 25, 40, 60, 15, 35, 20, 45], np.int64)
_POPULATION = samplers.Population(num_examples=_SIZES)


def _similarity_state(sampler, population=_POPULATION, seed=0):
  """A state where every client has reported a sketch."""
  sketches = _updates(seed, population.size, dim=sampler.sketch_size, zero_fraction=0.2)
  return sampler.observe(
    sampler.initialize(population),
    samplers.Selection(np.arange(population.size)),
    {'update_sketch': sketches},
  )


def _pooled_chisquare(observed, expected):
  """Pearson statistic and degrees of freedom, pooling cells with expected < 5."""
  observed, expected = np.asarray(observed, float), np.asarray(expected, float)
  keep = expected >= 5
  if np.any(~keep) and expected[~keep].sum() > 0:
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
  else:
    observed, expected = observed[keep], expected[keep]
  assert expected.shape[0] >= 1
  return float(np.sum((observed - expected) ** 2 / expected)), expected.shape[0] - 1


def _frequency_p_value(sampler, state, r, rounds, available):
  """Chi-square p-value of each slot's draws against its (renormalised) distribution."""
  num_draws, num_clients = r.shape
  counts = np.zeros((num_draws, num_clients))
  for round_num in range(rounds):
    clients = sampler.select(state, round_num, available).clients
    counts[np.arange(num_draws), clients] += 1
  statistic, dof = 0.0, 0
  for k in range(num_draws):
    expected = rounds * r[k] / r[k].sum()
    assert np.all(counts[k][expected == 0] == 0), f'slot {k} drew a client of probability 0'
    s, d = _pooled_chisquare(counts[k][expected > 0], expected[expected > 0])
    statistic, dof = statistic + s, dof + d
  return stats.chi2.sf(statistic, dof) if dof else 1.0


@pytest.mark.parametrize('method', ['size', 'similarity'])
def test_selection_frequencies_match_r(method):
  # Slot k draws from W_k: its counts over R rounds are Multinomial(R, r_k).
  # The per-slot Pearson statistics add up to one chi-square; level 1e-3.
  sampler = clustered.ClusteredSampler(
    4, seed=9, method=method, sketch_size=8 if method == 'similarity' else None
  )
  state = _similarity_state(sampler) if method == 'similarity' else sampler.initialize(_POPULATION)
  r = sampler.distributions(state)
  _check_identities(sampler.distribution_units(state), _SIZES, 4)
  rounds = 3000 if method == 'size' else 600  # Algorithm 2 re-clusters every round.
  assert _frequency_p_value(sampler, state, r, rounds, np.ones(_POPULATION.size, bool)) > _ALPHA


def test_selection_slots_and_weights():
  sampler = clustered.ClusteredSampler(5, seed=0)
  state = sampler.initialize(_POPULATION)
  selection = sampler.select(state, 1, np.ones(_POPULATION.size, bool))
  assert selection.clients.shape == (5,) and selection.clients.dtype == np.int64
  np.testing.assert_array_equal(selection.weights, np.full(5, 0.2, np.float32))
  r = sampler.distributions(state)
  assert all(r[k, client] > 0 for k, client in enumerate(selection.clients))


def test_availability_renormalises_and_falls_back_to_md():
  # Unequal sizes, m = 6 (Algorithm 1). Every client of W_0 and a few others
  # are unavailable: slot 0 falls back to MD over the available clients
  # (∝ n_i), the other slots draw from r_k restricted to the available clients
  # and renormalised (or fall back too if nothing of theirs is left).
  sizes = np.random.default_rng(2).integers(1, 50, 60)
  population = samplers.Population(sizes)
  sampler = clustered.ClusteredSampler(6, seed=3)
  state = sampler.initialize(population)
  r = sampler.distributions(state)
  available = np.ones(60, bool)
  available[r[0] > 0] = False
  available[[5, 17, 33]] = False
  expected = r * available
  md_row = sizes * available / np.sum(sizes * available)
  empty = expected.sum(axis=1) == 0
  assert empty[0]
  expected[empty] = md_row
  assert _frequency_p_value(sampler, state, expected, 3000, available) > _ALPHA
  with pytest.raises(ValueError, match='No client is available in round 3'):
    sampler.select(state, 3, np.zeros(60, bool))
  with pytest.raises(ValueError, match=r'available must have shape \(60,\)'):
    sampler.select(state, 3, np.ones(59, bool))


@pytest.mark.parametrize('method', ['size', 'similarity'])
def test_deterministic_in_seed_and_round(method):
  sketch_size = 8 if method == 'similarity' else None

  def make(seed):
    return clustered.ClusteredSampler(6, seed=seed, method=method, sketch_size=sketch_size)

  a, b, c = make(1), make(1), make(2)
  state = _similarity_state(a) if method == 'similarity' else a.initialize(_POPULATION)
  everyone = np.ones(_POPULATION.size, bool)
  for round_num in range(5):
    np.testing.assert_array_equal(
      a.select(state, round_num, everyone).clients, b.select(state, round_num, everyone).clients
    )
  rounds = [a.select(state, t, everyone).clients for t in range(10)]
  assert any(not np.array_equal(rounds[0], other) for other in rounds[1:])
  assert any(
    not np.array_equal(a.select(state, t, everyone).clients, c.select(state, t, everyone).clients)
    for t in range(10)
  )


@pytest.mark.parametrize('method', ['size', 'similarity'])
def test_restart_from_a_checkpoint_reproduces_the_next_round(method, tmp_path):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  sketch_size = 8 if method == 'similarity' else None

  def make():
    return clustered.ClusteredSampler(4, seed=5, method=method, sketch_size=sketch_size)

  everyone = np.ones(_POPULATION.size, bool)
  rng = np.random.default_rng(0)
  sampler = make()
  state = sampler.initialize(_POPULATION)
  manager = tff.program.FileProgramStateManager(str(tmp_path))
  for round_num in range(1, 6):
    selection = sampler.select(state, round_num, everyone)
    state = sampler.observe(
      state, selection, {'update_sketch': rng.normal(size=(4, sketch_size or 0)).astype(np.float32)}
    )
    asyncio.run(manager.save(state, round_num))
  expected = sampler.select(state, 6, everyone)

  restarted = make()
  structure = restarted.initialize(_POPULATION)
  loaded, version = asyncio.run(manager.load_latest(structure))
  assert version == 5 and isinstance(loaded, clustered.ClusteredSamplerState)
  for saved, restored in zip(state, loaded):
    np.testing.assert_array_equal(saved, restored)
    assert saved.dtype == restored.dtype
  np.testing.assert_array_equal(restarted.select(loaded, 6, everyone).clients, expected.clients)


def test_observe_stores_sketches_by_slot():
  sampler = clustered.ClusteredSampler(4, seed=0, method='similarity', sketch_size=3)
  state = sampler.initialize(_POPULATION)
  np.testing.assert_array_equal(state.representative_updates, np.zeros((12, 3), np.float32))
  assert state.distribution_units.shape == (0, 12)
  selection = samplers.Selection(np.array([7, 2, 7, 5]))
  sketch = np.array([[1, 2, 3], [4, 5, 6], [3, 4, 5], [7, 8, 9]], np.float32)
  new = sampler.observe(state, selection, {'update_sketch': sketch})
  np.testing.assert_array_equal(new.representative_updates[2], [4, 5, 6])
  np.testing.assert_array_equal(new.representative_updates[5], [7, 8, 9])
  # Client 7 holds slots 0 and 2: the mean (the same row when both are equal).
  np.testing.assert_array_equal(new.representative_updates[7], [2, 3, 4])
  untouched = np.setdiff1d(np.arange(12), [2, 5, 7])
  np.testing.assert_array_equal(new.representative_updates[untouched], 0)
  assert new.representative_updates.dtype == np.float32
  np.testing.assert_array_equal(state.representative_updates, 0)  # Not mutated.
  same = sampler.observe(
    state,
    samplers.Selection(np.array([7, 7])),
    {'update_sketch': np.array([[1, 2, 3], [1, 2, 3]], np.float32)},
  )
  np.testing.assert_array_equal(same.representative_updates[7], [1, 2, 3])
  # A round whose every selected client missed the deadline reports no sketch.
  nobody = sampler.observe(new, samplers.Selection(np.array([], np.int64)), {'seconds': []})
  np.testing.assert_array_equal(nobody.representative_updates, new.representative_updates)
  # The size method ignores the signals.
  size_sampler = clustered.ClusteredSampler(4, seed=0)
  size_state = size_sampler.initialize(_POPULATION)
  observed = size_sampler.observe(size_state, selection, {})
  for before, after in zip(size_state, observed):
    np.testing.assert_array_equal(before, after)
  assert size_state.representative_updates.shape == (12, 0)


def test_errors_name_the_value():
  with pytest.raises(ValueError, match='num_draws must be a positive integer, got 0'):
    clustered_size.size_based_distributions([1, 2], 0)
  with pytest.raises(ValueError, match='num_draws must be a positive integer'):
    clustered.ClusteredSampler(-2, seed=0)
  with pytest.raises(ValueError, match=r'client_sizes must be positive integers.*got 0 at index 1'):
    clustered_size.size_based_distributions([3, 0, 2], 2)
  with pytest.raises(ValueError, match=r'client_sizes must be positive.*got -4 at index 0'):
    clustered_similarity.similarity_based_distributions([-4, 2], np.ones((2, 2)), 2)
  with pytest.raises(ValueError, match=r'client_sizes must be positive integers.*index 0'):
    clustered.ClusteredSampler(2, seed=0).initialize(samplers.Population(np.array([0, 1])))
  bad_updates = np.ones((3, 2))
  bad_updates[2, 1] = np.inf
  with pytest.raises(ValueError, match=r'must be finite; row 2'):
    clustered_similarity.similarity_based_distributions([1, 2, 3], bad_updates, 2)
  with pytest.raises(ValueError, match='has 2 rows but there are 3 clients'):
    clustered_similarity.similarity_based_distributions([1, 2, 3], np.ones((2, 2)), 2)
  with pytest.raises(ValueError, match="Unknown similarity 'cosine'"):
    clustered_similarity.similarity_based_distributions(
      [1, 2], np.ones((2, 2)), 2, similarity='cosine'
    )
  with pytest.raises(ValueError, match="Unknown similarity 'cos'"):
    clustered.ClusteredSampler(2, seed=0, method='similarity', similarity='cos', sketch_size=4)
  with pytest.raises(ValueError, match="Unknown method 'random'"):
    clustered.ClusteredSampler(2, seed=0, method='random')
  with pytest.raises(ValueError, match='needs sketch_size.*got None'):
    clustered.ClusteredSampler(2, seed=0, method='similarity')
  with pytest.raises(ValueError, match="sketch_size=4 applies to method='similarity' only"):
    clustered.ClusteredSampler(2, seed=0, sketch_size=4)

  sampler = clustered.ClusteredSampler(4, seed=0, method='similarity', sketch_size=8)
  state = sampler.initialize(_POPULATION)
  selection = samplers.Selection(np.array([0, 3, 3, 9]))
  with pytest.raises(ValueError, match=r"update_sketch'\] has shape \(3, 5\), expected \(4, 8\)"):
    sampler.observe(state, selection, {'update_sketch': np.zeros((3, 5))})
  with pytest.raises(ValueError, match=r"needs signals\['update_sketch'\].*got keys \[\]"):
    sampler.observe(state, selection, {})
  nan_sketch = np.zeros((4, 8))
  nan_sketch[1, 1] = np.nan
  with pytest.raises(ValueError, match='must be finite'):
    sampler.observe(state, selection, {'update_sketch': nan_sketch})
  with pytest.raises(ValueError, match=r'client ids in \[0, 12\)'):
    sampler.observe(
      state, samplers.Selection(np.array([0, 1, 2, 12])), {'update_sketch': np.zeros((4, 8))}
    )
  with pytest.raises(
    ValueError, match=r'distribution_units has shape \(4, 12\), expected \(0, 12\)'
  ):
    sampler.select(
      clustered.ClusteredSampler(4, seed=0).initialize(_POPULATION), 1, np.ones(12, bool)
    )


def test_benchmark_main_tiny_configuration(capsys):
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top

  from bench import clustered as bench_clustered  # pylint: disable=g-import-not-at-top

  with flagsaver.flagsaver(
    cl_sizes=['20', '40'],
    cl_ari_sizes=['30'],
    cl_exact_dim=300,
    cl_sketch_size=64,
    cl_repetitions=1,
    cl_num_draws=4,
    cl_ari_sketch_seeds=2,
  ):
    bench_clustered.main(['clustered'])
  table = capsys.readouterr().out
  assert 'target: N=40' in table and 'NOT met' not in table
  assert 'ARI_groups' in table
  # The covered-directions formula against a hand case: two distributions, each
  # all on one direction, cover both surely; MD with p = (1/2, 1/2) covers
  # 2 (1 - 1/4).
  labels = np.array([0, 1])
  assert bench_clustered.expected_directions_covered(np.eye(2), labels) == 2.0
  assert bench_clustered.expected_directions_covered(np.full((2, 2), 0.5), labels) == 1.5
