"""Oort (Lai et al., OSDI 2021): guided participant selection by statistical and system utility.

Each explored client scores its last statistical utility (examples × training loss), min-max
normalised after clipping, plus a bonus for the rounds since it was last seen; a client slower
than the preferred round length ``T`` is penalised by ``(T / t_i)^α``. A share ``ε`` of each
cohort (decaying each round) explores clients never seen, the largest first; the rest is drawn,
in proportion to the scores, from the best-scoring explored clients. The pacer lengthens ``T``
when the exploited utility stops growing. ``docs/algorithms.md`` §6 has the formulas and every
choice made here.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import math
from typing import NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

# `base.round_rng(seed, round, stream)`: the exploitation and exploration draws.
_EXPLOIT_STREAM, _EXPLORE_STREAM = 3001, 3002
SECONDS = contract.SECONDS  # Under a system model, the round loop's: each kept client's seconds.


@dataclasses.dataclass(frozen=True)
class OortConfig:
  """Oort's settings (defaults: the paper's and its public implementation's).

  Attributes:
    exploration: ``ε`` before round 1; each round multiplies it by `decay`, down to
      `exploration_min`.
    decay, exploration_min: See `exploration`.
    penalty: ``α`` of the system penalty ``(T / t_i)^α``.
    threshold: The preferred round length ``T`` as a percentile of the clients' known
      durations (100 or more: no penalty).
    pacer_window: ``W``: every ``W`` rounds the pacer compares the exploited utility of the
      last ``W`` rounds with the ``W`` before.
    pacer_step: How far the pacer moves `threshold` (percentile points).
    cut_off: Exploitation draws from the clients scoring at least ``cut_off`` × the score
      ranked just past the exploited count (and at least 10 × that count of clients).
    clip: Statistical utilities are clipped at this quantile before normalising.
    sample_window: Exploration draws from the `sample_window` × its count largest
      unexplored clients.
    max_selections: A client selected more than this many times is left out (the cap on
      how often one client is picked; ``None``: no cap), at most ``max_left_out`` of the
      clients at once.
    max_left_out: See `max_selections`.
  """

  exploration: float = 0.9
  decay: float = 0.98
  exploration_min: float = 0.3
  penalty: float = 2.0
  threshold: float = 30.0
  pacer_window: int = 20
  pacer_step: float = 5.0
  cut_off: float = 0.95
  clip: float = 0.95
  sample_window: float = 5.0
  max_selections: int | None = None
  max_left_out: float = 0.3


class OortState(NamedTuple):
  """Oort's state; arrays over the ``N`` clients unless said.

  Attributes:
    utility: ``float64[N]``: the last statistical utility observed (the client's
      examples before it is explored; for a straggler, the kept clients' mean that round).
    seconds: ``float64[N]``: the last round duration observed (0: unknown).
    last_round: ``int64[N]``: the round it was last observed in (0: never).
    selections: ``int64[N]``: rounds it was kept in or a straggler in.
    exploration: ``float64[]``: ``ε`` after the last round.
    threshold: ``float64[]``: the pacer's percentile after the last round.
    exploited_utility: ``float64[2W]``: the mean utility of the last ``2W`` rounds'
      exploited clients, oldest first (the pacer's history; NaN before round 1). Fixed
      in size, as a checkpoint needs.
    rounds: ``int64[]``: rounds observed so far.
    num_examples: ``int64[N]``: the clients' examples (``|B_i|`` of the utility).
  """

  utility: np.ndarray
  seconds: np.ndarray
  last_round: np.ndarray
  selections: np.ndarray
  exploration: np.ndarray
  threshold: np.ndarray
  exploited_utility: np.ndarray
  rounds: np.ndarray
  num_examples: np.ndarray


class OortSampler(base.Sampler):
  """Oort's training selector; see the module docstring.

  Reads the clients' loss before training (signal ``'loss'``: a process built with
  ``client_losses=True``) and, under a system model, the round loop's ``'seconds'``; without
  one, every client is equally fast and the system penalty never applies.
  """

  needs_signals = frozenset({contract.LOSS})

  def __init__(self, clients_per_round: int, *, seed: int, config: OortConfig = OortConfig()):
    self.clients_per_round = validation.positive_int('clients_per_round', clients_per_round)
    self._seed = int(seed)
    self.config = config
    if not 0 <= config.exploration_min <= 1 or not 0 <= config.exploration <= 1:
      raise ValueError('exploration and exploration_min must be in [0, 1].')

  def initialize(self, population: base.Population) -> OortState:
    n = population.size
    return OortState(
      utility=np.asarray(population.num_examples, np.float64).copy(),
      seconds=np.zeros(n),
      last_round=np.zeros(n, np.int64),
      selections=np.zeros(n, np.int64),
      exploration=np.array(float(self.config.exploration)),
      threshold=np.array(float(self.config.threshold)),
      exploited_utility=np.full(2 * self.config.pacer_window, np.nan),
      rounds=np.array(0, np.int64),
      num_examples=np.asarray(population.num_examples, np.int64).copy(),
    )

  def preferred_seconds(self, state: OortState) -> float:
    """``T``: the `threshold` percentile of the known durations (inf without them)."""
    known = np.sort(state.seconds[state.seconds > 0])
    if float(state.threshold) >= 100 or not known.size:
      return math.inf
    return float(known[min(int(known.size * float(state.threshold) / 100), known.size - 1)])

  def _penalised(self, values: np.ndarray, seconds: np.ndarray, preferred: float) -> np.ndarray:
    slow = seconds > preferred
    factor = np.ones_like(values)
    factor[slow] = (preferred / np.maximum(seconds[slow], 1e-4)) ** self.config.penalty
    return values * factor

  def scores(self, state: OortState, round_num: int, clients: np.ndarray) -> np.ndarray:
    """The exploitation scores of explored `clients` in round `round_num`."""
    utility = state.utility[clients]
    if not clients.size:
      return utility
    ordered = np.sort(utility[utility > 0]) if np.any(utility > 0) else np.sort(utility)
    clip = ordered[min(int(ordered.size * self.config.clip), ordered.size - 1)]
    low = ordered[0] * 0.999
    spread = max(ordered[-1] - low, 1e-4)
    bonus = np.sqrt(0.1 * math.log(round_num) / state.last_round[clients])
    score = (np.minimum(utility, clip) - low) / spread + bonus
    preferred = self.preferred_seconds(state)
    return np.abs(self._penalised(score, state.seconds[clients], preferred))

  def select(
    self,
    state: OortState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    del probe  # Selects without one.
    k, config = self.clients_per_round, self.config
    feasible = np.asarray(available, bool) & ~self._left_out(state)
    explored = np.flatnonzero(feasible & (state.last_round > 0))
    unexplored = np.flatnonzero(feasible & (state.last_round == 0))
    exploration = max(float(state.exploration) * config.decay, config.exploration_min)
    # Exploration's share, at most the unexplored clients there are: exploitation takes the
    # rest, so the cohort is k whenever k clients are feasible.
    exploit_count = min(k - min(int(k * exploration), unexplored.size), explored.size)
    exploited = self._exploit(state, round_num, explored, exploit_count)
    explore_count = min(unexplored.size, k - exploited.size)
    explored_now = self._explore(state, round_num, unexplored, explore_count)
    clients = np.concatenate([explored_now, exploited]).astype(np.int64)
    return base.Selection(
      clients=clients,
      diagnostics={
        'oort_exploration': exploration,
        'oort_exploited': float(exploited.size),
        'oort_preferred_seconds': min(self.preferred_seconds(state), 1e30),
      },
    )

  def _left_out(self, state: OortState) -> np.ndarray:
    """The clients over the selection cap (the most selected, at most `max_left_out`)."""
    cap, n = self.config.max_selections, state.selections.size
    out = np.zeros(n, bool)
    if cap is None:
      return out
    over = np.flatnonzero(state.selections > cap)
    over = over[np.argsort(-state.selections[over], kind='stable')]
    out[over[: int(self.config.max_left_out * n)]] = True
    return out

  def _exploit(self, state, round_num, explored, count) -> np.ndarray:
    if count <= 0:
      return np.zeros(0, np.int64)
    score = self.scores(state, round_num, explored)
    order = np.argsort(-score, kind='stable')
    cut = score[order[min(count, order.size - 1)]] * self.config.cut_off
    # The clients above the cut-off, and at least 10 × count of them (as many as there are).
    pool = order[(score[order] >= cut) | (np.arange(order.size) <= 10 * count)]
    weights = np.maximum(score[pool], 1e-12)
    rng = base.round_rng(self._seed, round_num, _EXPLOIT_STREAM)
    picked = rng.choice(pool.size, size=count, replace=False, p=weights / weights.sum())
    return explored[pool[picked]]

  def _explore(self, state, round_num, unexplored, count) -> np.ndarray:
    if count <= 0:
      return np.zeros(0, np.int64)
    preferred = self.preferred_seconds(state)
    reward = self._penalised(state.utility[unexplored], state.seconds[unexplored], preferred)
    order = np.argsort(-reward, kind='stable')
    window = order[: min(int(self.config.sample_window * count), order.size)]
    weights = np.maximum(reward[window], 1e-12)
    rng = base.round_rng(self._seed, round_num, _EXPLORE_STREAM)
    picked = rng.choice(window.size, size=count, replace=False, p=weights / weights.sum())
    return unexplored[window[picked]]

  def observe(
    self, state: OortState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> OortState:
    """Records each kept client's utility (examples × its loss), duration and round, and
    each straggler's (a missed client that did not drop out) with the kept clients' mean
    utility; moves ``ε`` and the pacer."""
    clients = np.asarray(selection.clients, np.int64)
    round_num = int(state.rounds) + 1  # Every round is observed, in order.
    loss = np.asarray(signals.get(contract.LOSS, np.zeros(clients.size)), np.float64)
    utility, seconds = state.utility.copy(), state.seconds.copy()
    last_round, selections = state.last_round.copy(), state.selections.copy()
    exploited = clients[state.last_round[clients] > 0]
    utility[clients] = state.num_examples[clients] * loss
    if SECONDS in signals:
      seconds[clients] = np.asarray(signals[SECONDS], np.float64)
    last_round[clients] = round_num
    np.add.at(selections, clients, 1)
    if selection.missed is not None:
      finished = np.isfinite(selection.missed.seconds)
      stragglers = np.asarray(selection.missed.clients, np.int64)[finished]
      utility[stragglers] = float(utility[clients].mean()) if clients.size else 0.0
      seconds[stragglers] = np.asarray(selection.missed.seconds, np.float64)[finished]
      last_round[stragglers] = round_num
      np.add.at(selections, stragglers, 1)
    mean_exploited = float(utility[exploited].sum() / (exploited.size + 1e-4))
    history = np.append(state.exploited_utility[1:], mean_exploited)
    exploration = max(float(state.exploration) * self.config.decay, self.config.exploration_min)
    return OortState(
      utility,
      seconds,
      last_round,
      selections,
      np.array(exploration),
      np.array(self._paced(float(state.threshold), history, round_num + 1)),
      history,
      np.array(round_num, np.int64),
      state.num_examples,
    )

  def _paced(self, threshold: float, history: np.ndarray, next_round: int) -> float:
    """The pacer at the start of `next_round`: every ``W`` rounds, a flat exploited utility
    (within 10% of the ``W`` rounds before) relaxes ``T``; a jump (5 × or more) tightens it."""
    w, step = self.config.pacer_window, self.config.pacer_step
    if next_round < 2 * w or next_round % w or np.isnan(history[-2 * w :]).any():
      return threshold
    before, now = history[-2 * w : -w].sum(), history[-w:].sum()
    if abs(now - before) <= 0.1 * before:
      return min(100.0, threshold + step)
    if abs(now - before) >= 5 * before:
      return max(step, threshold - step)
    return threshold
