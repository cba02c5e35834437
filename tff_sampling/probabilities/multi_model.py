"""Optimal probabilities for several models sharing one population (MMFL): each client
trains at most one model a round; the budget ``m`` is split across models by the
clients' norms (docs/algorithms.md section 5). NumPy, and TensorFlow twins (``*_tf``)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_sampling.probabilities import common
from tff_sampling.probabilities import single_model


def _split_across_models(
  client_probabilities: np.ndarray, norms: np.ndarray, totals: np.ndarray
) -> np.ndarray:
  """``p_{s|i} = p_i · Ũ_{i,s} / M_i`` (zero where ``M_i = 0``): local to each client."""
  # Ũ/M first: it is exactly 1 for S = 1 (so p_{1|i} = p_i exactly) and at
  # most 1 for any S (a float sum of non-negative terms is at least each term).
  shares = np.divide(norms, totals[:, None], out=np.zeros_like(norms), where=totals[:, None] > 0)
  return client_probabilities[:, None] * shares


def multi_model_probabilities(weighted_norms, expected_clients: float) -> np.ndarray:
  """MMFL's variance-optimal probabilities ``p_{s|i}`` for ``S`` models, exactly.

  Minimises ``Σ_{i,s} Ũ_{i,s}² / p_{s|i}`` (the total sampling variance plus a
  constant) subject to ``p_{s|i} ≥ 0``, ``Σ_s p_{s|i} ≤ 1`` (a client trains
  at most one model) and ``Σ_{i,s} p_{s|i} = m``. The solution is
  ``p_{s|i} = p_i · Ũ_{i,s} / M_i`` with ``M_i = Σ_s Ũ_{i,s}`` and
  ``p = optimal_probabilities(M, m)``, the single-model optimum of the row
  sums.

  Derivation: for a fixed client total ``q_i = Σ_s p_{s|i} > 0``,
  Cauchy–Schwarz gives ``M_i² = (Σ_s Ũ_{i,s}/√p_{s|i} · √p_{s|i})² ≤
  q_i · Σ_s Ũ_{i,s}²/p_{s|i}``, with equality iff ``p_{s|i} ∝ Ũ_{i,s}``. So the
  best split of any ``q`` is proportional and costs ``Σ_i M_i² / q_i``, and
  the best ``q`` under ``0 ≤ q_i ≤ 1``, ``Σ q_i = m`` is Algorithm 1 applied
  to ``M``. This is the sorting formula of ``docs/algorithms.md`` §5.

  As in `optimal_probabilities`: ``expected_clients`` may be any positive
  real, ``m > N`` included; a client with an all-zero row (``M_i = 0``) gets
  ``p_{s|i} = 0`` for every model, and a zero ``Ũ_{i,s}`` gets
  ``p_{s|i} = 0``. Hence ``Σ_{i,s} p_{s|i} = min(m, #{M_i > 0})``; if at most
  ``m`` rows are non-zero, each non-zero client trains surely
  (``Σ_s p_{s|i} = 1``, split ∝ ``Ũ_{i,s}``). With ``S = 1`` the result is
  exactly ``optimal_probabilities(weighted_norms[:, 0], m)[:, None]``.

  Args:
    weighted_norms: ``Ũ_{i,s} = d_{i,s} ‖U_{i,s}‖`` (or the loss variant's
      ``d_{i,s} f_{i,s}``), shape ``[N, S]``, finite and non-negative.
    expected_clients: ``m``, the expected number of clients that train; any
      positive real.

  Returns:
    float64 array ``[N, S]`` with ``p_{s|i} ∈ [0, 1]`` and row sums ``p_i``
    (to rounding: a row sum may exceed one by a few ulps).

  Raises:
    ValueError: If the norms are not a non-empty 2-D array of finite,
      non-negative numbers, or ``expected_clients`` is not finite and positive.
  """
  norms = common.check_norm_matrix(weighted_norms)
  totals = np.sum(norms, axis=1)
  return _split_across_models(
    single_model.optimal_probabilities(totals, expected_clients), norms, totals
  )


def approximate_multi_model_probabilities_with_info(
  weighted_norms, expected_clients: float, max_rescaling_steps: int
) -> common.RescaledProbabilities:
  """Secure-aggregation version of `multi_model_probabilities`, and steps used.

  §1b's two-phase protocol run on the client totals ``M_i = Σ_s Ũ_{i,s}``,
  which each client computes from its own norms: the server sees only the
  secure sums ``Σ_i M_i`` and, per rescaling step, ``(P, I)``, exactly as for
  one model (same uplink, ``1 + 2 j_max`` floats, whatever ``S``). Each client
  then splits its ``p_i`` locally, ``p_{s|i} = p_i · Ũ_{i,s} / M_i``, which
  needs only its own ``Ũ_{i,·}``. This combination is ours (§5: none exists
  in the literature).

  Everything `approximate_optimal_probabilities_with_info` guarantees for
  ``p_i`` carries over row by row: with ``max_rescaling_steps ≥ N`` the
  result equals `multi_model_probabilities` to rounding; with fewer steps
  ``p_{s|i}`` is elementwise at most the exact answer and non-decreasing in
  the number of steps, so ``Σ_{i,s} p_{s|i} ≤ min(m, #{M_i > 0})`` and the
  variance is at least the optimum's. Zero rows and zero norms get zero, as
  in the exact version.

  Args:
    weighted_norms: ``Ũ_{i,s}``, shape ``[N, S]``, finite and non-negative.
    expected_clients: ``m``, any positive real.
    max_rescaling_steps: ``j_max ≥ 0``; 0 keeps only the first step.

  Returns:
    `RescaledProbabilities` with float64 probabilities ``[N, S]`` and the
    number of rescaling steps of the single-model protocol on ``M`` that
    rescaled by ``C > 1 + sqrt(eps)``.

  Raises:
    ValueError: On bad norms or ``expected_clients`` (as
      `multi_model_probabilities`), or if ``max_rescaling_steps`` is not a
      non-negative integer.
  """
  norms = common.check_norm_matrix(weighted_norms)
  totals = np.sum(norms, axis=1)
  info = single_model.approximate_optimal_probabilities_with_info(
    totals, expected_clients, max_rescaling_steps
  )
  return common.RescaledProbabilities(
    _split_across_models(info.probabilities, norms, totals), info.rescaling_steps_used
  )


def approximate_multi_model_probabilities(
  weighted_norms, expected_clients: float, max_rescaling_steps: int
) -> np.ndarray:
  """Secure ``p_{s|i}``; see `approximate_multi_model_probabilities_with_info`.

  Args:
    weighted_norms: ``Ũ_{i,s}``, shape ``[N, S]``, finite and non-negative.
    expected_clients: ``m``, any positive real.
    max_rescaling_steps: ``j_max ≥ 0``.

  Returns:
    float64 array ``[N, S]``.

  Raises:
    ValueError: On bad arguments.
  """
  return approximate_multi_model_probabilities_with_info(
    weighted_norms, expected_clients, max_rescaling_steps
  ).probabilities


def multi_model_sampling_variance(weighted_norms, probabilities) -> float:
  """``Σ_{i,s: Ũ>0} (1 - p_{s|i}) / p_{s|i} · Ũ_{i,s}²``, summed over the models.

  The total over models ``s`` of the variance ``E‖G_s - Σ_i d_{i,s} U_{i,s}‖²``
  of ``G_s = Σ_i 1[i trains s] / p_{s|i} · d_{i,s} U_{i,s}`` when
  ``Ũ_{i,s} = d_{i,s} ‖U_{i,s}‖``; defined as `sampling_variance` is (the
  objective ``Σ Ũ²/p`` minus its full-participation value ``Σ Ũ²``), and
  equal to it for ``S = 1``. It depends only on the marginals ``p_{s|i}``, so
  the row constraint ``Σ_s p_{s|i} ≤ 1`` is not checked here. Pairs with
  ``Ũ_{i,s} = 0`` contribute nothing whatever their probability.

  Args:
    weighted_norms: ``Ũ_{i,s}``, shape ``[N, S]``.
    probabilities: ``p_{s|i}``, shape ``[N, S]``, in ``[0, 1]`` and positive
      where ``Ũ_{i,s} > 0``.

  Returns:
    The variance, a non-negative float.

  Raises:
    ValueError: On bad norms, probabilities outside ``[0, 1]`` or of another
      shape, or ``p_{s|i} = 0`` with ``Ũ_{i,s} > 0`` (that update would be
      lost: an infinite variance).
  """
  norms = common.check_norm_matrix(weighted_norms)
  probs = common.check_multi_model_probabilities(probabilities, norms)
  return single_model.sampling_variance(norms.ravel(), probs.ravel())


def multi_model_improvement_factor(weighted_norms, probabilities, expected_clients: float) -> float:
  """``α`` for several models: the variance relative to random assignment.

  The baseline is §5's random assignment: ``min(m, N)`` clients on average,
  each training a uniformly random model, so ``p_{s|i} = u = min(m, N) / (N S)``
  for every pair, and ``α = Σ (1 - p)/p · Ũ² / Σ (1 - u)/u · Ũ²`` over
  ``Ũ_{i,s} > 0``. For ``S = 1`` this is `improvement_factor`. The optimal
  probabilities have ``α ∈ [0, 1]`` (the baseline is feasible). Degenerate
  cases, where the baseline has no variance, return 0.0: ``S = 1`` with
  ``m ≥ N`` (then ``u = 1``) and all ``Ũ = 0``. With ``S > 1`` and ``m ≥ N``
  the baseline has ``u = 1/S`` and a positive variance.

  Args:
    weighted_norms: ``Ũ_{i,s}``, shape ``[N, S]``.
    probabilities: ``p_{s|i}``, shape ``[N, S]``, positive where ``Ũ > 0``.
    expected_clients: ``m`` of the baseline.

  Returns:
    ``α`` as a float.

  Raises:
    ValueError: On bad arguments (see `multi_model_sampling_variance`).
  """
  norms = common.check_norm_matrix(weighted_norms)
  m = common.check_expected_clients(expected_clients)
  num_clients, num_models = norms.shape
  return common.relative_to_uniform(
    multi_model_sampling_variance(norms, probabilities),
    min(m, num_clients) / (num_clients * num_models),
    norms,
  )


def _split_across_models_tf(
  client_probabilities: tf.Tensor, norms: tf.Tensor, totals: tf.Tensor
) -> tf.Tensor:
  """TF twin of `_split_across_models` (same order of operations)."""
  return client_probabilities[:, None] * tf.math.divide_no_nan(norms, totals[:, None])


def multi_model_probabilities_tf(
  weighted_norms: common.TensorLike, expected_clients: float | tf.Tensor, *, validate: bool = True
) -> tf.Tensor:
  """TensorFlow twin of `multi_model_probabilities`, via `optimal_probabilities_tf`.

  Computes in float64 and returns the norms' dtype; no Python branching on
  values, so it traces once for any ``[N, S]``.

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[N, S]``.
    expected_clients: ``m``; a positive Python number (checked at trace time)
      or a scalar tensor (not checked).
    validate: Add run-time assertions that the norms are finite and
      non-negative (``tf.errors.InvalidArgumentError`` otherwise).

  Returns:
    Tensor ``[N, S]`` in the norms' dtype.

  Raises:
    ValueError: At trace time, for a non-float dtype, a static rank other than
      2, a statically empty dimension, or a bad Python ``expected_clients``.
  """
  input_norms = common.norms_tensor(weighted_norms, validate, rank=2)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  totals = tf.reduce_sum(norms, axis=1)
  client_probs = single_model.optimal_probabilities_tf(totals, expected_clients, validate=False)
  return tf.cast(_split_across_models_tf(client_probs, norms, totals), input_norms.dtype)


def approximate_multi_model_probabilities_with_info_tf(
  weighted_norms: common.TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> common.RescaledProbabilities:
  """TensorFlow twin of `approximate_multi_model_probabilities_with_info`.

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[N, S]``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.
    max_rescaling_steps: ``j_max ≥ 0``, a Python int (the loop is unrolled).
    validate: Add run-time assertions on the norms.

  Returns:
    `RescaledProbabilities` of a tensor ``[N, S]`` in the norms' dtype and an
    int32 scalar tensor.

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  input_norms = common.norms_tensor(weighted_norms, validate, rank=2)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  totals = tf.reduce_sum(norms, axis=1)
  info = single_model.approximate_optimal_probabilities_with_info_tf(
    totals, expected_clients, max_rescaling_steps, validate=False
  )
  probs = _split_across_models_tf(info.probabilities, norms, totals)
  return common.RescaledProbabilities(tf.cast(probs, input_norms.dtype), info.rescaling_steps_used)


def approximate_multi_model_probabilities_tf(
  weighted_norms: common.TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> tf.Tensor:
  """TensorFlow twin of `approximate_multi_model_probabilities`.

  Args:
    weighted_norms: float32 or float64 tensor of shape ``[N, S]``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.
    max_rescaling_steps: ``j_max ≥ 0``, a Python int (the loop is unrolled).
    validate: Add run-time assertions on the norms.

  Returns:
    Tensor ``[N, S]`` in the norms' dtype.

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  return approximate_multi_model_probabilities_with_info_tf(
    weighted_norms, expected_clients, max_rescaling_steps, validate=validate
  ).probabilities


def multi_model_sampling_variance_tf(
  weighted_norms: common.TensorLike, probabilities: common.TensorLike
) -> tf.Tensor:
  """TensorFlow twin of `multi_model_sampling_variance`, without its value checks.

  Args:
    weighted_norms: float tensor ``[N, S]``.
    probabilities: float tensor ``[N, S]``.

  Returns:
    Scalar tensor in the norms' dtype (computed in float64); ``inf`` if some
    ``p_{s|i} = 0`` has ``Ũ_{i,s} > 0``.

  Raises:
    ValueError: At trace time, for a bad dtype or static rank.
  """
  norms = common.norms_tensor(weighted_norms, validate=False, rank=2)
  return single_model.sampling_variance_tf(tf.reshape(norms, [-1]), tf.reshape(probabilities, [-1]))


def multi_model_improvement_factor_tf(
  weighted_norms: common.TensorLike,
  probabilities: common.TensorLike,
  expected_clients: float | tf.Tensor,
) -> tf.Tensor:
  """TensorFlow twin of `multi_model_improvement_factor` (0.0 when degenerate).

  Args:
    weighted_norms: float tensor ``[N, S]``.
    probabilities: tensor ``[N, S]``, positive where ``Ũ > 0``.
    expected_clients: ``m``; a positive Python number or a scalar tensor.

  Returns:
    Scalar tensor in the norms' dtype (computed in float64).

  Raises:
    ValueError: At trace time, for bad static arguments.
  """
  input_norms = common.norms_tensor(weighted_norms, validate=False, rank=2)
  norms = tf.cast(input_norms, common.COMPUTE_DTYPE)
  m = common.expected_clients_tensor(expected_clients, common.COMPUTE_DTYPE)
  variance = multi_model_sampling_variance_tf(norms, probabilities)
  shape = tf.cast(tf.shape(norms), common.COMPUTE_DTYPE)
  uniform = tf.minimum(m, shape[0]) / (shape[0] * shape[1])
  uniform_variance = (1 - uniform) / uniform * tf.reduce_sum(tf.square(norms))
  degenerate = (uniform >= 1) | (uniform_variance <= 0)
  alpha = tf.where(
    degenerate, tf.zeros_like(variance), tf.math.divide_no_nan(variance, uniform_variance)
  )
  return tf.cast(alpha, input_norms.dtype)
