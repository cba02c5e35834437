"""FedGS's selection problem (Wang et al., AAAI 2023): the 3DG's shortest-path distances from
client similarities, the count scores, and the objective that `fedgs_solvers` maximises."""

from __future__ import annotations

from collections.abc import Sequence
import math
import numbers
from typing import NamedTuple

import numpy as np
from scipy.sparse import csgraph

from tff_sampling import validation


def similarity_from_features(features: np.ndarray, kind: str = 'cosine') -> np.ndarray:
  """Returns ``V`` with ``V_ij = max(cos(u_i, u_j), 0)`` (the paper's Eq. 12).

  Args:
    features: ``float[N, F]`` one feature vector per client (a label
      distribution, a mean embedding or an update sketch).
    kind: The similarity; only ``'cosine'`` (clipped at 0) is defined.

  Returns:
    ``float64[N, N]`` symmetric, in ``[0, 1]``, with unit diagonal. A zero
    vector has similarity 0 with every other client.

  Raises:
    ValueError: If `kind` is unknown or `features` is not a finite 2-D array.
  """
  if kind != 'cosine':
    raise ValueError(f"kind must be 'cosine', got {kind!r}.")
  u = np.asarray(features, dtype=np.float64)
  if u.ndim != 2:
    raise ValueError(f'features must have shape [N, F], got {u.shape}.')
  if not np.all(np.isfinite(u)):
    raise ValueError('features must be finite.')
  norms = np.linalg.norm(u, axis=1)
  unit = np.divide(u, norms[:, None], out=np.zeros_like(u), where=norms[:, None] > 0)
  similarity = np.clip(unit @ unit.T, 0.0, 1.0)
  np.fill_diagonal(similarity, 1.0)
  return similarity


def validate_square(matrix: np.ndarray, name: str) -> np.ndarray:
  m = np.asarray(matrix, dtype=np.float64)
  if m.ndim != 2 or m.shape[0] != m.shape[1]:
    raise ValueError(f'{name} must be a square [N, N] matrix, got shape {m.shape}.')
  return m


KERNELS = {'linear': 1, 'squared': 2}  # Edge weight exp(-V^p / σ²): the power p of V.


def graph_distances(
  similarity: np.ndarray, *, epsilon: float = 0.1, sigma2: float = 0.01, kernel: str = 'linear'
) -> np.ndarray:
  """Returns the normalised shortest-path matrix ``H`` of the 3DG (§3a).

  Args:
    similarity: ``float[N, N]`` symmetric similarities ``V`` (see
      `similarity_from_features`); min-max normalised here over the
      off-diagonal entries.
    epsilon: The paper's ``ε``: pairs with normalised ``V_ij < ε`` get no edge.
    sigma2: The paper's ``σ²`` (> 0): edge weight ``exp(-V_ij / σ²)``.
    kernel: ``'linear'``, the paper's ``exp(-V_ij / σ²)``, or ``'squared'``,
      ``exp(-V_ij² / σ²)`` (the authors' published code, with ``σ² = 0.1``).

  Returns:
    ``float64[N, N]`` symmetric, zero diagonal, entries in ``[0, 1]``; small
    between similar clients; 1 for unreachable pairs.

  Raises:
    ValueError: If `similarity` is not a finite symmetric square matrix or
      `sigma2` is not positive, or `kernel` is unknown.
  """
  if kernel not in KERNELS:
    raise ValueError(f'kernel={kernel!r} is unknown; choose from {", ".join(KERNELS)}.')
  v = validate_square(similarity, 'similarity')
  if not np.all(np.isfinite(v)):
    raise ValueError('similarity must be finite.')
  if not np.allclose(v, v.T, rtol=0, atol=1e-12):
    raise ValueError('similarity must be symmetric.')
  validation.positive_number('sigma2', sigma2)
  n = v.shape[0]
  off = ~np.eye(n, dtype=bool)
  if n <= 1:
    return np.zeros((n, n))
  lo, hi = v[off].min(), v[off].max()
  # A constant V carries no information: all pairs equally similar.
  normalised = np.ones_like(v) if hi == lo else (v - lo) / (hi - lo)
  weights = np.where(
    normalised >= epsilon, np.exp(-(normalised ** KERNELS[kernel]) / sigma2), np.inf
  )
  weights[~off] = np.inf  # R_ii = 0 needs no edge: a path to oneself is empty.
  # null_value=inf: finite weights, 0.0 (underflow) included, are explicit edges.
  graph = csgraph.csgraph_from_dense(weights, null_value=np.inf)
  # Label-distribution 3DGs are dense (~96% of pairs are edges for Dirichlet(0.5)
  # over 10 labels, ε = 0.1): Floyd-Warshall's O(N³) is then ~8x faster than N
  # Dijkstra runs (6 s vs 49 s for N = 2,000); Dijkstra wins on sparse graphs.
  dense = np.count_nonzero(np.isfinite(weights)) > n * n / 4
  paths = csgraph.shortest_path(graph, method='FW' if dense else 'D', directed=False)
  finite = np.isfinite(paths)
  largest = paths[finite].max()
  if largest > 0:
    paths = np.where(finite, paths / largest, 1.0)
  else:
    paths = np.where(finite, 0.0, 1.0)
  np.fill_diagonal(paths, 0.0)
  return paths


def _validate_problem(distances, counts, available, budget):
  """Checks and converts the inputs of a selection problem."""
  h = validate_square(distances, 'distances')
  n = h.shape[0]
  v = np.asarray(counts)
  if v.shape != (n,):
    raise ValueError(f'counts must have shape ({n},) to match distances, got {v.shape}.')
  mask = np.asarray(available)
  if mask.shape != (n,):
    raise ValueError(f'available must have shape ({n},) to match distances, got {mask.shape}.')
  validation.positive_int('budget', budget)
  mask = mask.astype(bool)
  if not np.any(mask):
    raise ValueError('No client is available.')
  return h, v.astype(np.float64), mask


def validate_alpha(alpha) -> float:
  if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
    raise TypeError(f'alpha must be a real number, got {type(alpha).__name__} {alpha!r}.')
  if not (math.isfinite(alpha) and alpha >= 0):
    raise ValueError(f'alpha must be finite and non-negative, got {alpha!r}.')
  return float(alpha)


# The dispersion term's scale: the paper's α sᵀHs / (N (N-1)), or α sᵀHs / (M (M-1)), the mean
# distance between the cohort's clients (the authors' published code).
DISPERSION_SCALES = ('clients', 'cohort')


def scaled_alpha(alpha: float, scale: str, num_clients: int, size: int) -> float:
  """The α that gives the paper's objective the dispersion scale `scale`.

  ``'cohort'`` divides ``sᵀHs`` by ``M (M-1)`` instead of ``N (N-1)``: the
  same programme with ``α N (N-1) / (M (M-1))`` (``α`` when ``M ≤ 1``, where
  no pair exists).
  """
  if scale not in DISPERSION_SCALES:
    raise ValueError(
      f'dispersion_scale={scale!r} is unknown; choose from {", ".join(DISPERSION_SCALES)}.'
    )
  if scale == 'clients' or size <= 1:
    return alpha
  return alpha * num_clients * (num_clients - 1) / (size * (size - 1))


def count_scores(counts: np.ndarray, num_picked: int) -> np.ndarray:
  """Returns ``z_k = 2 (v_k - v̄ - M/N) + 1`` with ``v̄`` the mean over all clients."""
  v = np.asarray(counts, dtype=np.float64)
  return 2.0 * (v - v.mean() - num_picked / v.shape[0]) + 1.0


class Problem(NamedTuple):
  """One round's programme restricted to the available clients.

  ``f(S) = quad · Σ_{i,j∈S} h_ij - lin · Σ_{i∈S} z_i`` over ``|S| = size``.
  """

  candidates: np.ndarray  # int64[n] global indices of the available clients.
  distances: np.ndarray  # float64[n, n] H restricted to the candidates.
  scores: np.ndarray  # float64[n] z restricted to the candidates.
  size: int  # M.
  quad: float  # α / (N (N-1)).
  lin: float  # 1 / (N-1).
  num_clients: int  # N.


def build_problem(distances, counts, available, budget, alpha, num_clients) -> Problem:
  h, v, mask = _validate_problem(distances, counts, available, budget)
  alpha = validate_alpha(alpha)
  n = h.shape[0] if num_clients is None else int(num_clients)
  if n != h.shape[0]:
    raise ValueError(f'num_clients={num_clients} does not match distances {h.shape}.')
  candidates = np.flatnonzero(mask).astype(np.int64)
  size = min(int(budget), candidates.size)
  scores = count_scores(v, size)[candidates]
  quad, lin = (alpha / (n * (n - 1)), 1.0 / (n - 1)) if n > 1 else (0.0, 0.0)
  sub = h if candidates.size == n else h[np.ix_(candidates, candidates)]  # Read only.
  if not np.array_equal(sub, sub.T):
    # f(S) sums h_ij + h_ji: the symmetric part is the same programme, and the
    # heuristic's swap gains assume symmetry.
    sub = (sub + sub.T) / 2.0
  return Problem(candidates, sub, scores, size, quad, lin, n)


def local_value(problem: Problem, local: np.ndarray) -> float:
  sub = problem.distances[np.ix_(local, local)]
  return float(problem.quad * sub.sum() - problem.lin * problem.scores[local].sum())


def objective(
  s_indices: Sequence[int] | np.ndarray,
  H: np.ndarray,
  counts: np.ndarray,
  available: np.ndarray,
  budget: int,
  *,
  alpha: float,
  num_clients: int | None = None,
) -> float:
  """Returns ``α sᵀ H s / (N (N-1)) - zᵀ s / (N-1)`` for the clients `s_indices`.

  Args:
    s_indices: Distinct global indices of the picked clients, all available,
      exactly ``min(budget, |A|)`` of them.
    H: ``float[N, N]`` 3DG distances (zero diagonal).
    counts: ``int[N]`` sampling counts ``v`` before the round.
    available: ``bool[N]`` availability ``A``.
    budget: ``K``; ``M = min(K, |A|)`` enters ``z``.
    alpha: The paper's ``α ≥ 0``.
    num_clients: ``N``; defaults to ``H.shape[0]`` and must equal it.

  Returns:
    The objective value (0 when ``N = 1``).

  Raises:
    ValueError: On mismatched shapes, a bad budget, or an infeasible `s_indices`.
    TypeError: If `alpha` is not a real number.
  """
  problem = build_problem(H, counts, available, budget, alpha, num_clients)
  picked = np.asarray(s_indices, dtype=np.int64).reshape(-1)
  if picked.size != problem.size or np.unique(picked).size != picked.size:
    raise ValueError(f's_indices must hold {problem.size} distinct clients, got {picked}.')
  position = np.full(np.asarray(H).shape[0], -1, np.int64)
  position[problem.candidates] = np.arange(problem.candidates.size)
  if np.any(picked < 0) or np.any(picked >= position.size) or np.any(position[picked] < 0):
    raise ValueError(f's_indices must be available clients, got {picked}.')
  return local_value(problem, position[picked])
