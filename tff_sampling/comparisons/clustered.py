"""Clustered sampling (Fraboni et al., ICML 2021) against other server samplers: methods, table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses

import numpy as np
import tensorflow_federated as tff

from tff_sampling import samplers
from tff_sampling.learning import signals
from tff_sampling.runtime import results
from tff_sampling.task import Task

SAMPLINGS = (
  'uniform',
  'md',
  'clustered_size',
  'clustered_similarity',
  'target',
  'power_of_choice',
  'fedgs',
)


@dataclasses.dataclass(frozen=True)
class ClusteredMethods:
  """The samplers' settings.

  Attributes:
    clients_per_round: ``m``.
    client_learning_rate, server_learning_rate: FedAvg's SGD step sizes.
    similarity: clustered_similarity: distance between client update sketches.
    sketch_size: clustered_similarity: length of each sketch.
    num_candidates: power_of_choice: candidates per round.
    fedgs_alpha: fedgs: weight α of the graph-dispersion term.
  """

  clients_per_round: int
  client_learning_rate: float
  server_learning_rate: float = 1.0
  similarity: str = 'arccos'
  sketch_size: int = 1024
  num_candidates: int = 20
  fedgs_alpha: float = 1.0

  def process_factory(
    self, task: Task
  ) -> Callable[[str, int], tff.learning.templates.LearningProcess]:
    """``(method, seed) -> process``, one per kind, reused across methods and seeds.

    Only similarity-based sampling reads the update sketches, which cost client
    time; the other methods' process computes none.
    """
    processes: dict[int | None, tff.learning.templates.LearningProcess] = {}

    def make_process(method: str, seed: int) -> tff.learning.templates.LearningProcess:
      del seed  # The same for every seed.
      sketch_size = self.sketch_size if method == 'clustered_similarity' else None
      if sketch_size not in processes:
        processes[sketch_size] = signals.build_fed_avg_with_signals(
          task.model_fn,
          client_learning_rate=self.client_learning_rate,
          server_learning_rate=self.server_learning_rate,
          sketch_size=sketch_size,
        )
      return processes[sketch_size]

    return make_process

  def make_sampler(self, task: Task, method: str, seed: int) -> samplers.Sampler:
    """The server-side sampler `method`."""
    m = self.clients_per_round
    if method == 'uniform':
      return samplers.UniformSampler(m, seed=seed)
    if method == 'md':
      return samplers.MDSampler(m, seed=seed)
    if method == 'clustered_size':
      return samplers.ClusteredSampler(m, seed=seed, method='size')
    if method == 'clustered_similarity':
      return samplers.ClusteredSampler(
        m, seed=seed, method='similarity', similarity=self.similarity, sketch_size=self.sketch_size
      )
    if method == 'target':
      return samplers.TargetSampler(task.client_label_histograms.argmax(axis=1), seed=seed)
    if method == 'power_of_choice':
      return samplers.PowerOfChoiceSampler(m, num_candidates=self.num_candidates, seed=seed)
    if method == 'fedgs':
      # The oracle 3DG of FedGS's simulations: label-distribution features.
      histograms = task.client_label_histograms.astype(np.float64)
      features = histograms / np.maximum(histograms.sum(axis=1, keepdims=True), 1.0)
      return samplers.FedGSSampler(m, seed=seed, features=features, alpha=self.fedgs_alpha)
    raise ValueError(f'Unknown --sampling {method!r}; choose from {", ".join(SAMPLINGS)}.')


def _mean_over_runs(runs: Sequence[results.Run], column: str) -> float:
  return float(np.mean([np.nanmean(r.metrics[column][1:]) for r in runs]))


def summary_table(groups: dict[str, list[results.Run]]) -> str:
  """Final accuracy/loss and per-round selection statistics per method."""
  header = (
    f'{"method":<22} {"final accuracy":>16} {"final loss":>11} '
    f'{"distinct clients":>17} {"distinct labels":>16} {"weight var":>11}'
  )
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    accuracy = np.array([r.last_finite('eval/accuracy') for r in runs])
    loss = np.array([r.last_finite('eval/loss') for r in runs])
    lines.append(
      f'{method:<22} {accuracy.mean():>9.4f} ± {results.seed_spread(accuracy):.3f} '
      f'{loss.mean():>11.4f} '
      f'{_mean_over_runs(runs, "selection/distinct_clients"):>17.2f} '
      f'{_mean_over_runs(runs, "selection/distinct_labels"):>16.2f} '
      f'{_mean_over_runs(runs, "selection/weight_variance"):>11.2e}'
    )
  return '\n'.join(lines)
