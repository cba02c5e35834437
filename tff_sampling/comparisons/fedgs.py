"""FedGS (Wang et al., AAAI 2023) against other samplers under client availability: the
methods' samplers and processes (their tables: `tff_sampling.analysis.fedgs_tables`)."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_sampling import samplers
from tff_sampling.learning import graph_probe
from tff_sampling.learning import signals
from tff_sampling.samplers import fedgs_problem
from tff_sampling.task import Task

SAMPLINGS = ('fedgs', 'uniform', 'md', 'power_of_choice', 'power_of_choice_all', 'fedprox')
GRAPHS = ('oracle', 'functional', 'update_cosine')


@dataclasses.dataclass(frozen=True)
class FedGSMethods:
  """The methods' settings.

  Attributes:
    clients_per_round: ``m``.
    client_learning_rate, server_learning_rate: FedAvg's SGD step sizes (the
      client's also probes the clients for the ``functional`` and
      ``update_cosine`` graphs).
    client_steps: Local batches per client and round (``None``: the task's epochs).
    alpha: fedgs: weight α of the graph-dispersion term.
    graph: fedgs: features of the 3DG, one of `GRAPHS`.
    graph_epsilon, graph_sigma2: fedgs: the 3DG's edge threshold ε and σ².
    graph_kernel: fedgs: the 3DG's edge weight, ``'linear'`` ``exp(-V/σ²)`` (the
      paper) or ``'squared'`` ``exp(-V²/σ²)`` (the authors' code).
    dispersion_scale: fedgs: the dispersion term over ``N (N-1)`` (``'clients'``,
      the paper) or ``M (M-1)`` (``'cohort'``, the authors' code).
    solver, solver_time_limit: fedgs: how each selection is optimised, and its
      wall-clock limit in seconds.
    sketch_size: Length of the update sketches (``update_cosine`` graph).
    num_candidates: power_of_choice: candidates d per round (``None``: 2m).
    fedprox_mu: fedprox: proximal strength μ.
  """

  clients_per_round: int
  client_learning_rate: float
  server_learning_rate: float = 1.0
  client_steps: int | None = None
  alpha: float = 1.0
  graph: str = 'oracle'
  graph_epsilon: float = 0.1
  graph_sigma2: float = 0.01
  graph_kernel: str = 'linear'
  dispersion_scale: str = 'clients'
  solver: str = 'auto'
  solver_time_limit: float = 1.0
  sketch_size: int = 1024
  num_candidates: int | None = None
  fedprox_mu: float = 0.01

  def method_hparams(self, method: str) -> dict[str, Any]:
    """The values a method derives from the settings (power-of-choice's d)."""
    if method == 'power_of_choice':
      return dict(num_candidates=self.num_candidates or 2 * self.clients_per_round)
    if method == 'power_of_choice_all':
      return dict(num_candidates='all active')
    return {}

  def graph_features(self, task: Task, seed: int) -> np.ndarray:
    """The clients' 3DG features of `graph` (computed once per seed)."""
    if self.graph == 'oracle':
      return graph_probe.oracle_features(task)
    return graph_probe.client_graph_features(
      task,
      kind=self.graph,
      model_weights=task.initial_model_weights(seed),
      client_learning_rate=self.client_learning_rate,
      seed=seed,
      client_steps=self.client_steps,
      sketch_size=self.sketch_size,
    )

  def make_sampler(
    self, task: Task, method: str, seed: int, graphs: dict[int | None, np.ndarray]
  ) -> samplers.Sampler:
    """The sampler of `method`; `graphs` caches the 3DG distances per seed (one
    entry, ``None``, for the seed-independent oracle graph), so the all-pairs
    shortest paths run once, not once per availability mode."""
    m = self.clients_per_round
    if method in ('uniform', 'fedprox'):
      return samplers.UniformSampler(m, seed=seed)
    if method == 'md':
      return samplers.MDSampler(m, seed=seed)
    if method == 'power_of_choice':
      return samplers.PowerOfChoiceSampler(
        m, num_candidates=self.num_candidates or 2 * m, seed=seed
      )
    if method == 'power_of_choice_all':  # d = |A_t|: the sampler caps d at the active clients.
      return samplers.PowerOfChoiceSampler(m, num_candidates=task.num_clients, seed=seed)
    if method == 'fedgs':
      key = None if self.graph == 'oracle' else seed
      if key not in graphs:
        graphs[key] = fedgs_problem.graph_distances(
          fedgs_problem.similarity_from_features(self.graph_features(task, seed)),
          epsilon=self.graph_epsilon,
          sigma2=self.graph_sigma2,
          kernel=self.graph_kernel,
        )
      return samplers.FedGSSampler(
        m,
        seed=seed,
        distances=graphs[key],
        alpha=self.alpha,
        dispersion_scale=self.dispersion_scale,
        time_limit_s=self.solver_time_limit,
        method=self.solver,
      )
    raise ValueError(f'Unknown --sampling {method!r}; choose from {", ".join(SAMPLINGS)}.')

  def sampler_factory(self, task: Task) -> Callable[[str, int], samplers.Sampler]:
    """``(method, seed) -> sampler``, sharing the 3DG distances between calls."""
    graphs: dict[int | None, np.ndarray] = {}
    return lambda method, seed: self.make_sampler(task, method, seed, graphs)

  def process_factory(
    self, task: Task
  ) -> Callable[[str, int], tff.learning.templates.LearningProcess]:
    """``(method, seed) -> process``: FedAvg, with FedProx's term for fedprox; each built once."""
    processes: dict[float, tff.learning.templates.LearningProcess] = {}

    def make_process(method: str, seed: int) -> tff.learning.templates.LearningProcess:
      del seed  # The same for every seed.
      mu = self.fedprox_mu if method == 'fedprox' else 0.0
      if mu not in processes:
        processes[mu] = signals.build_fed_avg_with_signals(
          task.model_fn,
          client_learning_rate=self.client_learning_rate,
          server_learning_rate=self.server_learning_rate,
          sketch_size=None,
          proximal_strength=mu,
        )  # FedGS reads no sketches: none computed.
      return processes[mu]

    return make_process
