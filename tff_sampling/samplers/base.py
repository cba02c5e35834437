"""The server-side sampler interface.

A sampler chooses the clients of each round on the server. It is a plain Python
object whose state is an explicit value (a tuple/NamedTuple of NumPy arrays, empty
for stateless samplers) returned and consumed by its methods, so that the program
loop can checkpoint it with the TFF process state. A sampler's choices depend only
on (its configuration, its state, the seed, the round number, the availability
mask): restarted from a checkpoint at round r, it makes the same choices for rounds
r+1, ….
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling import randomness


class Population(NamedTuple):
  """What the server knows about the clients.

  Attributes:
    num_examples: ``int64[N]`` examples per client (their FedAvg weights).
  """

  num_examples: np.ndarray

  @property
  def size(self) -> int:
    return int(self.num_examples.shape[0])


class Missed(NamedTuple):
  """The selected clients that did not reach the server (a system model's round).

  Attributes:
    clients: ``int64[M]`` client indices, in cohort-slot order (a client drawn twice, by
      a sampler that draws with replacement, may be both kept and missed).
    seconds: ``float64[M]`` when each would have had its update to the server, in
      seconds after the round started: later than the deadline or than the clients kept
      (stragglers), or ``inf`` for a client that dropped out. With optimal uploads (two
      phases) that is when it would have finished training, as for a kept client that
      does not upload; otherwise when it would have finished uploading.
  """

  clients: np.ndarray
  seconds: np.ndarray


class Selection(NamedTuple):
  """The clients of one round.

  Attributes:
    clients: ``int64[K]`` client indices, in cohort-slot order (a client drawn
      twice appears twice).
    weights: ``float32[K]`` aggregation weight of each slot, or ``None`` when the
      process weights clients itself (e.g. FedAvg's example weighting). Set
      weights must reach the aggregation: a process built on
      `tff_sampling.learning.signals` receives them; a plain TFF FedAvg
      process applies them only with the matching ``client_weighting``
      (`tff_sampling.samplers.weighting`).
    diagnostics: Scalars about how the selection was made (e.g. FedGS's
      solver status), released by the program loop under ``selection/``; the
      same keys every round.
    missed: Set by the round loop under a system model, on the selection it hands to
      `Sampler.observe`: ``clients`` and ``weights`` are then the clients that reached
      the server, and ``missed`` those selected that did not (`Missed`). ``None``
      otherwise.
  """

  clients: np.ndarray
  weights: np.ndarray | None = None
  diagnostics: Mapping[str, float] | None = None
  missed: Missed | None = None


class Sampler(abc.ABC):
  """Chooses each round's clients; see the module docstring.

  What a sampler needs from the learning process is declared, and the program
  loop checks it once before a run (`tff_sampling.contract`):
  ``needs_signals`` names the per-client signals `observe` reads (e.g.
  ``{'update_sketch'}``), and ``probe_signal`` a measurement taken before
  selection (e.g. ``'loss'`` for power of choice), which the loop then passes
  to `select` as ``probe`` (client indices → one value per client).

  ``weighting`` declares the `Selection.weights` the sampler returns (see
  `tff_sampling.samplers.weighting`): ``'process'`` (``None``: the process
  weighs clients itself; the default), ``'equal'`` (every slot the same, e.g.
  ``1/m`` per draw), ``'num_examples'`` (``n_k / Σ_{j∈S} n_j``, each client
  once) or ``'custom'`` (anything else). A sampler that returns weights must
  declare one of the last three, so that a process which would drop its
  weights can be refused before the run.
  """

  needs_signals: frozenset[str] = frozenset()
  probe_signal: str | None = None
  weighting: str = 'process'

  @abc.abstractmethod
  def initialize(self, population: Population) -> Any:
    """Returns the initial state (a nest of NumPy arrays; ``()`` if none)."""

  @abc.abstractmethod
  def select(
    self, state: Any, round_num: int, available: np.ndarray, *, probe: contract.Probe | None = None
  ) -> Selection:
    """Returns round `round_num`'s selection among clients with `available` True.

    ``probe`` is given exactly when the sampler declares a ``probe_signal``.
    """

  def observe(self, state: Any, selection: Selection, signals: Mapping[str, np.ndarray]) -> Any:
    """Returns the state after the round (default: unchanged).

    `selection` holds the clients that reached the server, in the order of `signals`'
    rows; under a system model, ``selection.missed`` names the selected clients that did
    not. A sampler states what it does with those (e.g. FedGS counts them as sampled).
    """
    del selection, signals
    return state


# The generator for (seed, round[, stream…]): `tff_sampling.randomness`.
round_rng = randomness.round_rng
