"""Every sampler on the same task, alone and followed by optimal sampling of the uploads.

A method is a sampler name, optionally followed by ``+optimal``:

* ``<sampler>``: the sampler chooses ``m`` clients (`BenchmarkMethods.clients_per_round`);
  they train and all upload.
* ``<sampler>+optimal``: the sampler chooses a larger training cohort of ``K``
  clients (`BenchmarkMethods.training_cohort`); they train, then the two-phase
  secure-sum protocol (`tff_sampling.aggregators.OptimalSamplingFactory`) lets
  about ``m`` of them upload, each divided by its probability. Both stages are
  unbiased in turn, so the pair estimates what the sampler alone estimates
  (``tests/test_combined_sampling.py``), for the same expected uploads ``m``.

Samplers (`SAMPLERS`): ``uniform``; ``md``; ``clustered_size`` and
``clustered_similarity`` (Fraboni et al.); ``power_of_choice`` (``d = 2m``
candidates drawn ∝ size) and ``power_of_choice_all`` (``d = |A_t|``); ``fedgs``
(oracle 3DG); ``lefl``; ``oort`` (Lai et al.: utility from the clients' losses, and under
a system model their durations); ``tifl`` (Chai et al.: tiers by the latency the system
model gives each client); ``full`` (every available client: the reference;
``full+optimal`` is optimal client sampling as Chen et al. ran it with the
whole population as the cohort).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import samplers
from tff_sampling.aggregators import OptimalSamplingFactory
from tff_sampling.comparisons import clustered
from tff_sampling.comparisons import fedgs
from tff_sampling.comparisons import lefl
from tff_sampling.comparisons import settings
from tff_sampling.learning import signals
from tff_sampling.task import Task

SAMPLERS = (
  'uniform',
  'md',
  'clustered_size',
  'clustered_similarity',
  'power_of_choice',
  'power_of_choice_all',
  'fedgs',
  'lefl',
  'oort',
  'tifl',
  'full',
)
OPTIMAL_UPLOADS = '+optimal'


def parse_method(method: str) -> tuple[str, bool]:
  """``'md+optimal'`` -> ``('md', True)``; ``'md'`` -> ``('md', False)``.

  Raises:
    ValueError: For a sampler not in `SAMPLERS`.
  """
  optimal = method.endswith(OPTIMAL_UPLOADS)
  sampler = method[: -len(OPTIMAL_UPLOADS)] if optimal else method
  if sampler not in SAMPLERS:
    raise ValueError(
      f'Unknown method {method!r}: give a sampler of {", ".join(SAMPLERS)}, optionally '
      f'followed by {OPTIMAL_UPLOADS} (e.g. md{OPTIMAL_UPLOADS}).'
    )
  return sampler, optimal


def all_methods(samplers_: tuple[str, ...] = SAMPLERS) -> tuple[str, ...]:
  """Every sampler alone, then every sampler with optimal uploads."""
  return (*samplers_, *(s + OPTIMAL_UPLOADS for s in samplers_))


def uplink(process_metrics: Mapping[str, Any], cohort_size: int) -> communication.Uplink:
  """The program loop's uplink count for either kind of method.

  With optimal uploads the aggregator measures what was uploaded (and the
  protocol's scalars); otherwise the whole cohort uploads its update.
  """
  aggregator = process_metrics.get('aggregator', {})
  if isinstance(aggregator, Mapping) and 'uploads' in aggregator:
    return communication.uplink_from_measurements(process_metrics, cohort_size)
  return communication.full_cohort_uplink(process_metrics, cohort_size)


@dataclasses.dataclass(frozen=True)
class BenchmarkMethods:
  """The methods' settings.

  Attributes:
    clients_per_round: ``m``: the cohort of a sampler alone, and the expected
      uploads of a sampler with optimal uploads.
    training_cohort: ``K`` (> m): the cohort that trains before optimal uploads.
    client_learning_rate, server_learning_rate: FedAvg's SGD step sizes.
    client_steps: Local batches per client and round (``None``: the task's epochs).
    max_rescaling_steps: The secure protocol's rescaling steps (Algorithm 2).
    fedgs_alpha: FedGS's α.
    fedgs_solver, fedgs_solver_time_limit: How FedGS optimises each selection
      (``'heuristic'``, the default here, is deterministic; ``'auto'`` and
      ``'solver'`` run SCIP, which on 100 or more available clients often stops
      at the wall-clock limit, so its cohort depends on the machine), and the
      limit in seconds.
    sketch_size: clustered_similarity: length of the update sketches.
    public_inputs: lefl: ``(task, seed) -> float32[P, …]`` public unlabeled inputs.
    lefl_allocation: lefl: ``'proportional'`` (equal cohort) or ``'per_cluster'``.
    devices: The clients' devices (tifl tiers them by the latency they give each client).
    rounds: The run's rounds (tifl's credits).
  """

  clients_per_round: int
  training_cohort: int
  client_learning_rate: float
  server_learning_rate: float = 1.0
  client_steps: int | None = None
  max_rescaling_steps: int = 4
  fedgs_alpha: float = 1.0
  fedgs_solver: str = 'heuristic'
  fedgs_solver_time_limit: float = 1.0
  sketch_size: int = 1024
  public_inputs: Callable[[Task, int], np.ndarray] | None = None
  lefl_allocation: str = 'proportional'
  devices: settings.DeviceSpec = settings.DeviceSpec()
  rounds: int = 1

  def __post_init__(self):
    if not 0 < self.clients_per_round < self.training_cohort:
      raise ValueError(
        f'training_cohort={self.training_cohort} must exceed clients_per_round='
        f'{self.clients_per_round}: optimal uploads choose m of a larger trained cohort.'
      )

  def cohort(self, method: str) -> int:
    """How many clients the method's sampler chooses (before any upload sampling)."""
    return self.training_cohort if parse_method(method)[1] else self.clients_per_round

  def method_hparams(self, method: str) -> dict[str, Any]:
    """What a run records about its method besides its name."""
    sampler, optimal = parse_method(method)
    hparams: dict[str, Any] = dict(
      sampler=sampler, uploads='optimal' if optimal else 'all', cohort=self.cohort(method)
    )
    if sampler == 'power_of_choice':
      hparams['num_candidates'] = 2 * self.cohort(method)
    return hparams

  def sampler_factory(
    self, task: Task
  ) -> tuple[Callable[[str, int], samplers.Sampler], dict[tuple[str, int], Any]]:
    """``(method, seed) -> sampler``, and the pre-processing bits LEFL records by (method, seed)."""
    graphs: dict[int | None, np.ndarray] = {}
    costs: dict[tuple[str, int], communication.PreprocessingBits] = {}

    def make_sampler(method: str, seed: int) -> samplers.Sampler:
      sampler, _ = parse_method(method)
      count = task.num_clients if sampler == 'full' else self.cohort(method)
      if sampler in ('uniform', 'full'):
        return samplers.UniformSampler(count, seed=seed)
      if sampler == 'oort':
        return samplers.OortSampler(count, seed=seed)
      if sampler == 'tifl':
        system = self.devices.build(task, seed, self.client_steps)
        if system is None:
          raise ValueError('tifl tiers clients by their latency: give a system model (--devices).')
        latency = system.expected_seconds()
        return samplers.TiflSampler(count, latency, seed=seed, rounds=self.rounds)
      if sampler in ('md', 'clustered_size', 'clustered_similarity'):
        return clustered.ClusteredMethods(
          count, self.client_learning_rate, sketch_size=self.sketch_size
        ).make_sampler(task, sampler, seed)
      if sampler in ('power_of_choice', 'power_of_choice_all', 'fedgs'):
        return fedgs.FedGSMethods(
          count,
          self.client_learning_rate,
          alpha=self.fedgs_alpha,
          solver=self.fedgs_solver,
          solver_time_limit=self.fedgs_solver_time_limit,
        ).make_sampler(task, sampler, seed, graphs)
      if self.public_inputs is None:
        raise ValueError('lefl needs public inputs (BenchmarkMethods.public_inputs).')
      lefl_costs: dict[tuple[str, int], communication.PreprocessingBits] = {}
      made = lefl.LeflMethods(
        count,
        self.client_learning_rate,
        self.public_inputs,
        client_steps=self.client_steps,
        allocation=self.lefl_allocation,
      ).make_sampler(task, 'lefl', seed, lefl_costs)
      costs[method, seed] = lefl_costs['lefl', seed]
      return made

    return make_sampler, costs

  def process_factory(
    self, task: Task
  ) -> Callable[[str, int], tff.learning.templates.LearningProcess]:
    """``(method, seed) -> process``: FedAvg with the sampler's weights, built once per kind.

    Sketches only for clustered_similarity, the clients' losses only for oort and tifl;
    `OptimalSamplingFactory` as the model aggregator for ``+optimal`` (saying who uploaded
    when the devices time each upload).
    """
    timed = self.devices.profiles != 'none'
    processes: dict[tuple[bool, bool, bool], tff.learning.templates.LearningProcess] = {}

    def make_process(method: str, seed: int) -> tff.learning.templates.LearningProcess:
      del seed  # The same for every seed.
      sampler, optimal = parse_method(method)
      key = (sampler == 'clustered_similarity', optimal, sampler in ('oort', 'tifl'))
      if key not in processes:
        processes[key] = signals.build_fed_avg_with_signals(
          task.model_fn,
          client_learning_rate=self.client_learning_rate,
          server_learning_rate=self.server_learning_rate,
          sketch_size=self.sketch_size if key[0] else None,
          client_losses=key[2],
          update_fingerprints=optimal and timed,
          model_aggregator=(
            OptimalSamplingFactory(
              self.clients_per_round,
              max_rescaling_steps=self.max_rescaling_steps,
              report_uploaders=timed,
            )
            if optimal
            else None
          ),
        )
      return processes[key]

    return make_process
