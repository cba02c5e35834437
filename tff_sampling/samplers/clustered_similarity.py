"""Clustered sampling by similarity (Fraboni et al., ICML 2021, Algorithm 2): client updates'
similarity, Ward's hierarchical clustering, and the cut into ``m`` groups of equal weight that
become the ``m`` distributions."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.cluster import hierarchy
from scipy.spatial import distance

from tff_sampling.samplers import md

SIMILARITIES = ('arccos', 'L2', 'L1')


# Rows compared at a time when looking for identical rows (bounds the memory).
_CHUNK_ROWS = 256


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


def validate_similarity(similarity: str) -> str:
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
    _validate_updates(representative_updates, None), validate_similarity(similarity)
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
  similarity = validate_similarity(similarity)
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
