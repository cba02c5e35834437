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

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base
from tff_sampling.samplers import fedgs_problem
from tff_sampling.samplers import fedgs_solvers


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
    max_solver_clients: int = fedgs_solvers.DEFAULT_MAX_SOLVER_CLIENTS,
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
    fedgs_solvers.validate_method(method, max_solver_clients)
    self.method = method
    self.max_solver_clients = int(max_solver_clients)
    self.clients_per_round = int(clients_per_round)
    self.alpha = fedgs_problem.validate_alpha(alpha)
    self.time_limit_s = float(time_limit_s)
    self._seed = int(seed)
    if features is not None:
      self._distances = fedgs_problem.graph_distances(
        fedgs_problem.similarity_from_features(features), epsilon=epsilon, sigma2=sigma2
      )
    else:
      assert distances is not None  # Exactly one of the two is given.
      self._distances = fedgs_problem.validate_square(distances, 'distances').copy()

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
    report = fedgs_solvers.select_clients_with_report(
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
