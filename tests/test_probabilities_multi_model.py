"""Tests for tff_sampling/probabilities/multi_model.py, MMFL (docs/algorithms.md §5).

Hand-computed cases (arithmetic in the comments), two independent oracles
(scipy's SLSQP on the full ``[N, S]`` problem, and a bisection water filling on
the row sums), property tests (hypothesis), the reduction to the single-model
functions for ``S = 1``, the secure version's invariants and its measured
variance ratio to the exact optimum, NumPy/TF agreement and bad input.
"""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
from scipy import optimize
import tensorflow as tf

from tff_sampling import probabilities

_RTOL = 1e-12
_PROPERTY_SETTINGS = hypothesis.settings(
  max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)

# Norms with zeros and ties next to arbitrary ones (as in test_probabilities.py).
_NORM = st.one_of(
  st.just(0.0),
  st.sampled_from([0.5, 1.0, 2.0]),
  st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False),
)
_EXPECTED = st.one_of(st.integers(1, 20).map(float), st.floats(0.05, 20.0))


@st.composite
def _norm_matrices(draw, max_clients=15, max_models=4):
  """``[N, S]`` matrices; with a third of the entries zero, some rows are all zero."""
  num_clients = draw(st.integers(1, max_clients))
  num_models = draw(st.integers(1, max_models))
  values = draw(
    st.lists(_NORM, min_size=num_clients * num_models, max_size=num_clients * num_models)
  )
  return np.array(values, np.float64).reshape(num_clients, num_models)


def _target_sum(norms, expected_clients):
  return min(expected_clients, np.count_nonzero(np.sum(norms, axis=1) > 0))


def _random_norms(rng, num_clients, num_models, *, zero_fraction=0.2):
  """Lognormal norms, some zero, and some whole rows zero."""
  norms = rng.lognormal(mean=0.0, sigma=1.5, size=(num_clients, num_models))
  norms[rng.random(norms.shape) < zero_fraction] = 0.0
  norms[rng.random(num_clients) < 0.1] = 0.0
  return norms


def _objective(norms, probs):
  """Σ_{Ũ>0} Ũ²/p, the total variance up to the constant Σ Ũ²."""
  positive = norms > 0
  return np.sum(norms[positive] ** 2 / probs[positive])


def _water_filling_oracle(norms, expected_clients, iterations=300):
  """Independent of the code under test: q_i = min(1, M_i/λ) by bisection, split ∝ Ũ."""
  totals = np.sum(norms, axis=1)
  positive = totals > 0
  if np.count_nonzero(positive) <= expected_clients:
    client_probs = positive.astype(np.float64)
  else:
    low, high = np.min(totals[positive]), np.sum(totals) / expected_clients
    for _ in range(iterations):
      middle = 0.5 * (low + high)
      if np.sum(np.minimum(1.0, totals / middle)) > expected_clients:
        low = middle
      else:
        high = middle
    client_probs = np.minimum(1.0, totals / (0.5 * (low + high)))
  shares = np.zeros_like(norms)
  shares[positive] = norms[positive] / totals[positive, None]
  return client_probs[:, None] * shares


# ---------------------------------------------------------------------------
# Exact probabilities: hand-computed cases.

# Ũ = [[1, 3], [2, 2], [0, 8]]: M = [4, 4, 8], sorted prefix sums 4, 8, 16.
_EXAMPLE = [[1.0, 3.0], [2.0, 2.0], [0.0, 8.0]]


@pytest.mark.parametrize(
  'norms, expected_clients, expected',
  [
    # m = 1.5: k = 3: m - 3 + 3 = 1.5 ≤ 16/8 ✓ → p = 1.5 · M / 16 =
    # [3/8, 3/8, 3/4]; split: [3/8 · 1/4, 3/8 · 3/4], [3/8 · 1/2] · 2, [0, 3/4].
    (_EXAMPLE, 1.5, [[0.09375, 0.28125], [0.1875, 0.1875], [0.0, 0.75]]),
    # m = 2.5: k = 3: 2.5 ≤ 2 ✗; k = 2: 1.5 ≤ 8/4 ✓ → p = 1.5 · 4/8 = 3/4 for
    # the two M = 4 clients, 1 for M = 8. Split: [3/16, 9/16], [3/8, 3/8],
    # [0, 1]. Σ = 3/4 + 3/4 + 1 = 2.5.
    (_EXAMPLE, 2.5, [[0.1875, 0.5625], [0.375, 0.375], [0.0, 1.0]]),
    # m = 5 > N: every client trains surely, split ∝ Ũ: rows sum to one.
    (_EXAMPLE, 5, [[0.25, 0.75], [0.5, 0.5], [0.0, 1.0]]),
    # An all-zero row gets zeros; M = [0, 2, 2], m = 1 → p = [0, 1/2, 1/2].
    ([[0, 0], [1, 1], [2, 0]], 1, [[0, 0], [0.25, 0.25], [0.5, 0]]),
    # #non-zero rows = 2 ≤ m = 2: both train surely, the zero row never.
    ([[0, 0], [1, 3], [2, 0]], 2, [[0, 0], [0.25, 0.75], [1, 0]]),
    # All zero.
    ([[0, 0, 0], [0, 0, 0]], 1, [[0, 0, 0], [0, 0, 0]]),
    # Equal rows → m/N per client, split equally: 1/2 · 1/3.
    ([[1, 1, 1]] * 4, 2, [[1 / 6] * 3] * 4),
  ],
)
def test_exact_hand_computed(norms, expected_clients, expected):
  probs = probabilities.multi_model_probabilities(norms, expected_clients)
  assert probs.dtype == np.float64 and probs.shape == np.shape(expected)
  np.testing.assert_allclose(probs, expected, rtol=_RTOL, atol=0)


def test_variance_and_improvement_factor_hand_computed():
  # m = 2.5, p = [[3/16, 9/16], [3/8, 3/8], [0, 1]]: Σ (1-p)/p Ũ² =
  # (13/3)·1 + (7/9)·9 + 2 · (5/3)·4 + 0·64 = 13/3 + 7 + 40/3 = 74/3.
  # Check: Σ M²/p_i - Σ Ũ² = 2 · 16/(3/4) + 64 - 82 = 74/3.
  probs = probabilities.multi_model_probabilities(_EXAMPLE, 2.5)
  variance = probabilities.multi_model_sampling_variance(_EXAMPLE, probs)
  assert variance == pytest.approx(74 / 3, rel=1e-12)
  # Random assignment: u = min(2.5, 3)/(3 · 2) = 5/12, (1-u)/u = 7/5,
  # baseline 7/5 · 82; α = (74/3) / (7 · 82/5) = 185/861.
  assert probabilities.multi_model_improvement_factor(_EXAMPLE, probs, 2.5) == pytest.approx(
    185 / 861, rel=1e-12
  )
  # Zero-norm pairs contribute nothing, whatever their probability.
  assert probabilities.multi_model_sampling_variance([[0.0, 2.0]], [[0.0, 0.5]]) == pytest.approx(
    4.0, rel=1e-12
  )


def test_improvement_factor_baselines_and_degenerate_cases():
  norms = np.random.default_rng(5).lognormal(size=(20, 3))
  # Random assignment itself has α = 1.
  assert probabilities.multi_model_improvement_factor(
    norms, np.full((20, 3), 4 / 60), 4
  ) == pytest.approx(1.0, rel=1e-12)
  # m ≥ N with S > 1: the baseline is p = 1/S, not degenerate.
  assert probabilities.multi_model_improvement_factor(
    norms, np.full((20, 3), 1 / 3), 25
  ) == pytest.approx(1.0, rel=1e-12)
  # S = 1 with m ≥ N (baseline = full participation) and all-zero norms: 0.
  assert probabilities.multi_model_improvement_factor(norms[:, :1], np.ones((20, 1)), 20) == 0.0
  assert probabilities.multi_model_improvement_factor(np.zeros((3, 2)), np.zeros((3, 2)), 1) == 0.0


# ---------------------------------------------------------------------------
# Exact probabilities: oracles.


@pytest.mark.filterwarnings('ignore:Values in x were outside bounds')
@pytest.mark.parametrize('seed', range(12))
def test_exact_matches_slsqp_on_the_full_problem(seed):
  # min Σ_{i,s} Ũ²/p  s.t.  Σ_s p_{s|i} ≤ 1,  Σ p = m,  p ≥ 1e-9, over the
  # pairs with Ũ > 0: solved directly in [N, S], without the row-sum reduction
  # that the code under test relies on.
  rng = np.random.default_rng(seed)
  num_clients, num_models = int(rng.integers(3, 9)), int(rng.integers(2, 4))
  norms = rng.lognormal(sigma=1.5, size=(num_clients, num_models))
  norms[rng.random(norms.shape) < 0.2] = 0.0
  norms[np.sum(norms, axis=1) == 0, 0] = 1.0  # Keep every row non-zero.
  norms /= np.max(norms)  # SLSQP stalls on gradients ~1e7 without this.
  expected_clients = float(rng.uniform(0.5, num_clients - 0.5))
  rows, _ = np.nonzero(norms > 0)
  values = norms[norms > 0]
  row_matrix = (rows[None, :] == np.arange(num_clients)[:, None]).astype(np.float64)
  per_row = np.count_nonzero(norms > 0, axis=1)
  start = expected_clients / num_clients / per_row[rows]  # Rows sum to m/N < 1.
  result = optimize.minimize(
    lambda p: np.sum(values**2 / p),
    start,
    jac=lambda p: -(values**2) / p**2,
    method='SLSQP',
    bounds=[(1e-9, 1.0)] * values.size,
    constraints=[
      {
        'type': 'eq',
        'fun': lambda p: np.sum(p) - expected_clients,
        'jac': lambda p: np.ones_like(p),
      },
      {'type': 'ineq', 'fun': lambda p: 1.0 - row_matrix @ p, 'jac': lambda p: -row_matrix},
    ],
    options={'ftol': 1e-14, 'maxiter': 2000},
  )
  assert result.success, result
  assert abs(np.sum(result.x) - expected_clients) < 1e-8, result
  assert np.all(row_matrix @ result.x <= 1 + 1e-8), result
  exact = probabilities.multi_model_probabilities(norms, expected_clients)
  np.testing.assert_allclose(_objective(norms, exact), result.fun, rtol=1e-6)
  # The closed form is optimal: SLSQP's (nearly feasible) point is no better.
  assert _objective(norms, exact) <= result.fun * (1 + 1e-8)


def test_exact_agrees_with_water_filling_oracle():
  rng = np.random.default_rng(1)
  for _ in range(200):
    num_clients, num_models = int(rng.integers(1, 60)), int(rng.integers(1, 7))
    norms = _random_norms(rng, num_clients, num_models)
    expected_clients = float(rng.uniform(0.1, num_clients + 1))
    np.testing.assert_allclose(
      probabilities.multi_model_probabilities(norms, expected_clients),
      _water_filling_oracle(norms, expected_clients),
      rtol=1e-10,
      atol=1e-300,
      err_msg=f'norms={norms.tolist()}, m={expected_clients}',
    )


# ---------------------------------------------------------------------------
# Exact probabilities: properties.


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_norm_matrices(), expected_clients=_EXPECTED)
def test_exact_bounds_sums_and_zero_pattern(norms, expected_clients):
  probs = probabilities.multi_model_probabilities(norms, expected_clients)
  assert probs.shape == norms.shape
  assert np.all((probs >= 0) & (probs <= 1))
  row_sums = np.sum(probs, axis=1)
  assert np.all(row_sums <= 1 + 1e-12)
  assert abs(np.sum(probs) - _target_sum(norms, expected_clients)) <= 1e-9 * norms.size
  # Every client with M_i > 0 gets p_i > 0, so p_{s|i} = 0 exactly iff Ũ = 0.
  np.testing.assert_array_equal(probs > 0, norms > 0)
  # The split is proportional: p_{s|i} / Ũ_{i,s} = p_i / M_i within a row.
  totals = np.sum(norms, axis=1)
  client_probs = probabilities.optimal_probabilities(totals, expected_clients)
  np.testing.assert_allclose(row_sums, client_probs, rtol=1e-12, atol=0)
  positive = norms > 0
  rows = np.nonzero(positive)[0]
  np.testing.assert_allclose(
    probs[positive] / norms[positive], client_probs[rows] / totals[rows], rtol=1e-12
  )


@_PROPERTY_SETTINGS
@hypothesis.given(
  norms=_norm_matrices(max_models=1), expected_clients=_EXPECTED, steps=st.integers(0, 5)
)
def test_single_model_reduces_exactly(norms, expected_clients, steps):
  single = norms[:, 0]
  exact = probabilities.multi_model_probabilities(norms, expected_clients)
  np.testing.assert_array_equal(
    exact[:, 0], probabilities.optimal_probabilities(single, expected_clients)
  )
  info = probabilities.approximate_multi_model_probabilities_with_info(
    norms, expected_clients, steps
  )
  single_info = probabilities.approximate_optimal_probabilities_with_info(
    single, expected_clients, steps
  )
  np.testing.assert_array_equal(info.probabilities[:, 0], single_info.probabilities)
  assert info.rescaling_steps_used == single_info.rescaling_steps_used
  if np.all(exact[norms > 0] > 0):
    assert probabilities.multi_model_sampling_variance(norms, exact) == (
      probabilities.sampling_variance(single, exact[:, 0])
    )
    assert probabilities.multi_model_improvement_factor(norms, exact, expected_clients) == (
      probabilities.improvement_factor(single, exact[:, 0], expected_clients)
    )


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_norm_matrices(), expected_clients=_EXPECTED, seed=st.integers(0, 2**31))
def test_exact_equivariant_under_permutations(norms, expected_clients, seed):
  rng = np.random.default_rng(seed)
  clients, models = rng.permutation(norms.shape[0]), rng.permutation(norms.shape[1])
  probs = probabilities.multi_model_probabilities(norms, expected_clients)
  np.testing.assert_allclose(
    probabilities.multi_model_probabilities(norms[clients][:, models], expected_clients),
    probs[clients][:, models],
    rtol=1e-12,
    atol=0,
  )


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_norm_matrices(), expected_clients=_EXPECTED)
def test_exact_improvement_factor_in_unit_interval(norms, expected_clients):
  probs = probabilities.multi_model_probabilities(norms, expected_clients)
  alpha = probabilities.multi_model_improvement_factor(norms, probs, expected_clients)
  # Random assignment is feasible, so the optimum is no worse (1e-9 for the
  # rounding that test_probabilities.py explains).
  assert 0.0 <= alpha <= 1.0 + 1e-9


@_PROPERTY_SETTINGS
@hypothesis.given(
  norms=_norm_matrices(max_clients=8, max_models=3),
  expected_clients=_EXPECTED,
  seed=st.integers(0, 2**31),
)
def test_exact_no_feasible_perturbation_improves(norms, expected_clients, seed):
  # Random moves inside {p ≥ 0, Σ_s p_{s|i} ≤ 1, Σ p = m} on the pairs with
  # Ũ > 0 never lower Σ Ũ²/p: a local check of the closed form, with no solver.
  probs = probabilities.multi_model_probabilities(norms, expected_clients)
  positive = norms > 0
  hypothesis.assume(np.any(positive))
  rng = np.random.default_rng(seed)
  base = _objective(norms, probs)
  full = np.sum(probs, axis=1) >= 1 - 1e-12  # Rows that may not grow.
  free = positive & ~full[:, None]
  for _ in range(20):
    direction = np.where(positive, rng.normal(size=norms.shape), 0.0)
    for row in np.flatnonzero(full & np.any(positive, axis=1)):
      # Full rows move within themselves: their sum stays put.
      direction[row, positive[row]] -= np.mean(direction[row, positive[row]])
    if np.any(free):
      direction[free] -= np.sum(direction) / np.count_nonzero(free)  # Σ d = 0.
    row_change = np.sum(direction, axis=1)
    growing = ~full & (row_change > 0)
    room_rows = (1 - np.sum(probs, axis=1)[growing]) / row_change[growing]
    shrinking = positive & (direction < 0)
    room_pairs = probs[shrinking] / -direction[shrinking]
    # Half the largest step that keeps p > 0 and rows ≤ 1.
    step = 0.5 * min(np.min(room_rows, initial=1.0), np.min(room_pairs, initial=1.0))
    moved = probs + step * direction
    assert _objective(norms, moved) >= base * (1 - 1e-12)


# ---------------------------------------------------------------------------
# Secure-aggregation version.


@pytest.mark.parametrize(
  'steps, expected, steps_used',
  [
    # M = [4, 4, 8], m = 2.5, A = 16: p0 = min(1, 2.5 M/16) = [5/8, 5/8, 1];
    # split: [5/32, 15/32], [5/16, 5/16], [0, 1]. Σ = 2.25 < 2.5.
    (0, [[0.15625, 0.46875], [0.3125, 0.3125], [0.0, 1.0]], 0),
    # Step 1: I = 2, P = 5/4, C = (2.5 - 3 + 2)/(5/4) = 6/5 → p = [3/4, 3/4, 1],
    # the exact answer; step 2: C = 1 → stop.
    (1, [[0.1875, 0.5625], [0.375, 0.375], [0.0, 1.0]], 1),
    (4, [[0.1875, 0.5625], [0.375, 0.375], [0.0, 1.0]], 1),
  ],
)
def test_approximate_hand_computed(steps, expected, steps_used):
  info = probabilities.approximate_multi_model_probabilities_with_info(_EXAMPLE, 2.5, steps)
  np.testing.assert_allclose(info.probabilities, expected, rtol=_RTOL, atol=0)
  assert info.rescaling_steps_used == steps_used
  np.testing.assert_array_equal(
    probabilities.approximate_multi_model_probabilities(_EXAMPLE, 2.5, steps), info.probabilities
  )


def test_approximate_exact_without_rescaling_when_nothing_clips():
  # If m · max M_i ≤ Σ M_i, the first step min(1, m M_i / A) clips no one and
  # already is Algorithm 1's answer (k = N), so zero steps suffice.
  rng = np.random.default_rng(3)
  for _ in range(50):
    norms = rng.uniform(0.5, 1.5, size=(30, 4))
    expected_clients = float(rng.uniform(0.5, 10))
    totals = np.sum(norms, axis=1)
    assert expected_clients * np.max(totals) <= np.sum(totals)
    np.testing.assert_allclose(
      probabilities.approximate_multi_model_probabilities(norms, expected_clients, 0),
      probabilities.multi_model_probabilities(norms, expected_clients),
      rtol=1e-12,
      atol=0,
    )


@_PROPERTY_SETTINGS
@hypothesis.given(norms=_norm_matrices(), expected_clients=_EXPECTED)
def test_approximate_iterates_valid_increasing_and_reach_exact(norms, expected_clients):
  exact = probabilities.multi_model_probabilities(norms, expected_clients)
  target = _target_sum(norms, expected_clients)
  previous = None
  for steps in range(norms.shape[0] + 1):
    probs = probabilities.approximate_multi_model_probabilities(norms, expected_clients, steps)
    assert np.all((probs >= 0) & (probs <= 1))
    assert np.all(np.sum(probs, axis=1) <= 1 + 1e-12)
    assert np.sum(probs) <= target * (1 + 1e-12)
    assert np.all(probs[norms == 0] == 0)
    assert np.all(probs <= exact * (1 + 1e-12))
    if np.all(probs[norms > 0] > 0):
      assert _objective(norms, probs) >= _objective(norms, exact) * (1 - 1e-12)
    if previous is not None:
      assert np.all(probs >= previous)
    previous = probs
  # With N steps, Algorithm 2 on M is Algorithm 1 on M.
  np.testing.assert_allclose(previous, exact, rtol=_RTOL, atol=0)


def _heavy_tailed(kind, seed):
  rng = np.random.default_rng(seed)
  if kind == 'entrywise':  # Every Ũ_{i,s} lognormal(0, 2.5).
    return rng.lognormal(0.0, 2.5, size=(100, 5))
  # 'per_client': a heavy-tailed client scale (lognormal(0, 2)) times
  # lognormal(0, 1) per model, so the row sums M_i are heavy-tailed too.
  return rng.lognormal(0.0, 2.0, size=(100, 1)) * rng.lognormal(0.0, 1.0, size=(100, 5))


# Measured max over seeds 0..9 of variance(secure, j steps) / variance(exact),
# N = 100, S = 5, m = 10 (medians in brackets):
#   steps:         0               1               2..4
#   entrywise:     1.6004 (1.355)  1.01101 (1.0)   1 to 1e-12
#   per_client:    1.1847 (1.123)  1.00676 (1.0)   1 to 1e-12
# The bounds below leave a little room over these values.
_VARIANCE_RATIO_BOUNDS = {
  'entrywise': [1.61, 1.012, 1 + 1e-12, 1 + 1e-12, 1 + 1e-12],
  'per_client': [1.19, 1.007, 1 + 1e-12, 1 + 1e-12, 1 + 1e-12],
}


@pytest.mark.parametrize('kind', sorted(_VARIANCE_RATIO_BOUNDS))
def test_approximate_variance_ratio_on_heavy_tailed_norms(kind):
  ratios = []
  for seed in range(10):
    norms = _heavy_tailed(kind, seed)
    exact = probabilities.multi_model_sampling_variance(
      norms, probabilities.multi_model_probabilities(norms, 10)
    )
    ratios.append(
      [
        probabilities.multi_model_sampling_variance(
          norms, probabilities.approximate_multi_model_probabilities(norms, 10, steps)
        )
        / exact
        for steps in range(5)
      ]
    )
  ratios = np.array(ratios)
  assert np.all(ratios >= 1 - 1e-12)  # Never better than the optimum.
  assert np.all(np.diff(ratios, axis=1) <= 1e-12)  # Non-increasing in the steps.
  assert np.all(np.max(ratios, axis=0) <= _VARIANCE_RATIO_BOUNDS[kind]), np.max(ratios, axis=0)
  assert np.max(ratios[:, 0]) > 1.1  # The instances are hard enough to need rescaling.


# ---------------------------------------------------------------------------
# TensorFlow twins.

_TOLERANCES = {tf.float64: dict(rtol=1e-12, atol=0), tf.float32: dict(rtol=1e-6, atol=0)}


def _tf_cases(count, seed=0):
  rng = np.random.default_rng(seed)
  cases = [
    (np.array(_EXAMPLE), 2.5),
    (np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]), 1.0),
    (np.zeros((2, 3)), 1.0),
    (np.array([[5.0]]), 0.5),
    (np.array(_EXAMPLE), 7.5),
  ]
  for _ in range(count):
    num_clients = int(rng.integers(1, 40))
    cases.append(
      (
        _random_norms(rng, num_clients, int(rng.integers(1, 6))),
        float(rng.uniform(0.1, num_clients + 1)),
      )
    )
  return cases


@pytest.mark.parametrize('dtype', [tf.float64, tf.float32])
def test_tf_twins_agree_with_numpy(dtype):
  for norms, expected_clients in _tf_cases(40):
    norms = norms.astype(dtype.as_numpy_dtype)  # NumPy gets the same rounded values.
    tensor = tf.constant(norms, dtype)
    exact = probabilities.multi_model_probabilities(norms, expected_clients)
    exact_tf = probabilities.multi_model_probabilities_tf(tensor, expected_clients)
    assert exact_tf.dtype == dtype and exact_tf.shape == norms.shape
    np.testing.assert_allclose(exact_tf.numpy(), exact, **_TOLERANCES[dtype])
    for steps in (0, 1, 4, norms.shape[0]):
      info = probabilities.approximate_multi_model_probabilities_with_info(
        norms, expected_clients, steps
      )
      info_tf = probabilities.approximate_multi_model_probabilities_with_info_tf(
        tensor, expected_clients, steps
      )
      np.testing.assert_allclose(
        info_tf.probabilities.numpy(), info.probabilities, **_TOLERANCES[dtype]
      )
      assert int(info_tf.rescaling_steps_used) == info.rescaling_steps_used
      np.testing.assert_array_equal(
        probabilities.approximate_multi_model_probabilities_tf(
          tensor, expected_clients, steps
        ).numpy(),
        info_tf.probabilities.numpy(),
      )
    if np.all(exact[norms > 0] > 0):
      np.testing.assert_allclose(
        probabilities.multi_model_sampling_variance_tf(tensor, exact_tf).numpy(),
        probabilities.multi_model_sampling_variance(norms, exact),
        **_TOLERANCES[dtype],
      )
      np.testing.assert_allclose(
        probabilities.multi_model_improvement_factor_tf(tensor, exact_tf, expected_clients).numpy(),
        probabilities.multi_model_improvement_factor(norms, exact, expected_clients),
        **_TOLERANCES[dtype],
      )


def test_tf_twins_inside_tf_function_trace_once():

  @tf.function(
    input_signature=[tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([], tf.float32)]
  )
  def compute(norms, expected_clients):
    return (
      probabilities.multi_model_probabilities_tf(norms, expected_clients),
      probabilities.approximate_multi_model_probabilities_with_info_tf(norms, expected_clients, 4),
    )

  for norms, expected_clients in _tf_cases(8, seed=4):
    norms = norms.astype(np.float32)
    exact_tf, info_tf = compute(tf.constant(norms), tf.constant(expected_clients, tf.float32))
    np.testing.assert_allclose(
      exact_tf.numpy(), probabilities.multi_model_probabilities(norms, expected_clients), rtol=1e-6
    )
    info = probabilities.approximate_multi_model_probabilities_with_info(norms, expected_clients, 4)
    np.testing.assert_allclose(info_tf.probabilities.numpy(), info.probabilities, rtol=1e-6)
    assert int(info_tf.rescaling_steps_used) == info.rescaling_steps_used
  assert compute.experimental_get_tracing_count() == 1


def test_tf_runtime_checks_reject_bad_norms():
  with pytest.raises(tf.errors.InvalidArgumentError, match='non-negative'):
    probabilities.multi_model_probabilities_tf(tf.constant([[1.0, -1.0]]), 1.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match='finite'):
    probabilities.approximate_multi_model_probabilities_tf(tf.constant([[1.0], [np.nan]]), 1.0, 2)


@pytest.mark.parametrize(
  'call, match',
  [
    (lambda: probabilities.multi_model_probabilities_tf(tf.constant([[1, 2]]), 1.0), 'float32'),
    (lambda: probabilities.multi_model_probabilities_tf(tf.ones([2]), 1.0), '2-D'),
    (lambda: probabilities.multi_model_probabilities_tf(tf.zeros([2, 0]), 1.0), 'one model'),
    (lambda: probabilities.multi_model_probabilities_tf(tf.ones([2, 2]), 0.0), 'expected_clients'),
    (
      lambda: probabilities.approximate_multi_model_probabilities_tf(tf.ones([2, 2]), 1.0, -1),
      'max_rescaling_steps',
    ),
  ],
)
def test_tf_static_errors(call, match):
  with pytest.raises(ValueError, match=match):
    call()


# ---------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize(
  'norms, match',
  [
    ([[1.0, np.nan]], 'finite'),
    ([[1.0], [np.inf]], 'finite'),
    ([[1.0, -0.5]], r'non-negative, got \[-0.5\]'),
    ([1.0, 2.0], r'2-D \[clients, models\].*weighted_norms\[:, None\]'),
    (np.zeros((0, 2)), 'one client and one model'),
    (np.zeros((2, 0)), 'one client and one model'),
    ([['a', 'b']], 'real numbers'),
  ],
)
def test_bad_norms(norms, match):
  with pytest.raises(ValueError, match=match):
    probabilities.multi_model_probabilities(norms, 1)
  with pytest.raises(ValueError, match=match):
    probabilities.approximate_multi_model_probabilities(norms, 1, 2)
  with pytest.raises(ValueError, match=match):
    probabilities.multi_model_sampling_variance(norms, [[0.5, 0.5]])


@pytest.mark.parametrize(
  'expected_clients, match',
  [
    (0, 'positive, got 0'),
    (-2.0, r'positive, got -2.0'),
    (np.nan, 'got nan'),
    (True, 'got True'),
    (None, 'got None'),
  ],
)
def test_bad_expected_clients(expected_clients, match):
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.multi_model_probabilities([[1.0, 2.0]], expected_clients)
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.approximate_multi_model_probabilities([[1.0, 2.0]], expected_clients, 1)
  with pytest.raises(ValueError, match=f'expected_clients.*{match}'):
    probabilities.multi_model_improvement_factor([[1.0, 2.0]], [[0.5, 0.5]], expected_clients)


@pytest.mark.parametrize('steps', [-1, 1.5, True])
def test_bad_max_rescaling_steps(steps):
  with pytest.raises(ValueError, match='max_rescaling_steps'):
    probabilities.approximate_multi_model_probabilities([[1.0, 2.0]], 1, steps)


@pytest.mark.parametrize(
  'probs, match',
  [
    ([[0.5, 0.5]], 'shape'),
    ([[0.5, 0.5], [0.5, 1.5]], r'\[0, 1\], got \[1.5\]'),
    ([[0.5, 0.5], [np.nan, 0.5]], r'\[0, 1\]'),
    ([[0.5, 0.5], [0.5, 0.0]], r'\(client, model\) pairs \[\[1, 1\]\]'),
  ],
)
def test_bad_probabilities(probs, match):
  norms = [[1.0, 2.0], [3.0, 4.0]]
  with pytest.raises(ValueError, match=match):
    probabilities.multi_model_sampling_variance(norms, probs)
  with pytest.raises(ValueError, match=match):
    probabilities.multi_model_improvement_factor(norms, probs, 1)
