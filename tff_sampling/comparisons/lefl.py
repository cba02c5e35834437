"""LEFL (Abebe, Munoz, Jannesari) against uniform sampling: methods and table."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses

import numpy as np

from tff_sampling import communication
from tff_sampling import samplers
from tff_sampling.learning import soft_labels
from tff_sampling.runtime import results
from tff_sampling.task import Task

SAMPLINGS = ('lefl', 'uniform')


@dataclasses.dataclass(frozen=True)
class LeflMethods:
  """The samplers' settings.

  Attributes:
    clients_per_round: ``m``.
    client_learning_rate: Client SGD step size of the pre-training.
    client_steps: Local batches per pass (``None``: the task's epochs).
    pretrain_epochs: ``E_p``, passes over each client stream before its soft labels.
    public_inputs: ``(task, seed) -> float32[P, …]`` the public unlabeled
      inputs (e.g. `tasks.public.public_inputs` with its source bound).
    num_clusters: k-means clusters (``None``: ⌈log2 N⌉).
    sample_rate: per_cluster: fraction of each cluster per round (``None``: m / N).
    allocation: ``'per_cluster'`` or ``'proportional'``.
  """

  clients_per_round: int
  client_learning_rate: float
  public_inputs: Callable[[Task, int], np.ndarray]
  client_steps: int | None = None
  pretrain_epochs: int = 10
  num_clusters: int | None = None
  sample_rate: float | None = None
  allocation: str = 'per_cluster'

  def make_sampler(
    self,
    task: Task,
    method: str,
    seed: int,
    costs: dict[tuple[str, int], communication.PreprocessingBits],
  ) -> samplers.Sampler:
    """The sampler of `method`; LEFL's pre-processing cost goes to ``costs[method, seed]``."""
    m = self.clients_per_round
    if method == 'uniform':
      return samplers.UniformSampler(m, seed=seed)
    if method != 'lefl':
      raise ValueError(f'Unknown --sampling {method!r}; choose from {", ".join(SAMPLINGS)}.')
    inputs = self.public_inputs(task, seed)
    labels = soft_labels.client_soft_labels(
      task,
      public_inputs=inputs,
      model_weights=task.initial_model_weights(seed),
      client_learning_rate=self.client_learning_rate,
      seed=seed,
      pretrain_epochs=self.pretrain_epochs,
      client_steps=self.client_steps,
    )
    # A sequence model uploads one distribution per position (`num_classes`
    # counts them all); the KL treats each position as a public example.
    costs[method, seed] = communication.PreprocessingBits(
      **soft_labels.preprocessing_bits(
        num_clients=task.num_clients,
        public_examples=inputs.shape[0],
        input_size=int(np.prod(inputs.shape[1:])),
        num_classes=int(np.prod(labels.shape[2:])),
      )
    )
    per_example = labels.reshape(labels.shape[0], -1, labels.shape[-1])
    return samplers.LeflSampler(
      m,
      soft_labels=per_example,
      num_clusters=self.num_clusters,
      sample_rate=self.sample_rate,
      allocation=self.allocation,
      seed=seed,
    )


def default_target(groups: dict[str, list[results.Run]]) -> float:
  """90% of the best final accuracy (mean over seeds) among the methods."""
  return float(
    0.9 * max(np.mean([r.last_finite('eval/accuracy') for r in runs]) for runs in groups.values())
  )


def summary_table(groups: dict[str, list[results.Run]], target: float) -> str:
  """Relative entropy, accuracy, rounds to `target` and communication per method."""
  header = (
    f'{"method":<10}{"label KL/round":>16}{"final accuracy":>18}'
    f'{f"rounds to {target:.3f}":>18}{"cohort":>8}{"pre-proc. upload":>18}'
    f'{"= rounds":>10}{"pre-proc. download":>20}'
  )
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    kl = np.array([np.nanmean(r.metrics['selection/label_kl'][1:]) for r in runs])
    accuracy = np.array([r.last_finite('eval/accuracy') for r in runs])
    reached = [results.rounds_to_target(r, target) for r in runs]
    rounds = [x for x in reached if x is not None]
    rounds_text = (
      f'{np.mean(rounds):.1f} ({len(rounds)}/{len(runs)})' if rounds else f'never (0/{len(runs)})'
    )
    cohort = np.mean([np.nanmean(r.metrics['cohort_size'][1:]) for r in runs])
    upload = np.mean([r.metrics['uplink/round_bits'][0] for r in runs])
    per_round = np.mean([np.nanmean(r.metrics['uplink/round_bits'][1:]) for r in runs])
    download = np.mean(
      [np.nan_to_num(r.metrics.get('downlink/preprocessing_bits', np.zeros(1))[0]) for r in runs]
    )
    lines.append(
      f'{method:<10}{kl.mean():>9.4f} ± {results.seed_spread(kl):.3f}{accuracy.mean():>11.4f} ± '
      f'{results.seed_spread(accuracy):.3f}{rounds_text:>18}{cohort:>8.1f}{upload:>18.3g}'
      f'{upload / per_round:>10.2f}{download:>20.3g}'
    )
  return '\n'.join(lines)
