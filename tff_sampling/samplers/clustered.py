r"""Clustered sampling (Fraboni et al., ICML 2021): ``m`` distributions, one client drawn
from each, unbiased with a smaller aggregation-weight variance than MD sampling.
`ClusteredSampler` builds the distributions by client size (`clustered_size`, once) or by
the similarity of the clients' latest updates (`clustered_similarity`, from count sketches
the sampler observes). The formulas and every choice made here are ``docs/algorithms.md``
§2; the closed-form statistics against MD are `clustered_variance`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from tff_sampling import contract
from tff_sampling.samplers import base
from tff_sampling.samplers import clustered_similarity
from tff_sampling.samplers import clustered_size
from tff_sampling.samplers import md

METHODS = ('size', 'similarity')

# Stream ids of the round generator; the count-sketch hashes use their own
# generator seeded by (seed, _SKETCH_STREAM).
_COHORT_STREAM = 0


# ------------------------------------------------------------------------------
# Algorithm 1: by sample size.


# ------------------------------------------------------------------------------
# Algorithm 2: by model similarity.


# ------------------------------------------------------------------------------
# Exact per-client statistics (§2 of the paper, Section 3.2).


# ------------------------------------------------------------------------------
# Count sketch of client updates.


# ------------------------------------------------------------------------------
# The sampler.


class ClusteredSamplerState(NamedTuple):
  """The state of a `ClusteredSampler` (a nest of arrays, checkpointable).

  Attributes:
    num_examples: ``int64[N]`` client sizes ``n_i``.
    distribution_units: ``int64[m, N]`` Algorithm 1's distributions in integer
      units (``r = units / M``) for ``method='size'``; ``int64[0, N]`` for
      ``method='similarity'``, whose distributions are recomputed every round
      from the representative updates.
    representative_updates: ``float32[N, d]`` each client's last reported
      update sketch (zeros until it is first observed) for
      ``method='similarity'``; ``float32[N, 0]`` for ``method='size'``.
  """

  num_examples: np.ndarray
  distribution_units: np.ndarray
  representative_updates: np.ndarray


class ClusteredSampler(base.Sampler):
  """Clustered sampling (Fraboni et al., ICML 2021): one client per distribution.

  Each round draws client ``l_k`` from distribution ``W_k`` for each of the
  ``num_draws`` distributions (slot ``k`` of the selection), each slot with
  aggregation weight ``1 / num_draws`` (a client drawn from two distributions
  appears twice). ``method='size'`` uses Algorithm 1, computed once by
  `initialize`; ``method='similarity'`` uses Algorithm 2 on the representative
  updates held in the state, recomputed by every `select`; `observe` stores the
  sketches that the round's clients report under ``signals['update_sketch']``.
  Unavailable clients are handled as the module docstring says
  (renormalisation, MD fallback for a distribution with no available client).
  """

  weighting = 'equal'

  def __init__(
    self,
    num_draws: int,
    *,
    seed: int,
    method: str = 'size',
    similarity: str = 'arccos',
    sketch_size: int | None = None,
  ):
    """Initializes the sampler.

    Args:
      num_draws: ``m``, the number of distributions, i.e. of cohort slots.
      seed: Root of the sampler's randomness (with the round number).
      method: ``'size'`` (Algorithm 1) or ``'similarity'`` (Algorithm 2).
      similarity: For ``'similarity'``: ``'arccos'``, ``'L2'`` or ``'L1'``.
      sketch_size: For ``'similarity'`` (required): ``d``, the length of the
        representative update rows that clients report (a count sketch of
        their model delta, or the flattened delta itself).

    Raises:
      ValueError: If an argument is invalid or does not apply to `method`.
    """
    self.num_draws = md.validate_num_draws(num_draws)
    self.seed = int(seed)
    if method not in METHODS:
      raise ValueError(f'Unknown method {method!r}; expected one of {METHODS}.')
    self.method = method
    self.similarity = clustered_similarity.validate_similarity(similarity)
    if method == 'similarity':
      if (
        sketch_size is None
        or isinstance(sketch_size, bool)
        or not isinstance(sketch_size, (int, np.integer))
        or sketch_size <= 0
      ):
        raise ValueError(
          "method='similarity' needs sketch_size, the positive length of the "
          f'representative update rows; got {sketch_size!r}.'
        )
      self.sketch_size = int(sketch_size)
      self.needs_signals = frozenset({contract.UPDATE_SKETCH})
    else:
      if sketch_size is not None:
        raise ValueError(f"sketch_size={sketch_size!r} applies to method='similarity' only.")
      if similarity != 'arccos':
        raise ValueError(f"similarity={similarity!r} applies to method='similarity' only.")
      self.sketch_size = 0

  def initialize(self, population: base.Population) -> ClusteredSamplerState:
    """Returns the initial state (Algorithm 1 for ``'size'``, zero updates otherwise).

    Raises:
      ValueError: If a client size is not a positive integer.
    """
    sizes = md.validate_client_sizes(population.num_examples, self.num_draws)
    num_clients = sizes.shape[0]
    if self.method == 'size':
      units = clustered_size.size_based_units(sizes, self.num_draws)
    else:
      units = np.zeros((0, num_clients), np.int64)
    return ClusteredSamplerState(
      num_examples=sizes,
      distribution_units=units,
      representative_updates=np.zeros((num_clients, self.sketch_size), np.float32),
    )

  def _check_state(self, state: ClusteredSamplerState) -> ClusteredSamplerState:
    sizes = md.validate_client_sizes(state.num_examples, self.num_draws)
    num_clients = sizes.shape[0]
    rows = self.num_draws if self.method == 'size' else 0
    units = np.asarray(state.distribution_units)
    updates = np.asarray(state.representative_updates)
    if units.shape != (rows, num_clients):
      raise ValueError(
        f'state.distribution_units has shape {units.shape}, expected '
        f'{(rows, num_clients)} for method={self.method!r}.'
      )
    if updates.shape != (num_clients, self.sketch_size):
      raise ValueError(
        f'state.representative_updates has shape {updates.shape}, expected '
        f'{(num_clients, self.sketch_size)}.'
      )
    return ClusteredSamplerState(sizes, units.astype(np.int64), updates)

  def distribution_units(self, state: ClusteredSamplerState) -> np.ndarray:
    """The round's distributions in integer units, ``int64[m, N]`` (``r = units / M``)."""
    state = self._check_state(state)
    if self.method == 'size':
      return state.distribution_units
    return clustered_similarity.similarity_based_units(
      state.num_examples, state.representative_updates, self.num_draws, similarity=self.similarity
    )

  def distributions(self, state: ClusteredSamplerState) -> np.ndarray:
    """The round's distributions ``r``, ``float64[m, N]``."""
    units = self.distribution_units(state)
    return units / units[0].sum()

  def select(
    self,
    state: ClusteredSamplerState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    """Draws one client from each distribution among the available clients.

    Raises:
      ValueError: If `available` has the wrong shape or is all False, or the
        state does not match the sampler.
    """
    del probe  # Selects without one.
    units = self.distribution_units(state)
    sizes = np.asarray(state.num_examples, np.int64)
    mask = md.validate_available(available, sizes.shape[0], round_num)
    units = np.where(mask[None, :], units, 0)
    # A distribution with no available client falls back to MD sampling over
    # the available clients.
    empty = units.sum(axis=1) == 0
    units[empty] = np.where(mask, sizes, 0)
    rng = base.round_rng(self.seed, round_num, _COHORT_STREAM)
    return base.Selection(
      clients=md.draw_categorical(rng, units),
      weights=np.full(self.num_draws, 1.0 / self.num_draws, np.float32),
    )

  def observe(
    self, state: ClusteredSamplerState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> ClusteredSamplerState:
    """Stores the selected clients' reported update sketches (``'similarity'``).

    Args:
      state: The state the round's selection was made from.
      selection: The round's selection (``K`` slots).
      signals: For ``'similarity'``: ``'update_sketch'``, ``[K, d]`` finite rows
        in slot order. Ignored for ``'size'``.

    Returns:
      The new state: for ``'similarity'``, each selected client's row replaced
      by its sketch (the mean of its slots' rows when it holds several slots).

    Raises:
      ValueError: If the sketch is missing, has the wrong shape or is not
        finite, or a selected client is out of range.
    """
    state = self._check_state(state)
    if self.method == 'size' or len(selection.clients) == 0:  # Nothing reported: a deadline
      return state  # may drop every selected client, and the round then trains nobody.
    if contract.UPDATE_SKETCH not in signals:
      raise ValueError(
        "method='similarity' needs signals['update_sketch'] ([num_slots, "
        f'{self.sketch_size}]), got keys {sorted(signals)}.'
      )
    clients = np.asarray(selection.clients, np.int64)
    num_clients = state.num_examples.shape[0]
    if clients.ndim != 1 or np.any(clients < 0) or np.any(clients >= num_clients):
      raise ValueError(
        f'selection.clients must be a 1-D array of client ids in [0, {num_clients}), '
        f'got {clients!r}.'
      )
    sketches = np.asarray(signals[contract.UPDATE_SKETCH])
    expected = (clients.shape[0], self.sketch_size)
    if sketches.shape != expected:
      raise ValueError(
        f"signals['update_sketch'] has shape {sketches.shape}, expected {expected} "
        '(one row of length sketch_size per cohort slot).'
      )
    if not np.issubdtype(sketches.dtype, np.number) or not np.all(np.isfinite(sketches)):
      raise ValueError("signals['update_sketch'] must be finite numbers.")
    unique, slot_client = np.unique(clients, return_inverse=True)
    totals = np.zeros((unique.shape[0], self.sketch_size), np.float64)
    np.add.at(totals, slot_client, sketches.astype(np.float64))
    counts = np.bincount(slot_client, minlength=unique.shape[0])
    updates = np.array(state.representative_updates, np.float32, copy=True)
    updates[unique] = (totals / counts[:, None]).astype(np.float32)
    return state._replace(representative_updates=updates)
