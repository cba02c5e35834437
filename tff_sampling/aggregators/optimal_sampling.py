"""Optimal client sampling as a TFF aggregator (Chen, Horváth, Richtárik, TMLR 2022): every
cohort client has its update; each uploads with probability ``p_i``, chosen from sums only
(the two-phase secure-sum protocol, Algorithm 2) in ONE federated computation, and the server
forms the unbiased ``Σ ζ_i (w_i / p_i) U_i / Σ w_i``. The protocol, its secure sums and their
quantisation are ``docs/algorithms.md`` §1b; the modes, inner factories, measurements and
uplink accounting ``docs/optimal_sampling.md``."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling.aggregators import inner_factories
from tff_sampling.aggregators import protocol
from tff_sampling.aggregators import secure_context

Mode = protocol.Mode
MODES = protocol.MODES

_COUNT = protocol.COUNT
_FLOAT_TYPE = protocol.FLOAT_TYPE


def _global_norm(value) -> tf.Tensor:
  return tf.linalg.global_norm([tf.cast(t, tf.float32) for t in tf.nest.flatten(value)])


def _all_finite(value) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tf.nest.flatten(value)])


class _ClientPhase(NamedTuple):
  """What `OptimalSamplingFactory._client_phase` returns."""

  info: Any  # <norm, weight, clipped_norm, clipped_weight, non_finite, one>@CLIENTS.
  counts: Any  # <cohort_size, clipped_norms, clipped_weights, non_finite_updates>@SERVER.
  cohort_size: Any  # float32@SERVER, n.
  weight_sum: Any  # float32@SERVER, W.


class _UploadPhase(NamedTuple):
  """What `OptimalSamplingFactory._upload_phase` returns."""

  result: Any  # V@SERVER, G.
  upload_count: Any  # int32@SERVER.
  inner: Any  # The inner process's MeasuredProcessOutput.
  uploaders: Any  # int64[?]@SERVER, the uploaders' update fingerprints (or None).


class OptimalSamplingFactory(tff.aggregators.WeightedAggregationFactory):
  """Aggregates client updates with optimal (variance-minimising) client sampling.

  Plugs into TFF's learning algorithms as the model aggregator::

      tff.learning.algorithms.build_weighted_fed_avg(
          model_fn, client_optimizer_fn, server_optimizer_fn,
          model_aggregator=OptimalSamplingFactory(expected_clients=3))

  The created process has the type signature
  ``(<S@SERVER, {V}@CLIENTS, {float32}@CLIENTS> -> <state=S@SERVER,
  result=V@SERVER, measurements=M@SERVER>)`` where ``V`` is the update type and
  ``M`` an `OrderedDict` with keys:

  * ``uploads``: clients that uploaded their update this round.
  * ``expected_uploads``: ``Σ p_i`` (``m``, or fewer when fewer clients have a
    non-zero update).
  * ``cohort_size``: ``n``.
  * ``rescaling_steps``: rescaling steps that changed the probabilities
    (``approximate``; 0 otherwise).
  * ``improvement_factor``: ``α`` of §1c (0: as good as full participation,
    1: no better than uniform; 0 when ``m ≥ n``).
  * ``full_participation``: 1 if ``m ≥ n`` forced ``p_i = 1`` (for every
    client with a non-zero update).
  * ``clipped_norms``, ``clipped_weights``: clients whose ``a_i``/``w_i``
    exceeded the secure-sum range.
  * ``non_finite_updates``: clients whose update was non-finite (not uploaded).
  * ``extra_scalars_per_client``: scalars each cohort client uploaded besides
    its model update (counted in ``docs/optimal_sampling.md``).
  * ``inner``: the inner factory's measurements.
  * ``uploader_fingerprints`` (with ``report_uploaders``): ``int64[uploads]``, each
    uploaded update's fingerprint (`protocol.update_fingerprint`), in no set order:
    which clients uploaded, as the server of the protocol sees it (the round loop
    times a round's uploads from it; ``docs/devices.md``).
  """

  def __init__(
    self,
    expected_clients: float,
    *,
    max_rescaling_steps: int = 4,
    mode: str = Mode.APPROXIMATE,
    secure: bool | None = None,
    seed: int = 0,
    norm_bound: float = 1e6,
    weight_bound: float = 1e6,
    inner_factory: tff.aggregators.UnweightedAggregationFactory | None = None,
    scalar_sums: protocol.ScalarSums | None = None,
    report_uploaders: bool = False,
  ):
    """Configures the protocol.

    Args:
      expected_clients: ``m``, the expected number of uploads per round (> 0;
        need not be an integer).
      max_rescaling_steps: ``j_max``, the rescaling steps unrolled in the
        computation (≥ 0; ``approximate`` only).
      mode: One of `MODES` (``docs/optimal_sampling.md`` describes each).
      secure: Picks the default `scalar_sums`: secure (``True``, the default)
        or plain (``False``). Secure sums are not allowed with
        ``mode='exact'``, which reveals individual norms.
      seed: Root of the Bernoulli draws (mixed with the round counter).
      norm_bound: Upper end of the secure-sum range of ``a_i = w_i ‖U_i‖``.
      weight_bound: Upper end of the secure-sum range of the weights ``w_i``.
      inner_factory: Sums the weighted updates (default `tff.aggregators.SumFactory`);
        must return a sum (`tff_sampling.aggregators.inner_factories`).
      scalar_sums: Sums the protocol's and the measurements' client scalars
        (default: picked by `secure`, which must agree if also given).
      report_uploaders: Also measure ``uploader_fingerprints``.

    Raises:
      ValueError: For a non-positive `expected_clients`, a negative
        `max_rescaling_steps`, an unknown `mode`, secure sums with ``exact``,
        `secure` contradicting `scalar_sums`, or non-positive bounds.
      TypeError: For an `inner_factory` that does not return the sum of its
        client values (e.g. a mean), naming what is accepted, or a
        `scalar_sums` that is not a `ScalarSums`.
    """
    if not np.isfinite(expected_clients) or expected_clients <= 0:
      raise ValueError(f'expected_clients must be a positive number, got {expected_clients!r}.')
    if (
      not isinstance(max_rescaling_steps, (int, np.integer))
      or isinstance(max_rescaling_steps, bool)
      or max_rescaling_steps < 0
    ):
      raise ValueError(
        f'max_rescaling_steps must be a non-negative integer, got {max_rescaling_steps!r}.'
      )
    if mode not in MODES:
      raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
    scalar_sums = protocol.resolve_scalar_sums(secure, scalar_sums)
    if mode == Mode.EXACT and scalar_sums.secure:
      raise ValueError(
        "mode='exact' collects every client's norm, which secure aggregation "
        "forbids; pass secure=False, or use mode='approximate'."
      )
    for name, bound in (('norm_bound', norm_bound), ('weight_bound', weight_bound)):
      if not np.isfinite(bound) or bound <= 0:
        raise ValueError(f'{name} must be a positive number, got {bound!r}.')
    self._expected_clients = float(expected_clients)
    self._steps = int(max_rescaling_steps) if mode == Mode.APPROXIMATE else 0
    self._mode = mode
    self._scalar_sums = scalar_sums
    self._seed = int(seed)
    self._norm_bound = float(norm_bound)
    self._weight_bound = float(weight_bound)
    if inner_factory is None:
      inner_factory = tff.aggregators.SumFactory()
    inner_factories.check_sum_factory(inner_factory)
    self._inner_factory = inner_factory
    self._report_uploaders = bool(report_uploaders)

  @property
  def secure(self) -> bool:
    """Whether the protocol's scalar sums are secure sums (the process then has some)."""
    return self._scalar_sums.secure

  @property
  def extra_scalars_per_client(self) -> int:
    """Scalars each cohort client uploads besides its model update."""
    # Every mode: the cohort count and three diagnostic flags (clipped norm,
    # clipped weight, non-finite update), the weight, and the upload bit.
    scalars = 4 + 1 + 1
    if self._mode != 'full':
      scalars += 1 + 3  # The norm; Σp and the two improvement-factor sums.
    return scalars + 2 * self._steps

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    """The process whose ``next`` runs one round of ``docs/algorithms.md`` §1b."""
    if not (
      isinstance(weight_type, tff.TensorType)
      and np.issubdtype(weight_type.dtype, np.floating)
      and weight_type.shape == ()
    ):
      raise TypeError(f'Expected a scalar float weight type, got {weight_type}.')
    inner_process = self._inner_factory.create(value_type)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(
        collections.OrderedDict(
          round=tff.federated_value(np.int64(0), tff.SERVER), inner=inner_process.initialize()
        )
      )

    @tff.tensorflow.computation(tff.TensorType(np.int64))
    def server_next_round(round_num):
      return round_num + 1

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      client = self._client_phase(value, weight, value_type, weight_type)
      phases = protocol.federated_probabilities(
        client.info.norm,
        client.cohort_size,
        expected_clients=self._expected_clients,
        mode=self._mode,
        max_rescaling_steps=self._steps,
        norm_bound=self._norm_bound,
        scalar_sums=self._scalar_sums,
      )
      upload = self._upload_phase(
        state, value, client, phases.probability, value_type, inner_process
      )
      measurements = self._measurements(client, phases, upload)
      if upload.uploaders is not None:
        measurements['uploader_fingerprints'] = upload.uploaders
      new_state = tff.federated_zip(
        collections.OrderedDict(
          round=tff.federated_map(server_next_round, state['round']), inner=upload.inner.state
        )
      )
      return tff.templates.MeasuredProcessOutput(
        new_state, upload.result, tff.federated_zip(measurements)
      )

    # Secure sums fail outside TFF's test context: say what to call instead.
    return secure_context.with_secure_sum_hint(
      tff.templates.AggregationProcess(init_fn, next_fn), check=not self._scalar_sums.secure
    )

  def _client_phase(self, value, weight, value_type, weight_type) -> _ClientPhase:
    """Each client's ``a_i = w_i ‖U_i‖`` and ``w_i``; the counts, ``n`` and ``W = Σ w_i``.

    The inputs of ``docs/algorithms.md`` §1b: ``a_i`` is clipped to
    `norm_bound` and ``w_i`` to `weight_bound` (the secure-sum ranges; clipping
    is counted); a non-finite update or weight gives ``a_i = w_i = 0`` (counted).
    """
    norm_bound, weight_bound = self._norm_bound, self._weight_bound

    @tff.tensorflow.computation(value_type, weight_type)
    def client_norm(value, weight):
      finite = _all_finite(value) & tf.math.is_finite(weight)
      weight = tf.cast(weight, tf.float32)
      norm = tf.where(finite, weight * _global_norm(value), 0.0)
      norm = tf.where(tf.math.is_finite(norm), norm, 0.0)
      return collections.OrderedDict(
        norm=tf.minimum(norm, norm_bound),
        weight=tf.where(finite, tf.clip_by_value(weight, 0.0, weight_bound), 0.0),
        clipped_norm=tf.cast(norm > norm_bound, _COUNT),
        clipped_weight=tf.cast(finite & (weight > weight_bound), _COUNT),
        non_finite=tf.cast(tf.logical_not(finite), _COUNT),
        one=tf.constant(1, _COUNT),
      )

    @tff.tensorflow.computation(client_norm.type_signature.result)
    def client_counts(info):
      return collections.OrderedDict(
        cohort_size=info['one'],
        clipped_norms=info['clipped_norm'],
        clipped_weights=info['clipped_weight'],
        non_finite_updates=info['non_finite'],
      )

    info = tff.federated_map(client_norm, (value, weight))
    counts = self._scalar_sums.counts(tff.federated_map(client_counts, info))
    cohort_size = tff.federated_map(
      tff.tensorflow.computation(
        lambda c: tf.cast(c['cohort_size'], tf.float32), counts.type_signature.member
      ),
      counts,
    )
    weight_sum = self._scalar_sums.nonnegative(info.weight, weight_bound)
    return _ClientPhase(info, counts, cohort_size, weight_sum)

  def _upload_phase(
    self, state, value, client: _ClientPhase, probability, value_type, inner_process
  ) -> _UploadPhase:
    """Phase 3 of ``docs/algorithms.md`` §1b: ``G = Σ ζ_i (w_i/p_i) U_i / W``.

    ``ζ_i ~ Bernoulli(p_i)`` is drawn with the seed ``(s_t, f_i)``: the factory's seed mixed
    with the round counter, and the client's update fingerprint (``docs/optimal_sampling.md``);
    `inner_process` sums the uploads.
    """
    base_seed = self._seed

    @tff.tensorflow.computation(tff.TensorType(np.int64))
    def server_round_seed(round_num):
      return tf.stack([tf.constant(base_seed, tf.int64), round_num])

    @tff.tensorflow.computation(
      value_type, client.info.type_signature.member, _FLOAT_TYPE, tff.TensorType(np.int64, [2])
    )
    def client_upload(value, info, probability, round_seed):
      fingerprint = protocol.update_fingerprint(value)
      seed = tf.stack([round_seed[0] * 1_000_003 + round_seed[1], fingerprint])
      uniform = tf.random.stateless_uniform([], seed=seed, dtype=tf.float32)
      upload = (uniform < probability) & (probability > 0.0) & tf.equal(info['non_finite'], 0)
      factor = tf.where(upload, info['weight'] / tf.where(upload, probability, 1.0), 0.0)
      weighted = tf.nest.map_structure(
        lambda t: tf.where(upload, tf.cast(factor, t.dtype) * t, tf.zeros_like(t)), value
      )
      return weighted, tf.cast(upload, _COUNT), fingerprint

    @tff.tensorflow.computation(value_type, _FLOAT_TYPE)
    def server_divide(total, weight_sum):
      return tf.nest.map_structure(
        lambda t: tf.where(
          weight_sum > 0.0, t / tf.cast(tf.maximum(weight_sum, 1e-30), t.dtype), tf.zeros_like(t)
        ),
        total,
      )

    round_seed = tff.federated_map(server_round_seed, state['round'])
    uploads = tff.federated_map(
      client_upload, (value, client.info, probability, tff.federated_broadcast(round_seed))
    )
    inner_output = inner_process.next(state['inner'], uploads[0])
    result = tff.federated_map(server_divide, (inner_output.result, client.weight_sum))
    uploaders = protocol.gather_flagged(uploads[2], uploads[1]) if self._report_uploaders else None
    return _UploadPhase(result, self._scalar_sums.counts(uploads[1]), inner_output, uploaders)

  def _measurements(
    self, client: _ClientPhase, phases: protocol.FederatedProbabilities, upload: _UploadPhase
  ):
    """The measurements of the class docstring, from sums only (but ``uploader_fingerprints``).

    ``expected_uploads = Σ p_i`` and the improvement factor of
    ``docs/algorithms.md`` §1c, ``α = Σ (1−p_i)/p_i·ã_i² / ((1 − m/n)/(m/n)·Σ ã_i²)``
    with ``ã_i = a_i / A`` (the numerator summed ``× m/n`` to lie in [0, 1]).
    """
    m = self._expected_clients

    @tff.tensorflow.computation(
      client.info.type_signature.member, _FLOAT_TYPE, _FLOAT_TYPE, _FLOAT_TYPE
    )
    def client_measurement_terms(info, probability, norm_sum, cohort_size):
      # The variance term (1 − p)/p · ã² with ã = a_i / A, scaled by m/n so that
      # it lies in [0, 1] in every mode: optimal p ≥ min(1, m·ã) gives at most
      # ã/n; uniform p = m/n gives (1 − m/n)·ã².
      share = tf.where(norm_sum > 0.0, info['norm'] / tf.maximum(norm_sum, 1e-30), 0.0)
      rate = tf.minimum(1.0, m / tf.maximum(cohort_size, 1.0))
      variance_term = tf.where(
        probability > 0.0, (1.0 - probability) / tf.maximum(probability, 1e-30) * share**2, 0.0
      )
      return collections.OrderedDict(
        probability=probability,
        scaled_variance=tf.clip_by_value(rate * variance_term, 0.0, 1.0),
        share_squared=share**2,
      )

    @tff.tensorflow.computation(_FLOAT_TYPE, _FLOAT_TYPE, _FLOAT_TYPE)
    def server_improvement_factor(scaled_variance_sum, share_squared_sum, cohort_size):
      # α = Σ (1−p)/p·ã² / ((1 − m/n)/(m/n) · Σ ã²); the numerator arrives × m/n.
      rate = m / tf.maximum(cohort_size, 1.0)
      denominator = (1.0 - rate) * share_squared_sum
      return tf.where(
        (rate < 1.0) & (denominator > 0.0),
        scaled_variance_sum / tf.where(denominator > 0.0, denominator, 1.0),
        0.0,
      )

    if self._mode == 'full':
      expected_uploads = client.cohort_size
      improvement = tff.federated_value(np.float32(0.0), tff.SERVER)
    else:
      terms = tff.federated_map(
        client_measurement_terms,
        (
          client.info,
          phases.probability,
          tff.federated_broadcast(phases.norm_sum),
          tff.federated_broadcast(client.cohort_size),
        ),
      )
      term_sums = self._scalar_sums.floats(terms, 1.0)
      expected_uploads = term_sums.probability
      improvement = tff.federated_map(
        server_improvement_factor,
        (term_sums.scaled_variance, term_sums.share_squared, client.cohort_size),
      )

    return collections.OrderedDict(
      uploads=upload.upload_count,
      expected_uploads=expected_uploads,
      cohort_size=client.counts.cohort_size,
      rescaling_steps=phases.rescaling_steps,
      improvement_factor=improvement,
      full_participation=tff.federated_map(
        tff.tensorflow.computation(lambda f: tf.cast(f, _COUNT), _FLOAT_TYPE),
        phases.full_participation,
      ),
      clipped_norms=client.counts.clipped_norms,
      clipped_weights=client.counts.clipped_weights,
      non_finite_updates=client.counts.non_finite_updates,
      extra_scalars_per_client=tff.federated_value(
        np.int32(self.extra_scalars_per_client), tff.SERVER
      ),
      inner=upload.inner.measurements,
    )
