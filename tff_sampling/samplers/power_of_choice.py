"""Power-of-choice client selection (Cho, Wang, Joshi, 2020), a baseline of FedGS.

Each round: draw ``d = num_candidates`` distinct available clients with
probability ∝ ``n_k`` (successively, without replacement), evaluate the current
global model's loss on each candidate's local data, and keep the
``clients_per_round`` candidates with the highest loss (ties: the earlier
draw). The losses come from the program loop's *loss probe*, a federated
computation (`tff_sampling.learning.signals.build_loss_probe`) that reveals
each candidate's loss to the server. The program loop evaluates it on the
batches the candidate would train on this round: its whole data for epoch
training (the paper's pow-d), a mini-batch estimate when the local steps are
fixed (like the paper's cpow-d). Aggregation weights are left to the process
(``Selection.weights is None``: FedAvg's example weighting).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

_CANDIDATE_STREAM = 0


class PowerOfChoiceState(NamedTuple):
  """The example counts that set the candidate probabilities."""

  num_examples: np.ndarray


class PowerOfChoiceSampler(base.Sampler):
  """Keeps the highest-loss clients among ``num_candidates`` drawn ∝ ``n_k``."""

  probe_signal = contract.LOSS

  def __init__(self, clients_per_round: int, *, num_candidates: int, seed: int):
    validation.positive_int('clients_per_round', clients_per_round)
    validation.positive_int('num_candidates', num_candidates)
    if num_candidates < clients_per_round:
      raise ValueError(
        f'num_candidates={num_candidates} must be at least clients_per_round='
        f'{clients_per_round} (power of choice keeps the best of the candidates).'
      )
    self.clients_per_round = int(clients_per_round)
    self.num_candidates = int(num_candidates)
    self.seed = int(seed)

  def initialize(self, population: base.Population) -> PowerOfChoiceState:
    sizes = np.asarray(population.num_examples, dtype=np.int64)
    if np.any(sizes <= 0):
      raise ValueError(f'Every client needs examples; sizes {sizes[sizes <= 0][:5]} found.')
    if self.clients_per_round > population.size:
      raise ValueError(
        f'clients_per_round={self.clients_per_round} exceeds the population of '
        f'{population.size} clients.'
      )
    return PowerOfChoiceState(num_examples=sizes)

  def candidates(
    self, state: PowerOfChoiceState, round_num: int, available: np.ndarray
  ) -> np.ndarray:
    """The round's candidates, in draw order."""
    pool = np.flatnonzero(np.asarray(available, dtype=bool))
    if pool.size == 0:
      raise ValueError(f'No client is available in round {round_num}.')
    weights = state.num_examples[pool].astype(np.float64)
    rng = base.round_rng(self.seed, round_num, _CANDIDATE_STREAM)
    return rng.choice(
      pool, size=min(self.num_candidates, pool.size), replace=False, p=weights / weights.sum()
    )

  def select(
    self,
    state: PowerOfChoiceState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    """Keeps the ``clients_per_round`` candidates with the highest `probe` losses."""
    if probe is None:
      raise ValueError(
        'PowerOfChoiceSampler needs the loss probe of the program loop '
        '(select(..., probe=client indices -> losses)).'
      )
    candidates = self.candidates(state, round_num, available)
    losses = np.asarray(probe(candidates), dtype=np.float64)
    if losses.shape != candidates.shape:
      raise ValueError(
        f'The loss probe returned shape {losses.shape} for {candidates.shape[0]} candidates.'
      )
    # Non-finite losses rank last: a diverged client should not be preferred.
    losses = np.where(np.isfinite(losses), losses, -np.inf)
    keep = np.argsort(-losses, kind='stable')[: min(self.clients_per_round, candidates.size)]
    return base.Selection(clients=candidates[np.sort(keep)])
