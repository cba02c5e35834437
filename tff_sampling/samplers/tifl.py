"""TiFL (Chai et al., HPDC 2020): tier-based selection by measured latency.

The clients are sorted by their profiled round latency and cut into ``T`` tiers of (almost)
equal size. Each round one tier is drawn, among the tiers with credits left, by the tier
probabilities; its credits fall by one, and the cohort is drawn uniformly from its available
clients. Every ``I`` rounds the probabilities move to the tiers that do worst: ranked by their
mean loss, the worst of ``n`` tiers with credits gets ``n / D``, the next ``(n − 1) / D``, …,
``D = n (n + 1) / 2``. ``docs/algorithms.md`` §6b has the choices made here.
"""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

_TIER_STREAM, _CLIENT_STREAM = 3101, 3102


class TiflState(NamedTuple):
  """TiFL's state, over the ``T`` tiers.

  Attributes:
    probability: ``float64[T]``: each tier's selection probability.
    credits: ``int64[T]``: rounds each tier may still be selected in.
    loss: ``float64[T]``: the mean loss of the tier's clients when it was last selected
      (NaN: never).
    rounds: ``int64[]``: rounds observed so far.
  """

  probability: np.ndarray
  credits: np.ndarray
  loss: np.ndarray
  rounds: np.ndarray


def tiers_by_latency(latency: np.ndarray, num_tiers: int) -> np.ndarray:
  """``int64[N]``: each client's tier, 0 the fastest: the clients sorted by `latency` (ties by
  index) and cut into chunks of ``⌈N / T⌉``."""
  latency = np.asarray(latency, np.float64)
  size = math.ceil(latency.size / num_tiers)
  tier = np.empty(latency.size, np.int64)
  tier[np.argsort(latency, kind='stable')] = np.arange(latency.size) // size
  return tier


def reranked(loss: np.ndarray, credits: np.ndarray) -> np.ndarray:
  """The tier probabilities after an update: the ``n`` tiers with credits ranked by loss, the
  highest first (a tier never seen counts as the worst), get ``n / D, (n − 1) / D, …``; the
  others 0."""
  active = np.flatnonzero(credits > 0)
  n = active.size
  probability = np.zeros(loss.size)
  if not n:
    return probability
  worst_first = active[np.argsort(-np.nan_to_num(loss[active], nan=np.inf), kind='stable')]
  probability[worst_first] = (n - np.arange(n)) / (n * (n + 1) / 2)
  return probability


class TiflSampler(base.Sampler):
  """TiFL's adaptive tier selection; see the module docstring.

  Reads the clients' loss before training (signal ``'loss'``) to rank the tiers.
  """

  needs_signals = frozenset({contract.LOSS})

  def __init__(
    self,
    clients_per_round: int,
    latency: np.ndarray,
    *,
    seed: int,
    rounds: int,
    num_tiers: int = 5,
    interval: int = 10,
  ):
    """Initialises the sampler.

    Args:
      clients_per_round: The cohort, drawn from one tier.
      latency: ``float[N]``: each client's profiled round seconds.
      seed: Seed of the draws, combined with the round number.
      rounds: The run's rounds: each tier has ``⌈rounds / T⌉`` credits.
      num_tiers: ``T``.
      interval: ``I``: the probabilities are updated every this many rounds.
    """
    self.clients_per_round = validation.positive_int('clients_per_round', clients_per_round)
    self.num_tiers = validation.positive_int('num_tiers', num_tiers)
    self.interval = validation.positive_int('interval', interval)
    self.rounds = validation.positive_int('rounds', rounds)
    latency = np.asarray(latency, np.float64)
    if latency.ndim != 1 or not np.all(np.isfinite(latency)) or latency.size < self.num_tiers:
      raise ValueError(
        f'latency must hold a finite value for each of at least num_tiers={num_tiers} clients.'
      )
    self.tier = tiers_by_latency(latency, self.num_tiers)
    self._seed = int(seed)

  def initialize(self, population: base.Population) -> TiflState:
    if population.size != self.tier.size:
      raise ValueError(f'{self.tier.size} latencies for a population of {population.size}.')
    t = self.num_tiers
    return TiflState(
      probability=np.full(t, 1.0 / t),
      credits=np.full(t, math.ceil(self.rounds / t), np.int64),
      loss=np.full(t, np.nan),
      rounds=np.array(0, np.int64),
    )

  def select(
    self,
    state: TiflState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    del probe
    available = np.asarray(available, bool)
    candidates = (state.credits > 0) & (state.probability > 0)
    candidates &= np.bincount(self.tier[available], minlength=self.num_tiers) > 0
    if not candidates.any():  # No credits left where anyone is available: every tier may go.
      candidates = np.bincount(self.tier[available], minlength=self.num_tiers) > 0
      weights = candidates.astype(np.float64)
    else:
      weights = np.where(candidates, np.maximum(state.probability, 1e-12), 0.0)
    rng = base.round_rng(self._seed, round_num, _TIER_STREAM)
    tier = int(rng.choice(self.num_tiers, p=weights / weights.sum()))
    members = np.flatnonzero(available & (self.tier == tier))
    size = min(self.clients_per_round, members.size)
    clients = base.round_rng(self._seed, round_num, _CLIENT_STREAM).choice(
      members, size=size, replace=False
    )
    return base.Selection(clients=np.sort(clients), diagnostics={'tifl_tier': float(tier)})

  def observe(
    self, state: TiflState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> TiflState:
    """Spends the selected tier's credit, records its clients' mean loss, and every ``I``
    rounds re-ranks the tiers."""
    round_num = int(state.rounds) + 1
    credits, loss = state.credits.copy(), state.loss.copy()
    tier = int(selection.diagnostics['tifl_tier']) if selection.diagnostics else None
    if tier is not None:
      credits[tier] = max(credits[tier] - 1, 0)
      values = np.asarray(signals.get(contract.LOSS, ()), np.float64)
      if values.size:
        loss[tier] = float(values.mean())
    probability = state.probability
    if round_num % self.interval == 0:
      probability = reranked(loss, credits)
    return TiflState(probability, credits, loss, np.array(round_num, np.int64))
