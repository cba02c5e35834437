r"""Clustered sampling: ``m`` distributions, one client drawn from each.

Fraboni, Vidal, Kameni, Lorenzi, "Clustered Sampling: Low-Variance and Improved
Representativity for Clients Selection in Federated Learning", ICML 2021
(arXiv:2105.05883); the authors' code is
``github.com/Accenture/Labs-Federated-Learning`` (branch ``clustered_sampling``,
``py_func/clustering.py``). ``docs/algorithms.md`` §2 is the contract.

``N`` clients, client ``i`` holds ``n_i`` examples, ``M = Σ_i n_i``,
``p_i = n_i / M``; ``m`` (``num_draws``) clients per round. Clustered sampling
draws client ``l_k`` from distribution ``W_k`` (probabilities ``r_{k,i}``) for
``k = 1..m`` independently and aggregates ``θ ← (1/m) Σ_k θ_{l_k}`` (a client
drawn twice counts twice). It is unbiased iff ``Σ_i r_{k,i} = 1`` for every
``k`` and ``Σ_k r_{k,i} = m p_i`` for every ``i``; then every client's
aggregation-weight variance ``Σ_k r_{k,i}(1 - r_{k,i}) / m²`` is at most MD
sampling's ``m p_i (1 - p_i) / m²`` and its inclusion probability
``1 - Π_k (1 - r_{k,i})`` at least MD's ``1 - (1 - p_i)^m``.

Both algorithms work in integer *units* (the paper's ``r'_{k,i}``, its
Appendix C): client ``i`` owns ``m n_i`` units, each distribution is a bin of
capacity ``M`` units, and ``r_{k,i} = units of i in bin k / M``. Every bin is
filled to exactly ``M`` and every client's units are all placed, so both
identities hold exactly in integers (`size_based_units`,
`similarity_based_units`); the float ``r`` is the integer matrix divided by
``M``.

**Algorithm 1** (`size_based_distributions`, by sample size, computed once):
order clients by ``n_i`` descending and pour their units, in that order, into
bins ``1, 2, …``, spilling into the next bin when one is full. A client spans
at most ``⌊m p_i⌋ + 2`` bins.

**Algorithm 2** (`similarity_based_distributions`, by model similarity,
recomputed every round):

1. ``G_i``: client ``i``'s representative update (its last model delta, or a
   sketch of it, see `count_sketch`); zero for never-sampled clients.
2. ``ρ_{ij} = s(G_i, G_j)`` with ``s`` the arccos of the cosine (default), the
   L2 or the L1 distance (`similarity_matrix`).
3. Ward hierarchical clustering on the rows of ``ρ`` (`ward_linkage_of_rows`).
4. Cut the tree into the coarsest groups of weight ``q_k ≤ M`` (`cut_by_weight`).
5. Order the groups by ``q_k`` descending; the first groups each seed one
   distribution with all their units; the clients of the remaining groups are
   poured into the distributions, filling each to exactly ``M``.
6. First of all, a client with ``m n_i ≥ M`` gets ``⌊m n_i / M⌋`` dedicated
   distributions of probability 1; only its remainder ``m n_i mod M`` enters
   steps 3-5, which then fill ``m - Σ_i ⌊m n_i / M⌋`` distributions.

Choices made here (**[choice]**), beyond those of ``docs/algorithms.md``:

* **Ties in Algorithm 1.** Clients of equal size keep their index order (a
  stable sort), so the output is a function of the sizes alone.
* **Arccos of zero vectors.** The cosine is undefined when a vector is zero.
  We set ``cos(0, 0) = 1`` (angle 0) and ``cos(0, G) = 0`` (angle ``π/2``) for
  ``G ≠ 0``: never-sampled clients are identical to each other, so their rows
  of ``ρ`` are equal and Ward merges them first, and they are "orthogonal" to
  every observed client. (The authors' code returns angle 0 whenever either
  vector is zero, which makes a zero client identical to everybody.) L2 and L1
  need no convention. The diagonal of ``ρ`` is exactly 0.
* **L2 is the Euclidean distance** ``‖G_i - G_j‖`` (the authors' code uses its
  square); L1 is ``Σ |G_i - G_j|``.
* **Ward on the rows of ρ**, as the authors' code does
  (``scipy.cluster.hierarchy.linkage(ρ, 'ward')`` treats each row of ``ρ`` as an
  observation in ``ℝ^N``). We pass scipy the same Euclidean distances between
  rows, computed by one BLAS product instead of scipy's ``pdist`` loop, so the
  tree is scipy's Ward tree of the rows (the tests compare the two) at a
  fraction of the time for thousands of clients. For L2/L1 the updates are
  first divided by their largest absolute entry: a global scale multiplies
  every distance, which leaves Ward's tree unchanged, and keeps huge (finite)
  updates from overflowing.
* **The tree cut.** The weight of a tree node is the total units ``Σ u_i`` of
  its leaves, where ``u_i = m n_i mod M`` after step 6 (so every leaf weighs
  less than ``M``). Starting from the root, a node of weight ``≤ M`` becomes a
  group (all its leaves, in dendrogram order); a heavier node is replaced by
  its two children, recursively. Since a parent weighs at least as much as
  each child, the groups are the maximal subtrees of weight ``≤ M``: the
  coarsest cut compatible with the capacity, and the same partition as the
  authors' code (``fcluster`` with criterion ``'distance'`` after replacing
  every merge height by the merged weight). ``K ≥ m'`` because the weights sum
  to ``m' M``.
* **Only clients with remaining units are clustered** (``u_i > 0``); a client
  whose units all went to dedicated distributions (``m n_i`` a multiple of
  ``M``) takes no part in steps 2-5.
* **Order in step 5.** Groups of equal weight keep their dendrogram order;
  distributions are numbered after the dedicated ones in descending ``q_k``;
  the remaining groups are poured in descending ``q_k``, the clients of a
  group in dendrogram order (the authors shuffle them with NumPy's global
  generator; dendrogram order is deterministic and keeps similar clients
  adjacent, so the pieces of a split group stay similar), each into the first
  distribution that is not full, splitting a client across bins when needed
  (the paper's Algorithm 2 loop).
* **Representative updates live in the sampler state** as ``float32[N, d]``
  (``d = sketch_size``), replaced by `ClusteredSampler.observe` with the rows
  the round's clients report; a client in several cohort slots gets the mean
  of its slots' rows (equal to each of them when the process reports the same
  update for every slot of a client).
* **Availability.** ``r`` is computed over all clients (as in the paper);
  `ClusteredSampler.select` then renormalises each distribution ``W_k`` over
  the available clients and, when ``W_k`` has no available client at all,
  draws slot ``k`` by MD sampling over the available clients (``∝ n_i``). With
  every client available this is exactly the paper's sampling; otherwise it
  is unbiased only for the available clients' objective, like MD sampling.

**Determinism.** Everything is a function of the inputs; the only randomness
is `select`'s draw from ``round_rng(seed, round)``. Algorithm 2's tree comes
from floating-point products (BLAS): a restart on the same machine reproduces
it exactly, while another BLAS build could break an exact tie differently.

The count sketch (`count_sketch`, `count_sketch_hashes`) is for clients: a
fixed seeded hash ``h: [D] → [s]`` and signs ``σ: [D] → {±1}`` map an update
``x ∈ ℝ^D`` to ``y_b = Σ_{j: h(j) = b} σ(j) x_j``, which preserves inner products
in expectation. A TFF client can apply the same map with the two hash arrays
as constants: ``tf.math.unsorted_segment_sum(x * signs, buckets, s)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
from scipy import sparse
from scipy.cluster import hierarchy
from scipy.spatial import distance

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base
from tff_sampling.samplers import md

SIMILARITIES = ('arccos', 'L2', 'L1')
METHODS = ('size', 'similarity')

# Stream ids of the round generator; the count-sketch hashes use their own
# generator seeded by (seed, _SKETCH_STREAM).
_COHORT_STREAM = 0
_SKETCH_STREAM = 7919

# Rows compared at a time when looking for identical rows (bounds the memory).
_CHUNK_ROWS = 256


# ------------------------------------------------------------------------------
# Algorithm 1: by sample size.


def size_based_units(client_sizes: np.ndarray, num_draws: int) -> np.ndarray:
  """Algorithm 1 in integer units: ``units[k, i]`` units of client ``i`` in bin ``k``.

  Client ``i`` owns ``m n_i`` units; the clients, by ``n_i`` descending (ties
  by index), are poured into ``m`` bins of capacity ``M = Σ n_i``. Viewing the
  bins end to end as the interval ``[0, m M)``, the client at sorted position
  ``j`` occupies ``[C_{j-1}, C_j)`` with ``C_j`` the cumulative units, and its
  units in bin ``k`` are the overlap with ``[k M, (k+1) M)``.

  Args:
    client_sizes: ``[N]`` positive integer sizes ``n_i``.
    num_draws: ``m``.

  Returns:
    ``int64[m, N]``; every row sums to ``M``, column ``i`` to ``m n_i``.

  Raises:
    ValueError: If `num_draws` is not a positive integer or a size is not a
      positive integer.
  """
  num_draws = md.validate_num_draws(num_draws)
  sizes = md.validate_client_sizes(client_sizes, num_draws)
  capacity = int(sizes.sum())
  order = np.argsort(-sizes, kind='stable')
  end = np.cumsum(num_draws * sizes[order])
  start = end - num_draws * sizes[order]
  bin_start = capacity * np.arange(num_draws, dtype=np.int64)[:, None]
  overlap = np.minimum(end[None, :], bin_start + capacity) - np.maximum(start[None, :], bin_start)
  units = np.zeros((num_draws, sizes.shape[0]), np.int64)
  units[:, order] = np.maximum(overlap, 0)
  return units


def size_based_distributions(client_sizes: np.ndarray, num_draws: int) -> np.ndarray:
  """Algorithm 1 of Fraboni et al.: the ``m`` distributions by sample size.

  Args:
    client_sizes: ``[N]`` positive integer sizes ``n_i``.
    num_draws: ``m``, the number of distributions (clients per round).

  Returns:
    ``float64[m, N]`` probabilities ``r``: ``Σ_i r[k, i] = 1`` and
    ``Σ_k r[k, i] = m n_i / M``.

  Raises:
    ValueError: As `size_based_units`.
  """
  units = size_based_units(client_sizes, num_draws)
  return units / units[0].sum()


# ------------------------------------------------------------------------------
# Algorithm 2: by model similarity.


def _validate_updates(representative_updates: np.ndarray, num_clients: int | None) -> np.ndarray:
  updates = np.asarray(representative_updates)
  if updates.ndim != 2:
    raise ValueError(
      f'representative_updates must be a 2-D array [N, d], got shape {updates.shape}.'
    )
  if num_clients is not None and updates.shape[0] != num_clients:
    raise ValueError(
      f'representative_updates has {updates.shape[0]} rows but there are {num_clients} clients.'
    )
  if not np.issubdtype(updates.dtype, np.number):
    raise ValueError(f'representative_updates must be numeric, got dtype {updates.dtype}.')
  finite = np.isfinite(updates)
  if not np.all(finite):
    row = int(np.flatnonzero(~np.all(finite, axis=1))[0])
    raise ValueError(f'representative_updates must be finite; row {row} (client {row}) is not.')
  return updates.astype(np.float64)


def _validate_similarity(similarity: str) -> str:
  if similarity not in SIMILARITIES:
    raise ValueError(f'Unknown similarity {similarity!r}; expected one of {SIMILARITIES}.')
  return similarity


def similarity_matrix(representative_updates: np.ndarray, similarity: str = 'arccos') -> np.ndarray:
  """The matrix ``ρ_{ij} = s(G_i, G_j)`` between the rows of the updates.

  Args:
    representative_updates: ``[N, d]`` finite updates ``G_i`` (zero rows for
      never-sampled clients).
    similarity: ``'arccos'`` (angle in ``[0, π]``, with ``cos(0, 0) = 1`` and
      ``cos(0, G) = 0``: see the module docstring), ``'L2'`` (Euclidean
      distance) or ``'L1'``.

  Returns:
    ``float64[N, N]`` symmetric, non-negative, with a zero diagonal (a
    dissimilarity: 0 for identical clients).

  Raises:
    ValueError: If `similarity` is unknown or the updates are not a finite 2-D
      array.
  """
  return _similarity_matrix(
    _validate_updates(representative_updates, None), _validate_similarity(similarity)
  )


def _similarity_matrix(updates: np.ndarray, similarity: str) -> np.ndarray:
  """`similarity_matrix` of validated ``float64[N, d]`` updates."""
  if similarity == 'arccos':
    matrix = _arccos_matrix(updates)
  else:
    if similarity == 'L1':
      matrix = distance.squareform(distance.pdist(updates, 'cityblock'))
    else:
      updates = updates - updates.mean(axis=0)  # As in `ward_linkage_of_rows`.
      squared_norms = np.einsum('ij,ij->i', updates, updates)
      # `x @ x.T` of one buffer runs as a symmetric rank-k update (half the work).
      squared = squared_norms[:, None] + squared_norms[None, :] - 2.0 * (updates @ updates.T)
      matrix = np.sqrt(np.maximum(squared, 0.0))
    matrix = 0.5 * (matrix + matrix.T)  # Exactly symmetric whatever BLAS did.
  np.fill_diagonal(matrix, 0.0)
  return matrix


def _arccos_matrix(updates: np.ndarray) -> np.ndarray:
  """The angles between the rows, with the zero-vector convention, off the diagonal.

  Only the nonzero rows go through the product and the arccos: a zero row is
  at angle 0 from the other zero rows and ``π/2`` (``arccos(0)``) from the
  rest. A BLAS computes each entry of a product from its two rows alone, so
  every angle is the one that the product of all the rows (zero rows
  included) gives.
  """
  num_clients = updates.shape[0]
  # Scale each row by its largest entry before the norm so that neither
  # tiny nor huge (finite) updates underflow or overflow.
  largest = np.max(np.abs(updates), axis=1, initial=0.0)
  nonzero = np.flatnonzero(largest > 0)
  unit = updates[nonzero] / largest[nonzero, None]
  unit /= np.linalg.norm(unit, axis=1)[:, None]
  cosine = unit @ unit.T
  np.clip(cosine, -1.0, 1.0, out=cosine)
  angle = np.arccos(cosine, out=cosine)
  angle = angle + angle.T  # Exactly symmetric whatever BLAS did.
  angle *= 0.5
  if nonzero.shape[0] == num_clients:
    return angle
  zero = np.flatnonzero(largest == 0)
  matrix = np.full((num_clients, num_clients), np.pi / 2)  # == np.arccos(0.0).
  matrix[np.ix_(zero, zero)] = 0.0
  matrix[np.ix_(nonzero, nonzero)] = angle
  return matrix


def ward_linkage_of_rows(matrix: np.ndarray) -> np.ndarray:
  """Ward's hierarchical clustering of the rows of `matrix`.

  The same tree as ``scipy.cluster.hierarchy.linkage(matrix, 'ward')``, which
  treats each row as an observation and clusters by the Euclidean distances
  between rows: those distances are computed here with one BLAS product
  (``‖a - b‖² = ‖a‖² + ‖b‖² - 2 a·b``) and passed to scipy's Ward in condensed
  form.

  Rows that are bit-for-bit identical (the rows of ρ of never-sampled clients)
  enter the product once: the product, the expansion and the square root run
  on the ``U`` distinct rows (``O(U² N)`` instead of ``O(N³)``) and the
  condensed distances of all ``N`` rows are gathered from them. A BLAS
  computes each entry of a product from its two rows alone, so every distance
  is the one the product of all ``N`` rows gives, and so is the tree.

  Args:
    matrix: ``[N, F]`` finite observations, ``N ≥ 2`` (here the rows of the
      similarity matrix, ``F = N``).

  Returns:
    The ``[N - 1, 4]`` scipy linkage matrix.
  """
  rows = np.asarray(matrix, np.float64)
  num_rows = rows.shape[0]
  # Centering leaves the distances unchanged and shrinks the norms, hence the
  # cancellation error of the expansion (identical rows stay ~1e-7 apart).
  mean = rows.mean(axis=0)
  rows = np.ascontiguousarray(rows)
  distinct, inverse = np.unique(_first_identical_row(rows), return_inverse=True)
  centered = rows[distinct]
  centered -= mean
  squared_norms = np.einsum('ij,ij->i', centered, centered)
  # `x @ x.T` of one buffer runs as a symmetric rank-k update (half the work).
  gram = centered @ centered.T
  del centered
  gram *= 2.0
  squared = np.add.outer(squared_norms, squared_norms)
  squared -= gram
  del gram
  np.maximum(squared, 0.0, out=squared)
  distances = np.sqrt(squared, out=squared)
  if distinct.shape[0] == num_rows:
    condensed = distance.squareform(distances, checks=False)
  else:
    # Row i of the condensed matrix holds the distances to rows i+1..N-1.
    condensed = np.empty(num_rows * (num_rows - 1) // 2)
    start = 0
    for row in range(num_rows - 1):
      stop = start + num_rows - 1 - row
      np.take(distances[inverse[row]], inverse[row + 1 :], out=condensed[start:stop])
      start = stop
  return hierarchy.linkage(condensed, 'ward')


def _first_identical_row(rows: np.ndarray) -> np.ndarray:
  """For each row, the first row with the same bits (itself if none).

  Rows are grouped by a fixed random projection and a candidate duplicate is
  kept only if its bits equal its group's first row; a duplicate missed this
  way is merely computed twice. At least two rows stay distinct (when there
  are two), so that the product in `ward_linkage_of_rows` is a matrix product
  (numpy computes a ``1 × 1`` product with a dot product instead).
  """
  num_rows = rows.shape[0]
  probe = np.random.default_rng(0).standard_normal(rows.shape[1])
  _, first, group = np.unique(rows @ probe, return_index=True, return_inverse=True)
  first_identical = first[group]
  candidates = np.flatnonzero(first_identical != np.arange(num_rows))
  bits = rows.view(np.int64)
  for start in range(0, candidates.shape[0], _CHUNK_ROWS):
    chunk = candidates[start : start + _CHUNK_ROWS]
    differ = chunk[np.any(bits[chunk] != bits[first_identical[chunk]], axis=1)]
    first_identical[differ] = differ
  if num_rows >= 2 and np.all(first_identical == 0):
    first_identical[1] = 1
  return first_identical


def cut_by_weight(
  linkage_matrix: np.ndarray, weights: np.ndarray, capacity: int
) -> list[np.ndarray]:
  """Cuts a tree into its maximal subtrees of weight ``≤ capacity``.

  The weight of a node is the sum of its leaves' `weights`. From the root, a
  node of weight ``≤ capacity`` becomes a group; a heavier node is replaced by
  its two children. Weights are non-negative, so a parent weighs at least as
  much as its children and the groups are the coarsest partition into
  subtrees of weight ``≤ capacity``.

  Args:
    linkage_matrix: ``[N - 1, 4]`` scipy linkage matrix over ``N`` leaves
      (``[0, 4]`` when ``N = 1``).
    weights: ``int64[N]`` non-negative leaf weights (units), each
      ``≤ capacity``.
    capacity: The largest weight of a group (``M``).

  Returns:
    The groups as arrays of leaf indices, each in dendrogram (left-to-right)
    order; the groups in dendrogram order of their roots.

  Raises:
    ValueError: If a leaf is heavier than `capacity`.
  """
  weights = np.asarray(weights, np.int64)
  num_leaves = weights.shape[0]
  if np.any(weights > capacity):
    leaf = int(np.flatnonzero(weights > capacity)[0])
    raise ValueError(
      f'Leaf {leaf} weighs {weights[leaf]} > capacity {capacity}; no cut can hold it.'
    )
  if num_leaves == 1:
    return [np.zeros(1, np.int64)]
  children = np.asarray(linkage_matrix[:, :2], np.int64)
  node_weight = np.concatenate([weights, np.zeros(num_leaves - 1, np.int64)]).tolist()
  node_size = [1] * (2 * num_leaves - 1)
  for merge, (left, right) in enumerate(children.tolist(), start=num_leaves):
    node_weight[merge] = node_weight[left] + node_weight[right]
    node_size[merge] = node_size[left] + node_size[right]

  # The leaves of a subtree are consecutive in the dendrogram order of the
  # whole tree, and a left-first traversal meets the groups from left to
  # right: each group is the next `node_size` leaves of that order.
  order = hierarchy.leaves_list(linkage_matrix).astype(np.int64)
  groups, stack, position = [], [2 * num_leaves - 2], 0
  while stack:
    node = stack.pop()
    if node_weight[node] <= capacity:
      groups.append(order[position : position + node_size[node]])
      position += node_size[node]
    else:
      left, right = children[node - num_leaves]
      stack.extend((right, left))  # Left first: dendrogram order.
  return groups


class _Allocation(NamedTuple):
  units: np.ndarray  # int64[m, N].
  groups: list[np.ndarray]  # Step-4 groups, in the order they were used (q descending).


def _similarity_allocation(
  client_sizes: np.ndarray, representative_updates: np.ndarray, num_draws: int, similarity: str
) -> _Allocation:
  """Algorithm 2 (steps 6, then 2-5); see `similarity_based_units`."""
  num_draws = md.validate_num_draws(num_draws)
  sizes = md.validate_client_sizes(client_sizes, num_draws)
  similarity = _validate_similarity(similarity)
  updates = _validate_updates(representative_updates, sizes.shape[0])
  capacity = int(sizes.sum())
  num_clients = sizes.shape[0]
  units = np.zeros((num_draws, num_clients), np.int64)

  # Step 6: dedicated distributions for clients with m n_i ≥ M (largest first).
  dedicated, remainder = np.divmod(num_draws * sizes, capacity)
  row = 0
  for client in np.argsort(-sizes, kind='stable'):
    units[row : row + dedicated[client], client] = capacity
    row += int(dedicated[client])
  if row == num_draws:
    return _Allocation(units, [])

  # Steps 2-4 on the clients with remaining units.
  # At least two clients: the remainders sum to (m - row) M ≥ M and each is < M.
  clustered = np.flatnonzero(remainder > 0)
  updates = updates[clustered]
  largest = np.max(np.abs(updates))
  if similarity != 'arccos' and largest > 0:
    # Distances scale with the updates and Ward's tree is invariant to a
    # global scale; the rescaling keeps huge (finite) updates from overflowing.
    updates = updates / largest
  matrix = _similarity_matrix(updates, similarity)
  groups = cut_by_weight(ward_linkage_of_rows(matrix), remainder[clustered], capacity)
  groups = [clustered[group] for group in groups]
  weights = np.array([remainder[group].sum() for group in groups], np.int64)
  order = np.argsort(-weights, kind='stable')
  groups = [groups[g] for g in order]

  # Step 5: seed one distribution per heaviest group, pour the others.
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
  return _Allocation(units, groups)


def similarity_based_units(
  client_sizes: np.ndarray,
  representative_updates: np.ndarray,
  num_draws: int,
  *,
  similarity: str = 'arccos',
) -> np.ndarray:
  """Algorithm 2 in integer units; see `similarity_based_distributions`.

  Returns:
    ``int64[m, N]``; every row sums to ``M``, column ``i`` to ``m n_i``. The
    first ``Σ_i ⌊m n_i / M⌋`` rows are the dedicated distributions of step 6.
  """
  return _similarity_allocation(client_sizes, representative_updates, num_draws, similarity).units


def similarity_based_distributions(
  client_sizes: np.ndarray,
  representative_updates: np.ndarray,
  num_draws: int,
  *,
  similarity: str = 'arccos',
) -> np.ndarray:
  """Algorithm 2 of Fraboni et al.: the ``m`` distributions by model similarity.

  Step 6 (dedicated distributions for clients with ``m n_i ≥ M``), then the
  similarity matrix, Ward's tree of its rows, the cut into the coarsest groups
  of weight ``≤ M`` and the allocation of step 5; the module docstring states
  every choice.

  Args:
    client_sizes: ``[N]`` positive integer sizes ``n_i``.
    representative_updates: ``[N, d]`` finite representative updates ``G_i``
      (or their sketches); zero rows for never-sampled clients.
    num_draws: ``m``, the number of distributions.
    similarity: ``'arccos'`` (default), ``'L2'`` or ``'L1'``.

  Returns:
    ``float64[m, N]`` probabilities ``r``: ``Σ_i r[k, i] = 1`` and
    ``Σ_k r[k, i] = m n_i / M``.

  Raises:
    ValueError: If `num_draws` or a size is not a positive integer, the updates
      are not a finite ``[N, d]`` array, or `similarity` is unknown.
  """
  units = similarity_based_units(
    client_sizes, representative_updates, num_draws, similarity=similarity
  )
  return units / units[0].sum()


def similarity_groups(
  client_sizes: np.ndarray,
  representative_updates: np.ndarray,
  num_draws: int,
  *,
  similarity: str = 'arccos',
) -> np.ndarray:
  """The groups ``B_k`` of step 4 of Algorithm 2, as labels (for analysis).

  Args:
    client_sizes, representative_updates, num_draws, similarity: As
      `similarity_based_distributions`.

  Returns:
    ``int64[N]``: the group of each client, numbered by descending weight
    ``q_k`` (0 is the heaviest); ``-1`` for clients that take no part in the
    clustering (all their units went to dedicated distributions).
  """
  allocation = _similarity_allocation(client_sizes, representative_updates, num_draws, similarity)
  labels = np.full(np.asarray(client_sizes).shape[0], -1, np.int64)
  for label, group in enumerate(allocation.groups):
    labels[group] = label
  return labels


# ------------------------------------------------------------------------------
# Exact per-client statistics (§2 of the paper, Section 3.2).


def _validate_probabilities(values: np.ndarray, name: str) -> np.ndarray:
  values = np.asarray(values, np.float64)
  if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
    raise ValueError(f'{name} must be probabilities in [0, 1].')
  return values


def md_inclusion_probability(p: np.ndarray, num_draws: int) -> np.ndarray:
  """``P(i sampled) = 1 - (1 - p_i)^m`` under MD sampling.

  Args:
    p: ``[N]`` importances ``p_i = n_i / M``.
    num_draws: ``m``.

  Returns:
    ``float64[N]``.
  """
  num_draws = md.validate_num_draws(num_draws)
  return 1.0 - (1.0 - _validate_probabilities(p, 'p')) ** num_draws


def clustered_inclusion_probability(r: np.ndarray) -> np.ndarray:
  """``P(i sampled) = 1 - Π_k (1 - r_{k,i})`` under clustered sampling.

  Args:
    r: ``[m, N]`` distributions.

  Returns:
    ``float64[N]``.
  """
  return 1.0 - np.prod(1.0 - _validate_probabilities(r, 'r'), axis=0)


def md_weight_variance(p: np.ndarray, num_draws: int) -> np.ndarray:
  """Variance of client i's aggregation weight ``#draws(i) / m`` under MD sampling.

  ``#draws(i) ~ Binomial(m, p_i)``, so the variance is ``m p_i (1 - p_i) / m²``.

  Args:
    p: ``[N]`` importances ``p_i = n_i / M``.
    num_draws: ``m``.

  Returns:
    ``float64[N]``.
  """
  num_draws = md.validate_num_draws(num_draws)
  p = _validate_probabilities(p, 'p')
  return num_draws * p * (1.0 - p) / num_draws**2


def clustered_weight_variance(r: np.ndarray) -> np.ndarray:
  """Variance of client i's aggregation weight under clustered sampling.

  ``#draws(i)`` is a sum of independent Bernoulli(``r_{k,i}``), so the variance
  of ``#draws(i) / m`` is ``Σ_k r_{k,i} (1 - r_{k,i}) / m²``.

  Args:
    r: ``[m, N]`` distributions.

  Returns:
    ``float64[N]``.
  """
  r = _validate_probabilities(r, 'r')
  return np.sum(r * (1.0 - r), axis=0) / r.shape[0] ** 2


def expected_distinct_clients(r: np.ndarray) -> float:
  """Expected number of distinct clients per round, ``Σ_i P(i sampled)``.

  MD sampling is the special case ``r[k] = p`` for every ``k``.
  """
  return float(np.sum(clustered_inclusion_probability(r)))


def distinct_clients(selection: base.Selection | np.ndarray) -> int:
  """Number of distinct clients in a selection (or an array of client ids)."""
  clients = selection.clients if isinstance(selection, base.Selection) else selection
  return int(np.unique(np.asarray(clients)).shape[0])


# ------------------------------------------------------------------------------
# Count sketch of client updates.


def count_sketch_hashes(dim: int, sketch_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The hash ``h`` and signs ``σ`` of the count sketch ``ℝ^dim → ℝ^sketch_size``.

  Args:
    dim: ``D``, the length of the flattened update.
    sketch_size: ``s``, the length of the sketch.
    seed: The sketch's seed; clients and server must share it (and it must stay
      fixed across rounds, so that sketches of different rounds compare).

  Returns:
    ``(buckets int64[D] in [0, s), signs float32[D] in {-1, +1})``.

  Raises:
    ValueError: If `dim` or `sketch_size` is not a positive integer.
  """
  validation.positive_int('dim', dim)
  validation.positive_int('sketch_size', sketch_size)
  rng = np.random.default_rng([int(seed), _SKETCH_STREAM])
  buckets = rng.integers(0, sketch_size, size=dim, dtype=np.int64)
  signs = (2 * rng.integers(0, 2, size=dim) - 1).astype(np.float32)
  return buckets, signs


def count_sketch(vectors: np.ndarray, sketch_size: int, seed: int) -> np.ndarray:
  """Count sketch of each row: ``y_b = Σ_{j: h(j) = b} σ(j) x_j``.

  ``E[⟨Sx, Sy⟩] = ⟨x, y⟩``, so angles and distances between sketches estimate
  those between the vectors (relative error ``~1/√s`` on inner products).

  Args:
    vectors: ``[n, D]`` (or ``[D]``) finite vectors.
    sketch_size: ``s``.
    seed: As `count_sketch_hashes`.

  Returns:
    ``[n, s]`` (or ``[s]``) sketches, in the input's float dtype (float64 for
    integer input).

  Raises:
    ValueError: If the vectors are not finite or the sizes are not positive.
  """
  vectors = np.asarray(vectors)
  squeeze = vectors.ndim == 1
  matrix = np.atleast_2d(vectors)
  if matrix.ndim != 2:
    raise ValueError(f'vectors must be 1-D or 2-D, got shape {vectors.shape}.')
  if not np.all(np.isfinite(matrix)):
    raise ValueError('vectors must be finite.')
  dtype = matrix.dtype if np.issubdtype(matrix.dtype, np.floating) else np.float64
  dim = matrix.shape[1]
  buckets, signs = count_sketch_hashes(dim, sketch_size, seed)
  projection = sparse.csr_matrix(
    (signs.astype(dtype), (buckets, np.arange(dim))), shape=(sketch_size, dim)
  )
  sketches = np.asarray((projection @ matrix.astype(dtype).T).T, dtype=dtype)
  return sketches[0] if squeeze else sketches


# ------------------------------------------------------------------------------
# The sampler.


class ClusteredSamplerState(NamedTuple):
  """The state of a `ClusteredSampler` (a nest of arrays, checkpointable).

  Attributes:
    num_examples: ``int64[N]`` client sizes ``n_i``.
    distribution_units: ``int64[m, N]`` Algorithm 1's distributions in integer
      units (``r = units / M``) for ``method='size'``; ``int64[0, N]`` for
      ``method='similarity'``, whose distributions are recomputed every round
      from the representative updates.
    representative_updates: ``float32[N, d]`` each client's last reported
      update sketch (zeros until it is first observed) for
      ``method='similarity'``; ``float32[N, 0]`` for ``method='size'``.
  """

  num_examples: np.ndarray
  distribution_units: np.ndarray
  representative_updates: np.ndarray


class ClusteredSampler(base.Sampler):
  """Clustered sampling (Fraboni et al., ICML 2021): one client per distribution.

  Each round draws client ``l_k`` from distribution ``W_k`` for each of the
  ``num_draws`` distributions (slot ``k`` of the selection), each slot with
  aggregation weight ``1 / num_draws`` (a client drawn from two distributions
  appears twice). ``method='size'`` uses Algorithm 1, computed once by
  `initialize`; ``method='similarity'`` uses Algorithm 2 on the representative
  updates held in the state, recomputed by every `select`; `observe` stores the
  sketches that the round's clients report under ``signals['update_sketch']``.
  Unavailable clients are handled as the module docstring says
  (renormalisation, MD fallback for a distribution with no available client).
  """

  weighting = 'equal'

  def __init__(
    self,
    num_draws: int,
    *,
    seed: int,
    method: str = 'size',
    similarity: str = 'arccos',
    sketch_size: int | None = None,
  ):
    """Initializes the sampler.

    Args:
      num_draws: ``m``, the number of distributions, i.e. of cohort slots.
      seed: Root of the sampler's randomness (with the round number).
      method: ``'size'`` (Algorithm 1) or ``'similarity'`` (Algorithm 2).
      similarity: For ``'similarity'``: ``'arccos'``, ``'L2'`` or ``'L1'``.
      sketch_size: For ``'similarity'`` (required): ``d``, the length of the
        representative update rows that clients report (a count sketch of
        their model delta, or the flattened delta itself).

    Raises:
      ValueError: If an argument is invalid or does not apply to `method`.
    """
    self.num_draws = md.validate_num_draws(num_draws)
    self.seed = int(seed)
    if method not in METHODS:
      raise ValueError(f'Unknown method {method!r}; expected one of {METHODS}.')
    self.method = method
    self.similarity = _validate_similarity(similarity)
    if method == 'similarity':
      if (
        sketch_size is None
        or isinstance(sketch_size, bool)
        or not isinstance(sketch_size, (int, np.integer))
        or sketch_size <= 0
      ):
        raise ValueError(
          "method='similarity' needs sketch_size, the positive length of the "
          f'representative update rows; got {sketch_size!r}.'
        )
      self.sketch_size = int(sketch_size)
      self.needs_signals = frozenset({contract.UPDATE_SKETCH})
    else:
      if sketch_size is not None:
        raise ValueError(f"sketch_size={sketch_size!r} applies to method='similarity' only.")
      if similarity != 'arccos':
        raise ValueError(f"similarity={similarity!r} applies to method='similarity' only.")
      self.sketch_size = 0

  def initialize(self, population: base.Population) -> ClusteredSamplerState:
    """Returns the initial state (Algorithm 1 for ``'size'``, zero updates otherwise).

    Raises:
      ValueError: If a client size is not a positive integer.
    """
    sizes = md.validate_client_sizes(population.num_examples, self.num_draws)
    num_clients = sizes.shape[0]
    if self.method == 'size':
      units = size_based_units(sizes, self.num_draws)
    else:
      units = np.zeros((0, num_clients), np.int64)
    return ClusteredSamplerState(
      num_examples=sizes,
      distribution_units=units,
      representative_updates=np.zeros((num_clients, self.sketch_size), np.float32),
    )

  def _check_state(self, state: ClusteredSamplerState) -> ClusteredSamplerState:
    sizes = md.validate_client_sizes(state.num_examples, self.num_draws)
    num_clients = sizes.shape[0]
    rows = self.num_draws if self.method == 'size' else 0
    units = np.asarray(state.distribution_units)
    updates = np.asarray(state.representative_updates)
    if units.shape != (rows, num_clients):
      raise ValueError(
        f'state.distribution_units has shape {units.shape}, expected '
        f'{(rows, num_clients)} for method={self.method!r}.'
      )
    if updates.shape != (num_clients, self.sketch_size):
      raise ValueError(
        f'state.representative_updates has shape {updates.shape}, expected '
        f'{(num_clients, self.sketch_size)}.'
      )
    return ClusteredSamplerState(sizes, units.astype(np.int64), updates)

  def distribution_units(self, state: ClusteredSamplerState) -> np.ndarray:
    """The round's distributions in integer units, ``int64[m, N]`` (``r = units / M``)."""
    state = self._check_state(state)
    if self.method == 'size':
      return state.distribution_units
    return similarity_based_units(
      state.num_examples, state.representative_updates, self.num_draws, similarity=self.similarity
    )

  def distributions(self, state: ClusteredSamplerState) -> np.ndarray:
    """The round's distributions ``r``, ``float64[m, N]``."""
    units = self.distribution_units(state)
    return units / units[0].sum()

  def select(
    self,
    state: ClusteredSamplerState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    """Draws one client from each distribution among the available clients.

    Raises:
      ValueError: If `available` has the wrong shape or is all False, or the
        state does not match the sampler.
    """
    del probe  # Selects without one.
    units = self.distribution_units(state)
    sizes = np.asarray(state.num_examples, np.int64)
    mask = md.validate_available(available, sizes.shape[0], round_num)
    units = np.where(mask[None, :], units, 0)
    # A distribution with no available client falls back to MD sampling over
    # the available clients.
    empty = units.sum(axis=1) == 0
    units[empty] = np.where(mask, sizes, 0)
    rng = base.round_rng(self.seed, round_num, _COHORT_STREAM)
    return base.Selection(
      clients=md.draw_categorical(rng, units),
      weights=np.full(self.num_draws, 1.0 / self.num_draws, np.float32),
    )

  def observe(
    self, state: ClusteredSamplerState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> ClusteredSamplerState:
    """Stores the selected clients' reported update sketches (``'similarity'``).

    Args:
      state: The state the round's selection was made from.
      selection: The round's selection (``K`` slots).
      signals: For ``'similarity'``: ``'update_sketch'``, ``[K, d]`` finite rows
        in slot order. Ignored for ``'size'``.

    Returns:
      The new state: for ``'similarity'``, each selected client's row replaced
      by its sketch (the mean of its slots' rows when it holds several slots).

    Raises:
      ValueError: If the sketch is missing, has the wrong shape or is not
        finite, or a selected client is out of range.
    """
    state = self._check_state(state)
    if self.method == 'size':
      return state
    if contract.UPDATE_SKETCH not in signals:
      raise ValueError(
        "method='similarity' needs signals['update_sketch'] ([num_slots, "
        f'{self.sketch_size}]), got keys {sorted(signals)}.'
      )
    clients = np.asarray(selection.clients, np.int64)
    num_clients = state.num_examples.shape[0]
    if clients.ndim != 1 or np.any(clients < 0) or np.any(clients >= num_clients):
      raise ValueError(
        f'selection.clients must be a 1-D array of client ids in [0, {num_clients}), '
        f'got {clients!r}.'
      )
    sketches = np.asarray(signals[contract.UPDATE_SKETCH])
    expected = (clients.shape[0], self.sketch_size)
    if sketches.shape != expected:
      raise ValueError(
        f"signals['update_sketch'] has shape {sketches.shape}, expected {expected} "
        '(one row of length sketch_size per cohort slot).'
      )
    if not np.issubdtype(sketches.dtype, np.number) or not np.all(np.isfinite(sketches)):
      raise ValueError("signals['update_sketch'] must be finite numbers.")
    unique, slot_client = np.unique(clients, return_inverse=True)
    totals = np.zeros((unique.shape[0], self.sketch_size), np.float64)
    np.add.at(totals, slot_client, sketches.astype(np.float64))
    counts = np.bincount(slot_client, minlength=unique.shape[0])
    updates = np.array(state.representative_updates, np.float32, copy=True)
    updates[unique] = (totals / counts[:, None]).astype(np.float32)
    return state._replace(representative_updates=updates)
