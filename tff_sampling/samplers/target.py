"""The "target" reference sampler: one client of each group per round.

The ideal of clustered sampling's shard experiment (Fraboni et al., ICML 2021):
with clients that each hold one digit, a round that takes one client per digit
represents every label. It reads an oracle grouping (e.g. each client's single
label, `tasks.digits.shard_labels`), which real servers do not have: it is a
reference for analysis, not a deployable sampler. Weights are ``1/K`` per slot.
"""

from __future__ import annotations

import numpy as np

from tff_sampling import contract
from tff_sampling.samplers import base

_STREAM = 0


class TargetSampler(base.Sampler):
  """Draws one available client uniformly from each group, every round."""

  weighting = 'equal'

  def __init__(self, groups: np.ndarray, *, seed: int):
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.size == 0:
      raise ValueError(f'groups must be a non-empty 1-D array, got shape {groups.shape}.')
    self.groups = groups
    self.seed = int(seed)

  def initialize(self, population: base.Population) -> tuple[()]:
    if population.size != self.groups.size:
      raise ValueError(f'{self.groups.size} group labels for {population.size} clients.')
    return ()

  def select(
    self, state, round_num: int, available: np.ndarray, *, probe: contract.Probe | None = None
  ) -> base.Selection:
    del state, probe  # Stateless; selects without a probe.
    available = np.asarray(available, dtype=bool)
    rng = base.round_rng(self.seed, round_num, _STREAM)
    chosen = []
    for group in np.unique(self.groups):
      members = np.flatnonzero((self.groups == group) & available)
      if members.size:  # A group with nobody available is skipped this round.
        chosen.append(rng.choice(members))
    if not chosen:
      raise ValueError(f'No client is available in round {round_num}.')
    return base.Selection(
      clients=np.array(chosen, np.int64), weights=np.full(len(chosen), 1.0 / len(chosen))
    )
