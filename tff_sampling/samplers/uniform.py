"""Uniform sampling without replacement: the FedAvg baseline cohort."""

from __future__ import annotations

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

# Stream id of the cohort draw inside a round's generator.
_COHORT_STREAM = 0


class UniformSampler(base.Sampler):
  """Draws ``min(clients_per_round, #available)`` distinct available clients.

  Every available client is equally likely; the process applies its own
  aggregation weights (``Selection.weights`` is ``None``).
  """

  def __init__(self, clients_per_round: int, *, seed: int):
    self.clients_per_round = validation.positive_int('clients_per_round', clients_per_round)
    self.seed = int(seed)

  def initialize(self, population: base.Population) -> tuple[()]:
    if self.clients_per_round > population.size:
      raise ValueError(
        f'clients_per_round={self.clients_per_round} exceeds the population of '
        f'{population.size} clients; choose clients_per_round <= {population.size}.'
      )
    return ()

  def select(
    self, state, round_num: int, available: np.ndarray, *, probe: contract.Probe | None = None
  ) -> base.Selection:
    del state, probe  # Stateless; selects without a probe.
    candidates = np.flatnonzero(np.asarray(available, dtype=bool))
    if candidates.size == 0:
      raise ValueError(f'No client is available in round {round_num}.')
    size = min(self.clients_per_round, candidates.size)
    rng = base.round_rng(self.seed, round_num, _COHORT_STREAM)
    return base.Selection(clients=np.sort(rng.choice(candidates, size=size, replace=False)))
