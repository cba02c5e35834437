"""FedGS (Wang et al., AAAI 2023) against other samplers under client availability.

The methods' samplers and processes, the loss table over availability modes,
and the final sampling counts per client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

from matplotlib import figure as mpl_figure
from matplotlib.backends import backend_agg
import numpy as np
import tensorflow_federated as tff

from tff_sampling import evidence
from tff_sampling import plotting
from tff_sampling import results
from tff_sampling import samplers
from tff_sampling.learning import graph_probe
from tff_sampling.learning import signals
from tff_sampling.samplers import fedgs
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
        graphs[key] = fedgs.graph_distances(
          fedgs.similarity_from_features(self.graph_features(task, seed)),
          epsilon=self.graph_epsilon,
          sigma2=self.graph_sigma2,
        )
      return samplers.FedGSSampler(
        m,
        seed=seed,
        distances=graphs[key],
        alpha=self.alpha,
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
        processes[mu] = signals.build_fedavg_with_signals(
          task.model_fn,
          client_learning_rate=self.client_learning_rate,
          server_learning_rate=self.server_learning_rate,
          sketch_size=None,
          proximal_strength=mu,
        )  # FedGS reads no sketches: none computed.
      return processes[mu]

    return make_process


def best_loss(run: results.Run) -> float:
  """The lowest evaluated test loss of a run (the paper's "optimal testing loss")."""
  return evidence.lowest(run)


def loss_table(table: Mapping[str, Mapping[str, list[results.Run]]]) -> str:
  """Best test loss (mean ± std over seeds) per method (rows) × mode (columns),
  with the relative change against the method's IDL run where there is one."""
  modes = list(table)
  methods = list(dict.fromkeys(m for groups in table.values() for m in groups))
  width = 24
  header = f'{"method":<16}' + ''.join(f'{mode:>{width}}' for mode in modes)
  lines = [header, '-' * len(header)]
  for method in methods:
    cells = []
    ideal = table.get('IDL', {}).get(method)
    ideal_mean = np.mean([best_loss(r) for r in ideal]) if ideal else None
    for mode in modes:
      runs = table[mode].get(method, [])
      losses = np.array([best_loss(r) for r in runs])
      cell = f'{losses.mean():.4f} ± {results.seed_spread(losses):.4f}'
      if ideal_mean is not None and mode != 'IDL':
        cell += f' {100 * (losses.mean() / ideal_mean - 1):+.1f}%'
      cells.append(f'{cell:>{width}}')
    lines.append(f'{method:<16}' + ''.join(cells))
  return '\n'.join(lines)


def plot_sampling_counts(groups: Mapping[str, list[results.Run]], title: str, path: str) -> str:
  """Sorted final sampling counts per client, one line per method (its first seed's run)."""
  fig = mpl_figure.Figure(figsize=(6.4, 4.0))
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.subplots()
  for i, (method, runs) in enumerate(groups.items()):
    counts = runs[0].selection_counts
    if counts is None:
      continue
    # Dashes keep methods with the same sampler (uniform, fedprox) both visible.
    ax.plot(
      np.sort(counts)[::-1],
      marker='.',
      linestyle=('-', '--', ':', '-.')[i % 4],
      label=f'{method} (std {counts.std():.1f})',
    )
  ax.set_xlabel('client (sorted by count)')
  ax.set_ylabel('times sampled')
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  return plotting.save_figure(fig, path, dpi=100)


def count_table(groups: Mapping[str, list[results.Run]]) -> str:
  """Spread of the final sampling counts per method (mean over seeds)."""
  lines = [f'{"method":<16}{"count std":>10}{"min":>6}{"max":>6}{"never sampled":>15}']
  for method, runs in groups.items():
    counts = [r.selection_counts for r in runs if r.selection_counts is not None]
    if not counts:
      continue
    lines.append(
      f'{method:<16}{np.mean([c.std() for c in counts]):>10.2f}'
      f'{np.mean([c.min() for c in counts]):>6.1f}'
      f'{np.mean([c.max() for c in counts]):>6.1f}'
      f'{np.mean([np.sum(c == 0) for c in counts]):>15.1f}'
    )
  return '\n'.join(lines)
