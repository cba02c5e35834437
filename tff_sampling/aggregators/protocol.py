"""Federated building blocks of the optimal-sampling protocol (the probability phases and their
secure sums), shared by `OptimalSamplingFactory` and the multi-model process;
``docs/optimal_sampling.md`` has the details."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import probabilities


class Mode(enum.StrEnum):
  """Who uploads: each client with probability ``p_i``, chosen by one of these."""

  APPROXIMATE = 'approximate'  # Algorithm 2: optimal p from sums only (the secure protocol).
  EXACT = 'exact'  # Algorithm 1: optimal p from every client's norm (reveals them).
  UNIFORM = 'uniform'  # p = m / n.
  FULL = 'full'  # p = 1.


MODES = tuple(Mode)

FLOAT = np.float32
COUNT = np.int32
FLOAT_TYPE = tff.TensorType(FLOAT)
COUNT_TYPE = tff.TensorType(COUNT)


def update_fingerprint(value) -> tf.Tensor:
  """An int64 fingerprint of an update's bytes (TF's row fingerprint of its float32 values,
  flattened and concatenated): the upload coin's seed, and how the server tells uploaders."""
  flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tf.nest.flatten(value)], 0)
  digest = tf.fingerprint(tf.expand_dims(flat, 0))  # [1, 8] uint8
  return tf.reshape(tf.bitcast(digest, tf.int64), [])


def gather_flagged(values, flags):
  """The int64 client `values` whose int32 `flag` is non-zero, concatenated at the server
  (``int64[?]@SERVER``, in no set order: a multiset, which reveals those values)."""
  vector_type = tff.TensorType(np.int64, [None])
  pair_type = (tff.TensorType(np.int64), COUNT_TYPE)

  @tff.tensorflow.computation(vector_type, pair_type)
  def accumulate(accumulator, pair):
    return tf.concat([accumulator, tf.boolean_mask([pair[0]], [pair[1] > 0])], 0)

  return tff.federated_aggregate(
    tff.federated_zip((values, flags)),
    zero=np.zeros([0], np.int64),
    accumulate=accumulate,
    merge=tff.tensorflow.computation(lambda a, b: tf.concat([a, b], 0), vector_type, vector_type),
    report=tff.tensorflow.computation(lambda a: a, vector_type),
  )


class ScalarSums:
  """How the protocol sums its client scalars: in the clear, with ``tff.federated_sum``.

  The protocol's inner sum factory, injected as `tff.aggregators.MeanFactory`
  takes its ``weight_sum_factory``: `OptimalSamplingFactory` and
  `federated_probabilities` pass every client scalar (the counts, the norms,
  the weights, the (P, I) pairs, the measurement terms) through one instance.
  Unlike a TFF factory it is told each sum's range, which secure sums need.
  `SecureScalarSums` is the secure one; subclass or wrap either to inject
  another (e.g. to count the sums).

  Attributes:
    secure: Whether the server learns only the sums. Mode ``exact``, which
      gathers every norm, refuses secure scalar sums.
  """

  secure = False

  def counts(self, values):
    """Sums int32 (structures of) client counts in {0, 1}."""
    return tff.federated_sum(values)

  def floats(self, values, upper_bound: float):
    """Sums float32 (structures of) client values known to lie in ``[0, upper_bound]``."""
    del upper_bound  # A plain sum needs no range.
    return tff.federated_sum(values)

  def nonnegative(self, values, upper_bound: float):
    """Sums float32 client scalars in ``[0, upper_bound]`` for any scale of the bound."""
    del upper_bound  # A plain sum needs no range.
    return tff.federated_sum(values)


class SecureScalarSums(ScalarSums):
  """`ScalarSums` with ``tff.federated_secure_sum_bitwidth`` (module docstring)."""

  secure = True

  def counts(self, values):
    """A 1-bit secure sum."""
    return tff.federated_secure_sum_bitwidth(values, bitwidth=1)

  def floats(self, values, upper_bound: float):
    """`tff.aggregators.SecureSumFactory` over ``[0, upper_bound]``.

    Used for values in [0, 1], where 32-bit quantisation over the range costs
    at most 1.2e-10 per client.
    """
    process = tff.aggregators.SecureSumFactory(float(upper_bound), 0.0).create(
      values.type_signature.member
    )
    return process.next(process.initialize(), values).result

  def nonnegative(self, values, upper_bound: float):
    """Exact integer parts plus quantised fractions: ~1e-10 absolute error per client.

    Quantising over the whole range would cost up to ``upper_bound / 2³³`` per
    client (2e-4 for a bound of 1e6). Instead each value is split into its
    integer part, summed exactly by a bitwidth secure sum, and its fractional
    part in [0, 1), summed with 32-bit quantisation.
    """
    bitwidth = int(np.ceil(np.log2(upper_bound + 1.0)))
    split = tff.federated_map(
      tff.tensorflow.computation(
        lambda v: (tf.cast(tf.floor(v), tf.int64), v - tf.floor(v)), FLOAT_TYPE
      ),
      values,
    )
    whole = tff.federated_secure_sum_bitwidth(split[0], bitwidth=bitwidth)
    fraction = self.floats(split[1], 1.0)
    return tff.federated_map(
      tff.tensorflow.computation(
        lambda w, f: tf.cast(tf.cast(w, tf.float64) + tf.cast(f, tf.float64), tf.float32)
      ),
      (whole, fraction),
    )


def resolve_scalar_sums(
  secure: bool | None = None, scalar_sums: ScalarSums | None = None
) -> ScalarSums:
  """`scalar_sums`, or the default that `secure` picks (secure unless ``secure=False``).

  Raises:
    TypeError: If `scalar_sums` is not a `ScalarSums`.
    ValueError: If `secure` is given and disagrees with ``scalar_sums.secure``.
  """
  if scalar_sums is None:
    return SecureScalarSums() if secure is None or secure else ScalarSums()
  if not isinstance(scalar_sums, ScalarSums):
    raise TypeError(f'scalar_sums must be a ScalarSums, got {scalar_sums!r}.')
  if secure is not None and bool(secure) != scalar_sums.secure:
    raise ValueError(
      f'secure={secure!r} contradicts scalar_sums={scalar_sums!r} (secure='
      f'{scalar_sums.secure}); pass one of them.'
    )
  return scalar_sums


def sum_counts(values, secure: bool):
  """``ScalarSums.counts`` of the default scalar sums for `secure`."""
  return resolve_scalar_sums(secure).counts(values)


def sum_floats(values, upper_bound: float, secure: bool):
  """``ScalarSums.floats`` of the default scalar sums for `secure`."""
  return resolve_scalar_sums(secure).floats(values, upper_bound)


def gather_values(values):
  """Every client's float32 scalar, concatenated at the server (reveals them all)."""
  vector_type = tff.TensorType(FLOAT, [None])
  return tff.federated_aggregate(
    values,
    zero=np.zeros([0], FLOAT),
    accumulate=tff.tensorflow.computation(
      lambda acc, x: tf.concat([acc, tf.reshape(x, [1])], 0), vector_type, FLOAT_TYPE
    ),
    merge=tff.tensorflow.computation(lambda a, b: tf.concat([a, b], 0), vector_type, vector_type),
    report=tff.tensorflow.computation(lambda a: a, vector_type),
  )


class FederatedProbabilities(NamedTuple):
  """What `federated_probabilities` returns.

  Attributes:
    probability: ``float32@CLIENTS``, each client's ``p_i``.
    norm_sum: ``float32@SERVER``, ``A = Σ a_i`` (1.0 in mode ``full``, where no
      norm is summed).
    rescaling_steps: ``int32@SERVER``, steps whose factor exceeded ``1 + 1e-5``.
    full_participation: ``float32@SERVER``, 1.0 when ``m ≥ n`` forced ``p = 1``
      (on every non-zero norm in modes ``approximate`` and ``exact``).
    water_level: ``float32@SERVER``, λ in mode ``exact`` (0 otherwise).
    all_norms: ``float32[n]@SERVER``, the gathered norms in mode ``exact``,
      else ``None``.
  """

  probability: Any
  norm_sum: Any
  rescaling_steps: Any
  full_participation: Any
  water_level: Any
  all_norms: Any


def federated_probabilities(
  norms,
  cohort_size,
  *,
  expected_clients: float,
  mode: str,
  max_rescaling_steps: int,
  norm_bound: float,
  secure: bool | None = None,
  scalar_sums: ScalarSums | None = None,
) -> FederatedProbabilities:
  """The probability phases of the protocol, for use inside a federated computation.

  Phase 1 and the rescaling phase 2 of ``docs/algorithms.md`` §1b (mode
  ``approximate``), Algorithm 1's water level of §1a (``exact``), or the
  baselines of §1c.

  Args:
    norms: ``float32@CLIENTS`` in ``[0, norm_bound]`` (clip before calling).
    cohort_size: ``float32@SERVER``, the number of clients ``n``.
    expected_clients: ``m > 0``.
    mode: One of `MODES` (see the module docstring).
    max_rescaling_steps: Unrolled rescaling steps (mode ``approximate``).
    norm_bound: Upper end of the norms' secure-sum range.
    secure: Picks the default `scalar_sums` (`resolve_scalar_sums`). The
      caller must refuse ``exact`` with secure sums.
    scalar_sums: Sums the client scalars.

  Returns:
    `FederatedProbabilities`.
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
  sums = resolve_scalar_sums(secure, scalar_sums)
  m = float(expected_clients)
  if mode == 'full':
    norm_sum = tff.federated_value(FLOAT(1.0), tff.SERVER)
  else:  # Algorithm 2's A, and the scale of the callers' measurements.
    norm_sum = sums.nonnegative(norms, norm_bound)
  all_norms = gather_values(norms) if mode == Mode.EXACT else None
  water_level = _water_level(all_norms, m)
  probability, full_participation = _initial_probabilities(
    norms, norm_sum, cohort_size, water_level, m, mode
  )
  probability, steps_used = _rescale(
    probability, cohort_size, m, max_rescaling_steps if mode == Mode.APPROXIMATE else 0, sums
  )
  return FederatedProbabilities(
    probability, norm_sum, steps_used, full_participation, water_level, all_norms
  )


def _water_level(all_norms, m: float):
  """``λ@SERVER`` of Algorithm 1 (``docs/algorithms.md`` §1a) from the gathered norms.

  ``p_i = min(1, a_i/λ)``; 0.0 when the norms were not gathered (`all_norms` is None).
  """
  if all_norms is None:
    return tff.federated_value(FLOAT(0.0), tff.SERVER)

  @tff.tensorflow.computation(tff.TensorType(FLOAT, [None]))
  def server_water_level(all_norms):
    p = probabilities.optimal_probabilities_tf(all_norms, m, validate=False)  # Clipped, finite.
    unsaturated = (p > 0.0) & (p < 1.0)
    return tf.reduce_max(tf.where(unsaturated, all_norms / tf.where(unsaturated, p, 1.0), 0.0))

  return tff.federated_map(server_water_level, all_norms)


def _initial_probabilities(norms, norm_sum, cohort_size, water_level, m: float, mode: str):
  """``(p_i@CLIENTS, full_participation@SERVER)`` before rescaling (``docs/algorithms.md`` §1).

  ``p_i = min(1, m·a_i/A)`` (``approximate``, §1b phase 1), ``min(1, a_i/λ)``
  (``exact``, §1a), ``min(1, m/n)`` (``uniform``, §1c) or 1 (``full``); then
  ``m ≥ n`` sets ``p_i = 1`` (for ``a_i > 0`` unless norm-blind).
  """

  @tff.tensorflow.computation(FLOAT_TYPE, FLOAT_TYPE, FLOAT_TYPE, FLOAT_TYPE)
  def client_initial_probability(norm, norm_sum, size, water_level):
    if mode == 'full':
      return tf.constant(1.0)
    if mode == 'uniform':
      return tf.minimum(1.0, m / tf.maximum(size, 1.0))
    if mode == Mode.EXACT:
      # λ = 0 means every client with a non-zero norm saturates.
      return tf.where(
        norm > 0.0,
        tf.where(water_level > 0.0, tf.minimum(1.0, norm / tf.maximum(water_level, 1e-30)), 1.0),
        0.0,
      )
    return tf.where(norm_sum > 0.0, tf.minimum(1.0, m * norm / tf.maximum(norm_sum, 1e-30)), 0.0)

  @tff.tensorflow.computation(FLOAT_TYPE)
  def server_full_participation(size):
    return tf.cast(m >= size, tf.float32)

  @tff.tensorflow.computation(FLOAT_TYPE, FLOAT_TYPE, FLOAT_TYPE)
  def force_full(probability, norm, full_participation):
    # Zero norms keep p = 0 (their update contributes nothing); modes 'full'
    # and 'uniform' are norm-blind baselines.
    if mode in ('full', 'uniform'):
      return tf.where(full_participation > 0.0, 1.0, probability)
    return tf.where((full_participation > 0.0) & (norm > 0.0), 1.0, probability)

  probability = tff.federated_map(
    client_initial_probability,
    (
      norms,
      tff.federated_broadcast(norm_sum),
      tff.federated_broadcast(cohort_size),
      tff.federated_broadcast(water_level),
    ),
  )
  full_participation = tff.federated_map(server_full_participation, cohort_size)
  probability = tff.federated_map(
    force_full, (probability, norms, tff.federated_broadcast(full_participation))
  )
  return probability, full_participation


def _rescale(probability, cohort_size, m: float, steps: int, sums: ScalarSums):
  """``(p_i@CLIENTS, steps used@SERVER)`` after `steps` rescaling steps.

  Phase 2 of ``docs/algorithms.md`` §1b. Each step sums
  ``(P, I) = Σ (p_i·[p_i<1], [p_i<1])``, sets ``C = max(1, (m − n + I)/P)``
  (1 if ``I = 0`` or ``P = 0``) and ``p_i = min(1, C·p_i)`` where ``p_i < 1``.
  """

  @tff.tensorflow.computation(FLOAT_TYPE)
  def client_rescaling_sums(probability):
    below = probability < 1.0
    return (tf.where(below, probability, 0.0), tf.cast(below, COUNT))

  @tff.tensorflow.computation(FLOAT_TYPE, COUNT_TYPE, FLOAT_TYPE)
  def server_scale(probability_sum, unsaturated, size):
    unsaturated = tf.cast(unsaturated, tf.float32)
    valid = (unsaturated > 0.0) & (probability_sum > 0.0)
    scale = tf.where(valid, (m - size + unsaturated) / tf.where(valid, probability_sum, 1.0), 1.0)
    return tf.maximum(scale, 1.0)

  @tff.tensorflow.computation(FLOAT_TYPE, FLOAT_TYPE)
  def client_rescale(probability, scale):
    return tf.where(probability < 1.0, tf.minimum(1.0, scale * probability), probability)

  @tff.tensorflow.computation(FLOAT_TYPE)
  def changed(scale):
    # float32 sums put C within ~1e-7 of 1 at the fixed point; such a step
    # changes nothing that matters and is not counted as used.
    return tf.cast(scale > 1.0 + 1e-5, COUNT)

  steps_used = tff.federated_value(COUNT(0), tff.SERVER)
  for _ in range(steps):
    pairs = tff.federated_map(client_rescaling_sums, probability)
    probability_sum = sums.floats(pairs[0], 1.0)
    unsaturated = sums.counts(pairs[1])
    scale = tff.federated_map(server_scale, (probability_sum, unsaturated, cohort_size))
    steps_used = tff.federated_map(
      tff.tensorflow.computation(lambda a, b: a + b),
      (steps_used, tff.federated_map(changed, scale)),
    )
    probability = tff.federated_map(client_rescale, (probability, tff.federated_broadcast(scale)))
  return probability, steps_used
