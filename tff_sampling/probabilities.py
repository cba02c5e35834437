r"""Optimal client sampling probabilities: exact, secure-aggregation approximation, baselines.

Chen, Horváth, Richtárik, "Optimal Client Sampling for Federated Learning",
TMLR 2022 (arXiv:2010.13723). A cohort of ``n`` clients has trained; client ``i``
holds the update ``U_i`` with aggregation weight ``w_i``. Each client uploads
independently with probability ``p_i`` (``ζ_i ~ Bernoulli(p_i)``) and the server
forms ``G = Σ_i ζ_i (w_i / p_i) U_i``, an unbiased estimate of ``Σ_i w_i U_i``
whose sampling variance is ``Σ_i (1 - p_i) / p_i · a_i²`` with the *weighted
norms* ``a_i = w_i ‖U_i‖``. The paper chooses ``p`` to minimise that variance
subject to ``0 ≤ p_i ≤ 1`` and ``Σ_i p_i = m``, the expected number of uploads
(``expected_clients`` here). See ``docs/algorithms.md`` §1 for the contract.

In words:

* **Exact optimum (Algorithm 1, `optimal_probabilities`).** Sort the norms
  ascending, ``a_(1) ≤ … ≤ a_(n)``, with prefix sums ``S_k = Σ_{j≤k} a_(j)``.
  Take the largest ``k`` with ``0 < m - n + k ≤ S_k / a_(k)``. The ``n - k``
  largest clients upload surely (``p = 1``); the others share the remaining
  budget ``m - n + k`` in proportion to their norms,
  ``p_(j) = (m - n + k) · a_(j) / S_k``. Equivalently ("water filling")
  ``p_i = min(1, a_i / λ)`` with the threshold ``λ > 0`` for which the
  probabilities sum to ``m``.
* **Secure-aggregation approximation (Algorithm 2,
  `approximate_optimal_probabilities`).** Only sums reach the server. First
  every client sets ``p_i = min(1, m · a_i / Σ_j a_j)``. Then, for at most
  ``max_rescaling_steps`` (the paper's ``j_max``) steps, the server learns the
  number ``I`` of clients with ``p_i < 1`` and their total probability ``P``,
  and broadcasts ``C = (m - n + I) / P`` (``n - I`` clients already upload
  surely, so the others must sum to ``m - n + I``); clients below one set
  ``p_i = min(1, C · p_i)``. It stops when ``I = 0`` or ``C ≤ 1``.
* **Improvement factor (`improvement_factor`).** The variance of the chosen
  probabilities divided by that of uniform ``p_i = m / n``:
  ``α = Σ (1 - p_i)/p_i · a_i² / Σ (1 - m/n)/(m/n) · a_i²``; ``α = 0`` is as
  good as full participation, ``α = 1`` no better than uniform.
* **Several models (MMFL, ``docs/algorithms.md`` §5; `multi_model_probabilities`,
  `approximate_multi_model_probabilities`).** ``S`` models, each client trains
  at most one: the optimum is the single-model one on the row sums
  ``M_i = Σ_s Ũ_{i,s}``, split across models in proportion to ``Ũ_{i,s}``; the
  secure version runs Algorithm 2 on ``M`` and splits locally.

Every function has a NumPy version (float64) and a TensorFlow twin (``*_tf``,
float32 or float64 tensors of shape ``[n]``, or ``[N, S]`` for the multi-model
functions) with the same arithmetic, usable
inside ``tf.function`` and ``tff.tensorflow.computation``: no Python branching
on tensor values, and the rescaling loop is unrolled over
``max_rescaling_steps`` with later steps multiplying by one. The twins compute
in float64 and return the input's dtype, so they agree with NumPy to ~1e-15
(float64) or to float32 rounding (float32).

Conventions and choices (beyond the paper, which takes integer ``m`` and
positive norms):

* ``expected_clients`` may be any positive real: nothing in either algorithm
  needs an integer budget, and a fractional ``m`` is a finer knob on uplink.
* **Zero norms.** A client with ``a_i = 0`` gets ``p_i = 0`` always, also when
  ``m ≥ n``: its update contributes nothing to ``G``, the water-filling
  solution ``min(1, 0 / λ)`` is zero, Algorithm 2's first step gives it
  ``min(1, m · 0 / A) = 0``, and uploading it would only spend uplink. Hence
  ``Σ_i p_i = min(m, #{a_i > 0})``: when at most ``m`` norms are non-zero every
  non-zero client gets ``p_i = 1``. With all norms positive, ``m ≥ n`` gives
  full participation, ``p_i = 1`` for all.
* **Zero norms in Algorithm 2.** They count in ``I`` exactly as the protocol
  says (such a client sends ``([p_i<1] p_i, [p_i<1]) = (0, 1)``). That is
  correct, not a compromise: ``n - I`` must count the clients at ``p = 1``,
  and zero-norm clients are not among them; their zero probability adds
  nothing to ``P``. When every client below one has ``p_i = 0`` (``P = 0``),
  rescaling cannot change anything and the loop stops (**[choice]** of §1b:
  test first, guard ``P = 0``; the authors' code divides by zero there).
* With ``max_rescaling_steps ≥ n`` Algorithm 2 returns Algorithm 1's
  probabilities (to rounding): every step either clips at least one more
  client to one or reaches ``Σ p = m``. Before that, the iterate ``p^(j)`` after
  step ``j`` satisfies ``p^(j) ≤ p^(j+1) ≤ p*`` elementwise (``p*`` exact), hence
  ``Σ p^(j) ≤ min(m, #{a_i > 0})`` and a variance at least the optimum's. Proof:
  the iterate is ``min(1, γ_j a_i)`` with ``γ_0 = m / A`` and
  ``γ_{j+1} = (m - |clipped_j|) / Σ_{unclipped_j} a_i``; since
  ``m = Σ min(1, a_i/λ) ≤ |clipped_j| + Σ_{unclipped_j} a_i / λ``, every
  ``γ_j ≤ 1/λ`` (also ``γ_0``, taking ``clipped = ∅``), and a client clipped
  at step ``j`` has ``a_i / λ ≥ γ_j a_i ≥ 1``. (With ``#{a_i > 0} ≤ m``, ``p*``
  is one on every non-zero client and the bound is immediate.) Steps to
  converge: at most the number of clients clipped after the first step, plus
  one, which is at most ``n``.
* ``rescaling_steps_used`` counts the steps that rescaled by a factor
  ``C > 1 + sqrt(eps)`` (float64 eps, so 1.5e-8). Once ``Σ p = m`` holds,
  rounding in ``P`` leaves ``C`` a few ulps off one; such steps move probabilities by
  ~1e-16 and are not counted (they are applied, as §1b's arithmetic says).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, TypeAlias

import numpy as np
import tensorflow as tf

_FLOAT_DTYPES = (tf.float32, tf.float64)
# The TF twins compute in float64 whatever the input dtype: a float32 cumulative
# sum over n norms drifts by ~n ulps, which would move float32 results by more
# than 1e-6 from NumPy's. These are O(n) vector operations, cheap in float64.
_COMPUTE_DTYPE = tf.float64
# A rescaling factor within this of one is rounding noise in the sum P once
# Σ p = m holds (float64 sums of n terms err by far less for any realistic n);
# such a step moves probabilities by ~1e-16 and is not counted as a step used.
_NEGLIGIBLE_RESCALING = float(np.sqrt(np.finfo(np.float64).eps))

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


# ---------------------------------------------------------------------------
# Input checks.


def _check_norms(weighted_norms) -> np.ndarray:
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


def _check_expected_clients(expected_clients) -> float:
  """Returns ``m`` as a float, or raises ValueError unless it is finite and positive."""
  if isinstance(expected_clients, (bool, np.bool_)) or not isinstance(
    expected_clients, numbers.Real
  ):
    raise ValueError(f'expected_clients must be a positive real number, got {expected_clients!r}.')
  value = float(expected_clients)
  if not (np.isfinite(value) and value > 0):
    raise ValueError(f'expected_clients must be finite and positive, got {expected_clients!r}.')
  return value


def _check_max_rescaling_steps(max_rescaling_steps) -> int:
  if isinstance(max_rescaling_steps, (bool, np.bool_)) or not isinstance(
    max_rescaling_steps, numbers.Integral
  ):
    raise ValueError(
      f'max_rescaling_steps must be a non-negative integer, got {max_rescaling_steps!r}.'
    )
  if max_rescaling_steps < 0:
    raise ValueError(f'max_rescaling_steps must be non-negative, got {max_rescaling_steps!r}.')
  return int(max_rescaling_steps)


def _check_probabilities(probabilities, norms: np.ndarray) -> np.ndarray:
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


# ---------------------------------------------------------------------------
# NumPy.


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
  norms = _check_norms(weighted_norms)
  m = _check_expected_clients(expected_clients)
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
) -> RescaledProbabilities:
  """Algorithm 2's probabilities (secure-aggregation compatible) and steps used.

  The arithmetic of the two-phase protocol of ``docs/algorithms.md`` §1b, computed in
  one place: ``p_i = min(1, m · a_i / A)`` with ``A = Σ a_j`` (zero if
  ``A = 0``), then up to ``max_rescaling_steps`` (``j_max``) steps of
  ``I = #{p_i < 1}``, ``P = Σ_{p_i<1} p_i``, ``C = (m - n + I) / P``; stop if
  ``I = 0``, ``P = 0`` or ``C ≤ 1``, else ``p_i = min(1, C · p_i)`` for
  ``p_i < 1``. Zero-norm clients count in ``I`` as in the protocol (see the
  module docstring for why that is right).

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
  norms = _check_norms(weighted_norms)
  m = _check_expected_clients(expected_clients)
  steps = _check_max_rescaling_steps(max_rescaling_steps)
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
    steps_used += int(factor > 1 + _NEGLIGIBLE_RESCALING)
    if np.array_equal(rescaled, probs):
      break  # Deterministic: every later step would compute the same no-op.
    probs = rescaled
  return RescaledProbabilities(probs, steps_used)


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
  norms = _check_norms(weighted_norms)
  probs = _check_probabilities(probabilities, norms)
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
  norms = _check_norms(weighted_norms)
  m = _check_expected_clients(expected_clients)
  return _relative_to_uniform(sampling_variance(norms, probabilities), m / norms.size, norms)


def _relative_to_uniform(variance: float, uniform: float, norms: np.ndarray) -> float:
  """``variance`` over the variance of probability `uniform` everywhere (0 if
  that has none: ``uniform ≥ 1`` or all norms 0)."""
  uniform_variance = (1 - uniform) / uniform * np.sum(norms**2)
  if uniform >= 1 or uniform_variance == 0:
    return 0.0
  return float(variance / uniform_variance)


# ---------------------------------------------------------------------------
# TensorFlow twins.


def _norms_tensor(weighted_norms: TensorLike, validate: bool, rank: int = 1) -> tf.Tensor:
  """The norms as a float tensor of `rank` 1 (``[n]``) or 2 (``[N, S]``), with
  run-time checks if `validate`."""
  norms = tf.convert_to_tensor(weighted_norms)
  if norms.dtype not in _FLOAT_DTYPES:
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


def _expected_clients_tensor(expected_clients, dtype: tf.DType) -> tf.Tensor:
  if isinstance(expected_clients, (tf.Tensor, tf.Variable)):
    return tf.cast(expected_clients, dtype)
  return tf.constant(_check_expected_clients(expected_clients), dtype)


def optimal_probabilities_tf(
  weighted_norms: TensorLike, expected_clients: float | tf.Tensor, *, validate: bool = True
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
  input_norms = _norms_tensor(weighted_norms, validate)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  dtype = _COMPUTE_DTYPE
  m = _expected_clients_tensor(expected_clients, dtype)
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
  weighted_norms: TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> RescaledProbabilities:
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
  input_norms = _norms_tensor(weighted_norms, validate)
  steps = _check_max_rescaling_steps(max_rescaling_steps)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  dtype = _COMPUTE_DTYPE
  m = _expected_clients_tensor(expected_clients, dtype)
  n = tf.cast(tf.size(norms), dtype)
  ones = tf.ones_like(norms)
  # divide_no_nan: all-zero norms give p = 0, as in the NumPy version.
  probs = tf.minimum(ones, tf.math.divide_no_nan(m * norms, tf.reduce_sum(norms)))
  negligible = tf.constant(_NEGLIGIBLE_RESCALING, dtype)
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
  return RescaledProbabilities(tf.cast(probs, input_norms.dtype), steps_used)


def approximate_optimal_probabilities_tf(
  weighted_norms: TensorLike,
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


def sampling_variance_tf(weighted_norms: TensorLike, probabilities: TensorLike) -> tf.Tensor:
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
  input_norms = _norms_tensor(weighted_norms, validate=False)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  probs = tf.cast(probabilities, _COMPUTE_DTYPE)
  positive = norms > 0
  # The unselected branch may divide by zero; tf.where discards it.
  terms = tf.where(positive, (1 - probs) / probs * tf.square(norms), tf.zeros_like(norms))
  return tf.cast(tf.reduce_sum(terms), input_norms.dtype)


def improvement_factor_tf(
  weighted_norms: TensorLike, probabilities: TensorLike, expected_clients: float | tf.Tensor
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
  input_norms = _norms_tensor(weighted_norms, validate=False)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  m = _expected_clients_tensor(expected_clients, _COMPUTE_DTYPE)
  variance = sampling_variance_tf(norms, probabilities)
  uniform = m / tf.cast(tf.size(norms), _COMPUTE_DTYPE)
  uniform_variance = (1 - uniform) / uniform * tf.reduce_sum(tf.square(norms))
  degenerate = (uniform >= 1) | (uniform_variance <= 0)
  alpha = tf.where(
    degenerate, tf.zeros_like(variance), tf.math.divide_no_nan(variance, uniform_variance)
  )
  return tf.cast(alpha, input_norms.dtype)


# ---------------------------------------------------------------------------
# Several models at once (docs/algorithms.md §5, MMFL).
#
# ``S`` models train over the same ``N`` clients and each client trains at
# most one model per round. Client ``i`` trains model ``s`` with probability
# ``p_{s|i}`` (and none with ``1 - Σ_s p_{s|i}``); model ``s``'s server forms
# ``G_s = Σ_i 1[i trains s] / p_{s|i} · d_{i,s} U_{i,s}``, unbiased for
# ``Σ_i d_{i,s} U_{i,s}``. Within one ``G_s`` the indicators of different
# clients are independent, so ``E‖G_s - Σ_i d_{i,s} U_{i,s}‖² =
# Σ_i (1 - p_{s|i}) / p_{s|i} · Ũ_{i,s}²`` with ``Ũ_{i,s} = d_{i,s} ‖U_{i,s}‖``,
# and the total over models is ``Σ_{i,s} Ũ_{i,s}² / p_{s|i} - Σ_{i,s} Ũ_{i,s}²``.
# `multi_model_probabilities` minimises it (derivation in its docstring);
# `approximate_multi_model_probabilities` is the secure-aggregation version.


def _check_norm_matrix(weighted_norms) -> np.ndarray:
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
  _check_norms(norms.ravel())  # Finite and non-negative, with its messages.
  return norms


def _check_multi_model_probabilities(probabilities, norms: np.ndarray) -> np.ndarray:
  """`_check_probabilities` for ``[N, S]``, naming (client, model) pairs with ``p = 0``."""
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
  return _check_probabilities(probs, norms)


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
  norms = _check_norm_matrix(weighted_norms)
  totals = np.sum(norms, axis=1)
  return _split_across_models(optimal_probabilities(totals, expected_clients), norms, totals)


def approximate_multi_model_probabilities_with_info(
  weighted_norms, expected_clients: float, max_rescaling_steps: int
) -> RescaledProbabilities:
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
  norms = _check_norm_matrix(weighted_norms)
  totals = np.sum(norms, axis=1)
  info = approximate_optimal_probabilities_with_info(totals, expected_clients, max_rescaling_steps)
  return RescaledProbabilities(
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
  norms = _check_norm_matrix(weighted_norms)
  probs = _check_multi_model_probabilities(probabilities, norms)
  return sampling_variance(norms.ravel(), probs.ravel())


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
  norms = _check_norm_matrix(weighted_norms)
  m = _check_expected_clients(expected_clients)
  num_clients, num_models = norms.shape
  return _relative_to_uniform(
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
  weighted_norms: TensorLike, expected_clients: float | tf.Tensor, *, validate: bool = True
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
  input_norms = _norms_tensor(weighted_norms, validate, rank=2)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  totals = tf.reduce_sum(norms, axis=1)
  client_probs = optimal_probabilities_tf(totals, expected_clients, validate=False)
  return tf.cast(_split_across_models_tf(client_probs, norms, totals), input_norms.dtype)


def approximate_multi_model_probabilities_with_info_tf(
  weighted_norms: TensorLike,
  expected_clients: float | tf.Tensor,
  max_rescaling_steps: int,
  *,
  validate: bool = True,
) -> RescaledProbabilities:
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
  input_norms = _norms_tensor(weighted_norms, validate, rank=2)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  totals = tf.reduce_sum(norms, axis=1)
  info = approximate_optimal_probabilities_with_info_tf(
    totals, expected_clients, max_rescaling_steps, validate=False
  )
  probs = _split_across_models_tf(info.probabilities, norms, totals)
  return RescaledProbabilities(tf.cast(probs, input_norms.dtype), info.rescaling_steps_used)


def approximate_multi_model_probabilities_tf(
  weighted_norms: TensorLike,
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
  weighted_norms: TensorLike, probabilities: TensorLike
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
  norms = _norms_tensor(weighted_norms, validate=False, rank=2)
  return sampling_variance_tf(tf.reshape(norms, [-1]), tf.reshape(probabilities, [-1]))


def multi_model_improvement_factor_tf(
  weighted_norms: TensorLike, probabilities: TensorLike, expected_clients: float | tf.Tensor
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
  input_norms = _norms_tensor(weighted_norms, validate=False, rank=2)
  norms = tf.cast(input_norms, _COMPUTE_DTYPE)
  m = _expected_clients_tensor(expected_clients, _COMPUTE_DTYPE)
  variance = multi_model_sampling_variance_tf(norms, probabilities)
  shape = tf.cast(tf.shape(norms), _COMPUTE_DTYPE)
  uniform = tf.minimum(m, shape[0]) / (shape[0] * shape[1])
  uniform_variance = (1 - uniform) / uniform * tf.reduce_sum(tf.square(norms))
  degenerate = (uniform >= 1) | (uniform_variance <= 0)
  alpha = tf.where(
    degenerate, tf.zeros_like(variance), tf.math.divide_no_nan(variance, uniform_variance)
  )
  return tf.cast(alpha, input_norms.dtype)
