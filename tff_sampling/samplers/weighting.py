"""Applying a sampler's aggregation weights with TFF's FedAvg: a `Selection`'s per-slot weights
reach the clients with their data, or a plain process's ``client_weighting`` is checked to give
the same weights (`check_plain_process_weighting`); ``docs/samplers.md`` has the rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tff_sampling.samplers import base

PROCESS = 'process'
EQUAL = 'equal'
NUM_EXAMPLES = 'num_examples'
CUSTOM = 'custom'
KINDS = (PROCESS, EQUAL, NUM_EXAMPLES, CUSTOM)

_UNIFORM = 'UNIFORM'
_NUM_EXAMPLES = 'NUM_EXAMPLES'

# float32 weights such as 1/3 or n_k/Σn: equal or proportional to this
# relative tolerance (float32 rounding is 6e-8; anything real is far larger).
_RTOL = 1e-5

_SIGNALS_HINT = (
  'build the process with tff_sampling.learning.signals.build_fed_avg_with_signals (its '
  "clients receive each slot's weight: signals.selection_client_data), which "
  "tff_sampling.program.train_model feeds the sampler's weights"
)


def _weighting_name(client_weighting: Any) -> str:
  """``'UNIFORM'`` or ``'NUM_EXAMPLES'`` for a `tff.learning.ClientWeighting` (or its name)."""
  name = getattr(client_weighting, 'name', client_weighting)
  if name not in (_UNIFORM, _NUM_EXAMPLES):
    raise ValueError(
      'client_weighting must be tff.learning.ClientWeighting.UNIFORM or NUM_EXAMPLES (the '
      f'only ones build_weighted_fed_avg accepts in TFF 0.87), got {client_weighting!r}.'
    )
  return name


def sampler_weighting(sampler: base.Sampler) -> str:
  """The sampler's declared `base.Sampler.weighting` (one of `KINDS`).

  Raises:
    ValueError: If the attribute holds something else.
  """
  kind = getattr(sampler, 'weighting', PROCESS)
  if kind not in KINDS:
    raise ValueError(f'{type(sampler).__name__}.weighting must be one of {KINDS}, got {kind!r}.')
  return kind


def sampler_sets_weights(sampler: base.Sampler) -> bool:
  """Whether the sampler's `Selection.weights` must be applied by the aggregation.

  False only for samplers that leave weighting to the process (``weights is
  None``); for the others the process must apply the sampler's weights: a
  process built on `tff_sampling.learning.signals` does, a plain FedAvg
  process only with the ``client_weighting`` of `required_client_weighting`.
  """
  return sampler_weighting(sampler) != PROCESS


def required_client_weighting(sampler: base.Sampler):
  """The `tff.learning.ClientWeighting` with which plain FedAvg applies the sampler's weights.

  Returns:
    ``None`` if the sampler leaves weighting to the process (any weighting
    will do); ``ClientWeighting.UNIFORM`` for equal weights;
    ``ClientWeighting.NUM_EXAMPLES`` for weights ``∝ n_k`` (exact only when
    every client trains the same number of whole epochs).

  Raises:
    ValueError: For a sampler with ``weighting = 'custom'``: no built-in
      weighting applies its weights.
  """
  kind = sampler_weighting(sampler)
  if kind == PROCESS:
    return None
  if kind == CUSTOM:
    raise ValueError(
      f'{type(sampler).__name__} sets aggregation weights that no built-in '
      f'tff.learning.ClientWeighting reproduces; {_SIGNALS_HINT}.'
    )
  import tensorflow_federated as tff  # Local: the samplers package is NumPy-only.

  if kind == EQUAL:
    return tff.learning.ClientWeighting.UNIFORM
  return tff.learning.ClientWeighting.NUM_EXAMPLES


def check_fed_avg_weighting(
  sampler: base.Sampler, client_weighting, *, fixed_local_steps: bool = False
) -> None:
  """Raises unless plain FedAvg with `client_weighting` applies the sampler's weights.

  Args:
    sampler: The sampler.
    client_weighting: The ``client_weighting`` the process was built with
      (`tff.learning.ClientWeighting`, or its name).
    fixed_local_steps: Whether every client trains a fixed number of local
      steps (then ``NUM_EXAMPLES`` weighs every client the same and cannot
      reproduce weights ``∝ n_k``).

  Raises:
    ValueError: Naming the sampler, the weighting it needs, and the way out.
  """
  name = _weighting_name(client_weighting)
  kind = sampler_weighting(sampler)
  sampler_name = type(sampler).__name__
  if kind == PROCESS:
    return
  if kind == CUSTOM:
    required_client_weighting(sampler)  # Raises.
  needed = _UNIFORM if kind == EQUAL else _NUM_EXAMPLES
  if name != needed:
    raise ValueError(
      f'{sampler_name} weights each slot {"equally (1/m)" if kind == EQUAL else "by n_k/Σn"}, '
      f'but a FedAvg process built with client_weighting={name} replaces those weights with '
      f'its own, which biases the aggregate. Build it with client_weighting='
      f'tff.learning.ClientWeighting.{needed}, or {_SIGNALS_HINT}.'
    )
  if kind == NUM_EXAMPLES and fixed_local_steps:
    raise ValueError(
      f'{sampler_name} weights clients by n_k/Σn, but with a fixed number of local steps '
      'ClientWeighting.NUM_EXAMPLES weighs every client the same; train whole epochs, or '
      f'{_SIGNALS_HINT}.'
    )


def _slot_weights(selection: base.Selection) -> np.ndarray | None:
  clients = np.asarray(selection.clients)
  if selection.weights is None:
    return None
  weights = np.asarray(selection.weights, np.float64)
  if weights.shape != clients.shape:
    raise ValueError(f'Selection has {clients.size} clients but weights of shape {weights.shape}.')
  if not np.all(np.isfinite(weights)) or np.any(weights < 0) or not np.sum(weights) > 0:
    raise ValueError(
      f'Selection weights must be finite, non-negative and not all zero, got {weights}.'
    )
  return weights


def _check_selection(
  selection: base.Selection, name: str, examples_trained: np.ndarray | None
) -> None:
  """Raises unless plain FedAvg with weighting `name` applies the selection's weights."""
  weights = _slot_weights(selection)
  if weights is None:
    return
  share = weights / weights.sum()
  if name == _UNIFORM:
    target = np.full(share.shape, 1.0 / share.size)
    what = 'UNIFORM gives every slot the same share'
  else:
    if examples_trained is None:
      raise ValueError(
        'With ClientWeighting.NUM_EXAMPLES, pass examples_trained (the examples each slot '
        "trains on this round) so that the selection's weights can be checked against it."
      )
    target = examples_trained / examples_trained.sum()
    what = 'NUM_EXAMPLES gives each slot a share ∝ the examples it trains on'
  if not np.allclose(share, target, rtol=_RTOL, atol=0.0):
    raise ValueError(
      f"The selection's weights {np.round(share, 6).tolist()} (as shares) are not what a "
      f'FedAvg process with client_weighting={name} applies ({what}: '
      f'{np.round(target, 6).tolist()}); {_SIGNALS_HINT}.'
    )


def _examples(examples_trained, size: int) -> np.ndarray | None:
  if examples_trained is None:
    return None
  examples = np.asarray(examples_trained, np.float64)
  if examples.shape != (size,) or not np.all(examples > 0):
    raise ValueError(
      f'examples_trained must hold one positive count per slot ({size}), got {examples_trained!r}.'
    )
  return examples


def fed_avg_datasets(
  selection: base.Selection,
  client_dataset: Callable[[int], Any],
  client_weighting,
  *,
  examples_trained: Sequence[float] | None = None,
) -> list[Any]:
  """The client data of one round of a plain `build_weighted_fed_avg` process.

  One dataset per slot, in slot order (a client drawn twice appears twice:
  with ``UNIFORM`` weighting each of its slots counts ``1/K``, as the
  sampler's weights say). Before building them, checks that the process's
  `client_weighting` applies the selection's weights (see the module
  docstring), so that a mismatch is an error instead of a biased aggregate.

  Example (MD sampling, ``1/m`` per draw)::

      process = tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, client_optimizer_fn, server_optimizer_fn,
          client_weighting=weighting.required_client_weighting(sampler))  # UNIFORM
      selection = sampler.select(state, round_num, available)
      data = weighting.fed_avg_datasets(selection, lambda c: datasets[c],
                                        tff.learning.ClientWeighting.UNIFORM)
      output = process.next(process_state, data)

  Args:
    selection: The round's selection.
    client_dataset: Client index → its dataset for this round.
    client_weighting: The ``client_weighting`` the process was built with.
    examples_trained: With ``NUM_EXAMPLES`` and weights set: the number of
      examples each slot trains on this round (e.g. epochs × ``n_k``).

  Returns:
    A list with one dataset per slot.

  Raises:
    ValueError: If the process's weighting does not apply the selection's
      weights (e.g. equal MD weights with ``NUM_EXAMPLES``), or on bad
      arguments.
  """
  name = _weighting_name(client_weighting)
  clients = np.asarray(selection.clients, np.int64)
  _check_selection(selection, name, _examples(examples_trained, clients.size))
  return [client_dataset(int(c)) for c in clients]


def realised_weights(
  selection: base.Selection,
  client_weighting,
  num_clients: int,
  *,
  examples_trained: Sequence[float] | None = None,
) -> np.ndarray:
  """Each client's share of a plain FedAvg process's aggregate for this selection.

  What TFF's weighted mean does with the slots' weights ``c_k`` (1 for
  ``UNIFORM``, `examples_trained` for ``NUM_EXAMPLES``): slot ``k`` gets
  ``c_k / Σ_j c_j``, summed over a client's slots. The selection's own
  weights are ignored here, exactly as the process ignores them (compare with
  `selection_shares`).

  Args:
    selection: The round's selection.
    client_weighting: ``UNIFORM`` or ``NUM_EXAMPLES``.
    num_clients: ``N``, the population size.
    examples_trained: Per slot, for ``NUM_EXAMPLES``.

  Returns:
    ``float64[N]`` shares, summing to one.
  """
  name = _weighting_name(client_weighting)
  clients = np.asarray(selection.clients, np.int64)
  slot: np.ndarray | None
  if name == _UNIFORM:
    slot = np.ones(clients.size)
  else:
    slot = _examples(examples_trained, clients.size)
    if slot is None:
      raise ValueError('NUM_EXAMPLES needs examples_trained (one count per slot).')
  shares = np.zeros(num_clients)
  np.add.at(shares, clients, slot / slot.sum())
  return shares


def selection_shares(selection: base.Selection, num_clients: int) -> np.ndarray:
  """Each client's share of the aggregate under the selection's own weights.

  ``ω_k / Σ_j ω_j`` summed over a client's slots: what a process that receives
  the weights (`tff_sampling.learning.signals`) applies.

  Raises:
    ValueError: If the selection has no weights (``None``).
  """
  weights = _slot_weights(selection)
  if weights is None:
    raise ValueError('The selection leaves weighting to the process (weights is None).')
  shares = np.zeros(num_clients)
  np.add.at(shares, np.asarray(selection.clients, np.int64), weights / weights.sum())
  return shares
