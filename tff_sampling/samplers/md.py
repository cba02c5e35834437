"""MD sampling: ``m`` i.i.d. draws from Categorical(``p_i = n_i / M``).

The baseline of Fraboni, Vidal, Kameni, Lorenzi, "Clustered Sampling:
Low-Variance and Improved Representativity for Clients Selection in Federated
Learning", ICML 2021 (arXiv:2105.05883), §2 ("MD sampling", after Li et al.,
2020): the server draws ``m`` clients (``num_draws``) independently, client ``i``
with probability ``p_i = n_i / M`` where ``n_i`` is its number of examples and
``M = Σ_j n_j``, and aggregates ``θ ← (1/m) Σ_k θ_{l_k}``: every draw carries
the weight ``1/m`` and a client drawn twice counts twice. See
``docs/algorithms.md`` §2 for the contract.

**[choice] Availability.** Only available clients can be drawn: ``p`` is
renormalised over the available clients (``p_i ∝ n_i``), which is unbiased for
the available clients' objective only.

Draws are exact: the categorical is sampled by an integer drawn uniformly from
``[0, Σ_available n_i)`` located in the integer cumulative sizes, so no floating
point rounding can pick a client of probability zero.
"""

from __future__ import annotations

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base

# Stream id of the cohort draw inside a round's generator.
_COHORT_STREAM = 0


def validate_num_draws(num_draws: int) -> int:
  """Returns `num_draws` as an `int` after checking it is a positive integer.

  Raises:
    ValueError: If `num_draws` is not a positive integer.
  """
  return validation.positive_int('num_draws', num_draws)


def validate_client_sizes(client_sizes: np.ndarray, num_draws: int = 1) -> np.ndarray:
  """Returns the client sizes as ``int64[N]`` after checking them.

  Args:
    client_sizes: ``[N]`` numbers of examples ``n_i``; positive integers (an
      integral float array is accepted).
    num_draws: ``m``; the check also guarantees that ``m · Σ n_i`` fits in int64
      (the integer units of the clustered-sampling algorithms).

  Returns:
    ``int64[N]``.

  Raises:
    ValueError: If the array is not 1-D and non-empty, or holds a value that is
      not a finite positive integer, or the total is too large.
  """
  sizes = np.asarray(client_sizes)
  if sizes.ndim != 1 or sizes.shape[0] == 0:
    raise ValueError(f'client_sizes must be a non-empty 1-D array, got shape {sizes.shape}.')
  if not (np.issubdtype(sizes.dtype, np.integer) or np.issubdtype(sizes.dtype, np.floating)):
    raise ValueError(f'client_sizes must be numeric, got dtype {sizes.dtype}.')
  bad = ~np.isfinite(sizes) | (sizes <= 0) | (sizes != np.round(sizes))
  if np.any(bad):
    index = int(np.flatnonzero(bad)[0])
    raise ValueError(
      f'client_sizes must be positive integers (every client holds examples); '
      f'got {sizes[index]!r} at index {index}.'
    )
  # Checked in floating point first so that the int64 sum cannot overflow.
  if float(np.sum(sizes, dtype=np.float64)) * num_draws >= 2.0**62:
    raise ValueError(
      f'num_draws * sum(client_sizes) = {num_draws} * {np.sum(sizes, dtype=np.float64):.4g} '
      'is too large for int64 units.'
    )
  return sizes.astype(np.int64)


def validate_available(available: np.ndarray, num_clients: int, round_num: int) -> np.ndarray:
  """Returns the availability mask as ``bool[N]`` after checking it.

  Raises:
    ValueError: If the mask has the wrong shape or no client is available.
  """
  mask = np.asarray(available)
  if mask.shape != (num_clients,):
    raise ValueError(
      f'available must have shape ({num_clients},) (one flag per client), got {mask.shape}.'
    )
  mask = mask.astype(bool)
  if not np.any(mask):
    raise ValueError(f'No client is available in round {round_num}.')
  return mask


def draw_categorical(rng: np.random.Generator, units: np.ndarray) -> np.ndarray:
  """Draws one index from each row of a matrix of integer masses, exactly.

  Row ``k`` is the categorical distribution ``units[k] / Σ_i units[k, i]``. The
  draw is an integer uniform in ``[0, Σ_i units[k, i])`` located in the row's
  integer cumulative sums, so an index of mass zero is never drawn.

  Args:
    rng: The generator (one call to ``rng.integers`` consumes ``K`` values).
    units: ``int64[K, N]`` non-negative masses, every row with a positive sum.

  Returns:
    ``int64[K]`` drawn indices.
  """
  cumulative = np.cumsum(units, axis=1, dtype=np.int64)
  positions = rng.integers(0, cumulative[:, -1])
  return np.array(
    [np.searchsorted(row, position, side='right') for row, position in zip(cumulative, positions)],
    dtype=np.int64,
  )


class MDSampler(base.Sampler):
  """MD sampling: ``num_draws`` i.i.d. draws from Categorical(``n_i / M``).

  `select` returns ``num_draws`` slots (a client drawn twice appears twice),
  each with aggregation weight ``1 / num_draws``. Only available clients are
  drawn (the categorical is renormalised over them). The sampler keeps no state
  (``()``); the population is configuration, remembered by `initialize` (the
  program calls it before resuming a checkpoint too).
  """

  weighting = 'equal'

  def __init__(self, num_draws: int, *, seed: int):
    """Initializes the sampler.

    Args:
      num_draws: ``m``, the number of i.i.d. draws (cohort slots) per round.
      seed: Root of the sampler's randomness (with the round number).

    Raises:
      ValueError: If `num_draws` is not a positive integer.
    """
    self.num_draws = validate_num_draws(num_draws)
    self.seed = int(seed)
    self._num_examples: np.ndarray | None = None

  def initialize(self, population: base.Population) -> tuple[()]:
    """Remembers the client sizes and returns the (empty) state.

    Raises:
      ValueError: If a client size is not a positive integer.
    """
    self._num_examples = validate_client_sizes(population.num_examples, self.num_draws)
    return ()

  def select(
    self, state, round_num: int, available: np.ndarray, *, probe: contract.Probe | None = None
  ) -> base.Selection:
    """Draws round `round_num`'s ``num_draws`` clients among `available` ones.

    Raises:
      RuntimeError: If called before `initialize`.
      ValueError: If `available` has the wrong shape or is all False.
    """
    del state, probe  # Stateless; selects without a probe.
    if self._num_examples is None:
      raise RuntimeError('MDSampler.select called before initialize(population).')
    mask = validate_available(available, self._num_examples.shape[0], round_num)
    units = np.where(mask, self._num_examples, 0)
    rng = base.round_rng(self.seed, round_num, _COHORT_STREAM)
    clients = draw_categorical(rng, np.broadcast_to(units, (self.num_draws, units.shape[0])))
    return base.Selection(
      clients=clients, weights=np.full(self.num_draws, 1.0 / self.num_draws, np.float32)
    )
