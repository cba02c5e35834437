r"""FedGS (Wang et al., AAAI 2023): graph-based client sampling under arbitrary availability.

`FedGSSampler` keeps each client's sampling count ``v`` and, each round, picks the budget's
clients among the available ones that are far apart on the 3DG (`fedgs_problem`) and lift the
least-sampled, by the heuristic and SCIP of `fedgs_solvers`. The formulas and every choice
made here are ``docs/algorithms.md`` §3a-§3b; the solver's behaviour ``docs/fedgs.md``."""

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
    kernel: str = 'linear',
    dispersion_scale: str = 'clients',
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
      kernel: The 3DG's edge weight, ``exp(-V/σ²)`` or ``exp(-V²/σ²)``
        (`fedgs_problem.graph_distances`).
      dispersion_scale: The dispersion term over ``N (N-1)`` (``'clients'``,
        the paper) or ``M (M-1)`` (``'cohort'``; `fedgs_problem.scaled_alpha`).
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
    fedgs_problem.scaled_alpha(self.alpha, dispersion_scale, 2, 2)  # Validates the scale.
    self.dispersion_scale = dispersion_scale
    self.time_limit_s = float(time_limit_s)
    self._seed = int(seed)
    if features is not None:
      self._distances = fedgs_problem.graph_distances(
        fedgs_problem.similarity_from_features(features),
        epsilon=epsilon,
        sigma2=sigma2,
        kernel=kernel,
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
    n = state.distances.shape[0]
    size = min(self.clients_per_round, int(np.count_nonzero(available)))
    report = fedgs_solvers.select_clients_with_report(
      state.distances,
      state.counts,
      available,
      self.clients_per_round,
      alpha=fedgs_problem.scaled_alpha(self.alpha, self.dispersion_scale, n, size),
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
    """Returns the state with ``v_k += 1`` for every selected client: kept or, under a
    system model, missed (``v`` counts the clients sampled, Alg. 1 line 15)."""
    del signals
    counts = state.counts.copy()
    np.add.at(counts, np.asarray(selection.clients, np.int64), 1)
    if selection.missed is not None:
      np.add.at(counts, np.asarray(selection.missed.clients, np.int64), 1)
    return state._replace(counts=counts)
