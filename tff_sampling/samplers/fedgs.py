r"""FedGS: graph-based client sampling under arbitrary client availability.

Zheng Wang, Xiaoliang Fan, Jianzhong Qi, Haibing Jin, Peizhen Yang, Siqi Shen,
Cheng Wang, "FedGS: Federated Graph-based Sampling with Arbitrary Client
Availability", AAAI 2023 (arXiv:2211.13975); the authors' code is
``github.com/WwZzz/FedGS``. ``shared/ALGORITHMS.md`` §3a-§3b is the contract.

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

Interpretations made here (**[choice]**), beyond those of ``ALGORITHMS.md``:

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
  ``τ_max`` and keeps the best solution found. No solver package is installed,
  so `select_clients` uses a greedy construction (add the client of largest
  marginal gain) followed by best-improvement 1-swap local search until no swap
  improves or ``time_limit_s`` runs out, restarted from ``num_starts`` greedy
  starts (the plain one, then ones forcing one client first) while time
  remains; the best local optimum wins. It is exact when ``M = 1``,
  ``M ≥ |A| - 1`` or ``α = 0`` (see the tests), and otherwise a local optimum;
  its gap to `brute_force_select` is measured in the tests. ``method='solver'``
  is reserved for a MIQP solver (e.g. PySCIPOpt) warm-started with the
  heuristic; it raises `NotImplementedError` for now.
* **Ties** are broken by a random order of the available clients drawn from
  ``np.random.default_rng(seed)``; the sampler passes ``seed = (seed, round)``,
  so choices are deterministic in (seed, round, state, availability) as long
  as the local search converges within ``time_limit_s`` (it converges in
  milliseconds for hundreds of clients; the limit is a safety net, and a run
  cut by it is no longer reproducible).
* **State and purity.** `FedGSSampler.select` is pure (state in, selection
  out); the count update ``v_k += 1`` happens in `FedGSSampler.observe`, so a
  sampler restarted from a checkpointed state repeats the same choices. The
  client sizes ``n_k`` (for the aggregation weights) are kept in the state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import itertools
import math
import numbers
import time
from typing import NamedTuple

import numpy as np
from scipy.sparse import csgraph

from tff_sampling.samplers import base

_MAX_BRUTE_FORCE_CLIENTS = 14


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


def graph_distances(similarity: np.ndarray, *, epsilon: float = 0.1,
                    sigma2: float = 0.01) -> np.ndarray:
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
  if not sigma2 > 0:
    raise ValueError(f'sigma2 must be positive, got {sigma2!r}.')
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
  paths = csgraph.shortest_path(graph, method='D', directed=False)
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
  if (isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer))
      or budget <= 0):
    raise ValueError(f'budget must be a positive integer, got {budget!r}.')
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
  return _Problem(candidates, h[np.ix_(candidates, candidates)], scores, size, quad, lin)


def _local_value(problem: _Problem, local: np.ndarray) -> float:
  sub = problem.distances[np.ix_(local, local)]
  return float(problem.quad * sub.sum() - problem.lin * problem.scores[local].sum())


def objective(s_indices: Sequence[int] | np.ndarray, H: np.ndarray, counts: np.ndarray,
              available: np.ndarray, budget: int, *, alpha: float,
              num_clients: int | None = None) -> float:
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


def _greedy_swap(problem: _Problem, order: np.ndarray, first: int | None,
                 deadline: float) -> np.ndarray:
  """Greedy construction + best-improvement 1-swap search; local indices.

  `order` is a permutation of the candidates: ties go to the earlier one.
  `first` (a position in `order`), if given, is forced into the greedy start.
  """
  h = problem.distances[np.ix_(order, order)]
  z = problem.scores[order]
  n, m = order.size, problem.size
  picked = np.zeros(n, dtype=bool)
  reach = np.zeros(n)  # reach[x] = Σ_{l ∈ S} h[x, l].
  for step in range(m):
    gain = 2.0 * problem.quad * reach - problem.lin * z
    gain[picked] = -np.inf
    best = first if (step == 0 and first is not None) else int(np.argmax(gain))
    picked[best] = True
    reach += h[:, best]
  scale = (problem.quad * (np.abs(h).max() if n else 0.0)
           + problem.lin * (np.abs(z).max() if n else 0.0))
  tol = 1e-12 * max(scale, 1e-300)
  while m < n and time.monotonic() < deadline:
    inside, outside = np.flatnonzero(picked), np.flatnonzero(~picked)
    # Swapping i ∈ S for j ∉ S changes the objective by
    # 2·quad·(reach_j - reach_i - h_ij) - lin·(z_j - z_i).
    delta = (2.0 * problem.quad * (reach[outside][None, :] - reach[inside][:, None]
                                   - h[np.ix_(inside, outside)])
             - problem.lin * (z[outside][None, :] - z[inside][:, None]))
    flat = int(np.argmax(delta))
    if delta.flat[flat] <= tol:
      break
    i, j = inside[flat // outside.size], outside[flat % outside.size]
    picked[i], picked[j] = False, True
    reach += h[:, j] - h[:, i]
  return np.sort(order[picked])


def _heuristic(problem: _Problem, order: np.ndarray, num_starts: int,
               deadline: float) -> np.ndarray:
  """Best of greedy + 1-swap from the plain greedy start and `num_starts - 1`
  starts that force one client first (clients taken in `order`); local indices.

  Later starts run only while time remains; the first always runs.
  """
  best = _greedy_swap(problem, order, None, deadline)
  best_value = _local_value(problem, best)
  if problem.size <= 1 or problem.size >= order.size - 1:
    return best  # 1-swap search is already exact.
  for first in range(min(num_starts - 1, order.size)):
    if time.monotonic() >= deadline:
      break
    local = _greedy_swap(problem, order, first, deadline)
    value = _local_value(problem, local)
    if value > best_value:
      best, best_value = local, value
  return best


def _solve_with_solver(problem: _Problem, warm_start: np.ndarray, time_limit_s: float):
  """Hook for an exact MIQP solver warm-started with the heuristic."""
  del problem, warm_start, time_limit_s
  raise NotImplementedError(
      "method='solver' needs a MIQP solver (e.g. PySCIPOpt), which is not installed; "
      "implement fedgs._solve_with_solver(problem, warm_start, time_limit_s) to return "
      "the local indices of the best solution found, or use method='heuristic'.")


def select_clients(distances: np.ndarray, counts: np.ndarray, available: np.ndarray,
                   budget: int, *, alpha: float, time_limit_s: float = 1.0,
                   seed: int | Sequence[int] = 0, num_starts: int = 16,
                   method: str = 'heuristic') -> tuple[np.ndarray, float]:
  """Maximises the FedGS objective over ``min(budget, |A|)`` available clients.

  Args:
    distances: ``float[N, N]`` 3DG distances ``H``.
    counts: ``int[N]`` sampling counts before the round.
    available: ``bool[N]`` availability mask.
    budget: ``K`` clients per round.
    alpha: The paper's ``α ≥ 0``.
    time_limit_s: Wall-clock limit of the local search (the paper's ``τ_max``).
    seed: Seed of the tie-breaking order (``np.random.default_rng(seed)``).
    num_starts: Greedy starts: the plain greedy one, then ones forcing each of
      the first ``num_starts - 1`` clients of the tie-breaking order first.
    method: ``'heuristic'`` (greedy + 1-swap) or ``'solver'`` (not available).

  Returns:
    ``(indices, value)``: the picked clients (``int64``, ascending) and their
    objective value.

  Raises:
    ValueError: On bad shapes, budget, time limit or method.
    TypeError: If `alpha` is not a real number.
    NotImplementedError: For ``method='solver'``.
  """
  if method not in ('heuristic', 'solver'):
    raise ValueError(f"method must be 'heuristic' or 'solver', got {method!r}.")
  if not time_limit_s > 0:
    raise ValueError(f'time_limit_s must be positive, got {time_limit_s!r}.')
  deadline = time.monotonic() + float(time_limit_s)
  problem = _build_problem(distances, counts, available, budget, alpha, None)
  order = np.random.default_rng(seed).permutation(problem.candidates.size)
  if (isinstance(num_starts, (bool, np.bool_)) or not isinstance(num_starts, (int, np.integer))
      or num_starts <= 0):
    raise ValueError(f'num_starts must be a positive integer, got {num_starts!r}.')
  local = _heuristic(problem, order, int(num_starts), deadline)
  if method == 'solver':
    local = _solve_with_solver(problem, local, time_limit_s)
  return problem.candidates[local], _local_value(problem, local)


def brute_force_select(distances: np.ndarray, counts: np.ndarray, available: np.ndarray,
                       budget: int, *, alpha: float) -> tuple[np.ndarray, float]:
  """Exact optimum by enumeration (the tests' oracle); at most 14 available clients.

  Returns:
    ``(indices, value)`` as `select_clients`; ties go to the lexicographically
    first subset.

  Raises:
    ValueError: If more than 14 clients are available, or as `select_clients`.
  """
  problem = _build_problem(distances, counts, available, budget, alpha, None)
  if problem.candidates.size > _MAX_BRUTE_FORCE_CLIENTS:
    raise ValueError(f'brute_force_select handles at most {_MAX_BRUTE_FORCE_CLIENTS} '
                     f'available clients, got {problem.candidates.size}.')
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
  """

  def __init__(self, clients_per_round: int, *, seed: int,
               features: np.ndarray | None = None,
               distances: np.ndarray | None = None,
               alpha: float = 1.0, time_limit_s: float = 1.0,
               epsilon: float = 0.1, sigma2: float = 0.01):
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

    Raises:
      ValueError: On a bad `clients_per_round`, limit, or graph input.
      TypeError: If `alpha` is not a real number.
    """
    if (isinstance(clients_per_round, (bool, np.bool_))
        or not isinstance(clients_per_round, (int, np.integer)) or clients_per_round <= 0):
      raise ValueError(
          f'clients_per_round must be a positive integer, got {clients_per_round!r}.')
    if (features is None) == (distances is None):
      raise ValueError('Give exactly one of features and distances.')
    if not time_limit_s > 0:
      raise ValueError(f'time_limit_s must be positive, got {time_limit_s!r}.')
    self.clients_per_round = int(clients_per_round)
    self.alpha = _validate_alpha(alpha)
    self.time_limit_s = float(time_limit_s)
    self._seed = int(seed)
    if features is not None:
      self._distances = graph_distances(similarity_from_features(features),
                                        epsilon=epsilon, sigma2=sigma2)
    else:
      self._distances = _validate_square(distances, 'distances').copy()

  def initialize(self, population: base.Population) -> FedGSState:
    """Returns zero counts, the 3DG distances and the client sizes.

    Raises:
      ValueError: If the population size does not match the 3DG.
    """
    sizes = np.asarray(population.num_examples, dtype=np.int64)
    n = self._distances.shape[0]
    if sizes.shape != (n,):
      raise ValueError(f'population has {sizes.shape} sizes but the 3DG has {n} clients.')
    return FedGSState(self._distances.copy(), np.zeros(n, np.int64), sizes.copy())

  def select(self, state: FedGSState, round_num: int,
             available: np.ndarray) -> base.Selection:
    """Returns the maximiser found, weighted ``n_k / Σ_{j∈S} n_j``; pure."""
    clients, _ = select_clients(
        state.distances, state.counts, available, self.clients_per_round,
        alpha=self.alpha, time_limit_s=self.time_limit_s, seed=(self._seed, int(round_num)))
    sizes = state.num_examples[clients].astype(np.float64)
    total = sizes.sum()
    weights = (sizes / total if total > 0 else np.full(clients.size, 1.0 / clients.size))
    return base.Selection(clients=clients, weights=weights.astype(np.float32))

  def observe(self, state: FedGSState, selection: base.Selection,
              signals: Mapping[str, np.ndarray]) -> FedGSState:
    """Returns the state with ``v_k += 1`` for every selected client."""
    del signals
    counts = state.counts.copy()
    np.add.at(counts, np.asarray(selection.clients, np.int64), 1)
    return state._replace(counts=counts)
