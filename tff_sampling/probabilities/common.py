"""What the single- and multi-model probabilities share: dtypes, argument checks, the
conversions of norms and budgets to tensors, and `RescaledProbabilities`."""

from __future__ import annotations

import numbers
from typing import NamedTuple, TypeAlias

import numpy as np
import tensorflow as tf

FLOAT_DTYPES = (tf.float32, tf.float64)


# The TF twins compute in float64 whatever the input dtype: a float32 cumulative
# sum over n norms drifts by ~n ulps, which would move float32 results by more
# than 1e-6 from NumPy's. These are O(n) vector operations, cheap in float64.
COMPUTE_DTYPE = tf.float64


# A rescaling factor within this of one is rounding noise in the sum P once
# Σ p = m holds (float64 sums of n terms err by far less for any realistic n);
# such a step moves probabilities by ~1e-16 and is not counted as a step used.
NEGLIGIBLE_RESCALING = float(np.sqrt(np.finfo(np.float64).eps))


TensorLike: TypeAlias = tf.Tensor | np.ndarray | float


class RescaledProbabilities(NamedTuple):
  """Algorithm 2's result.

  Attributes:
    probabilities: ``p_i`` per client, shape ``[n]`` (``[N, S]`` for the
      multi-model functions; NumPy float64 array, or a tensor of the input's
      dtype for the TF twin).
    rescaling_steps_used: How many rescaling steps rescaled by a factor
      materially above one (``C > 1 + sqrt(eps)``); at most
      ``max_rescaling_steps`` (an ``int``, or an int32 scalar tensor).
  """

  probabilities: np.ndarray | tf.Tensor
  rescaling_steps_used: int | tf.Tensor


def check_norms(weighted_norms) -> np.ndarray:
  """Returns the norms as a float64 vector, or raises ValueError."""
  try:
    norms = np.asarray(weighted_norms, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(
      f'weighted_norms must be a 1-D array of real numbers, got {weighted_norms!r}.'
    ) from e
  if norms.ndim != 1:
    raise ValueError(f'weighted_norms must be 1-D (one norm per client), got shape {norms.shape}.')
  if norms.size == 0:
    raise ValueError('weighted_norms is empty: a cohort needs at least one client.')
  if not np.all(np.isfinite(norms)):
    bad = norms[~np.isfinite(norms)]
    raise ValueError(f'weighted_norms must be finite, got non-finite values {bad[:5]}.')
  if np.any(norms < 0):
    raise ValueError(f'weighted_norms must be non-negative, got {norms[norms < 0][:5]}.')
  return norms


def check_expected_clients(expected_clients) -> float:
  """Returns ``m`` as a float, or raises ValueError unless it is finite and positive."""
  if isinstance(expected_clients, (bool, np.bool_)) or not isinstance(
    expected_clients, numbers.Real
  ):
    raise ValueError(f'expected_clients must be a positive real number, got {expected_clients!r}.')
  value = float(expected_clients)
  if not (np.isfinite(value) and value > 0):
    raise ValueError(f'expected_clients must be finite and positive, got {expected_clients!r}.')
  return value


def check_max_rescaling_steps(max_rescaling_steps) -> int:
  if isinstance(max_rescaling_steps, (bool, np.bool_)) or not isinstance(
    max_rescaling_steps, numbers.Integral
  ):
    raise ValueError(
      f'max_rescaling_steps must be a non-negative integer, got {max_rescaling_steps!r}.'
    )
  if max_rescaling_steps < 0:
    raise ValueError(f'max_rescaling_steps must be non-negative, got {max_rescaling_steps!r}.')
  return int(max_rescaling_steps)


def check_probabilities(probabilities, norms: np.ndarray) -> np.ndarray:
  try:
    probs = np.asarray(probabilities, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(
      f'probabilities must be an array of real numbers, got {probabilities!r}.'
    ) from e
  if probs.shape != norms.shape:
    raise ValueError(
      f'probabilities has shape {probs.shape} but weighted_norms has shape {norms.shape}.'
    )
  if not np.all((probs >= 0) & (probs <= 1)):  # Also rejects NaN.
    bad = probs[~((probs >= 0) & (probs <= 1))]
    raise ValueError(f'probabilities must lie in [0, 1], got {bad[:5]}.')
  if np.any((probs == 0) & (norms > 0)):
    raise ValueError(
      'probabilities must be positive where weighted_norms is positive (the estimator '
      'divides by p_i), got p_i = 0 for clients '
      f'{np.flatnonzero((probs == 0) & (norms > 0))[:5]}.'
    )
  return probs


def relative_to_uniform(variance: float, uniform: float, norms: np.ndarray) -> float:
  """``variance`` over the variance of probability `uniform` everywhere (0 if
  that has none: ``uniform ≥ 1`` or all norms 0)."""
  uniform_variance = (1 - uniform) / uniform * np.sum(norms**2)
  if uniform >= 1 or uniform_variance == 0:
    return 0.0
  return float(variance / uniform_variance)


def norms_tensor(weighted_norms: TensorLike, validate: bool, rank: int = 1) -> tf.Tensor:
  """The norms as a float tensor of `rank` 1 (``[n]``) or 2 (``[N, S]``), with
  run-time checks if `validate`."""
  norms = tf.convert_to_tensor(weighted_norms)
  if norms.dtype not in FLOAT_DTYPES:
    raise ValueError(f'weighted_norms must be float32 or float64, got {norms.dtype!r}.')
  if norms.shape.rank is not None and norms.shape.rank != rank:
    if rank == 1:
      raise ValueError(f'weighted_norms must be 1-D, got shape {norms.shape}.')
    raise ValueError(
      f'weighted_norms must be 2-D [clients, models], got shape {norms.shape}; for a '
      'single model pass weighted_norms[:, None].'
    )
  if norms.shape.rank == rank and 0 in norms.shape:
    if rank == 1:
      raise ValueError('weighted_norms is empty: a cohort needs at least one client.')
    raise ValueError(
      f'weighted_norms has shape {norms.shape}: at least one client and one model needed.'
    )
  if not validate:
    return norms
  # In graph mode (tff.tensorflow.computation) the assertions are ops that
  # must be made dependencies; eagerly they raise at once and return None.
  checks = [
    tf.debugging.assert_rank(norms, rank, message=f'weighted_norms must be {rank}-D'),
    tf.debugging.assert_positive(tf.size(norms), message='weighted_norms is empty'),
    tf.debugging.assert_all_finite(norms, message='weighted_norms must be finite'),
    tf.debugging.assert_non_negative(norms, message='weighted_norms must be non-negative'),
  ]
  with tf.control_dependencies([c for c in checks if c is not None]):
    return tf.identity(norms)


def expected_clients_tensor(expected_clients, dtype: tf.DType) -> tf.Tensor:
  if isinstance(expected_clients, (tf.Tensor, tf.Variable)):
    return tf.cast(expected_clients, dtype)
  return tf.constant(check_expected_clients(expected_clients), dtype)


def check_norm_matrix(weighted_norms) -> np.ndarray:
  """Returns the ``[N, S]`` norms as a float64 matrix, or raises ValueError."""
  try:
    norms = np.asarray(weighted_norms, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(
      'weighted_norms must be a 2-D array [clients, models] of real numbers, got '
      f'{weighted_norms!r}.'
    ) from e
  if norms.ndim != 2:
    raise ValueError(
      'weighted_norms must be 2-D [clients, models] (one norm per client and model), got '
      f'shape {norms.shape}; for a single model pass weighted_norms[:, None].'
    )
  if norms.shape[0] == 0 or norms.shape[1] == 0:
    raise ValueError(
      f'weighted_norms has shape {norms.shape}: at least one client and one model needed.'
    )
  check_norms(norms.ravel())  # Finite and non-negative, with its messages.
  return norms


def check_multi_model_probabilities(probabilities, norms: np.ndarray) -> np.ndarray:
  """`check_probabilities` for ``[N, S]``, naming (client, model) pairs with ``p = 0``."""
  try:
    probs = np.asarray(probabilities, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(
      f'probabilities must be an array of real numbers, got {probabilities!r}.'
    ) from e
  if probs.shape == norms.shape:
    lost = (probs == 0) & (norms > 0)
    if np.any(lost):
      raise ValueError(
        'probabilities must be positive where weighted_norms is positive (the estimator '
        'divides by p_{s|i}), got p = 0 for (client, model) pairs '
        f'{np.argwhere(lost)[:5].tolist()}.'
      )
  return check_probabilities(probs, norms)
