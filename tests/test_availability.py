"""Tests of `tff_sampling.availability` (FedGS, docs/algorithms.md §3c)."""

import math

import numpy as np
import pytest

from tff_sampling import availability

# Hand-made population: sizes n = [1, 4, 9, 16], label sets
# [{0}, {1, 2}, {5}, {9}] with Y = 10 labels (max label 9).
SIZES = [1, 4, 9, 16]
LABELS = [{0}, {1, 2}, {5}, {9}]
HISTOGRAM = np.array(
  [
    [3, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 2, 2, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 9, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 16],
  ]
)
SEED = 7


def _build(mode, beta, **kwargs):
  kwargs.setdefault('client_sizes', SIZES)
  kwargs.setdefault('client_labels', LABELS)
  kwargs.setdefault('seed', SEED)
  kwargs.setdefault('num_labels', 10)
  return availability.build_availability(mode, beta, **kwargs)


def _lognormal_weights(seed, beta, n):
  """The documented one-off draw: sigma = ln(1/(1−β))."""
  rng = np.random.default_rng([seed, 0x41564C4E, 0, 1])
  return rng.lognormal(0.0, math.log(1.0 / (1.0 - beta)), n)


# ---------------------------------------------------------------- probabilities


@pytest.mark.parametrize(
  'mode, beta, expected',
  [
    # IDL: 1 for everyone.
    ('IDL', 0.5, [1.0, 1.0, 1.0, 1.0]),
    # MDF β=0.5: sqrt(n) = [1, 2, 3, 4], / 4.
    ('MDF', 0.5, [0.25, 0.5, 0.75, 1.0]),
    # MDF β=0: n^0 = 1 everywhere.
    ('MDF', 0.0, [1.0, 1.0, 1.0, 1.0]),
    # LDF β=0.5: 1/sqrt(n) = [1, 1/2, 1/3, 1/4], max is 1.
    ('LDF', 0.5, [1.0, 0.5, 1.0 / 3.0, 0.25]),
    # LDF β=1: 1/n = [1, 1/4, 1/9, 1/16].
    ('LDF', 1.0, [1.0, 0.25, 1.0 / 9.0, 1.0 / 16.0]),
    # YMF β=0.9, max label 9: min labels [0, 1, 5, 9] ->
    # 0.9·[0, 1/9, 5/9, 1] + 0.1 = [0.1, 0.2, 0.6, 1.0].
    ('YMF', 0.9, [0.1, 0.2, 0.6, 1.0]),
    # HOMO β=0.2: 0.8 everywhere.
    ('HOMO', 0.2, [0.8, 0.8, 0.8, 0.8]),
  ],
)
def test_static_probabilities_by_hand(mode, beta, expected):
  avail = _build(mode, beta)
  assert not avail.is_time_varying
  for round_num in (0, 1, 13):
    probs = avail.probabilities(round_num)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_histogram_labels_equal_label_sets():
  from_sets = _build('YMF', 0.9)
  from_histogram = _build('YMF', 0.9, client_labels=HISTOGRAM, num_labels=None)
  assert from_histogram.num_labels == 10
  np.testing.assert_allclose(from_histogram.probabilities(0), from_sets.probabilities(0))
  yc = _build('YC', 0.9, client_labels=HISTOGRAM, num_labels=None, period=10)
  np.testing.assert_allclose(yc.probabilities(0), [0.1, 1.0, 0.1, 0.1])


def test_num_labels_defaults_to_largest_label_plus_one():
  # Largest label 9 -> Y = 10, max label 9: same as the explicit Y = 10.
  avail = _build('YMF', 0.9, num_labels=None)
  assert avail.num_labels == 10
  np.testing.assert_allclose(avail.probabilities(0), [0.1, 0.2, 0.6, 1.0])
  # With Y = 19 the max label is 18: 0.9·[0, 1/18, 5/18, 9/18] + 0.1.
  wide = _build('YMF', 0.9, num_labels=19)
  np.testing.assert_allclose(wide.probabilities(0), [0.1, 0.15, 0.35, 0.55], rtol=1e-12)


@pytest.mark.parametrize(
  'round_num, expected',
  [
    # T = 10, Y = 10: phase k/T with k = 1 + t mod 10 lies in [y/10, (y+1)/10)
    # for y = k. t=0: k=1 -> label 1, held by client 1 -> 0.9 + 0.1.
    (0, [0.1, 1.0, 0.1, 0.1]),
    # t=14: k=5 -> label 5 -> client 2.
    (14, [0.1, 0.1, 1.0, 0.1]),
    # t=8: k=9 -> label 9 -> client 3.
    (8, [0.1, 0.1, 0.1, 1.0]),
    # t=11: k=2 -> label 2 -> client 1 again.
    (11, [0.1, 1.0, 0.1, 0.1]),
    # t=9: k=10 -> phase 1.0 is in [10/10, 11/10): label 10, held by nobody.
    (9, [0.1, 0.1, 0.1, 0.1]),
  ],
)
def test_label_cycle_by_hand(round_num, expected):
  avail = _build('YC', 0.9, period=10)
  assert avail.is_time_varying
  np.testing.assert_allclose(avail.probabilities(round_num), expected, rtol=1e-12)


def test_label_cycle_default_period():
  avail = _build('YC', 0.5)
  assert avail.period == availability.DEFAULT_PERIOD == 24
  # t=0: k=1, 1/24 ∈ [0, 1/10) -> label 0 -> client 0: 0.5 + 0.5.
  np.testing.assert_allclose(avail.probabilities(0), [1.0, 0.5, 0.5, 0.5])
  # t=5: k=6, 6/24 = 0.25 ∈ [0.2, 0.3) -> label 2 -> client 1.
  np.testing.assert_allclose(avail.probabilities(5), [0.5, 1.0, 0.5, 0.5])
  # t=11: k=12, 0.5 ∈ [0.5, 0.6) exactly on the boundary -> label 5, client 2.
  np.testing.assert_allclose(avail.probabilities(11), [0.5, 0.5, 1.0, 0.5])
  # t=24+11 is the same phase.
  np.testing.assert_allclose(avail.probabilities(35), [0.5, 0.5, 1.0, 0.5])


def test_lognormal_by_regenerating_the_documented_draw():
  beta = 0.5
  avail = _build('LN', beta)
  c = _lognormal_weights(SEED, beta, 4)
  probs = avail.probabilities(0)
  np.testing.assert_allclose(probs, c / c.max(), rtol=1e-12)
  assert probs[np.argmax(c)] == 1.0
  assert np.all(probs > 0) and len(set(probs.tolist())) == 4
  for round_num in (1, 5, 1000):
    np.testing.assert_array_equal(avail.probabilities(round_num), probs)
  # Another seed, other weights.
  other = _build('LN', beta, seed=SEED + 1)
  assert not np.allclose(other.probabilities(0), probs)
  # β = 0: sigma 0, every c_i = 1.
  np.testing.assert_array_equal(_build('LN', 0.0).probabilities(3), np.ones(4))


def test_sine_lognormal_by_hand():
  beta = 0.5
  avail = _build('SLN', beta, period=4)
  c = _lognormal_weights(SEED, beta, 4)
  q = c / c.max()
  # T=4. t=0: k=1, 0.4 sin(2π/4) + 0.5 = 0.4 + 0.5 = 0.9.
  np.testing.assert_allclose(avail.probabilities(0), 0.9 * q, rtol=1e-12)
  # t=2: k=3, 0.4 sin(3π/2) + 0.5 = -0.4 + 0.5 = 0.1.
  np.testing.assert_allclose(avail.probabilities(2), 0.1 * q, rtol=1e-12)
  # t=3: k=4, 0.4 sin(2π) + 0.5 = 0.5; t=7 the same phase.
  np.testing.assert_allclose(avail.probabilities(3), 0.5 * q, rtol=1e-12)
  np.testing.assert_allclose(avail.probabilities(7), 0.5 * q, rtol=1e-12)
  # Same c as LN with the same seed and β.
  np.testing.assert_allclose(avail.base_probabilities, _build('LN', beta).probabilities(0))


def test_probabilities_are_not_writable_through_the_object():
  avail = _build('HOMO', 0.2)
  probs = avail.probabilities(0)
  probs[:] = 0.0
  np.testing.assert_allclose(avail.probabilities(0), 0.8)
  with pytest.raises(ValueError):
    avail.base_probabilities[0] = 0.0


# ------------------------------------------------------------------------ masks


def test_mask_is_the_documented_draw():
  avail = _build('MDF', 0.5)  # p = [0.25, 0.5, 0.75, 1]
  for round_num in range(20):
    mask, redraws = avail.active(round_num)
    u = np.random.default_rng([SEED, round_num, 0x41564C00]).random(4)
    assert redraws == 0  # Client 3 has p = 1.
    np.testing.assert_array_equal(mask, u < avail.probabilities(round_num))


def test_masks_are_deterministic_and_order_independent():
  rounds = list(range(50))
  first = _build('HOMO', 0.5, client_sizes=np.arange(1, 31), client_labels=None)
  forward = [first.active(t) for t in rounds]
  # A second object, other availability objects and global-state changes in
  # between, rounds in reverse order, some rounds twice.
  np.random.seed(123)
  second = _build('HOMO', 0.5, client_sizes=np.arange(1, 31), client_labels=None)
  _build('LN', 0.5).active(3)
  np.random.random(10)
  backward = {t: second.active(t) for t in reversed(rounds)}
  second.active(7)
  for t in rounds:
    np.testing.assert_array_equal(forward[t][0], backward[t][0])
    assert forward[t][1] == backward[t][1]
    np.testing.assert_array_equal(forward[t][0], first.active(t)[0])
  # Masks differ between rounds (30 clients at p = 0.5).
  distinct = {tuple(mask.tolist()) for mask, _ in forward}
  assert len(distinct) == len(rounds)
  # A different seed gives different masks.
  third = _build('HOMO', 0.5, client_sizes=np.arange(1, 31), client_labels=None, seed=SEED + 1)
  assert any(not np.array_equal(third.active(t)[0], forward[t][0]) for t in rounds)


def test_idl_is_all_true():
  avail = _build('IDL', 0.3)
  for t in range(10):
    mask, redraws = avail.active(t)
    assert mask.dtype == bool and mask.all() and redraws == 0


@pytest.mark.parametrize(
  'mode, beta, period',
  [
    ('MDF', 0.7, 24),
    ('LDF', 0.7, 24),
    ('YMF', 0.9, 24),
    ('YC', 0.9, 10),
    ('LN', 0.5, 24),
    ('SLN', 0.5, 4),
    ('HOMO', 0.6, 24),
  ],
)
def test_empirical_frequencies_match_probabilities(mode, beta, period):
  # Final masks are independent Bernoulli(p) draws conditioned on being
  # non-empty, so P(i active in round t) = p_i(t) / (1 − Π_j (1 − p_j(t))).
  # Over R rounds client i's count has that sum as mean and Σ q(1 − q) as
  # variance; we accept |count − mean| ≤ 5 sd: a false alarm has probability
  # ≈ 6e-7 per client (normal approximation), ≈ 2e-5 over the 28 checks.
  avail = _build(mode, beta, period=period)
  num_rounds = 3000
  counts = np.zeros(4)
  mean = np.zeros(4)
  variance = np.zeros(4)
  total_redraws = 0
  for t in range(num_rounds):
    mask, redraws = avail.active(t)
    assert mask.any()
    counts += mask
    total_redraws += redraws
    p = avail.probabilities(t)
    q = p / (1.0 - np.prod(1.0 - p))
    mean += q
    variance += q * (1.0 - q)
  sd = np.sqrt(variance)
  assert np.all(np.abs(counts - mean) <= 5.0 * sd + 1e-9), (counts, mean, sd)
  if mode in ('YC', 'SLN', 'HOMO'):
    assert total_redraws > 0  # These leave rounds with no sure client.


def test_redraw_when_everyone_is_nearly_unavailable():
  # 10 clients at p = 0.01: a draw is empty with probability 0.99^10 ≈ 0.90.
  avail = _build('HOMO', 0.99, client_sizes=[5] * 10, client_labels=None)
  all_redraws = []
  for t in range(30):
    mask, redraws = avail.active(t)
    assert mask.any()
    all_redraws.append(redraws)
    # Oracle: the streams before the returned one were all empty.
    for attempt in range(redraws + 1):
      u = np.random.default_rng([SEED, t, 0x41564C00 + attempt]).random(10)
      expected = u < 0.01
      if attempt < redraws:
        assert not expected.any()
      else:
        np.testing.assert_array_equal(mask, expected)
  assert min(all_redraws) >= 0 and sum(all_redraws) > 0
  # Mean redraws ≈ 0.904 / 0.096 ≈ 9.4; generous bounds.
  assert 2.0 < np.mean(all_redraws) < 40.0


def test_redraw_cap_raises_naming_mode_and_beta():
  kwargs = dict(client_sizes=[5] * 10, client_labels=None)
  uncapped = _build('HOMO', 0.99, **kwargs)
  round_num, redraws = next((t, r) for t in range(100) for _, r in [uncapped.active(t)] if r >= 2)
  # Exactly `redraws` redraws allowed: the same mask; one fewer: an error.
  capped = _build('HOMO', 0.99, max_redraws=redraws, **kwargs)
  np.testing.assert_array_equal(capped.active(round_num)[0], uncapped.active(round_num)[0])
  assert capped.active(round_num)[1] == redraws
  too_few = _build('HOMO', 0.99, max_redraws=redraws - 1, **kwargs)
  with pytest.raises(RuntimeError, match=rf"'HOMO'.*beta=0\.99.*{redraws - 1} redraws"):
    too_few.active(round_num)


def test_all_zero_probabilities_raise():
  avail = _build('HOMO', 1.0)
  with pytest.raises(RuntimeError, match=r"'HOMO'.*beta=1\.0"):
    avail.active(0)


# ----------------------------------------------------------------------- errors


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(mode='FOO'), r"'FOO'.*IDL, MDF, LDF, YMF, YC, LN, SLN, HOMO"),
    (dict(mode='idl'), r"'idl'"),
    (dict(beta=-0.1), r'-0\.1'),
    (dict(beta=1.5), r'1\.5'),
    (dict(beta=float('nan')), r'nan'),
    (dict(mode='LN', beta=1.0), r"'LN'.*< 1"),
    (dict(mode='SLN', beta=1.0), r"'SLN'.*< 1"),
    (dict(client_sizes=[1, 0, 3, 4]), r'> 0, got 0'),
    (dict(client_sizes=[1, -2, 3, 4]), r'-2'),
    (dict(client_sizes=[]), r'non-empty'),
    (dict(period=0), r'`period`.*got 0'),
    (dict(period=-3), r'`period`.*got -3'),
    (dict(seed=-1), r'`seed`.*-1'),
    (dict(client_sizes=[1, 4, 9]), r'4 clients.*has 3'),
    (dict(client_labels=LABELS[:3]), r'3 clients.*has 4'),
    (dict(mode='YMF', client_labels=None), r"'YMF' needs `client_labels`"),
    (dict(mode='YC', client_labels=None), r"'YC' needs `client_labels`"),
    (dict(mode='YMF', client_labels=[{0}, set(), {5}, {9}]), r'client 1'),
    (dict(client_labels=[{0}, {1, 2}, {5}, {12}]), r'12.*0\.\.9'),
    (dict(client_labels=[{0}, {-1}, {5}, {9}]), r'-1'),
    (dict(client_labels=HISTOGRAM, num_labels=12), r'12.*10 columns'),
    (dict(num_labels=0), r'`num_labels`.*got 0'),
  ],
)
def test_bad_arguments_raise_value_error(kwargs, message):
  args = dict(
    mode='MDF', beta=0.5, client_sizes=SIZES, client_labels=LABELS, seed=SEED, num_labels=10
  )
  args.update(kwargs)
  mode = args.pop('mode')
  beta = args.pop('beta')
  with pytest.raises(ValueError, match=message):
    availability.build_availability(mode, beta, **args)


@pytest.mark.parametrize('round_num', [-1, 1.5, True])
def test_bad_round_raises_value_error(round_num):
  avail = _build('HOMO', 0.2)
  with pytest.raises(ValueError, match='round_num'):
    avail.probabilities(round_num)
  with pytest.raises(ValueError, match='round_num'):
    avail.active(round_num)


def test_every_mode_builds_and_draws():
  assert availability.AVAILABILITY_MODES == ('IDL', 'MDF', 'LDF', 'YMF', 'YC', 'LN', 'SLN', 'HOMO')
  for mode in availability.AVAILABILITY_MODES:
    avail = _build(mode, 0.5)
    for t in range(30):
      probs = avail.probabilities(t)
      assert probs.shape == (4,)
      assert np.all((probs >= 0.0) & (probs <= 1.0))
      mask, redraws = avail.active(t)
      assert mask.shape == (4,) and mask.dtype == bool and mask.any()
      assert redraws >= 0
