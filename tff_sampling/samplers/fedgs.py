r"""FedGS: graph-based client sampling under arbitrary client availability.

Zheng Wang, Xiaoliang Fan, Jianzhong Qi, Haibing Jin, Peizhen Yang, Siqi Shen,
Cheng Wang, "FedGS: Federated Graph-based Sampling with Arbitrary Client
Availability", AAAI 2023 (arXiv:2211.13975); the authors' code is
``github.com/WwZzz/FedGS``. ``docs/algorithms.md`` §3a-§3b is the contract.

**The 3DG** (Data-Distribution-Dependency Graph, §3a, the paper's Eqs. 10-12).
Client ``i`` has a feature vector ``u_i`` (oracle: its label distribution;
model-based: a mean embedding or a model-update sketch).
``V_ij = max(cos(u_i, u_j), 0)`` (`similarity_from_features`); ``V`` is min-max
normalised to ``[0, 1]``; the graph has the edge weights

    R_ii = 0,   R_ij = exp(-V_ij / σ²) if V_ij ≥ ε,   no edge if V_ij < ε,

and ``H`` (`graph_distances`) is the matrix of all-pairs shortest-path lengths,
divided by its largest finite entry, with unreachable pairs set to that largest
value (1 after the division).

**Selection** (§3b, the paper's Eqs. 14-15). With ``A`` the available clients,
``v`` the sampling counts before the round and ``M = min(K, |A|)`` clients to
pick, FedGS maximises over ``s ∈ {0, 1}^N`` with ``s ≤ 1_A``, ``Σ s = M``

    α · sᵀ H s / (N (N-1))  -  zᵀ s / (N-1),    z_k = 2 (v_k - v̄ - M/N) + 1

(`objective`), a p-dispersion-type binary quadratic programme (NP-hard). The
first term is the (scaled) mean 3DG distance between the picked clients; the
second is, up to a constant, the sample variance of the counts after the round:
``Var(v + s) = Σ_k (v_k - v̄ - M/N)² / (N-1) + zᵀ s / (N-1)`` (the paper's
Eq. 7, expanded with ``s_k² = s_k``). Then ``v_k += 1`` for the picked clients and
the server aggregates ``θ ← Σ_{k∈S} n_k / Σ_{j∈S} n_j · θ_k``.

Interpretations made here (**[choice]**), beyond those of ``docs/algorithms.md``:

* **Edge-weight direction.** ``exp(-V/σ²)`` *decreases* in ``V``: the more
  similar two clients, the lighter (shorter) their edge, so ``H`` is small
  between similar clients and large between dissimilar ones, and maximising
  ``sᵀ H s`` spreads the cohort over dissimilar data, as the paper intends
  ("keep the sampled clients' data far from each other"). The formula is used
  exactly as written. Pairs below the threshold ``ε`` (the *least* similar) get
  no direct edge; their distance is a path through similar intermediaries, or
  the maximum 1 when there is none.
* **Zero-weight edges.** ``exp(-V/σ²)`` underflows to ``0.0`` when
  ``V/σ² ≳ 745``. scipy's csgraph treats zeros of a *dense* matrix as missing
  edges, so we build the graph with ``csgraph_from_dense(R, null_value=inf)``,
  which stores every finite weight, zero included, as an explicit edge; such a
  pair is at distance 0, never "unreachable".
* **Min-max normalisation of V** runs over the off-diagonal entries only
  (``V_ii`` never enters ``R``). If they are all equal (including ``N ≤ 2``)
  every pair is equally similar; we then set the normalised ``V`` to 1, a
  complete graph with equal edges, so every off-diagonal ``H`` entry is 1 (the
  choice 0, an edgeless graph, would give the same ``H``).
* **Normalisation of H.** If the largest finite entry is 0 (e.g. every weight
  underflowed, or ``N = 1``) reachable pairs stay at 0 and unreachable pairs
  get 1.
* **Zero feature vectors** have cosine similarity 0 with every other client,
  the minimum, so (for ``ε > 0``) they are isolated in the 3DG, at distance 1
  from everybody. ``V_ii = 1`` for every client.
* **v̄ and M in z.** ``v̄`` is the mean of the counts over *all* ``N`` clients
  before the round, and ``M`` is the number of clients actually picked this
  round, ``M_t = min(K, |A_t|)`` (the derivation of Eq. 7 uses
  ``v̄^t = v̄^{t-1} + M_t/N``). Since ``Σ s = M`` is fixed, only ``v_k`` affects
  which clients are picked; ``v̄`` and ``M`` shift the objective's value only.
  ``N`` is the number of all clients. For ``N = 1`` the objective is 0.
* **The optimiser.** The paper runs a solver up to a wall-clock limit
  ``τ_max`` and keeps the best solution found. `select_clients_with_report`
  (and `select_clients`, which returns its indices and value) first runs a
  heuristic: a greedy construction (add the client of largest marginal gain)
  followed by best-improvement 1-swap local search until no swap improves or
  ``time_limit_s`` runs out, restarted from ``num_starts`` greedy starts (the
  plain one, then ones forcing one client first) while time remains; the best
  local optimum wins. It is exact when ``M = 1``, ``M ≥ |A| - 1`` or the
  quadratic term vanishes (``α = 0``; see the tests), and otherwise a local
  optimum; its gap to `brute_force_select` is measured in the tests. (``H`` is
  used as `objective` reads it: an asymmetric one through its symmetric part,
  a non-zero diagonal ``h_kk`` as a linear term ``α h_kk s_k / (N (N-1))``;
  `graph_distances` gives neither.)

  With ``method='solver'``, or ``'auto'`` (the default) when the heuristic is
  not already provably exact, SCIP (PyPI ``pyscipopt``, which bundles it) then
  solves an exact MILP linearisation in the time left: binary ``s_k``,
  continuous ``y_kl ∈ [0, 1]`` for each pair with a non-zero quadratic
  coefficient, ``Σ_l y_kl = (M-1) s_k`` (``Σ s = M`` multiplied by ``s_k``,
  the reformulation-linearisation technique; ``≤`` when some pairs of ``k`` were
  skipped), ``y_kl ≥ s_k + s_l - 1`` for negative coefficients, ``Σ s = M``,
  and the objective multiplied by ``N (N-1)`` (``2α Σ_{k<l} h_kl y_kl -
  N Σ_k z_k s_k`` for a symmetric ``H``). SCIP starts from the heuristic's
  solution, runs single-threaded with a fixed random seed shift, stops at the
  time left (building the model counts against it; presolving and the root LP
  check the clock coarsely: it overruns by up to ~0.1 s at 150 clients, more on
  larger ones), and the better of its best solution and the heuristic's, with
  the objective recomputed exactly, is returned: never worse than the
  heuristic. The report carries SCIP's status and dual bound (an upper bound on
  the optimum). Measured on a 2-core machine (``bench/fedgs.py``, ``K = 10``,
  3DGs of Dirichlet label distributions): SCIP proves the optimum of ≤ 14
  clients in milliseconds and of 100-200 clients in 0.2 s to over 5 s, so
  under the default 1 s it often stops at the limit, with a relative gap of
  ~1e-5 up to ~175 clients and no useful bound from ~200 (its root LP
  unfinished). On these
  3DGs the heuristic's solution was optimal wherever SCIP finished, and SCIP
  never improved on it: there the solver certifies the cohort rather than
  changing it. On the tests' random uniform ``H`` it does correct the
  single-start heuristic.

  Fallbacks, reported in `SelectionReport.status` and never raised: when
  ``pyscipopt`` cannot be imported, ``'auto'`` and ``'solver'`` both use the
  heuristic (``'solver_not_installed'``; a `RuntimeWarning` once per process
  says how to install it); above ``max_solver_clients`` available clients
  (default 150: the model has ``O(|A|²)`` variables, built in Python in
  ~0.05 s for 150 clients and ~0.25 s for 300, and SCIP's root LP on 200 or
  more clients rarely finishes within 1 s) the heuristic is used
  (``'too_large'``); when the heuristic used up the whole limit, SCIP does not
  start (``'time_limit'``).
* **Ties** are broken by a random order of the available clients drawn from
  ``np.random.default_rng(seed)``; the sampler passes ``seed = (seed, round)``.
  SCIP's model does not depend on the seed, but on ties with its best solution
  the heuristic's (seed-dependent) solution is kept. Choices are deterministic
  in (seed, round, state, availability) as long as neither the local search nor
  SCIP is cut by ``time_limit_s`` (`SelectionReport.timed_out`): the heuristic
  converges in milliseconds for hundreds of clients and in ~0.1 s for 3,400,
  and SCIP is deterministic when it stops at ``'optimal'``. A run that stops
  at the time limit (status ``'time_limit'``) depends on the machine's speed
  and load and may not be reproducible; pass ``method='heuristic'`` for
  reproducible runs on large populations.
* **State and purity.** `FedGSSampler.select` is pure (state in, selection
  out); the count update ``v_k += 1`` happens in `FedGSSampler.observe`, so a
  sampler restarted from a checkpointed state repeats the same choices. The
  client sizes ``n_k`` (for the aggregation weights) are kept in the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import gc
import itertools
import math
import numbers
import time
from typing import Any, NamedTuple
import warnings

import numpy as np
from scipy.sparse import csgraph

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

_MAX_BRUTE_FORCE_CLIENTS = 14
_METHODS = ('auto', 'heuristic', 'solver')
# Most available clients for which `method='auto'`/`'solver'` builds the MILP.
# Building its O(n²) variables in Python takes ~0.05 s for 150 clients and
# ~0.25 s for 300 on a 2-core machine; the limit is SCIP's root LP: with the
# default 1 s, SCIP reaches a useful dual bound (relative gap ≤ 1e-4) on most
# 3DG instances of 150 clients and on few of 200 (bench/fedgs.py), and at 300
# the root LP alone overruns the limit by ~0.5 s.
DEFAULT_MAX_SOLVER_CLIENTS = 150
_PYSCIPOPT_VERSION = '6.3.0'  # The version in requirements/lock.txt.
_SCIP_SEED_SHIFT = 0  # SCIP's randomization/randomseedshift: fixed for reproducibility.


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


def _validate_square(matrix: np.ndarray, name: str) -> np.ndarray:
  m = np.asarray(matrix, dtype=np.float64)
  if m.ndim != 2 or m.shape[0] != m.shape[1]:
    raise ValueError(f'{name} must be a square [N, N] matrix, got shape {m.shape}.')
  return m


def graph_distances(
  similarity: np.ndarray, *, epsilon: float = 0.1, sigma2: float = 0.01
) -> np.ndarray:
  """Returns the normalised shortest-path matrix ``H`` of the 3DG (§3a).

  Args:
    similarity: ``float[N, N]`` symmetric similarities ``V`` (see
      `similarity_from_features`); min-max normalised here over the
      off-diagonal entries.
    epsilon: The paper's ``ε``: pairs with normalised ``V_ij < ε`` get no edge.
    sigma2: The paper's ``σ²`` (> 0): edge weight ``exp(-V_ij / σ²)``.

  Returns:
    ``float64[N, N]`` symmetric, zero diagonal, entries in ``[0, 1]``; small
    between similar clients; 1 for unreachable pairs.

  Raises:
    ValueError: If `similarity` is not a finite symmetric square matrix or
      `sigma2` is not positive.
  """
  v = _validate_square(similarity, 'similarity')
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
  weights = np.where(normalised >= epsilon, np.exp(-normalised / sigma2), np.inf)
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
  h = _validate_square(distances, 'distances')
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


def _validate_alpha(alpha) -> float:
  if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
    raise TypeError(f'alpha must be a real number, got {type(alpha).__name__} {alpha!r}.')
  if not (math.isfinite(alpha) and alpha >= 0):
    raise ValueError(f'alpha must be finite and non-negative, got {alpha!r}.')
  return float(alpha)


def count_scores(counts: np.ndarray, num_picked: int) -> np.ndarray:
  """Returns ``z_k = 2 (v_k - v̄ - M/N) + 1`` with ``v̄`` the mean over all clients."""
  v = np.asarray(counts, dtype=np.float64)
  return 2.0 * (v - v.mean() - num_picked / v.shape[0]) + 1.0


class _Problem(NamedTuple):
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


def _build_problem(distances, counts, available, budget, alpha, num_clients) -> _Problem:
  h, v, mask = _validate_problem(distances, counts, available, budget)
  alpha = _validate_alpha(alpha)
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
  return _Problem(candidates, sub, scores, size, quad, lin, n)


def _local_value(problem: _Problem, local: np.ndarray) -> float:
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
  problem = _build_problem(H, counts, available, budget, alpha, num_clients)
  picked = np.asarray(s_indices, dtype=np.int64).reshape(-1)
  if picked.size != problem.size or np.unique(picked).size != picked.size:
    raise ValueError(f's_indices must hold {problem.size} distinct clients, got {picked}.')
  position = np.full(np.asarray(H).shape[0], -1, np.int64)
  position[problem.candidates] = np.arange(problem.candidates.size)
  if np.any(picked < 0) or np.any(picked >= position.size) or np.any(position[picked] < 0):
    raise ValueError(f's_indices must be available clients, got {picked}.')
  return _local_value(problem, position[picked])


class _Ordered(NamedTuple):
  """The programme's vectors permuted by the tie-breaking order.

  ``H`` itself is not permuted (an O(n²) copy): its rows and blocks are read
  through `order`.
  """

  order: np.ndarray  # int64[n] the permutation: position -> local index.
  diagonal: np.ndarray  # float64[n] H's diagonal in that order (zero for a 3DG).
  scores: np.ndarray  # float64[n] z in that order.
  tolerance: float  # Smallest swap gain counted as an improvement.


def _greedy_swap(
  problem: _Problem, ordered: _Ordered, first: int | None, deadline: float
) -> tuple[np.ndarray, bool]:
  """Greedy construction + best-improvement 1-swap search.

  Positions in the tie-breaking order stand for clients: ties go to the earlier
  one. `first` (a position), if given, is forced into the greedy start.

  Returns:
    The picked positions (a boolean mask over the order) and whether the
    search converged (rather than stopping at `deadline`).
  """
  h, order = problem.distances, ordered.order
  diagonal, z = ordered.diagonal, ordered.scores
  n, m = z.size, problem.size
  picked = np.zeros(n, dtype=bool)
  reach = np.zeros(n)  # reach[x] = Σ_{l ∈ S} h[x, l].
  for step in range(m):
    gain = problem.quad * (2.0 * reach + diagonal) - problem.lin * z
    gain[picked] = -np.inf
    best = first if (step == 0 and first is not None) else int(np.argmax(gain))
    picked[best] = True
    reach += h[order[best]][order]  # A row: H is symmetric.
  while m < n:
    if time.monotonic() >= deadline:
      return picked, False
    inside, outside = np.flatnonzero(picked), np.flatnonzero(~picked)
    # Swapping i ∈ S for j ∉ S changes the objective by
    # quad·(2 (reach_j - reach_i - h_ij) + h_ii + h_jj) - lin·(z_j - z_i).
    delta = problem.quad * (
      2.0
      * (
        reach[outside][None, :] - reach[inside][:, None] - h[np.ix_(order[inside], order[outside])]
      )
      + diagonal[inside][:, None]
      + diagonal[outside][None, :]
    ) - problem.lin * (z[outside][None, :] - z[inside][:, None])
    flat = int(np.argmax(delta))
    if delta.flat[flat] <= ordered.tolerance:
      break
    i, j = inside[flat // outside.size], outside[flat % outside.size]
    picked[i], picked[j] = False, True
    reach += (h[order[j]] - h[order[i]])[order]
  return picked, True


def _heuristic(
  problem: _Problem, order: np.ndarray, num_starts: int, deadline: float
) -> tuple[np.ndarray, bool]:
  """Best of greedy + 1-swap from the plain greedy start and `num_starts - 1`
  starts that force one client first (clients taken in `order`).

  Later starts run only while time remains; the first always runs.

  Returns:
    The local indices (ascending) of the best solution, and whether every
    start ran and converged before `deadline` (then the result does not depend
    on timing).
  """
  h = problem.distances
  z = problem.scores[order]
  scale = problem.quad * (max(h.max(), -h.min()) if z.size else 0.0) + problem.lin * (
    np.abs(z).max() if z.size else 0.0
  )
  ordered = _Ordered(order, np.diagonal(h)[order], z, 1e-12 * max(scale, 1e-300))
  picked, complete = _greedy_swap(problem, ordered, None, deadline)
  best = np.sort(order[picked])
  best_value = _local_value(problem, best)
  if problem.size <= 1 or problem.size >= order.size - 1:
    return best, complete  # 1-swap search is already exact.
  for first in range(min(num_starts - 1, order.size)):
    if time.monotonic() >= deadline:
      return best, False
    picked, converged = _greedy_swap(problem, ordered, first, deadline)
    complete = complete and converged
    local = np.sort(order[picked])
    value = _local_value(problem, local)
    if value > best_value:
      best, best_value = local, value
  return best, complete


class SelectionReport(NamedTuple):
  """The result of one round's optimisation (`select_clients_with_report`).

  Attributes:
    indices: ``int64[M]`` the picked clients (global indices, ascending).
    value: Their objective value, recomputed exactly from `indices`.
    method_used: ``'heuristic'`` or ``'solver'`` (SCIP ran on the instance).
    status: ``'optimal'`` (proven optimal: by SCIP, or the heuristic on an
      instance where it is exact, see the module docstring), ``'time_limit'``
      (SCIP, or the heuristic before SCIP could start, ran out of time: the
      best solution found), ``'heuristic'`` (``method='heuristic'``: a local
      optimum, not proven), ``'solver_not_installed'`` (PySCIPOpt cannot be
      imported: the heuristic's solution), ``'too_large'`` (more than
      ``max_solver_clients`` available clients: the heuristic's solution), or
      any other SCIP status name (e.g. ``'memlimit'``): the best solution found.
    bound: An upper bound on the optimum in the objective's scale: SCIP's dual
      bound (``inf`` when SCIP stopped before it had one), `value` when the
      status is ``'optimal'`` without SCIP, else ``nan``.
    timed_out: Whether ``time_limit_s`` cut the heuristic (a local search or
      its later starts) or SCIP: the result then depends on the machine's
      speed and load and may not be reproducible.
  """

  indices: np.ndarray
  value: float
  method_used: str
  status: str
  bound: float
  timed_out: bool


class _SolverResult(NamedTuple):
  local: np.ndarray  # int64[M] local indices of the better of SCIP's best and the warm start.
  status: str  # See SelectionReport.status.
  bound: float  # SCIP's dual bound in the objective's scale (inf when it has none).
  incumbent_value: float  # SCIP's own best solution's value (nan if it has none).


def _import_pyscipopt():
  """Returns the `pyscipopt` module; raises ImportError when it is missing.

  A function of its own so that tests can simulate a missing package.
  """
  import pyscipopt  # pylint: disable=g-import-not-at-top

  return pyscipopt


_solver_missing_warned = False


def _solver_installed() -> bool:
  """Whether PySCIPOpt imports; warns once per process when it does not."""
  global _solver_missing_warned
  try:
    _import_pyscipopt()
  except ImportError as e:
    if not _solver_missing_warned:
      _solver_missing_warned = True
      warnings.warn(
        f'FedGS: the MILP solver package pyscipopt cannot be imported ({e}); selecting '
        'clients with the greedy + 1-swap heuristic instead (SelectionReport.status '
        f"'solver_not_installed'). Install it with `pip install pyscipopt=={_PYSCIPOPT_VERSION}` "
        "or pass method='heuristic' to silence this warning.",
        RuntimeWarning,
        stacklevel=3,
      )
    return False
  return True


def _heuristic_is_exact(problem: _Problem) -> bool:
  """Whether greedy + 1-swap (run to convergence) is provably optimal here.

  True for ``M ≤ 1`` or ``M ≥ n - 1`` (every two feasible sets differ by one
  swap) and for a linear objective (``α = 0``, or no off-diagonal ``H`` entry:
  the diagonal is a linear term), which greedy maximises.
  """
  h = problem.distances
  return (
    problem.size <= 1
    or problem.size >= problem.candidates.size - 1
    or problem.quad == 0
    or np.count_nonzero(h) == np.count_nonzero(np.diagonal(h))
  )


def _solve_with_solver(
  problem: _Problem, warm_start: np.ndarray, time_limit_s: float
) -> _SolverResult:
  """Solves the programme's exact MILP linearisation with SCIP (PySCIPOpt).

  Binary ``s_k`` per candidate; for each pair ``k < l`` with
  ``h_kl + h_lk ≠ 0`` a continuous ``y_kl ∈ [0, 1]`` standing for ``s_k s_l``,
  linked by ``Σ_l y_kl = (M-1) s_k`` (the product of ``Σ s = M`` with ``s_k``;
  ``≤`` when some pairs of ``k`` have no ``y``) and, for negative
  ``h_kl + h_lk``, ``y_kl ≥ s_k + s_l - 1``; ``Σ s = M``. With binary ``s``
  these force ``y_kl = s_k s_l`` wherever it matters, so the MILP is exact.
  The objective is ``N (N-1)`` times `_local_value` (for conditioning):
  ``Σ_{k<l} α (h_kl + h_lk) y_kl + Σ_k (α h_kk - N z_k) s_k``.

  Args:
    problem: The round's programme.
    warm_start: ``int64[M]`` local indices of a feasible solution (the
      heuristic's), given to SCIP as its first incumbent.
    time_limit_s: Wall-clock budget for building the model and solving it.

  Returns:
    The better of SCIP's best solution and `warm_start` (the latter on ties),
    SCIP's status and its dual bound converted back to the objective's scale.
  """
  deadline = time.monotonic() + time_limit_s
  # The model's O(n²) Python objects are no garbage, yet creating them triggers
  # the cyclic collector, whose full passes over a process that imported
  # TensorFlow take ~0.25 s each: pause it while building and solving.
  collecting = gc.isenabled()
  gc.disable()
  try:
    return _solve_scip(problem, warm_start, deadline)
  finally:
    if collecting:
      gc.enable()


def _solve_scip(problem: _Problem, warm_start: np.ndarray, deadline: float) -> _SolverResult:
  """`_solve_with_solver` with a `time.monotonic()` deadline."""
  pyscipopt = _import_pyscipopt()
  n, size = problem.candidates.size, problem.size
  h = problem.distances
  n_all = problem.num_clients
  scale = float(n_all * (n_all - 1)) if n_all > 1 else 1.0
  linear = scale * (problem.quad * np.diagonal(h) - problem.lin * problem.scores)

  model = pyscipopt.Model('fedgs')
  model.hideOutput()
  model.setParam('parallel/maxnthreads', 1)
  model.setParam('lp/threads', 1)
  model.setParam('randomization/randomseedshift', _SCIP_SEED_SHIFT)
  model.setParam('misc/catchctrlc', False)  # Ctrl-C reaches Python once SCIP returns.
  model.setMaximize()
  s = [model.addVar(vtype='B', obj=float(c)) for c in linear.tolist()]
  first, second = np.triu_indices(n, 1)
  pair = scale * problem.quad * (h[first, second] + h[second, first])
  if size < 2 or problem.quad == 0:
    pair = pair[:0]
  keep = np.flatnonzero(pair != 0)
  first, second, pair = first[keep], second[keep], pair[keep]
  y = [model.addVar(lb=0.0, ub=1.0, obj=c) for c in pair.tolist()]
  partners: list[list[Any]] = [[] for _ in range(n)]  # SCIP variables.
  for var, i, j in zip(y, first.tolist(), second.tolist()):
    partners[i].append(var)
    partners[j].append(var)
  for k in range(n):
    if partners[k]:
      row = pyscipopt.quicksum(partners[k]) - (size - 1) * s[k]
      model.addCons(row == 0 if len(partners[k]) == n - 1 else row <= 0)
  for index in np.flatnonzero(pair < 0).tolist():
    model.addCons(y[index] - s[first[index]] - s[second[index]] >= -1)
  model.addCons(pyscipopt.quicksum(s) == size)

  picked = np.zeros(n, dtype=bool)
  picked[warm_start] = True
  solution = model.createSol()
  for k in np.flatnonzero(picked).tolist():
    model.setSolVal(solution, s[k], 1.0)
  for index in np.flatnonzero(picked[first] & picked[second]).tolist():
    model.setSolVal(solution, y[index], 1.0)
  model.addSol(solution, free=True)

  model.setParam('limits/time', max(deadline - time.monotonic(), 0.0))
  model.optimize()
  status = model.getStatus()
  status = {'optimal': 'optimal', 'timelimit': 'time_limit'}.get(status, status)
  dual = model.getDualbound()
  bound = math.copysign(math.inf, dual) if abs(dual) >= model.infinity() else dual / scale

  best, best_value = np.sort(np.asarray(warm_start, np.int64)), _local_value(problem, warm_start)
  incumbent_value = math.nan
  if model.getNSols() > 0:
    incumbent = model.getBestSol()
    values = np.array([model.getSolVal(incumbent, var) for var in s])
    local = np.flatnonzero(values > 0.5).astype(np.int64)
    if local.size == size:
      incumbent_value = _local_value(problem, local)
      if incumbent_value > best_value:
        best, best_value = local, incumbent_value
  return _SolverResult(best, status, bound, incumbent_value)


def _validate_method(method: str, max_solver_clients: int) -> None:
  if method not in _METHODS:
    raise ValueError(f'method must be one of {", ".join(map(repr, _METHODS))}, got {method!r}.')
  if (
    isinstance(max_solver_clients, (bool, np.bool_))
    or not isinstance(max_solver_clients, (int, np.integer))
    or max_solver_clients < 0
  ):
    raise ValueError(
      'max_solver_clients must be a non-negative integer (0 never runs the '
      f'solver), got {max_solver_clients!r}.'
    )


def select_clients_with_report(
  distances: np.ndarray,
  counts: np.ndarray,
  available: np.ndarray,
  budget: int,
  *,
  alpha: float,
  time_limit_s: float = 1.0,
  seed: int | Sequence[int] = 0,
  num_starts: int = 16,
  method: str = 'auto',
  max_solver_clients: int = DEFAULT_MAX_SOLVER_CLIENTS,
) -> SelectionReport:
  """Maximises the FedGS objective over ``min(budget, |A|)`` available clients.

  The heuristic (greedy + 1-swap, see the module docstring) always runs first;
  the solver, where it runs, is warm-started with its solution and never
  returns a worse one.

  Args:
    distances: ``float[N, N]`` 3DG distances ``H``.
    counts: ``int[N]`` sampling counts before the round.
    available: ``bool[N]`` availability mask.
    budget: ``K`` clients per round.
    alpha: The paper's ``α ≥ 0``.
    time_limit_s: Wall-clock limit of the whole optimisation (the paper's
      ``τ_max``): the heuristic, then building and solving the MILP in the time
      left. A run cut by it may not be reproducible.
    seed: Seed of the tie-breaking order (``np.random.default_rng(seed)``).
    num_starts: The heuristic's greedy starts: the plain greedy one, then ones
      forcing each of the first ``num_starts - 1`` clients of the tie-breaking
      order first.
    method: ``'auto'`` (the solver if PySCIPOpt is installed, at most
      `max_solver_clients` clients are available and the heuristic is not
      already provably exact; else the heuristic), ``'solver'`` (SCIP whenever
      it can run; it falls back to the heuristic, with status
      ``'solver_not_installed'`` and a once-per-process warning, or
      ``'too_large'``, as ``'auto'`` does) or ``'heuristic'``.
    max_solver_clients: Most available clients for which the solver runs
      (default 150; see `DEFAULT_MAX_SOLVER_CLIENTS`): the model has
      ``O(|A|²)`` variables, and SCIP's root LP on 200 or more clients rarely
      finishes within 1 s.

  Returns:
    A `SelectionReport`.

  Raises:
    ValueError: On bad shapes, budget, time limit, starts, method or
      `max_solver_clients`.
    TypeError: If `alpha` is not a real number.
  """
  _validate_method(method, max_solver_clients)
  validation.positive_number('time_limit_s', time_limit_s)
  deadline = time.monotonic() + float(time_limit_s)
  problem = _build_problem(distances, counts, available, budget, alpha, None)
  order = np.random.default_rng(seed).permutation(problem.candidates.size)
  validation.positive_int('num_starts', num_starts)
  local, complete = _heuristic(problem, order, int(num_starts), deadline)
  value = _local_value(problem, local)
  exact = complete and _heuristic_is_exact(problem)

  def heuristic_report(status: str) -> SelectionReport:
    if exact:
      return SelectionReport(problem.candidates[local], value, 'heuristic', 'optimal', value, False)
    return SelectionReport(
      problem.candidates[local],
      value,
      'heuristic',
      status,
      math.nan,
      not complete or status == 'time_limit',
    )

  if method == 'heuristic' or (method == 'auto' and exact):
    return heuristic_report('heuristic')
  if problem.candidates.size > max_solver_clients:
    return heuristic_report('too_large')
  if not _solver_installed():
    return heuristic_report('solver_not_installed')
  remaining = deadline - time.monotonic()
  if remaining <= 0:
    return heuristic_report('time_limit')
  result = _solve_with_solver(problem, local, remaining)
  return SelectionReport(
    problem.candidates[result.local],
    _local_value(problem, result.local),
    'solver',
    result.status,
    result.bound,
    not complete or result.status == 'time_limit',
  )


def select_clients(
  distances: np.ndarray,
  counts: np.ndarray,
  available: np.ndarray,
  budget: int,
  *,
  alpha: float,
  time_limit_s: float = 1.0,
  seed: int | Sequence[int] = 0,
  num_starts: int = 16,
  method: str = 'auto',
  max_solver_clients: int = DEFAULT_MAX_SOLVER_CLIENTS,
) -> tuple[np.ndarray, float]:
  """`select_clients_with_report` without the report's diagnostics.

  Takes the same arguments as `select_clients_with_report` (``method='auto'``
  by default: SCIP where it is installed and the instance small enough).

  Returns:
    ``(indices, value)``: the picked clients (``int64``, ascending) and their
    objective value.

  Raises:
    ValueError: On bad shapes, budget, time limit, starts, method or
      `max_solver_clients`.
    TypeError: If `alpha` is not a real number.
  """
  report = select_clients_with_report(
    distances,
    counts,
    available,
    budget,
    alpha=alpha,
    time_limit_s=time_limit_s,
    seed=seed,
    num_starts=num_starts,
    method=method,
    max_solver_clients=max_solver_clients,
  )
  return report.indices, report.value


def brute_force_select(
  distances: np.ndarray, counts: np.ndarray, available: np.ndarray, budget: int, *, alpha: float
) -> tuple[np.ndarray, float]:
  """Exact optimum by enumeration (the tests' oracle); at most 14 available clients.

  Returns:
    ``(indices, value)`` as `select_clients`; ties go to the lexicographically
    first subset.

  Raises:
    ValueError: If more than 14 clients are available, or as `select_clients`.
  """
  problem = _build_problem(distances, counts, available, budget, alpha, None)
  if problem.candidates.size > _MAX_BRUTE_FORCE_CLIENTS:
    raise ValueError(
      f'brute_force_select handles at most {_MAX_BRUTE_FORCE_CLIENTS} '
      f'available clients, got {problem.candidates.size}.'
    )
  best, best_value = None, -np.inf
  for subset in itertools.combinations(range(problem.candidates.size), problem.size):
    value = _local_value(problem, np.asarray(subset, np.int64))
    if value > best_value:
      best, best_value = np.asarray(subset, np.int64), value
  return problem.candidates[best], best_value


class FedGSState(NamedTuple):
  """The FedGS sampler's state.

  Attributes:
    distances: ``float64[N, N]`` normalised 3DG shortest paths ``H``.
    counts: ``int64[N]`` times each client has been sampled (``v``).
    num_examples: ``int64[N]`` client sizes ``n_k`` (aggregation weights).
  """

  distances: np.ndarray
  counts: np.ndarray
  num_examples: np.ndarray


class FedGSSampler(base.Sampler):
  """FedGS (Wang et al., AAAI 2023); see the module docstring.

  The 3DG comes from `features` (oracle label distributions, embeddings or
  sketches: ``H = graph_distances(similarity_from_features(features))``) or
  directly from `distances`; exactly one must be given.

  Each round runs `select_clients` with ``method`` (default ``'auto'``: SCIP,
  warm-started with the heuristic, on up to ``max_solver_clients`` available
  clients; the heuristic alone above that or without PySCIPOpt). Rounds whose
  optimisation stops at ``time_limit_s`` may not be reproducible; pass
  ``method='heuristic'`` where reproducibility matters more than optimality.
  """

  weighting = 'num_examples'

  def __init__(
    self,
    clients_per_round: int,
    *,
    seed: int,
    features: np.ndarray | None = None,
    distances: np.ndarray | None = None,
    alpha: float = 1.0,
    time_limit_s: float = 1.0,
    epsilon: float = 0.1,
    sigma2: float = 0.01,
    method: str = 'auto',
    max_solver_clients: int = DEFAULT_MAX_SOLVER_CLIENTS,
  ):
    """Initialises the sampler.

    Args:
      clients_per_round: ``K`` (the paper's ``M``), clients per round.
      seed: Seed of the tie-breaking order, combined with the round number.
      features: ``float[N, F]`` client features for the 3DG.
      distances: ``float[N, N]`` a precomputed ``H`` instead of `features`.
      alpha: The paper's ``α ≥ 0`` (distance vs. count balance).
      time_limit_s: Wall-clock limit of each round's optimisation.
      epsilon: The 3DG's edge threshold ``ε``.
      sigma2: The 3DG's ``σ²``.
      method: Each round's optimiser, ``'auto'``, ``'solver'`` or
        ``'heuristic'`` (see `select_clients_with_report`).
      max_solver_clients: Most available clients for which the solver runs.

    Raises:
      ValueError: On a bad `clients_per_round`, limit, method,
        `max_solver_clients` or graph input.
      TypeError: If `alpha` is not a real number.
    """
    validation.positive_int('clients_per_round', clients_per_round)
    if (features is None) == (distances is None):
      raise ValueError('Give exactly one of features and distances.')
    validation.positive_number('time_limit_s', time_limit_s)
    _validate_method(method, max_solver_clients)
    self.method = method
    self.max_solver_clients = int(max_solver_clients)
    self.clients_per_round = int(clients_per_round)
    self.alpha = _validate_alpha(alpha)
    self.time_limit_s = float(time_limit_s)
    self._seed = int(seed)
    if features is not None:
      self._distances = graph_distances(
        similarity_from_features(features), epsilon=epsilon, sigma2=sigma2
      )
    else:
      assert distances is not None  # Exactly one of the two is given.
      self._distances = _validate_square(distances, 'distances').copy()

  def initialize(self, population: base.Population) -> FedGSState:
    """Returns zero counts, the 3DG distances and the client sizes.

    Raises:
      ValueError: If the population size does not match the 3DG, or
        `clients_per_round` exceeds it.
    """
    sizes = np.asarray(population.num_examples, dtype=np.int64)
    n = self._distances.shape[0]
    if sizes.shape != (n,):
      raise ValueError(f'population has {sizes.shape} sizes but the 3DG has {n} clients.')
    if self.clients_per_round > n:
      raise ValueError(
        f'clients_per_round={self.clients_per_round} exceeds the population of N={n} '
        f'clients; pass clients_per_round <= {n}.'
      )
    return FedGSState(self._distances.copy(), np.zeros(n, np.int64), sizes.copy())

  def select(
    self,
    state: FedGSState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    """Returns the maximiser found, weighted ``n_k / Σ_{j∈S} n_j``; pure.

    Its diagnostics (released as ``selection/fedgs_*``): ``objective``,
    ``solver_ran`` (SCIP ran), ``proven_optimal`` (status ``'optimal'``) and
    ``timed_out`` (the round hit ``time_limit_s``: it may not be
    reproducible), each 0 or 1 but the objective.
    """
    del probe  # Selects without one.
    report = select_clients_with_report(
      state.distances,
      state.counts,
      available,
      self.clients_per_round,
      alpha=self.alpha,
      time_limit_s=self.time_limit_s,
      seed=(self._seed, int(round_num)),
      method=self.method,
      max_solver_clients=self.max_solver_clients,
    )
    clients = report.indices
    sizes = state.num_examples[clients].astype(np.float64)
    total = sizes.sum()
    weights = sizes / total if total > 0 else np.full(clients.size, 1.0 / clients.size)
    diagnostics = {
      'fedgs_objective': float(report.value),
      'fedgs_solver_ran': float(report.method_used == 'solver'),
      'fedgs_proven_optimal': float(report.status == 'optimal'),
      'fedgs_timed_out': float(report.timed_out),
    }
    return base.Selection(
      clients=clients, weights=weights.astype(np.float32), diagnostics=diagnostics
    )

  def observe(
    self, state: FedGSState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> FedGSState:
    """Returns the state with ``v_k += 1`` for every selected client."""
    del signals
    counts = state.counts.copy()
    np.add.at(counts, np.asarray(selection.clients, np.int64), 1)
    return state._replace(counts=counts)
