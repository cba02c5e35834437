"""The multi-model process's assignment: which model each client trains this round, from the
clients' signals (update norms or losses) by the exact or the secure (sums only) optimum, or
at random / round robin; with the variance measurements of that choice."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import probabilities
from tff_sampling.aggregators import protocol
from tff_sampling.learning import multi_model_types


class _Assignment(NamedTuple):
  """One round's assignment, as federated values."""

  cohort_size: Any  # int32@SERVER, N.
  size: Any  # float32@SERVER, N.
  info: Any  # <signal, total, clipped, non_finite>@CLIENTS (`_client_signal_computation`).
  phases: protocol.FederatedProbabilities  # Of M_i (or of no signal: `_uniform_phases`).
  choice: Any  # <selected, factor, probability, marginal>@CLIENTS (`_client_choice_computation`).


class _AssignmentAggregator(NamedTuple):
  """The server's side of a round (`build_assignment_aggregator`)."""

  assign: Callable[..., _Assignment]  # (round, values, meta) -> _Assignment.
  # (_Assignment, updates) -> (S sums of weighted updates, measurements), all @SERVER.
  aggregate: Callable[..., tuple[list[Any], Any]]


def build_assignment_aggregator(
  num_models: int,
  config: multi_model_types.Sampling,
  *,
  expected_clients: float,
  max_rescaling_steps: int,
  seed: int,
  norm_bound: float,
) -> _AssignmentAggregator:
  """The assignment aggregator: probabilities, draws, per-model sums and measurements.

  ``assign`` counts the cohort, clips each client's ``M_i``, runs
  `protocol.federated_probabilities` on it (or gives every client ``min(1,
  m/N)`` without a signal) and lets each client draw its model; ``aggregate``
  sums each model's weighted updates and the measurements, through secure sums
  for the secure samplings (`protocol.sum_counts`, `protocol.sum_floats`).
  """
  m, steps, secure = expected_clients, max_rescaling_steps, config.secure
  uses_signal = config.from_signal
  client_signal = _client_signal_computation(norm_bound)
  client_choice = _client_choice_computation(num_models, config.assignment, seed)
  extra_scalars = 4 + num_models + 1  # Cohort count, 3 flags, upload bits, Σp.
  if uses_signal:  # M_i for Σ M_i; the two variance terms; M_i gathered, or (P, I) per step.
    extra_scalars += 1 + 2 + (1 if config.assignment == 'exact' else 2 * steps)

  def assign(round_num, values, meta) -> _Assignment:
    cohort_size = protocol.sum_counts(
      tff.federated_value(multi_model_types.COUNT(1), tff.CLIENTS), secure
    )
    size = tff.federated_map(
      tff.tensorflow.computation(lambda n: tf.cast(n, multi_model_types.FLOAT)), cohort_size
    )
    info = tff.federated_map(client_signal, (meta, tff.federated_zip(tuple(values))))
    if uses_signal:
      phases = protocol.federated_probabilities(
        info.total,
        size,
        expected_clients=m,
        mode=config.assignment,
        max_rescaling_steps=steps,
        secure=secure,
        norm_bound=norm_bound,
      )
    else:
      phases = _uniform_phases(size, m)
    choice = tff.federated_map(
      client_choice, (meta, info.signal, phases.probability, tff.federated_broadcast(round_num))
    )
    return _Assignment(cohort_size, size, info, phases, choice)

  def aggregate(assignment: _Assignment, updates):
    sums = [tff.federated_sum(update.update) for update in updates]
    counts = _sum_counts(assignment, updates, secure)
    measurements = collections.OrderedDict(
      cohort_size=assignment.cohort_size,
      uploads=counts.uploads,
      expected_uploads=protocol.sum_floats(assignment.choice.probability, 1.0, secure),
      rescaling_steps=assignment.phases.rescaling_steps,
      full_participation=assignment.phases.full_participation,
    )
    if uses_signal:
      measurements.update(
        _variance_measurements(
          assignment,
          expected_clients=m,
          num_models=num_models,
          max_rescaling_steps=steps,
          exact=config.assignment == 'exact',
          secure=secure,
        )
      )
    for name in ('clipped_signals', 'non_finite_signals', 'non_finite_updates'):
      measurements[name] = counts[name]
    measurements['extra_scalars_per_client'] = tff.federated_value(
      multi_model_types.COUNT(extra_scalars), tff.SERVER
    )
    return sums, tff.federated_zip(measurements)

  return _AssignmentAggregator(assign, aggregate)


def _uniform_phases(size, m: float) -> protocol.FederatedProbabilities:
  """Every client takes part with probability ``min(1, m/N)``; no client value needed."""
  probability = tff.federated_broadcast(
    tff.federated_map(
      tff.tensorflow.computation(lambda n: tf.minimum(1.0, m / tf.maximum(n, 1.0))), size
    )
  )
  full_participation = tff.federated_map(
    tff.tensorflow.computation(lambda n: tf.cast(m >= n, multi_model_types.FLOAT)), size
  )
  return protocol.FederatedProbabilities(
    probability=probability,
    norm_sum=None,
    rescaling_steps=tff.federated_value(multi_model_types.COUNT(0), tff.SERVER),
    full_participation=full_participation,
    water_level=None,
    all_norms=None,
  )


def _client_signal_computation(norm_bound: float) -> tff.Computation:
  """``(meta, values) -> <signal, total, clipped, non_finite>``: ``Ũ_{i,·}`` and ``M_i``.

  ``values`` are the raw per-model values (norms, or ``[1]``-shaped losses); a
  non-finite one counts as zero, and ``M_i`` is clipped to `norm_bound`.
  """

  @tff.tensorflow.computation
  def client_signal(meta, values):
    raw = meta['shares'] * tf.reshape(tf.stack(values), [-1])
    finite = tf.math.is_finite(raw)
    signal = tf.where(finite, raw, 0.0)
    total = tf.reduce_sum(signal)
    return collections.OrderedDict(
      signal=signal,
      total=tf.minimum(total, norm_bound),
      clipped=tf.cast(total > norm_bound, multi_model_types.COUNT),
      non_finite=tf.cast(tf.reduce_any(tf.logical_not(finite)), multi_model_types.COUNT),
    )

  return client_signal


def _client_choice_computation(num_models: int, assignment: str, seed: int) -> tff.Computation:
  """``(meta, Ũ_{i,·}, p_i, round) -> <selected, factor, probability, marginal>``.

  The client's ``p_{s|i}`` (by `assignment`), its draw (``stateless_uniform``
  seeded by (seed, round, client)), the upload weight ``factor = d_{i,s} /
  p_{s|i}`` of the model it chose, ``Σ_s p_{s|i}`` and the marginals.
  """

  @tff.tensorflow.computation(
    multi_model_types.meta_type(num_models),
    tff.TensorType(multi_model_types.FLOAT, [num_models]),
    tff.TensorType(multi_model_types.FLOAT),
    tff.TensorType(np.int64),
  )
  def client_choice(meta, signal, probability, round_num):
    shares = meta['shares']
    has_data = shares > 0.0
    index = tf.range(num_models)
    if assignment in ('exact', 'approximate'):
      draw = probability * tf.math.divide_no_nan(signal, tf.reduce_sum(signal))
      marginal = draw
    elif assignment == 'random':
      choices = tf.reduce_sum(tf.cast(has_data, multi_model_types.FLOAT))
      draw = tf.where(has_data, probability / tf.maximum(choices, 1.0), 0.0)
      marginal = draw
    else:  # round_robin
      offset = tf.cast(seed % num_models, tf.int64)
      turn = tf.cast(
        (tf.cast(meta['client'], tf.int64) + round_num + offset) % num_models, tf.int32
      )
      draw = tf.where(tf.equal(index, turn) & has_data, probability, 0.0)
      marginal = draw / num_models
    client_seed = tf.random.experimental.stateless_fold_in(
      tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64), round_num),
      tf.cast(meta['client'], tf.int64),
    )
    uniform = tf.random.stateless_uniform([], seed=client_seed, dtype=tf.float32)
    cumulative = tf.cumsum(draw)
    chosen = tf.reduce_sum(tf.cast(cumulative <= uniform, tf.int32))  # num_models: none.
    selected = tf.equal(index, chosen) & (draw > 0.0)
    factor = tf.where(selected, shares / tf.where(selected, marginal, 1.0), 0.0)
    return collections.OrderedDict(
      selected=tf.cast(selected, multi_model_types.COUNT),
      factor=factor,
      probability=tf.reduce_sum(draw),
      marginal=marginal,
    )

  return client_choice


@tff.tensorflow.computation
def _client_counts(info, choice, non_finite_updates):
  """A client's contribution to the count measurements (summed by `aggregate`)."""
  return collections.OrderedDict(
    uploads=choice['selected'],
    clipped_signals=info['clipped'],
    non_finite_signals=info['non_finite'],
    non_finite_updates=tf.add_n(list(non_finite_updates)),
  )


def _sum_counts(assignment: _Assignment, updates, secure: bool):
  """The count measurements @SERVER: `_client_counts` summed over the clients."""
  non_finite_updates = tff.federated_zip(tuple(update.non_finite for update in updates))
  counts = tff.federated_map(
    _client_counts, (assignment.info, assignment.choice, non_finite_updates)
  )
  return protocol.sum_counts(counts, secure)


def _variance_measurements(
  assignment: _Assignment,
  *,
  expected_clients: float,
  num_models: int,
  max_rescaling_steps: int,
  exact: bool,
  secure: bool,
) -> collections.OrderedDict:
  """``improvement_factor`` and, if `exact`, ``secure_variance_ratio`` (see
  `build_multi_model_process`), from two sums of per-client terms."""
  m = expected_clients
  bound = max(1.0, 1.0 / m)

  @tff.tensorflow.computation
  def client_variance_terms(info, choice, norm_sum):
    # Σ_s (1 − p)/p · (Ũ_s/A)² and Σ_s (Ũ_s/A)², each in [0, max(1, 1/m)]
    # (p_{s|i} ≥ m Ũ_s / A below saturation, p_{s|i} = Ũ_s / M_i at it).
    shares = info['signal'] / tf.maximum(norm_sum, 1e-30)
    p = choice['marginal']
    terms = tf.where(p > 0.0, (1.0 - p) / tf.where(p > 0.0, p, 1.0) * shares**2, 0.0)
    return collections.OrderedDict(
      variance=tf.clip_by_value(tf.reduce_sum(terms), 0.0, bound), squares=tf.reduce_sum(shares**2)
    )

  @tff.tensorflow.computation(protocol.FLOAT_TYPE, protocol.FLOAT_TYPE, protocol.FLOAT_TYPE)
  def server_improvement(variance, squares, size):
    uniform = tf.minimum(m, size) / tf.maximum(size * num_models, 1.0)
    denominator = (1.0 - uniform) / uniform * squares
    return tf.where(
      denominator > 0.0, variance / tf.where(denominator > 0.0, denominator, 1.0), 0.0
    )

  @tff.tensorflow.computation(
    tff.TensorType(multi_model_types.FLOAT, [None]), tff.TensorType(multi_model_types.FLOAT)
  )
  def server_secure_variance_ratio(totals, squares_sum):
    # Variance with the proportional split: Σ_i M_i²/p_i − Σ_{i,s} Ũ², all
    # scaled by 1/A² (squares_sum arrives scaled).
    totals = tf.cast(totals, tf.float64)
    scaled = totals / tf.maximum(tf.reduce_sum(totals), 1e-300)

    def variance(p):
      return tf.reduce_sum(tf.math.divide_no_nan(scaled**2, p)) - tf.cast(squares_sum, tf.float64)

    optimum = variance(probabilities.optimal_probabilities_tf(scaled, m, validate=False))
    ratios = [
      variance(probabilities.approximate_optimal_probabilities_tf(scaled, m, j, validate=False))
      for j in range(max_rescaling_steps + 1)
    ]
    return tf.cast(tf.math.divide_no_nan(tf.stack(ratios), optimum), multi_model_types.FLOAT)

  terms = protocol.sum_floats(
    tff.federated_map(
      client_variance_terms,
      (assignment.info, assignment.choice, tff.federated_broadcast(assignment.phases.norm_sum)),
    ),
    bound,
    secure,
  )
  measurements = collections.OrderedDict(
    improvement_factor=tff.federated_map(
      server_improvement, (terms.variance, terms.squares, assignment.size)
    )
  )
  if exact:
    measurements['secure_variance_ratio'] = tff.federated_map(
      server_secure_variance_ratio, (assignment.phases.all_norms, terms.squares)
    )
  return measurements
