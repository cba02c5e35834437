"""Tests for tff_sampling/aggregators/optimal_sampling.py."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import tree_analysis
import tensorflow_privacy as tfp

from tff_sampling import probabilities
from tff_sampling.aggregators import OptimalSamplingFactory
from tff_sampling.aggregators import ScalarSums
from tff_sampling.aggregators import SecureScalarSums
from tff_sampling.runtime import tff_context

tff_context.use_secure_sum_simulation()

_VALUE_TYPE = tff.to_type(
  collections.OrderedDict(a=tff.TensorType(np.float32, [3]), b=tff.TensorType(np.float32, [2]))
)
_WEIGHT_TYPE = tff.TensorType(np.float32)


def _values(vectors):
  return [
    collections.OrderedDict(a=np.asarray(v[:3], np.float32), b=np.asarray(v[3:], np.float32))
    for v in vectors
  ]


def _flat(result):
  return np.concatenate([result['a'], result['b']])


def _process(m, **kwargs):
  return OptimalSamplingFactory(m, **kwargs).create(_VALUE_TYPE, _WEIGHT_TYPE)


@pytest.fixture(scope='module')
def built():
  """`_process`, memoised per argument set for the module.

  Building a process and its first call (TFF compiles it then) take seconds each; tests
  that build the identical process share one. The processes are stateless, and the
  arguments passed here are plain values.
  """
  processes = {}

  def get(m, **kwargs):
    key = (m, tuple(sorted(kwargs.items())))
    if key not in processes:
      processes[key] = _process(m, **kwargs)
    return processes[key]

  return get


def _intrinsic_uris(computation):
  uris = []

  def record(node):
    if isinstance(node, building_blocks.Intrinsic):
      uris.append(node.uri)
    return False

  tree_analysis.count(computation.to_building_block(), record)
  return uris


_NON_SECURE = {'federated_sum', 'federated_aggregate', 'federated_mean', 'federated_weighted_mean'}


def test_type_signature_and_measurement_keys(built):
  process = built(3.0)
  signature = process.next.type_signature
  assert signature.parameter[1].placement is tff.CLIENTS
  assert signature.parameter[2].placement is tff.CLIENTS
  assert signature.result.result.placement is tff.SERVER
  assert signature.result.result.member.is_equivalent_to(_VALUE_TYPE)
  measurements = signature.result.measurements.member
  assert [name for name, _ in tff.structure.iter_elements(measurements)] == [
    'uploads',
    'expected_uploads',
    'cohort_size',
    'rescaling_steps',
    'improvement_factor',
    'full_participation',
    'clipped_norms',
    'clipped_weights',
    'non_finite_updates',
    'extra_scalars_per_client',
    'inner',
  ]


def test_secure_computation_has_no_plain_aggregation_of_client_values(built):
  secure_inner = tff.aggregators.SecureSumFactory(1e4)
  uris = _intrinsic_uris(_process(3.0, inner_factory=secure_inner).next)
  assert not _NON_SECURE & set(uris), uris
  assert 'federated_secure_sum_bitwidth' in uris
  # With the default inner factory the model update is the one plain sum.
  uris = _intrinsic_uris(built(3.0).next)
  assert [u for u in uris if u in _NON_SECURE] == ['federated_sum']
  # The check can fail: the non-secure variant aggregates in the clear.
  assert len([u for u in _intrinsic_uris(_process(3.0, secure=False).next) if u in _NON_SECURE]) > 5


@pytest.mark.parametrize('mode', ['approximate', 'exact'])
def test_hand_computed_round(built, mode):
  # U_i = i · (1, 1, 1, 1, 1), w_i = 1, m = 2: a_i = i·√5, A = 21·√5 and
  # p_i = 2i/21 < 1 for i = 1..6, so each uploaded term (w_i/p_i)·U_i equals
  # (21/2)·(1, …, 1) and the aggregate is uploads · 10.5 / W with W = 6.
  process = built(2.0, mode=mode, secure=(mode == 'approximate'))
  output = process.next(process.initialize(), _values([[i] * 5 for i in range(1, 7)]), [1.0] * 6)
  measurements = output.measurements
  np.testing.assert_allclose(_flat(output.result), measurements['uploads'] * 1.75, rtol=1e-6)
  assert measurements['cohort_size'] == 6
  assert measurements['expected_uploads'] == pytest.approx(2.0, abs=1e-5)
  assert measurements['rescaling_steps'] == 0
  # α = Σ(1−p)/p·a² / Σ(1−m/n)/(m/n)·a², with p_i = 2i/21 and m/n = 1/3.
  p = 2 * np.arange(1, 7) / 21
  a = np.arange(1, 7.0)
  expected_alpha = np.sum((1 - p) / p * a**2) / np.sum(2 * a**2)
  assert measurements['improvement_factor'] == pytest.approx(expected_alpha, rel=1e-5)
  assert int(output.state['round']) == 1


def test_measurements_match_numpy_probabilities_with_saturation():
  # One dominant client saturates (p = 1) and a rescaling step is needed.
  rng = np.random.default_rng(0)
  norms = np.array([0.2, 0.5, 0.7, 1.0, 1.3, 9.0])
  vectors = [rng.normal(size=5) for _ in norms]
  vectors = [v / np.linalg.norm(v) * n for v, n in zip(vectors, norms)]
  weights = [1.0, 2.0, 1.0, 3.0, 1.0, 1.0]
  a = norms * np.array(weights)
  for steps in (1, 4):
    process = _process(2.0, max_rescaling_steps=steps)
    measurements = process.next(process.initialize(), _values(vectors), weights).measurements
    p = probabilities.approximate_optimal_probabilities(a, 2.0, steps)
    assert measurements['expected_uploads'] == pytest.approx(p.sum(), rel=1e-5)
    assert measurements['improvement_factor'] == pytest.approx(
      probabilities.improvement_factor(a, p, 2.0), rel=1e-4
    )
  exact = probabilities.optimal_probabilities(a, 2.0)
  assert measurements['expected_uploads'] == pytest.approx(exact.sum(), rel=1e-5)
  assert measurements['rescaling_steps'] >= 1


def test_approximate_with_enough_steps_equals_exact():
  rng = np.random.default_rng(1)
  vectors = rng.lognormal(size=(10, 5)) * rng.lognormal(sigma=1.5, size=(10, 1))
  weights = [float(w) for w in rng.integers(1, 50, size=10)]
  approximate = _process(3.0, max_rescaling_steps=10, seed=5)
  exact = _process(3.0, mode='exact', secure=False, seed=5)
  state_a, state_e = approximate.initialize(), exact.initialize()
  for _ in range(3):  # Same seed and round: same draws wherever p agrees.
    out_a = approximate.next(state_a, _values(vectors), weights)
    out_e = exact.next(state_e, _values(vectors), weights)
    state_a, state_e = out_a.state, out_e.state
    np.testing.assert_allclose(_flat(out_a.result), _flat(out_e.result), rtol=1e-4)
    assert out_a.measurements['uploads'] == out_e.measurements['uploads']
    assert out_a.measurements['improvement_factor'] == pytest.approx(
      out_e.measurements['improvement_factor'], rel=1e-4
    )


def test_uniform_mode_has_improvement_factor_one(built):
  rng = np.random.default_rng(5)
  vectors = rng.normal(size=(8, 5)) * rng.lognormal(sigma=1.5, size=(8, 1))
  process = built(2.0, mode='uniform')
  measurements = process.next(process.initialize(), _values(vectors), [1.0] * 8).measurements
  assert measurements['improvement_factor'] == pytest.approx(1.0, rel=1e-4)
  assert measurements['expected_uploads'] == pytest.approx(2.0, rel=1e-5)


def test_full_mode_is_the_weighted_mean(built):
  rng = np.random.default_rng(2)
  vectors = rng.normal(size=(5, 5))
  weights = [3.0, 1.0, 4.0, 1.0, 5.0]
  process = built(2.0, mode='full')
  output = process.next(process.initialize(), _values(vectors), weights)
  np.testing.assert_allclose(
    _flat(output.result), np.average(vectors, axis=0, weights=weights), rtol=1e-6, atol=1e-7
  )
  assert output.measurements['uploads'] == 5
  assert output.measurements['extra_scalars_per_client'] == 6


def test_expected_clients_at_least_cohort_means_full_participation(built):
  rng = np.random.default_rng(3)
  vectors = rng.normal(size=(4, 5))
  process = built(4.0)
  output = process.next(process.initialize(), _values(vectors), [1.0] * 4)
  assert output.measurements['full_participation'] == 1
  assert output.measurements['uploads'] == 4
  np.testing.assert_allclose(_flat(output.result), vectors.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_non_finite_and_zero_updates():
  vectors = [[1, 2, 3, 4, 5], [np.nan] * 5, [0] * 5, [2, 1, 0, 1, 2]]
  process = _process(1.0)
  output = process.next(process.initialize(), _values(vectors), [1.0] * 4)
  assert output.measurements['non_finite_updates'] == 1
  assert np.all(np.isfinite(_flat(output.result)))
  # Only the two non-zero finite clients can upload (p = 0 for the others).
  assert output.measurements['expected_uploads'] == pytest.approx(1.0, abs=1e-5)
  zeros = process.next(process.initialize(), _values([[0] * 5] * 3), [1.0] * 3)
  assert zeros.measurements['uploads'] == 0
  np.testing.assert_array_equal(_flat(zeros.result), np.zeros(5))


def test_fewer_non_zero_updates_than_m_saturate_without_division_by_zero():
  # 2 non-zero updates, m = 3 < n = 5: both get p = 1, the three zero-norm
  # clients keep p = 0 (< 1, so I = 3 but P = 0): the guard keeps C = 1.
  vectors = [[1, 2, 3, 4, 5], [0] * 5, [2, 1, 0, 1, 2], [0] * 5, [0] * 5]
  weights = [2.0, 1.0, 3.0, 1.0, 1.0]
  process = _process(3.0, max_rescaling_steps=4)
  output = process.next(process.initialize(), _values(vectors), weights)
  assert output.measurements['uploads'] == 2
  assert output.measurements['expected_uploads'] == pytest.approx(2.0, abs=1e-6)
  assert output.measurements['full_participation'] == 0
  np.testing.assert_allclose(
    _flat(output.result), np.average(np.array(vectors, float), axis=0, weights=weights), rtol=1e-6
  )


def test_norms_above_the_bound_are_clipped_and_counted():
  process = _process(1.0, norm_bound=10.0)
  output = process.next(
    process.initialize(), _values([[100, 0, 0, 0, 0], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0]]), [1.0] * 3
  )
  assert output.measurements['clipped_norms'] == 1


@pytest.mark.slow
def test_unbiased_with_the_stated_variance():
  # Monte Carlo over 200 rounds (the Bernoulli draws depend on (seed, round)).
  # Per coordinate, the mean of R draws deviates from the weighted mean by
  # N(0, Var/R); 4.5 standard deviations on 5 coordinates: false alarm < 4e-5.
  # With the variance check below (a normal approximation of skewed squared norms), the
  # whole test's false alarm is 7.1e-5: 142 of 2,000,000 NumPy simulations of these
  # clients' Bernoulli uploads over 200 rounds fail either check (3.3e-5 the mean's).
  rng = np.random.default_rng(4)
  vectors = rng.normal(size=(8, 5)) * rng.lognormal(sigma=1.0, size=(8, 1))
  weights = rng.integers(1, 20, size=8).astype(float)
  a = weights * np.linalg.norm(vectors, axis=1)
  p = probabilities.approximate_optimal_probabilities(a, 2.0, 4)
  truth = np.average(vectors, axis=0, weights=weights)
  w = weights / weights.sum()
  variance = ((1 - p) / p)[:, None] * (w[:, None] * vectors) ** 2  # Per client, coordinate.
  process = _process(2.0, seed=9)
  state = process.initialize()
  draws = []
  for _ in range(200):
    output = process.next(state, _values(vectors), [float(w) for w in weights])
    state = output.state
    draws.append(_flat(output.result))
  draws = np.array(draws)
  standard_error = np.sqrt(variance.sum(axis=0) / len(draws))
  assert np.all(np.abs(draws.mean(axis=0) - truth) <= 4.5 * standard_error)
  # E‖G − μ‖² = Σ (1 − p)/p · w²‖U‖²: the sample mean within 5 standard errors.
  squared = np.sum((draws - truth) ** 2, axis=1)
  expected = probabilities.sampling_variance(w * np.linalg.norm(vectors, axis=1), p)
  assert abs(squared.mean() - expected) <= 5 * squared.std(ddof=1) / np.sqrt(len(draws))


@pytest.mark.parametrize(
  'kwargs,match',
  [
    (dict(expected_clients=0), 'expected_clients must be a positive number, got 0'),
    (dict(expected_clients=-1.5), 'got -1.5'),
    (dict(expected_clients=float('nan')), 'got nan'),
    (
      dict(expected_clients=2, max_rescaling_steps=-1),
      'max_rescaling_steps must be a non-negative integer, got -1',
    ),
    (dict(expected_clients=2, mode='optimal'), "mode must be one of .* got 'optimal'"),
    (dict(expected_clients=2, mode='exact'), "mode='exact' collects every client's norm"),
    (dict(expected_clients=2, norm_bound=0.0), 'norm_bound must be a positive number'),
    (
      dict(expected_clients=2, mode='exact', scalar_sums=SecureScalarSums()),
      "mode='exact' collects every client's norm",
    ),
    (
      dict(expected_clients=2, secure=True, scalar_sums=ScalarSums()),
      'secure=True contradicts scalar_sums',
    ),
  ],
)
def test_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    OptimalSamplingFactory(**kwargs)


# --- Zero norms: p = 0 in every case, m ≥ n included. ---------------------------


@pytest.mark.parametrize('mode', ['approximate', 'exact'])
def test_zero_norm_gets_probability_zero_also_at_full_participation(built, mode):
  # n = 2, m = 2, client 0's update is zero: p = [0, 1] (the NumPy/TF functions
  # say the same), so Σp = 1 and one upload; the result is w_1 U_1 / (w_0 + w_1).
  vectors = [[0] * 5, [1, -2, 3, 0, 4]]
  process = built(2.0, mode=mode, secure=(mode == 'approximate'))
  output = process.next(process.initialize(), _values(vectors), [2.0, 3.0])
  measurements = output.measurements
  assert measurements['full_participation'] == 1
  assert measurements['expected_uploads'] == pytest.approx(1.0, abs=1e-6)
  assert measurements['uploads'] == 1
  np.testing.assert_allclose(
    _flat(output.result), np.array([1, -2, 3, 0, 4]) * 3.0 / 5.0, rtol=1e-6
  )
  np.testing.assert_array_equal(probabilities.optimal_probabilities([0.0, 3.0], 2.0), [0, 1])


@pytest.mark.parametrize('mode', ['uniform', 'full'])
def test_norm_blind_baselines_keep_every_client(built, mode):
  # The baselines do not look at norms: at m ≥ n both clients get p = 1.
  process = built(2.0, mode=mode)
  output = process.next(process.initialize(), _values([[0] * 5, [1, -2, 3, 0, 4]]), [2.0, 3.0])
  assert output.measurements['uploads'] == 2
  np.testing.assert_allclose(
    _flat(output.result), np.array([1, -2, 3, 0, 4]) * 3.0 / 5.0, rtol=1e-6
  )


# --- Inner factories: sums accepted and exact at full participation, means refused. ---

# Four clients, m = n = 4 and every update non-zero: every p_i = 1, so the
# aggregate is exactly Σ w_i T(U_i) / Σ w_i for the transformation T that the
# factory composition applies; each oracle below computes it in float64.
_VECTORS = np.array(
  [
    [0.5, -0.25, 0.25, 0.125, -0.375],
    [1.5, 1.0, -0.5, 0.75, 0.25],
    [-0.5, 2.25, 0.5, -1.0, 0.75],
    [0.25, 0.5, -1.25, 0.5, 0.5],
  ]
)
_WEIGHTS = np.array([1.0, 2.0, 3.0, 4.0])
_M = 4.0
# float32: inputs exact in binary; sums of four products of magnitude < 10
# carry float32 rounding ~1e-6 relative, hence rtol 1e-6 and atol 1e-7.
_RTOL, _ATOL = 1e-6, 1e-7


def _full_participation_round(factory):
  return _round_of(factory.create(_VALUE_TYPE, _WEIGHT_TYPE))


def _round_of(process):
  output = process.next(process.initialize(), _values(_VECTORS), [float(w) for w in _WEIGHTS])
  return _flat(output.result), output.measurements


def _oracle(transformed):
  return (_WEIGHTS[:, None] * transformed).sum(axis=0) / _WEIGHTS.sum()


def _clip_l2(vectors, bound):
  norms = np.linalg.norm(vectors, axis=1, keepdims=True)
  return vectors * np.minimum(1.0, bound / norms)


def test_default_inner_factory_is_the_exact_weighted_mean(built):
  # OptimalSamplingFactory(_M) with the default inner factory (a SumFactory).
  result, measurements = _round_of(built(_M))
  assert measurements['uploads'] == 4
  np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=_RTOL, atol=_ATOL)


def test_clipping_around_the_factory_clips_each_update():
  # clipping_factory(1, ·) projects each U_i on the unit L2 ball before the
  # protocol: clients 1-3 have norms 2.03, 2.67, 1.54 and are clipped.
  assert np.sum(np.linalg.norm(_VECTORS, axis=1) > 1.0) == 3
  factory = tff.aggregators.clipping_factory(1.0, OptimalSamplingFactory(_M))
  result, measurements = _full_participation_round(factory)
  np.testing.assert_allclose(result, _oracle(_clip_l2(_VECTORS, 1.0)), rtol=_RTOL, atol=_ATOL)
  assert measurements['clipped_count'] == 3


def test_zeroing_around_the_factory_zeroes_large_updates_with_p_zero():
  # zeroing_factory(2, ·) zeroes U_i with max |U_ij| > 2: client 2 (2.25).
  # Its zero update gets p = 0 (no upload) while its weight stays in W.
  factory = tff.aggregators.zeroing_factory(2.0, OptimalSamplingFactory(_M))
  result, measurements = _full_participation_round(factory)
  kept = _VECTORS * (np.max(np.abs(_VECTORS), axis=1, keepdims=True) <= 2.0)
  np.testing.assert_allclose(result, _oracle(kept), rtol=_RTOL, atol=_ATOL)
  assert measurements['zeroed_count'] == 1
  assert measurements['zeroing']['uploads'] == 3
  assert measurements['zeroing']['expected_uploads'] == pytest.approx(3.0, abs=1e-6)


def test_secure_sum_inner_factory_equals_the_oracle_to_its_quantisation():
  bound = 20.0
  result, measurements = _full_participation_round(
    OptimalSamplingFactory(_M, inner_factory=tff.aggregators.SecureSumFactory(bound))
  )
  # Each value is quantised over [-bound, bound] to 32 bits (step 2·bound/2³²)
  # and the sum dequantised in float32 (relative 2⁻²⁴ of at most n·bound); both
  # together stay below n·bound·2⁻²² on the sum, divided by W for the mean.
  tolerance = len(_WEIGHTS) * bound * 2.0**-22 / _WEIGHTS.sum()
  np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=0, atol=tolerance)
  assert measurements['inner']['secure_upper_clipped_count'] == 0


def test_dp_sum_inner_factory_without_noise_is_exact_and_clips_the_records():
  from tff_sampling.aggregators import dp_gaussian_sum_factory

  result, _ = _full_participation_round(
    OptimalSamplingFactory(_M, inner_factory=dp_gaussian_sum_factory(0.0, 100.0))
  )
  np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=_RTOL, atol=_ATOL)
  # The query clips each record w_i U_i / p_i (p_i = 1) to L2 norm 1.5.
  result, _ = _full_participation_round(
    OptimalSamplingFactory(_M, inner_factory=dp_gaussian_sum_factory(0.0, 1.5))
  )
  records = _clip_l2(_WEIGHTS[:, None] * _VECTORS, 1.5)
  np.testing.assert_allclose(result, records.sum(axis=0) / _WEIGHTS.sum(), rtol=_RTOL, atol=_ATOL)


def test_dp_sum_inner_factory_adds_noise_of_the_stated_scale_to_the_sum():
  # Noise N(0, (z·C)²) per coordinate on the sum, divided by W = 10: with
  # z = 1, C = 100 the five coordinates of (result − oracle)·W are N(0, 100²).
  # Their mean square is 100²·χ²₅/5; P(χ²₅/5 ∉ [0.01, 6]) = 4.4e-5 (TF's noise
  # is not seeded); without noise the ratio is ~1e-12.
  from tff_sampling.aggregators import dp_gaussian_sum_factory

  result, _ = _full_participation_round(
    OptimalSamplingFactory(_M, inner_factory=dp_gaussian_sum_factory(1.0, 100.0))
  )
  noise = (result - _oracle(_VECTORS)) * _WEIGHTS.sum()
  assert 0.01 <= np.mean(noise**2) / 100.0**2 <= 6.0


def test_clipping_inside_clips_the_scaled_records():
  factory = OptimalSamplingFactory(
    _M, inner_factory=tff.aggregators.clipping_factory(1.5, tff.aggregators.SumFactory())
  )
  result, _ = _full_participation_round(factory)
  records = _clip_l2(_WEIGHTS[:, None] * _VECTORS, 1.5)
  np.testing.assert_allclose(result, records.sum(axis=0) / _WEIGHTS.sum(), rtol=_RTOL, atol=_ATOL)


def test_compression_inner_factory_identity_and_quantised():
  # Below the threshold EncodedSumFactory sums as is: exact.
  result, _ = _full_participation_round(
    OptimalSamplingFactory(
      _M, inner_factory=tff.aggregators.EncodedSumFactory.quantize_above_threshold(8, 1000)
    )
  )
  np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=_RTOL, atol=_ATOL)
  # Above it each client's tensor t = w_i U_i (a or b) is quantised to 2^8 − 1
  # steps over [min t, max t]: error below one step per element, so the mean
  # errs by at most Σ_i (max − min)/255 / W per coordinate (plus float32).
  bits = 8
  result, _ = _full_participation_round(
    OptimalSamplingFactory(
      _M, inner_factory=tff.aggregators.EncodedSumFactory.quantize_above_threshold(bits, 0)
    )
  )
  records = _WEIGHTS[:, None] * _VECTORS
  bound = (
    np.concatenate(
      [
        np.full(width, np.sum(np.ptp(records[:, part], axis=1)) / (2**bits - 1))
        for part, width in ((slice(0, 3), 3), (slice(3, 5), 2))
      ]
    )
    / _WEIGHTS.sum()
  )
  error = np.abs(result - _oracle(_VECTORS))
  assert np.all(error <= bound + 1e-6), (error, bound)
  assert np.any(error > 1e-6)  # It did quantise.


def _dp_mean():
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
    noise_multiplier=0.0, clients_per_round=4.0, clip=100.0
  )


@pytest.mark.parametrize(
  'make_inner,match',
  [
    (tff.aggregators.UnweightedMeanFactory, 'UnweightedMeanFactory returns a mean'),
    (tff.aggregators.MeanFactory, 'MeanFactory is a weighted mean'),
    (_dp_mean, 'NormalizedQuery .* divided by clients_per_round.*dp_gaussian_sum_factory'),
    (
      lambda: tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(0.0, 4.0),
      'NormalizedQuery',
    ),
    (
      lambda: tff.aggregators.clipping_factory(1.0, tff.aggregators.UnweightedMeanFactory()),
      'UnweightedMeanFactory returns a mean .*inside tff.aggregators.clipping_factory',
    ),
    (
      lambda: tff.aggregators.DifferentiallyPrivateFactory(
        tfp.GaussianSumQuery(1.0, 0.0), tff.aggregators.UnweightedMeanFactory()
      ),
      'record aggregation factory',
    ),
    (
      lambda: tff.aggregators.SecureModularSumFactory(2**16),
      'SecureModularSumFactory is not known to return the sum',
    ),
    (
      lambda: tff.aggregators.HadamardTransformFactory(tff.aggregators.UnweightedMeanFactory()),
      'UnweightedMeanFactory returns a mean .*inside tff.aggregators.HadamardTransformFactory',
    ),
    (
      lambda: tff.learning.ddp_secure_aggregator(0.0, 4),
      'returns a mean .*pass the sum they wrap instead.*DistributedDpSumFactory',
    ),
    (
      lambda: tff.learning.compression_aggregator(weighted=False),
      'returns a mean .*EncodedSumFactory.quantize_above_threshold',
    ),
    (lambda: tff.learning.secure_aggregator(weighted=False), 'returns a mean'),
    # The weighted forms (the default) wrap a weighted mean: the advice reaches them too.
    (
      lambda: tff.learning.secure_aggregator(),
      'MeanFactory is a weighted mean .*inside tff.aggregators.clipping_factory.*pass the sum',
    ),
    (
      lambda: tff.learning.compression_aggregator(),
      'weighted mean .*EncodedSumFactory.quantize_above_threshold',
    ),
  ],
)
def test_inner_factories_that_do_not_sum_are_refused(make_inner, match):
  with pytest.raises(TypeError, match=match) as info:
    OptimalSamplingFactory(_M, inner_factory=make_inner())
  assert 'Accepted: tff.aggregators.SumFactory, SecureSumFactory' in str(info.value)


# --- TFF's sum-preserving wrappers and distributed DP, composed underneath. -------------
# Full participation (m >= cohort): the aggregate is deterministic, the weighted mean of
# the updates up to the wrapper's own rounding. _VECTORS are multiples of 1/8 and
# _WEIGHTS integers, so each record w_i U_i is a multiple of 1/8: a discretisation with
# scale 2^10 represents it exactly.


def test_rotations_return_the_sum():
  # Rotate (random signs, then a Hadamard or Fourier transform), sum, rotate back: exact
  # in real arithmetic; in float32 each coordinate of the 8-padded record (|.| <= 9) picks
  # up O(log2(8) * 2^-24 * 9 * 8) ~ 1e-5 at most, far below any fraction of the answer.
  for make in (
    tff.aggregators.HadamardTransformFactory,
    tff.aggregators.DiscreteFourierTransformFactory,
  ):
    result, _ = _full_participation_round(
      OptimalSamplingFactory(_M, inner_factory=make(tff.aggregators.SumFactory()))
    )
    np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=0, atol=1e-5)


def test_discretisation_and_modular_secure_sum_return_the_sum():
  from tensorflow_federated.python.aggregators import discretization
  from tensorflow_federated.python.aggregators import modular_clipping

  plain = discretization.DiscretizationFactory(tff.aggregators.SumFactory(), scale_factor=2.0**10)
  # The secure-aggregation pipeline's shape: integers, summed modulo 2^20 by the secure
  # modular sum inside the modular clipping (the records, 2^10 * |w_i U_i| <= 2^14, wrap
  # nowhere).
  modular = discretization.DiscretizationFactory(
    modular_clipping.ModularClippingSumFactory(
      -(2**19), 2**19, tff.aggregators.SecureModularSumFactory(2**19, symmetric_range=True)
    ),
    scale_factor=2.0**10,
  )
  for inner in (plain, modular):
    result, _ = _full_participation_round(OptimalSamplingFactory(_M, inner_factory=inner))
    np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=_RTOL, atol=_ATOL)


@pytest.mark.slow
def test_distributed_dp_sum_without_noise_returns_the_sum_to_its_quantisation():
  from tensorflow_federated.python.aggregators import distributed_dp

  def error(bits):
    inner = distributed_dp.DistributedDpSumFactory(
      noise_multiplier=0.0, expected_clients_per_round=4, bits=bits, l2_clip=100.0
    )
    result, _ = _full_participation_round(OptimalSamplingFactory(_M, inner_factory=inner))
    return np.max(np.abs(result - _oracle(_VECTORS)))

  # Noise off, the records (norms <= 9) below the clip: only the stochastic rounding to
  # the bits' grid is left. A mean instead of a sum would be off by 3/4 of the answer
  # (max |oracle| = 1.05); the error is below 1% of it, and it shrinks with more bits.
  fine, coarse = error(20), error(12)
  assert fine < 0.01 * 1.05
  assert fine < coarse


def test_the_refused_mean_would_have_been_a_fraction_of_the_answer():
  # Why the refusal: the same composition built by hand around UnweightedMeanFactory
  # returns 1/n of the weighted mean (here n = 4).
  from tff_sampling.aggregators import inner_factories

  inner_factories._REGISTERED.add(tff.aggregators.UnweightedMeanFactory)
  try:
    factory = OptimalSamplingFactory(_M, inner_factory=tff.aggregators.UnweightedMeanFactory())
  finally:
    inner_factories._REGISTERED.discard(tff.aggregators.UnweightedMeanFactory)
  result, _ = _full_participation_round(factory)
  np.testing.assert_allclose(result, _oracle(_VECTORS) / 4, rtol=_RTOL, atol=_ATOL)


def test_registered_sum_factory_is_accepted():
  from tff_sampling.aggregators import register_sum_factory

  class MySum(tff.aggregators.UnweightedAggregationFactory):
    def create(self, value_type):
      return tff.aggregators.SumFactory().create(value_type)

  with pytest.raises(TypeError, match='MySum is not known to return the sum'):
    OptimalSamplingFactory(_M, inner_factory=MySum())
  register_sum_factory(MySum)
  result, _ = _full_participation_round(OptimalSamplingFactory(_M, inner_factory=MySum()))
  np.testing.assert_allclose(result, _oracle(_VECTORS), rtol=_RTOL, atol=_ATOL)
  with pytest.raises(TypeError, match='register_sum_factory takes a subclass'):
    register_sum_factory(tff.aggregators.MeanFactory)


# --- Injected scalar sums. ------------------------------------------------------


class _CountingSums(ScalarSums):
  """Delegates to `inner` and counts the sums of each kind."""

  def __init__(self, inner):
    self.inner = inner
    self.secure = inner.secure
    self.calls = collections.Counter()

  def counts(self, values):
    self.calls['counts'] += 1
    return self.inner.counts(values)

  def floats(self, values, upper_bound):
    self.calls['floats'] += 1
    return self.inner.floats(values, upper_bound)

  def nonnegative(self, values, upper_bound):
    self.calls['nonnegative'] += 1
    return self.inner.nonnegative(values, upper_bound)


@pytest.mark.parametrize('secure', [False, True])
def test_injected_scalar_sums_do_every_scalar_sum(secure):
  # Two rescaling steps: counts = the client counts, 2 × I, the uploads;
  # floats = 2 × P, the measurement terms; nonnegative = W, A.
  sums = _CountingSums(SecureScalarSums() if secure else ScalarSums())
  process = _process(2.0, max_rescaling_steps=2, scalar_sums=sums)
  assert sums.calls == {'counts': 4, 'floats': 3, 'nonnegative': 2}
  uris = set(_intrinsic_uris(process.next))
  assert ('federated_secure_sum_bitwidth' in uris) == secure
  # The same round as with the default sums that `secure` picks.
  reference = _process(2.0, max_rescaling_steps=2, secure=secure)
  args = (_values(_VECTORS), [float(w) for w in _WEIGHTS])
  output = process.next(process.initialize(), *args)
  expected = reference.next(reference.initialize(), *args)
  np.testing.assert_array_equal(_flat(output.result), _flat(expected.result))
  assert output.measurements == expected.measurements
