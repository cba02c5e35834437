"""Tests for tff_sampling/probabilities/single_model.py (Chen, Horváth, Richtárik, TMLR 2022).

Hand-computed cases (arithmetic in the comments), an independent water-filling
oracle, property tests (hypothesis), optimality against scipy's SLSQP and by
perturbation, Algorithm 2's invariants, NumPy/TF agreement (also in
``tf.function`` and ``tff.tensorflow.computation``), the improvement factor,
bad input, and a smoke run of ``bench/probabilities.py``.
"""

from absl.testing import flagsaver
import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
from scipy import optimize
import tensorflow as tf
import tensorflow_federated as tff

from bench import probabilities as bench_probabilities
from tff_sampling import probabilities

_RTOL = 1e-12
_PROPERTY_SETTINGS = hypothesis.settings(
  max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)

# Norms with zeros and ties (a few repeated values) next to arbitrary ones.
_NORM = st.one_of(
  st.just(0.0),
  st.sampled_from([0.5, 1.0, 2.0]),
  st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False),
)
_NORMS = st.lists(_NORM, min_size=1, max_size=25).map(lambda x: np.array(x, np.float64))
_EXPECTED = st.one_of(st.integers(1, 30).map(float), st.floats(0.05, 30.0))


def _target_sum(norms, expected_clients):
  return min(expected_clients, np.count_nonzero(norms))


def _random_norms(rng, n, *, zero_fraction=0.2, tie_fraction=0.3):
  """Lognormal norms with some zeros and (after rounding) some ties."""
  norms = rng.lognormal(mean=0.0, sigma=1.5, size=n)
  if rng.random() < tie_fraction:
    norms = np.round(norms)
  norms[rng.random(n) < zero_fraction] = 0.0
  return norms


def _water_filling(norms, expected_clients, iterations=300):
  """Independent oracle: p_i = min(1, a_i / λ), λ by bisection so that Σ p = m."""
  norms = np.asarray(norms, np.float64)
  positive = norms > 0
  if np.count_nonzero(positive) <= expected_clients:
    return positive.astype(np.float64)
  total = lambda lam: np.sum(np.minimum(1.0, norms / lam))
  # total(low) = #non-zero > m (everyone non-zero at 1); total(high) ≤ Σa/high = m.
  low, high = np.min(norms[positive]), np.sum(norms) / expected_clients
  for _ in range(iterations):
    middle = 0.5 * (low + high)
    if total(middle) > expected_clients:
      low = middle
    else:
      high = middle
  return np.minimum(1.0, norms / (0.5 * (low + high)))


def _objective(norms, probs):
  """Σ_{a>0} a²/p, the variance up to the constant Σ a²."""
  positive = norms > 0
  return np.sum(norms[positive] ** 2 / probs[positive])


# ---------------------------------------------------------------------------
# Algorithm 1: hand-computed cases.


@pytest.mark.parametrize(
  'norms, expected_clients, expected',
  [
    # a = [1,2,3,4], m = 2: S = 1,3,6,10. k = 4: m-n+k = 2 ≤ S_4/a_4 = 10/4 ✓.
    # p = 2·a/10 = [.2, .4, .6, .8] (no client reaches 1).
    ([1, 2, 3, 4], 2, [0.2, 0.4, 0.6, 0.8]),
    # a = [1,2,3,4], m = 3: k = 4: 3 ≤ 2.5 ✗; k = 3: 2 ≤ 6/3 = 2 ✓ (equality, so
    # p_3 = 1 either way). p = 2·[1,2,3]/6 = [1/3, 2/3, 1], p_4 = 1. Σ = 3.
    ([1, 2, 3, 4], 3, [1 / 3, 2 / 3, 1, 1]),
    # m = 2.5 (real): k = 4: 2.5 ≤ 10/4 ✓ → p = 2.5·a/10 = [.25, .5, .75, 1].
    ([1, 2, 3, 4], 2.5, [0.25, 0.5, 0.75, 1.0]),
    # One dominant norm, a = [1,1,1,10], m = 2: k = 4: 2 ≤ 13/10 ✗; k = 3:
    # 1 ≤ 3/1 ✓ → p = 1·1/3 for the three small ones; p_4 = 1. Σ = 2.
    ([1, 1, 1, 10], 2, [1 / 3, 1 / 3, 1 / 3, 1]),
    # Unsorted input, same answer in input order.
    ([10, 1, 1, 1], 2, [1, 1 / 3, 1 / 3, 1 / 3]),
    # Ties, a = [2,2,5,5], m = 3: k = 4: 3 ≤ 14/5 ✗; k = 3: 2 ≤ 9/5 ✗; k = 2:
    # 1 ≤ 4/2 ✓ → p = 1·2/4 = 1/2 for both 2s, the 5s get 1. Σ = 3.
    ([5, 2, 5, 2], 3, [1, 0.5, 1, 0.5]),
    # All equal → m/n.
    ([3, 3, 3, 3, 3], 2, [0.4] * 5),
    # A zero, a = [0,1,2,3], m = 2: k = 4: 2 ≤ 6/3 ✓ → p = 2·a/6 = [0, 1/3, 2/3, 1].
    ([0, 1, 2, 3], 2, [0, 1 / 3, 2 / 3, 1]),
    # #non-zero = 2 ≤ m = 2: the non-zero clients upload surely, zeros never.
    ([0, 5, 0, 1], 2, [0, 1, 0, 1]),
    # m ≥ n: full participation.
    ([1, 2, 3], 3, [1, 1, 1]),
    ([1, 2, 3], 7.5, [1, 1, 1]),
    # m ≥ n with a zero: the zero-norm client still gets 0 (module docstring).
    ([0, 1, 2], 5, [0, 1, 1]),
    # All zero.
    ([0, 0, 0], 1, [0, 0, 0]),
    # A single client: k = 1: m-1+1 = 0.5 ≤ 4.2/4.2 ✓ → p = 0.5·4.2/4.2.
    ([4.2], 0.5, [0.5]),
    ([4.2], 1, [1]),
    # Budget below one client, a = [1, 3], m = 0.5: k = 2: 0.5 ≤ 4/3 ✓ → p = a/8.
    ([1, 3], 0.5, [0.125, 0.375]),
  ],
)
def test_optimal_hand_computed(norms, expected_clients, expected):
  probs = probabilities.optimal_probabilities(norms, expected_clients)
  assert probs.dtype == np.float64
  np.testing.assert_allclose(probs, expected, rtol=_RTOL, atol=0)


def test_optimal_equal_norms_equal_probabilities_and_exact_ones():
  # Clients above the threshold get exactly 1 (not 1 - ulp): they always upload.
  probs = probabilities.optimal_probabilities([7, 1, 7, 1, 100, 0.3], 3)
  assert probs[0] == probs[2] and probs[1] == probs[3]
  assert probs[4] == 1.0


def test_optimal_agrees_with_water_filling_oracle():
  rng = np.random.default_rng(1)
  for _ in range(300):
    n = int(rng.integers(1, 60))
    norms = _random_norms(rng, n)
    expected_clients = float(rng.choice([rng.integers(1, n + 2), rng.uniform(0.1, n + 1)]))
    np.testing.assert_allclose(
      probabilities.optimal_probabilities(norms, expected_clients),
      _water_filling(norms, expected_clients),
      rtol=1e-10,
      atol=0,
      err_msg=f'norms={norms.tolist()}, m={expected_clients}',
    )


def test_optimal_on_a_million_norms_spends_exactly_the_budget():
  # Its speed is a benchmark's (python -m bench.probabilities), not a test's.
  norms = np.random.default_rng(0).lognormal(sigma=2.0, size=1_000_000)
  probs = probabilities.optimal_probabilities(norms, 100_000)
  assert abs(np.sum(probs) - 100_000) < 1e-9 * norms.size
  assert np.all((probs > 0) & (probs <= 1))


# ---------------------------------------------------------------------------
# Algorithm 1: properties.


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED)
def test_optimal_bounds_and_sum(norms, expected_clients):
  probs = probabilities.optimal_probabilities(norms, expected_clients)
  assert np.all((probs >= 0) & (probs <= 1))
  assert np.all(probs[norms == 0] == 0)
  assert np.all(probs[norms > 0] > 0)
  assert abs(np.sum(probs) - _target_sum(norms, expected_clients)) <= 1e-9 * norms.size


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED)
def test_optimal_monotone_in_norm(norms, expected_clients):
  probs = probabilities.optimal_probabilities(norms, expected_clients)
  order = np.argsort(norms, kind='stable')
  assert np.all(np.diff(probs[order]) >= 0)  # Exactly, also in floating point.
  for value in np.unique(norms):
    assert np.ptp(probs[norms == value]) == 0  # Ties get identical probabilities.


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED, scale=st.floats(1e-3, 1e3))
def test_optimal_scale_invariant(norms, expected_clients, scale):
  np.testing.assert_allclose(
    probabilities.optimal_probabilities(scale * norms, expected_clients),
    probabilities.optimal_probabilities(norms, expected_clients),
    rtol=_RTOL,
    atol=0,
  )


@pytest.mark.filterwarnings('ignore:Values in x were outside bounds')
@pytest.mark.parametrize('seed', range(12))
def test_optimal_matches_slsqp(seed):
  # min Σ a²/p  s.t.  Σ p = m, 0 < p ≤ 1: a convex problem SLSQP solves from
  # the uniform start; the exact answer must be at least as good and close.
  rng = np.random.default_rng(seed)
  n = int(rng.integers(3, 8))
  norms = rng.lognormal(sigma=1.5, size=n)
  expected_clients = float(rng.uniform(0.5, n - 0.5))
  result = optimize.minimize(
    lambda p: np.sum(norms**2 / p),
    np.full(n, expected_clients / n),
    jac=lambda p: -(norms**2) / p**2,
    method='SLSQP',
    bounds=[(1e-9, 1.0)] * n,
    constraints=[
      {
        'type': 'eq',
        'fun': lambda p: np.sum(p) - expected_clients,
        'jac': lambda p: np.ones_like(p),
      }
    ],
    options={'ftol': 1e-12, 'maxiter': 1000},
  )
  # SLSQP may stop with a line-search message near the optimum; what counts
  # is a feasible point, which the exact answer must not lose to.
  assert abs(np.sum(result.x) - expected_clients) < 1e-8, result
  exact = probabilities.optimal_probabilities(norms, expected_clients)
  assert _objective(norms, exact) <= result.fun * (1 + 1e-8)
  np.testing.assert_allclose(exact, result.x, atol=1e-3)


@st.composite
def _norms_above_m(draw):
  """Norms with more non-zero entries than m, and m: some client's probability is below 1.
  (Drawn together, not filtered: most independent draws would have m too large.) m stays
  0.01 below the count: within rounding of it the library rounds every probability to 1."""
  norms = draw(_NORMS.filter(lambda a: np.count_nonzero(a) >= 2))
  nonzero = np.count_nonzero(norms)
  expected_clients = draw(
    st.one_of(st.integers(1, nonzero - 1).map(float), st.floats(0.05, nonzero - 0.01))
  )
  return norms, expected_clients


@_PROPERTY_SETTINGS
@hypothesis.given(drawn=_norms_above_m(), seed=st.integers(0, 2**31))
def test_optimal_no_feasible_perturbation_improves(drawn, seed):
  norms, expected_clients = drawn
  probs = probabilities.optimal_probabilities(norms, expected_clients)
  positive = norms > 0
  interior = positive & (probs < 1)  # Non-empty: Σ p = m < #non-zero.
  at_one = positive & (probs == 1)
  # KKT: a_i / p_i is one constant λ inside, and a_i ≥ λ for clients at 1.
  ratios = norms[interior] / probs[interior]
  np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)
  assert np.all(norms[at_one] >= ratios[0] * (1 - 1e-12))
  # Random feasible directions: free sign inside, downwards at 1, Σ d = 0.
  rng = np.random.default_rng(seed)
  base = _objective(norms, probs)
  for _ in range(20):
    direction = np.zeros_like(probs)
    direction[interior] = rng.normal(size=np.count_nonzero(interior))
    direction[at_one] = -np.abs(rng.normal(size=np.count_nonzero(at_one)))
    direction[interior] -= np.sum(direction) / np.count_nonzero(interior)
    # A step that keeps every p in (0, 1].
    room = np.where(
      direction > 0,
      (1 - probs) / np.maximum(direction, 1e-300),
      probs / np.maximum(-direction, 1e-300),
    )
    step = 0.5 * np.min(room[positive & (direction != 0)], initial=1.0)
    moved = probs + step * direction
    assert _objective(norms, moved) >= base * (1 - 1e-12)


# ---------------------------------------------------------------------------
# Algorithm 2.


@pytest.mark.parametrize(
  'norms, expected_clients, steps, expected, steps_used',
  [
    # a = [1,1,1,10], m = 2, A = 13. First step: p = min(1, 2a/13) =
    # [2/13, 2/13, 2/13, 1].
    ([1, 1, 1, 10], 2, 0, [2 / 13] * 3 + [1], 0),
    # Step 1: I = 3, P = 6/13, C = (2-4+3)/(6/13) = 13/6 → p = 1/3 each.
    # Step 2: I = 3, P = 1, C = 1 → stop. Exact Algorithm 1 answer, one step.
    ([1, 1, 1, 10], 2, 1, [1 / 3] * 3 + [1], 1),
    ([1, 1, 1, 10], 2, 4, [1 / 3] * 3 + [1], 1),
    # a = [1,2,4,8,16], m = 3, A = 31: p0 = 3a/31 = [3,6,12,24,31(48)]/31.
    # Step 1: I = 4, P = 45/31, C = (3-5+4)/(45/31) = 62/45 → p = 2a/15 =
    # [2/15, 4/15, 8/15, 1 (16/15 clipped), 1].
    ([1, 2, 4, 8, 16], 3, 1, [2 / 15, 4 / 15, 8 / 15, 1, 1], 1),
    # Step 2: I = 3, P = 14/15, C = (3-5+3)/(14/15) = 15/14 → p = a/7, which is
    # Algorithm 1's answer (k = 3: 1 ≤ 7/4). Step 3: C = 1 → stop.
    ([1, 2, 4, 8, 16], 3, 2, [1 / 7, 2 / 7, 4 / 7, 1, 1], 2),
    ([1, 2, 4, 8, 16], 3, 10, [1 / 7, 2 / 7, 4 / 7, 1, 1], 2),
    # Zero norms count in I. a = [0,1,100], m = 2, A = 101: p0 = [0, 2/101, 1].
    # Step 1: I = 2 (the zero client sends [p<1] = 1), P = 2/101,
    # C = (2-3+2)/(2/101) = 101/2 → p = [0, 1, 1]; step 2: I = 1, P = 0 → stop.
    # (Not counting the zero, C = (2-3+1)/P = 0 would stop at [0, 2/101, 1].)
    ([0, 1, 100], 2, 3, [0, 1, 1], 1),
    # m ≥ n: a = [1,2,3], m = 3, A = 6: p0 = [1/2, 1, 1]; step 1: I = 1,
    # P = 1/2, C = (3-3+1)/(1/2) = 2 → all 1; step 2: I = 0 → stop.
    ([1, 2, 3], 3, 3, [1, 1, 1], 1),
    # All zero: A = 0 → p = 0, P = 0 → no step.
    ([0, 0], 1, 3, [0, 0], 0),
    # Uniform norms: p0 = m/n already sums to m; C = 1 → no step.
    ([2, 2, 2, 2], 1, 3, [0.25] * 4, 0),
  ],
)
def test_approximate_hand_computed(norms, expected_clients, steps, expected, steps_used):
  info = probabilities.approximate_optimal_probabilities_with_info(norms, expected_clients, steps)
  np.testing.assert_allclose(info.probabilities, expected, rtol=_RTOL, atol=0)
  assert info.rescaling_steps_used == steps_used
  np.testing.assert_array_equal(
    probabilities.approximate_optimal_probabilities(norms, expected_clients, steps),
    info.probabilities,
  )


# The last column is Algorithm 2 with no rescaling step: min(1, m·a/Σa).
@pytest.mark.parametrize(
  'norms,expected_clients,expected,first_step',
  [
    # n = 2, m = 2, one zero norm: p = [0, 1], Σp = 1 (not 2).
    ([0.0, 3.0], 2, [0, 1], [0, 1]),
    ([3.0, 0.0], 2, [1, 0], [1, 0]),
    # m well above n: still zero for the zero norm; first step 5·0.5/3.5 = 5/7.
    ([0.0, 3.0, 0.5], 5, [0, 1, 1], [0, 1, 5 / 7]),
    # m < #non-zero: a = [0, 1, 3], m = 1.5: k = 3: 1.5 ≤ 4/3 ✗; k = 2 (a = 1):
    # 0.5 ≤ 1 ✓ → p = 0.5·a/1 = [0, 0.5] and the 3 saturates. First step:
    # 1.5·a/4 = [0, 0.375, 1.125 → 1].
    ([0.0, 1.0, 3.0], 1.5, [0, 0.5, 1], [0, 0.375, 1]),
    # Every norm zero.
    ([0.0, 0.0], 2, [0, 0], [0, 0]),
  ],
)
@pytest.mark.parametrize(
  'variant',
  ['numpy_exact', 'numpy_approximate', 'tf_exact', 'tf_approximate', 'tf_approximate_no_steps'],
)
def test_zero_norms_get_zero_in_every_variant(
  norms, expected_clients, expected, first_step, variant
):
  # The convention (module docstring): a_i = 0 → p_i = 0, also for m ≥ n.
  norms64 = np.asarray(norms, np.float64)
  compute = {
    'numpy_exact': lambda: probabilities.optimal_probabilities(norms64, expected_clients),
    'numpy_approximate': lambda: probabilities.approximate_optimal_probabilities(
      norms64, expected_clients, 4
    ),
    'tf_exact': lambda: probabilities.optimal_probabilities_tf(norms64, expected_clients),
    'tf_approximate': lambda: probabilities.approximate_optimal_probabilities_tf(
      norms64, expected_clients, 4
    ),
    'tf_approximate_no_steps': lambda: probabilities.approximate_optimal_probabilities_tf(
      norms64, expected_clients, 0
    ),
  }[variant]
  probs = np.asarray(compute())
  if variant == 'tf_approximate_no_steps':
    expected = first_step
  np.testing.assert_allclose(probs, expected, rtol=_RTOL, atol=0)
  assert np.all(probs[norms64 == 0] == 0)


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED, extra_steps=st.integers(0, 3))
def test_approximate_with_n_steps_equals_exact(norms, expected_clients, extra_steps):
  info = probabilities.approximate_optimal_probabilities_with_info(
    norms, expected_clients, norms.size + extra_steps
  )
  np.testing.assert_allclose(
    info.probabilities,
    probabilities.optimal_probabilities(norms, expected_clients),
    rtol=_RTOL,
    atol=0,
  )
  assert info.rescaling_steps_used <= norms.size


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED)
def test_approximate_iterates_increase_towards_exact(norms, expected_clients):
  # The invariant (proof in the module docstring): after any number j of
  # steps, p^(j) ≤ p^(j+1) ≤ p* elementwise, so Σ p^(j) ≤ min(m, #non-zero)
  # and the variance is at least the optimum's and never increases with j.
  exact = probabilities.optimal_probabilities(norms, expected_clients)
  target = _target_sum(norms, expected_clients)
  previous = None
  for steps in range(norms.size + 1):
    probs = probabilities.approximate_optimal_probabilities(norms, expected_clients, steps)
    assert np.all((probs >= 0) & (probs <= 1))
    assert np.all(probs <= exact * (1 + 1e-12))
    assert np.sum(probs) <= target * (1 + 1e-12)
    assert np.all(probs[norms == 0] == 0)
    order = np.argsort(norms, kind='stable')
    assert np.all(np.diff(probs[order]) >= 0)  # Monotone in a_i, exactly.
    # The variance is Σ a²/p - Σ a² over a > 0; compare Σ a²/p, which has no
    # cancellation when p is within rounding of 1.
    if np.all(probs[norms > 0] > 0):
      assert _objective(norms, probs) >= _objective(norms, exact) * (1 - 1e-12)
    if previous is not None:
      assert np.all(probs >= previous)  # Exactly: C > 1 and rounding is monotone.
      if np.all(previous[norms > 0] > 0):
        assert _objective(norms, probs) <= _objective(norms, previous) * (1 + 1e-12)
    previous = probs


def test_approximate_random_inputs_converge_within_n_steps():
  rng = np.random.default_rng(2)
  for _ in range(200):
    n = int(rng.integers(1, 50))
    norms = _random_norms(rng, n)
    expected_clients = float(rng.uniform(0.1, n + 1))
    np.testing.assert_allclose(
      probabilities.approximate_optimal_probabilities(norms, expected_clients, n),
      probabilities.optimal_probabilities(norms, expected_clients),
      rtol=_RTOL,
      atol=0,
    )


# ---------------------------------------------------------------------------
# NumPy vs TensorFlow.


def _tf_cases(count, seed=3):
  rng = np.random.default_rng(seed)
  cases = [
    (np.array([1.0, 2.0, 3.0, 4.0]), 3.0),
    (np.array([0.0, 1.0, 100.0]), 2.0),
    (np.array([0.0, 0.0]), 1.0),
    (np.array([5.0]), 0.5),
    (np.array([1.0, 2.0, 3.0]), 7.5),
  ]
  for _ in range(count):
    n = int(rng.integers(1, 40))
    cases.append((_random_norms(rng, n), float(rng.uniform(0.1, n + 1))))
  return cases


_TOLERANCES = {tf.float64: dict(rtol=1e-12, atol=0), tf.float32: dict(rtol=1e-6, atol=0)}


@pytest.mark.parametrize('dtype', [tf.float64, tf.float32])
def test_tf_twins_agree_with_numpy(dtype):
  for norms, expected_clients in _tf_cases(60):
    # NumPy gets the same (dtype-rounded) values as TF.
    norms = norms.astype(dtype.as_numpy_dtype)
    tensor = tf.constant(norms, dtype)
    exact = probabilities.optimal_probabilities(norms, expected_clients)
    exact_tf = probabilities.optimal_probabilities_tf(tensor, expected_clients)
    assert exact_tf.dtype == dtype and exact_tf.shape == norms.shape
    np.testing.assert_allclose(exact_tf.numpy(), exact, **_TOLERANCES[dtype])
    for steps in (0, 1, 4, norms.size):
      info = probabilities.approximate_optimal_probabilities_with_info(
        norms, expected_clients, steps
      )
      info_tf = probabilities.approximate_optimal_probabilities_with_info_tf(
        tensor, expected_clients, steps
      )
      np.testing.assert_allclose(
        info_tf.probabilities.numpy(), info.probabilities, **_TOLERANCES[dtype]
      )
      assert int(info_tf.rescaling_steps_used) == info.rescaling_steps_used
      np.testing.assert_array_equal(
        probabilities.approximate_optimal_probabilities_tf(tensor, expected_clients, steps).numpy(),
        info_tf.probabilities.numpy(),
      )
    if np.all(exact[norms > 0] > 0):
      np.testing.assert_allclose(
        probabilities.improvement_factor_tf(tensor, exact_tf, expected_clients).numpy(),
        probabilities.improvement_factor(norms, exact, expected_clients),
        **_TOLERANCES[dtype],
      )
      np.testing.assert_allclose(
        probabilities.sampling_variance_tf(tensor, exact_tf).numpy(),
        probabilities.sampling_variance(norms, exact),
        **_TOLERANCES[dtype],
      )


@pytest.mark.parametrize('dtype', [tf.float64, tf.float32])
def test_tf_twins_inside_tf_function_trace_once(dtype):

  @tf.function(input_signature=[tf.TensorSpec([None], dtype), tf.TensorSpec([], dtype)])
  def compute(norms, expected_clients):
    return (
      probabilities.optimal_probabilities_tf(norms, expected_clients),
      probabilities.approximate_optimal_probabilities_with_info_tf(norms, expected_clients, 4),
    )

  for norms, expected_clients in _tf_cases(10, seed=4):
    norms = norms.astype(dtype.as_numpy_dtype)
    exact_tf, info_tf = compute(tf.constant(norms), tf.constant(expected_clients, dtype))
    np.testing.assert_allclose(
      exact_tf.numpy(),
      probabilities.optimal_probabilities(norms, expected_clients),
      **_TOLERANCES[dtype],
    )
    info = probabilities.approximate_optimal_probabilities_with_info(norms, expected_clients, 4)
    np.testing.assert_allclose(
      info_tf.probabilities.numpy(), info.probabilities, **_TOLERANCES[dtype]
    )
    assert int(info_tf.rescaling_steps_used) == info.rescaling_steps_used
  # One graph for every n and every case (no Python branching on values).
  assert compute.experimental_get_tracing_count() == 1


def test_tf_twins_inside_tff_computation():

  @tff.tensorflow.computation(tff.TensorType(np.float32, [None]))
  def compute(norms):
    return (
      probabilities.optimal_probabilities_tf(norms, 2.0),
      probabilities.approximate_optimal_probabilities_tf(norms, 2.0, 4),
    )

  exact, approximate = compute(np.array([1, 1, 1, 10], np.float32))
  np.testing.assert_allclose(exact, [1 / 3, 1 / 3, 1 / 3, 1], rtol=1e-6)
  np.testing.assert_allclose(approximate, [1 / 3, 1 / 3, 1 / 3, 1], rtol=1e-6)


def test_tf_runtime_checks_reject_bad_norms():
  with pytest.raises(tf.errors.InvalidArgumentError, match='non-negative'):
    probabilities.optimal_probabilities_tf(tf.constant([1.0, -1.0]), 1.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match='finite'):
    probabilities.approximate_optimal_probabilities_tf(tf.constant([1.0, np.nan]), 1.0, 2)
  compute = tf.function(lambda a: probabilities.optimal_probabilities_tf(a, 1.0))
  with pytest.raises(tf.errors.InvalidArgumentError, match='finite'):
    compute(tf.constant([1.0, np.inf]))


@pytest.mark.parametrize(
  'call, match',
  [
    (lambda: probabilities.optimal_probabilities_tf(tf.constant([1, 2]), 1.0), 'float32'),
    (lambda: probabilities.optimal_probabilities_tf(tf.ones([2, 2]), 1.0), '1-D'),
    (lambda: probabilities.optimal_probabilities_tf(tf.zeros([0]), 1.0), 'empty'),
    (lambda: probabilities.optimal_probabilities_tf(tf.ones([2]), 0.0), 'expected_clients'),
    (
      lambda: probabilities.approximate_optimal_probabilities_tf(tf.ones([2]), 1.0, -1),
      'max_rescaling_steps',
    ),
  ],
)
def test_tf_static_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


# ---------------------------------------------------------------------------
# Improvement factor and variance.


def test_improvement_factor_hand_computed():
  # a = [1,1,1,10], m = 2, optimal p = [1/3, 1/3, 1/3, 1]:
  # numerator Σ (1-p)/p a² = 3 · (2/3)/(1/3) · 1 + 0 = 6;
  # denominator (1 - 1/2)/(1/2) · (1+1+1+100) = 103; α = 6/103.
  norms = np.array([1.0, 1.0, 1.0, 10.0])
  probs = probabilities.optimal_probabilities(norms, 2)
  assert probabilities.sampling_variance(norms, probs) == pytest.approx(6.0, rel=1e-12)
  assert probabilities.improvement_factor(norms, probs, 2) == pytest.approx(6 / 103, rel=1e-12)


def test_improvement_factor_baselines_and_degenerate_cases():
  norms = np.random.default_rng(5).lognormal(size=20)
  # Full participation: no variance. Uniform m/n: exactly the baseline.
  assert probabilities.improvement_factor(norms, np.ones(20), 4) == 0.0
  assert probabilities.improvement_factor(norms, np.full(20, 4 / 20), 4) == pytest.approx(
    1.0, rel=1e-12
  )
  # m ≥ n (uniform is full participation) and all-zero norms: 0 by definition.
  assert probabilities.improvement_factor(norms, np.ones(20), 20) == 0.0
  assert probabilities.improvement_factor(norms, np.ones(20), 25.5) == 0.0
  assert probabilities.improvement_factor(np.zeros(3), np.zeros(3), 1) == 0.0
  # Zero-norm clients are left out of both sums, whatever their probability.
  assert probabilities.sampling_variance([0.0, 2.0], [0.0, 0.5]) == pytest.approx(4.0)
  for args in ((norms, np.ones(20), 20.0), (np.zeros(3), np.zeros(3), 1.0)):
    assert (
      float(
        probabilities.improvement_factor_tf(tf.constant(args[0]), tf.constant(args[1]), args[2])
      )
      == 0.0
    )


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_NORMS, expected_clients=_EXPECTED)
def test_improvement_factor_of_optimal_in_unit_interval(norms, expected_clients):
  probs = probabilities.optimal_probabilities(norms, expected_clients)
  alpha = probabilities.improvement_factor(norms, probs, expected_clients)
  # α = 1 exactly when p = m/n (e.g. one client with m < 1); computing
  # (1 − p)/(1 − m/n) amplifies a one-ulp difference between the two by
  # 1/(1 − m/n), up to ~1e5 here, so allow 1e-9 rather than 1e-12.
  assert 0.0 <= alpha <= 1.0 + 1e-9
  if np.count_nonzero(norms) <= expected_clients:
    assert alpha == 0.0


# ---------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize(
  'norms, match',
  [
    ([1.0, np.nan], 'finite'),
    ([1.0, np.inf], 'finite'),
    ([1.0, -0.5], r'non-negative, got \[-0.5\]'),
    ([], 'empty'),
    ([[1.0, 2.0]], '1-D'),
    (3.0, '1-D'),
    (['a', 'b'], 'real numbers'),
  ],
)
def test_bad_norms(norms, match):
  with pytest.raises(ValueError, match=match):
    probabilities.optimal_probabilities(norms, 1)
  with pytest.raises(ValueError, match=match):
    probabilities.approximate_optimal_probabilities(norms, 1, 2)
  with pytest.raises(ValueError, match=match):
    probabilities.improvement_factor(norms, [1.0, 1.0], 1)


@pytest.mark.parametrize(
  'expected_clients, match',
  [
    (0, 'positive, got 0'),
    (-2.0, r'positive, got -2.0'),
    (np.nan, 'got nan'),
    (np.inf, 'got inf'),
    (True, 'got True'),
    ('2', "got '2'"),
    (None, 'got None'),
  ],
)
def test_bad_expected_clients(expected_clients, match):
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.optimal_probabilities([1.0, 2.0], expected_clients)
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.approximate_optimal_probabilities([1.0, 2.0], expected_clients, 1)
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.improvement_factor([1.0, 2.0], [1.0, 1.0], expected_clients)


@pytest.mark.parametrize('steps, match', [(-1, 'got -1'), (1.5, 'got 1.5'), (True, 'got True')])
def test_bad_max_rescaling_steps(steps, match):
  with pytest.raises(ValueError, match=f'max_rescaling_steps.*{match}'):
    probabilities.approximate_optimal_probabilities([1.0, 2.0], 1, steps)


@pytest.mark.parametrize(
  'probs, match',
  [
    ([0.5], 'shape'),
    ([0.5, 1.5], r'\[0, 1\], got \[1.5\]'),
    ([0.5, np.nan], r'\[0, 1\]'),
    ([0.0, 0.5], 'positive where weighted_norms is positive'),
  ],
)
def test_bad_probabilities(probs, match):
  with pytest.raises(ValueError, match=match):
    probabilities.sampling_variance([1.0, 2.0], probs)
  with pytest.raises(ValueError, match=match):
    probabilities.improvement_factor([1.0, 2.0], probs, 1)


# ---------------------------------------------------------------------------
# Benchmark smoke test.


def test_bench_main_small(capsys):
  with flagsaver.flagsaver(num_norms=2000, repetitions=2, norms_expected_clients=200.0):
    bench_probabilities.main(['probabilities'])
  table = capsys.readouterr().out
  for label in ('exact_numpy', 'exact_tf', 'approximate_numpy_4_steps', 'approximate_tf_4_steps'):
    assert label in table
  assert ': met' in table
