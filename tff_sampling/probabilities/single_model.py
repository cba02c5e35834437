"""Optimal client sampling probabilities of one model (Chen, Horvath, Richtarik, TMLR 2022):
Algorithm 1 (`optimal_probabilities`), Algorithm 2 from sums only
(`approximate_optimal_probabilities`), the sampling variance and the improvement factor,
in NumPy and as TensorFlow twins (``*_tf``) that TFF computations run."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_sampling.probabilities import common


def optimal_probabilities(weighted_norms, expected_clients: float) -> np.ndarray:
  """The variance-optimal upload probabilities (the paper's Algorithm 1), exactly.

  Minimises ``Σ_i a_i² / p_i`` subject to ``0 ≤ p_i ≤ 1``, ``Σ_i p_i = m`` by
  the sorting formula: with ``a_(1) ≤ … ≤ a_(n)`` and ``S_k = Σ_{j≤k} a_(j)``,
  ``k`` is the largest index with ``0 < m - n + k ≤ S_k / a_(k)`` (tested as
  ``(m - n + k) · a_(k) ≤ S_k``, only over ``a_(k) > 0``), and
  ``p_i = min(1, a_i · (m - n + k) / S_k)``, set to exactly one for
  ``a_i > a_(k)``. O(n log n) for the sort; the rest is vectorised.

  Zero norms get ``p_i = 0``; if at most ``m`` norms are non-zero (including
  whenever ``m ≥ n``), every non-zero client gets ``p_i = 1``. So
  ``Σ_i p_i = min(m, #{a_i > 0})``. Equal norms get equal probabilities, and
  ``p`` is non-decreasing in ``a`` (exactly, also in floating point).

  Args:
    weighted_norms: ``a_i = w_i ‖U_i‖`` per client, shape ``[n]``, finite and
      non-negative.
    expected_clients: ``m``, the expected number of uploads; any positive real.

  Returns:
    float64 array of shape ``[n]``, ``p_i ∈ [0, 1]``.

  Raises:
    ValueError: If the norms are empty, not 1-D, non-finite or negative, or
      ``expected_clients`` is not finite and positive.
  """
  norms = common.check_norms(weighted_norms)
  m = common.check_expected_clients(expected_clients)
  n = norms.size
  positive = norms > 0
  if np.count_nonzero(positive) <= m:
    return positive.astype(np.float64)
  ascending = np.sort(norms)
  prefix_sums = np.cumsum(ascending)
  budgets = m - n + np.arange(1, n + 1, dtype=np.float64)  # m - n + k.
  # Multiplying instead of dividing keeps a_(k) = 0 out of the test (0/0).
  feasible = (budgets > 0) & (ascending > 0) & (budgets * ascending <= prefix_sums)
  # Non-empty: more than m positive norms means k = floor(n - m) + 1 passes
  # (there m - n + k ∈ (0, 1] and S_k ≥ a_(k)).
  k = np.flatnonzero(feasible)[-1]
  threshold, scale = ascending[k], budgets[k] / prefix_sums[k]
  return np.where(norms > threshold, 1.0, np.minimum(1.0, norms * scale))


def approximate_optimal_probabilities_with_info(
  weighted_norms, expected_clients: float, max_rescaling_steps: int
) -> common.RescaledProbabilities:
  """Algorithm 2's probabilities (secure-aggregation compatible) and steps used.

  The arithmetic of the two-phase protocol of ``docs/algorithms.md`` §1b, computed in
  one place: ``p_i = min(1, m · a_i / A)`` with ``A = Σ a_j`` (zero if
  ``A = 0``), then up to ``max_rescaling_steps`` (``j_max``) steps of
  ``I = #{p_i < 1}``, ``P = Σ_{p_i<1} p_i``, ``C = (m - n + I) / P``; stop if
  ``I = 0``, ``P = 0`` or ``C ≤ 1``, else ``p_i = min(1, C · p_i)`` for
  ``p_i < 1``. Zero-norm clients count in ``I`` as in the protocol (``docs/algorithms.md``
  §1b says why that is right).

  With ``max_rescaling_steps ≥ n`` the result equals `optimal_probabilities`
  to rounding; with fewer steps it is elementwise at most the exact answer and
  non-decreasing in the number of steps. The loop also ends early once a step
  leaves ``p`` unchanged (later steps would repeat it), so a large
  ``max_rescaling_steps`` costs O(n) per step actually needed.

  Args:
    weighted_norms: ``a_i`` per client, shape ``[n]``, finite and non-negative.
    expected_clients: ``m``, any positive real.
    max_rescaling_steps: ``j_max ≥ 0``; 0 keeps only the first step.

  Returns:
    `RescaledProbabilities` with float64 probabilities of shape ``[n]`` and
    the number of steps that rescaled by ``C > 1 + sqrt(eps)``.

  Raises:
    ValueError: On bad norms or ``expected_clients`` (as
      `optimal_probabilities`), or if ``max_rescaling_steps`` is not a
      non-negative integer.
  """
  norms = common.check_norms(weighted_norms)
  m = common.check_expected_clients(expected_clients)
  steps = common.check_max_rescaling_steps(max_rescaling_steps)
  n = norms.size
  total = np.sum(norms)
  probs = np.minimum(1.0, m * norms / total) if total > 0 else np.zeros(n)
  steps_used = 0
  for _ in range(steps):
    below = probs < 1
    count_below = np.count_nonzero(below)
    mass_below = np.sum(np.where(below, probs, 0.0))
    if count_below == 0 or mass_below == 0:
      break
    factor = (m - n + count_below) / mass_below
    if factor <= 1:
      break
    rescaled = np.where(below, np.minimum(1.0, factor * probs), probs)
    steps_used += int(factor > 1 + common.NEGLIGIBLE_RESCALING)
    if np.array_equal(rescaled, probs):
      break  # Deterministic: every later step would compute the same no-op.
    probs = rescaled
  return common.RescaledProbabilities(probs, steps_used)


def approximate_optimal_probabilities(
  weighted_norms, expected_clients: float, max_rescaling_steps: int
) -> np.ndarray:
  """Algorithm 2's probabilities; see `approximate_optimal_probabilities_with_info`.

  Args:
    weighted_norms: ``a_i`` per client, shape ``[n]``, finite and non-negative.
    expected_clients: ``m``, any positive real.
    max_rescaling_steps: ``j_max ≥ 0``.

  Returns:
    float64 array of shape ``[n]``.

  Raises:
    ValueError: On bad arguments.
  """
  return approximate_optimal_probabilities_with_info(
    weighted_norms, expected_clients, max_rescaling_steps
  ).probabilities


def sampling_variance(weighted_norms, probabilities) -> float:
  """``Σ_{a_i>0} (1 - p_i) / p_i · a_i²``, the variance of the estimator ``G``.

  Exactly the variance ``E‖G - Σ w_i U_i‖²`` when ``a_i = w_i ‖U_i‖``.
  Clients with ``a_i = 0`` contribute nothing whatever their ``p_i``.

  Args:
    weighted_norms: ``a_i`` per client, shape ``[n]``.
    probabilities: ``p_i`` per client, shape ``[n]``, in ``[0, 1]`` and positive
      where ``a_i > 0``.

  Returns:
    The variance, a non-negative float.

  Raises:
    ValueError: On bad norms, probabilities outside ``[0, 1]`` or of another
      shape, or ``p_i = 0`` with ``a_i > 0`` (an infinite variance: that
      client's update would be lost).
  """
  norms = common.check_norms(weighted_norms)
  probs = common.check_probabilities(probabilities, norms)
  positive = norms > 0
  p, a = probs[positive], norms[positive]
  return float(np.sum((1 - p) / p * a**2))


def improvement_factor(weighted_norms, probabilities, expected_clients: float) -> float:
  """``α``: the variance of ``probabilities`` relative to uniform ``p_i = m/n``.

  ``α = Σ (1 - p_i)/p_i · a_i² / Σ (1 - m/n)/(m/n) · a_i²`` over clients with
  ``a_i > 0``. For the optimal probabilities ``α ∈ [0, 1]``: 0 is as good as
  full participation, 1 no better than uniform sampling. Degenerate cases,
  where uniform sampling has no variance to improve on, return 0.0: ``m ≥ n``
  (uniform is full participation) and all ``a_i = 0``.

  Args:
    weighted_norms: ``a_i`` per client, shape ``[n]``.
    probabilities: ``p_i`` per client, positive where ``a_i > 0``.
    expected_clients: ``m`` of the uniform baseline.

  Returns:
    ``α`` as a float.

  Raises:
    ValueError: On bad arguments (see `sampling_variance`).
  """
  norms = common.check_norms(weighted_norms)
  m = common.check_expected_clients(expected_clients)
  return common.relative_to_uniform(sampling_variance(norms, probabilities), m / norms.size, norms)


def optimal_probabilities_tf(
  weighted_norms: common.TensorLike, expected_clients: float | tf.Tensor, *, validate: bool = True
) -> tf.Tensor:
  """TensorFlow twin of `optimal_probabilities` (Algorithm 1), same arithmetic.

  Computes in float64, returns the norms' dtype. Every case (``#{a_i > 0} ≤ m`` included) is
  evaluated without Python branching on values, so the function traces once
  for any ``n`` and runs inside ``tf.function`` or
  ``tff.tensorflow.computation``.

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[n]``.
    expected_clients: ``m``; a positive Python number (checked at trace time)
      or a scalar tensor (not checked).
    validate: Add run-time assertions that the norms are finite and
      non-negative (``tf.errors.InvalidArgumentError`` otherwise).

  Returns:
    Tensor of shape ``[n]`` and the norms' dtype.

  Raises:
    ValueError: At trace time, for a non-float dtype, a static rank other than
      1, a statically empty input, or a bad Python ``expected_clients``.
  """
  input_norms = common.norms_tensor(weighted_norms, validate)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  dtype = common.COMPUTE_DTYPE
  m = common.expected_clients_tensor(expected_clients, dtype)
  size = tf.size(norms)
  n = tf.cast(size, dtype)
  positive = norms > 0
  ascending = tf.sort(norms)
  prefix_sums = tf.math.cumsum(ascending)
  budgets = m - n + tf.range(1, size + 1, dtype=dtype)
  feasible = (budgets > 0) & (ascending > 0) & (budgets * ascending <= prefix_sums)
  # -1 when nothing is feasible, which happens only in the branch below.
  k = tf.maximum(tf.reduce_max(tf.where(feasible, tf.range(size), -1)), 0)
  threshold = ascending[k]
  scale = tf.math.divide_no_nan(budgets[k], prefix_sums[k])
  water_filling = tf.where(
    norms > threshold, tf.ones_like(norms), tf.minimum(tf.ones_like(norms), norms * scale)
  )
  few_positive = tf.reduce_sum(tf.cast(positive, dtype)) <= m
  probs = tf.where(few_positive, tf.cast(positive, dtype), water_filling)
  return tf.cast(probs, input_norms.dtype)


def approximate_optimal_probabilities_with_info_tf(
  weighted_norms: common.TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> common.RescaledProbabilities:
  """TensorFlow twin of `approximate_optimal_probabilities_with_info`.

  The loop is unrolled over ``max_rescaling_steps`` (a Python int). A step
  after the stopping condition is a no-op, as §1b prescribes for the
  federated version: ``C := max(C, 1)``, and ``C := 1`` when ``I = 0`` or
  ``P = 0``. Such a step recomputes the same ``C`` from the same ``p``, so the
  result equals the NumPy loop that stops.

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[n]``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.
    max_rescaling_steps: ``j_max ≥ 0``, a Python int.
    validate: Add run-time assertions on the norms.

  Returns:
    `RescaledProbabilities` of a tensor ``[n]`` in the norms' dtype and an
    int32 scalar tensor.

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  input_norms = common.norms_tensor(weighted_norms, validate)
  steps = common.check_max_rescaling_steps(max_rescaling_steps)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  dtype = common.COMPUTE_DTYPE
  m = common.expected_clients_tensor(expected_clients, dtype)
  n = tf.cast(tf.size(norms), dtype)
  ones = tf.ones_like(norms)
  # divide_no_nan: all-zero norms give p = 0, as in the NumPy version.
  probs = tf.minimum(ones, tf.math.divide_no_nan(m * norms, tf.reduce_sum(norms)))
  negligible = tf.constant(common.NEGLIGIBLE_RESCALING, dtype)
  steps_used = tf.constant(0, tf.int32)
  for _ in range(steps):
    below = probs < 1
    count_below = tf.reduce_sum(tf.cast(below, dtype))
    mass_below = tf.reduce_sum(tf.where(below, probs, tf.zeros_like(probs)))
    factor = tf.math.divide_no_nan(m - n + count_below, mass_below)
    active = (count_below > 0) & (mass_below > 0) & (factor > 1)
    factor = tf.where(active, factor, tf.ones_like(factor))
    steps_used += tf.cast(factor > 1 + negligible, tf.int32)
    probs = tf.where(below, tf.minimum(ones, factor * probs), probs)
  return common.RescaledProbabilities(tf.cast(probs, input_norms.dtype), steps_used)


def approximate_optimal_probabilities_tf(
  weighted_norms: common.TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> tf.Tensor:
  """TensorFlow twin of `approximate_optimal_probabilities` (Algorithm 2).

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[n]``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.
    max_rescaling_steps: ``j_max ≥ 0``, a Python int (the loop is unrolled).
    validate: Add run-time assertions on the norms.

  Returns:
    Tensor of shape ``[n]`` in the norms' dtype.

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  return approximate_optimal_probabilities_with_info_tf(
    weighted_norms, expected_clients, max_rescaling_steps, validate=validate
  ).probabilities


def sampling_variance_tf(
  weighted_norms: common.TensorLike, probabilities: common.TensorLike
) -> tf.Tensor:
  """TensorFlow twin of `sampling_variance`, without its value checks.

  Args:
    weighted_norms: float tensor ``[n]``.
    probabilities: float tensor ``[n]``.

  Returns:
    Scalar tensor in the norms' dtype (computed in float64); ``inf`` if some
    ``p_i = 0`` has ``a_i > 0``.

  Raises:
    ValueError: At trace time, for a bad dtype or static rank.
  """
  input_norms = common.norms_tensor(weighted_norms, validate=False)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  probs = tf.cast(probabilities, common.COMPUTE_DTYPE)
  positive = norms > 0
  # The unselected branch may divide by zero; tf.where discards it.
  terms = tf.where(positive, (1 - probs) / probs * tf.square(norms), tf.zeros_like(norms))
  return tf.cast(tf.reduce_sum(terms), input_norms.dtype)


def improvement_factor_tf(
  weighted_norms: common.TensorLike,
  probabilities: common.TensorLike,
  expected_clients: float | tf.Tensor,
) -> tf.Tensor:
  """TensorFlow twin of `improvement_factor` (``α``, 0.0 in the degenerate cases).

  Args:
    weighted_norms: float tensor ``[n]``.
    probabilities: tensor ``[n]``, positive where ``a_i > 0``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.

  Returns:
    Scalar tensor in the norms' dtype (computed in float64).

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  input_norms = common.norms_tensor(weighted_norms, validate=False)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  m = common.expected_clients_tensor(expected_clients, common.COMPUTE_DTYPE)
  variance = sampling_variance_tf(norms, probabilities)
  uniform = m / tf.cast(tf.size(norms), common.COMPUTE_DTYPE)
  uniform_variance = (1 - uniform) / uniform * tf.reduce_sum(tf.square(norms))
  degenerate = (uniform >= 1) | (uniform_variance <= 0)
  alpha = tf.where(
    degenerate, tf.zeros_like(variance), tf.math.divide_no_nan(variance, uniform_variance)
  )
  return tf.cast(alpha, input_norms.dtype)
