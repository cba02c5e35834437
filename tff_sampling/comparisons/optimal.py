"""Optimal client sampling (Chen, Horváth, Richtárik): its learning processes and tables.

Shared by ``bin.optimal_sampling`` (one run) and ``bin.demo`` (a comparison of
samplings over seeds).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_federated as tff

from tff_sampling import aggregators
from tff_sampling import learning
from tff_sampling.runtime import results
from tff_sampling.task import Task

# --sampling (a method's name in runs and reports) -> the aggregator's mode: who uploads.
SAMPLING_MODES = {
  'optimal': aggregators.Mode.APPROXIMATE,
  'optimal_exact': aggregators.Mode.EXACT,
  'uniform': aggregators.Mode.UNIFORM,
  'full': aggregators.Mode.FULL,
}
ALGORITHMS = ('fedavg', 'dsgd')

_ALPHA_COLUMN = 'process/aggregator/improvement_factor'
_STEPS_COLUMN = 'process/aggregator/rescaling_steps'


@dataclasses.dataclass(frozen=True)
class OptimalSampling:
  """How the cohort trains and who uploads.

  Attributes:
    algorithm: ``'fedavg'`` (local SGD) or ``'dsgd'`` (one gradient per client).
    expected_clients: ``m``, the expected uploads per round.
    max_rescaling_steps: ``j_max`` of the secure protocol.
    client_learning_rate: Client SGD step size (FedAvg).
    server_learning_rate: Server SGD step size.
  """

  algorithm: str
  expected_clients: float
  max_rescaling_steps: int
  client_learning_rate: float
  server_learning_rate: float

  def aggregator(self, sampling: str, seed: int) -> aggregators.OptimalSamplingFactory:
    """Who uploads under method `sampling`: optimal client sampling's aggregator in its mode
    (the secure protocol for ``optimal``; ``optimal_exact`` reveals norms, so never secure)."""
    mode = SAMPLING_MODES[sampling]
    return aggregators.OptimalSamplingFactory(
      self.expected_clients,
      max_rescaling_steps=self.max_rescaling_steps,
      mode=mode,
      secure=(mode != aggregators.Mode.EXACT),
      seed=seed,
    )

  def process(
    self, task: Task, aggregator: aggregators.OptimalSamplingFactory
  ) -> tff.learning.templates.LearningProcess:
    """FedAvg (or DSGD) on `task` with `aggregator`: every cohort client trains, and the
    aggregator lets each upload with its probability."""
    server_optimizer = tff.learning.optimizers.build_sgdm(self.server_learning_rate)
    if self.algorithm == 'dsgd':
      return learning.build_dsgd_with_aggregator(task.model_fn, server_optimizer, aggregator)
    return learning.build_fed_avg_with_aggregator(
      task.model_fn,
      tff.learning.optimizers.build_sgdm(self.client_learning_rate),
      server_optimizer,
      aggregator,
    )

  def make_process(
    self, task: Task, sampling: str, seed: int
  ) -> tff.learning.templates.LearningProcess:
    """The learning process in which the cohort uploads as `sampling` says."""
    return self.process(task, self.aggregator(sampling, seed))


def summary_table(groups: dict[str, list[results.Run]], target: float) -> str:
  """One row per method: accuracy, rounds and bits to `target`, mean α."""
  header = (
    f'{"method":<14} {"final accuracy":>16} {f"rounds to {target:.0%}":>14} '
    f'{f"Mbit to {target:.0%}":>14} {"total Mbit":>11} {"mean α":>7}'
  )
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    final = np.array([r.last_finite('eval/accuracy') for r in runs])
    rounds = [results.rounds_to_target(r, target) for r in runs]
    bits = [results.bits_to_target(r, target) for r in runs]
    reached = [b for b in bits if b is not None]
    alpha = np.nanmean(
      [np.nanmean(r.metrics[_ALPHA_COLUMN]) for r in runs if _ALPHA_COLUMN in r.metrics]
    )
    rounds_text = (
      f'{np.median([r for r in rounds if r is not None]):.0f}'
      f' ({len([r for r in rounds if r is not None])}/{len(runs)})'
      if any(r is not None for r in rounds)
      else 'never'
    )
    bits_text = f'{np.median(reached) / 1e6:.2f}' if reached else 'never'
    total = np.median([r.metrics['uplink/cumulative_bits'][-1] for r in runs]) / 1e6
    lines.append(
      f'{method:<14} {final.mean():>9.4f} ± {results.seed_spread(final):.3f} '
      f'{rounds_text:>14} '
      f'{bits_text:>14} {total:>11.2f} {alpha:>7.3f}'
    )
  return '\n'.join(lines)


def improvement_table(groups: dict[str, list[results.Run]], blocks: int = 3) -> str:
  """Mean improvement factor α (over seeds) per block of rounds, and rescaling steps used."""
  rounds = max(int(r.rounds[-1]) for runs in groups.values() for r in runs)
  edges = np.linspace(0, rounds, min(blocks, rounds) + 1).astype(int)  # No empty block.
  names = [f'rounds {lo + 1}-{hi}' for lo, hi in zip(edges[:-1], edges[1:])]
  lines = [
    f'{"method":<14} ' + ' '.join(f'{n:>14}' for n in names) + f' {"steps used (mean/max)":>22}'
  ]
  for method, runs in groups.items():
    if _ALPHA_COLUMN not in runs[0].metrics:
      continue
    cells = []
    for lo, hi in zip(edges[:-1], edges[1:]):
      values = [r.metrics[_ALPHA_COLUMN][(r.rounds > lo) & (r.rounds <= hi)] for r in runs]
      cells.append(f'{np.nanmean(np.concatenate(values)):>14.3f}')
    steps = np.concatenate([r.metrics[_STEPS_COLUMN][1:] for r in runs])
    lines.append(
      f'{method:<14} '
      + ' '.join(cells)
      + f' {f"{np.nanmean(steps):.2f}/{np.nanmax(steps):.0f}":>22}'
    )
  return '\n'.join(lines)
