"""Tests for tasks/unbalance.py and the ``emnist_unbalanced_*`` tasks.

The procedure is checked on synthetic client sizes (exact rules, a binomial
bound on the removal frequency, determinism), the concentration on
hand-computed cases, the calibration on a hand-solvable case and the
presets on the FEMNIST stand-in; end to end, a tiny database in TFF's format
is unbalanced and the task's statistics are checked against the data it
actually yields.
"""

import collections
import math
import os

import numpy as np
import pytest
import tensorflow as tf
import tff_sqlite_fixtures as fixtures

from tasks import _common
from tasks import digits
from tasks import emnist
from tasks import get_task
from tasks import task_names
from tasks import task_options
from tasks import unbalance

# 4 standard deviations of a binomial frequency: a correct implementation
# fails a check with probability < 1e-4 (and the seeds are fixed).
_Z = 4.0


def _synthetic_sizes(num_clients=20_000, seed=0):
  return np.random.default_rng(seed).integers(1, 500, num_clients)


def _apply(sizes, seed=0, **params):
  defaults = dict(lower=50, upper=300, removal_probability=0.3, keep_examples=5)
  defaults.update(params)
  return unbalance.unbalance_client_sizes(sizes, seed=seed, **defaults)


# --------------------------------------------------------------------------
# The procedure.


def test_clients_outside_the_range_are_untouched():
  sizes = _synthetic_sizes()
  result = _apply(sizes)
  outside = (sizes < 50) | (sizes > 300)
  assert outside.sum() > 5_000 and (~outside).sum() > 5_000
  assert result.kept_mask[outside].all()
  np.testing.assert_array_equal(result.new_sizes[outside], sizes[outside])


@pytest.mark.parametrize('removal_probability', [0.1, 0.5, 0.9])
@pytest.mark.parametrize('seed', [0, 1])
def test_removal_frequency_matches_probability(removal_probability, seed):
  sizes = _synthetic_sizes(seed=seed)
  result = _apply(sizes, seed=seed, removal_probability=removal_probability)
  inside = (sizes >= 50) & (sizes <= 300)
  removed = (~result.kept_mask[inside]).mean()
  bound = _Z * math.sqrt(removal_probability * (1 - removal_probability) / inside.sum())
  assert abs(removed - removal_probability) <= bound
  assert (result.new_sizes[~result.kept_mask] == 0).all()


def test_survivors_inside_keep_the_small_size():
  sizes = np.concatenate([np.arange(1, 60), _synthetic_sizes(2_000)])
  result = _apply(sizes, lower=1, upper=300, keep_examples=7)
  survivors = result.kept_mask & (sizes <= 300)
  assert survivors.sum() > 500
  # min(n, keep): clients with fewer than 7 examples keep all of them.
  np.testing.assert_array_equal(result.new_sizes[survivors], np.minimum(sizes[survivors], 7))
  assert set(result.new_sizes[survivors]) == set(range(1, 8))


def test_extreme_probabilities():
  sizes = _synthetic_sizes(1_000)
  inside = (sizes >= 50) & (sizes <= 300)
  assert _apply(sizes, removal_probability=0.0).kept_mask.all()
  np.testing.assert_array_equal(_apply(sizes, removal_probability=1.0).kept_mask, ~inside)


def test_deterministic_in_the_seed_and_nested_in_the_probability():
  sizes = _synthetic_sizes(5_000)
  first, again, other = _apply(sizes, seed=3), _apply(sizes, seed=3), _apply(sizes, seed=4)
  np.testing.assert_array_equal(first.kept_mask, again.kept_mask)
  np.testing.assert_array_equal(first.new_sizes, again.new_sizes)
  assert not np.array_equal(first.kept_mask, other.kept_mask)
  # One uniform per client: a larger p removes a superset of the clients.
  more = _apply(sizes, seed=3, removal_probability=0.6)
  assert (~first.kept_mask <= ~more.kept_mask).all()


def test_select_kept_examples():
  kept = unbalance.select_kept_examples(50, 8, seed=1, client_index=7)
  assert kept.dtype == np.int64 and len(kept) == 8
  assert (np.diff(kept) > 0).all() and kept.min() >= 0 and kept.max() < 50
  np.testing.assert_array_equal(kept, unbalance.select_kept_examples(50, 8, seed=1, client_index=7))
  assert not np.array_equal(kept, unbalance.select_kept_examples(50, 8, seed=1, client_index=8))
  assert not np.array_equal(kept, unbalance.select_kept_examples(50, 8, seed=2, client_index=7))
  np.testing.assert_array_equal(
    unbalance.select_kept_examples(6, 6, seed=0, client_index=0), np.arange(6)
  )
  with pytest.raises(ValueError, match='num_kept must be in'):
    unbalance.select_kept_examples(5, 6, seed=0, client_index=0)


def test_selection_is_uniform_over_examples():
  # Over 4,000 clients of 20 examples keeping 5, every position is kept with
  # frequency 1/4 within the binomial bound.
  kept = np.concatenate(
    [unbalance.select_kept_examples(20, 5, seed=0, client_index=i) for i in range(4_000)]
  )
  frequency = np.bincount(kept, minlength=20) / 4_000
  assert np.abs(frequency - 0.25).max() <= _Z * math.sqrt(0.25 * 0.75 / 4_000)


@pytest.mark.parametrize(
  'params, pattern',
  [
    (dict(lower=10, upper=5), r'upper must be an integer >= lower \(10\), got 5'),
    (dict(lower=-1), 'lower must be an integer >= 0, got -1'),
    (dict(removal_probability=1.5), r'removal_probability must be in \[0, 1\], got 1.5'),
    (dict(keep_examples=0), 'keep_examples must be an integer >= 1, got 0'),
    (dict(keep_examples=2.0), 'keep_examples must be an integer >= 1, got 2.0'),
  ],
)
def test_bad_parameters(params, pattern):
  with pytest.raises(ValueError, match=pattern):
    _apply(np.array([1, 2, 3]), **params)


def test_bad_sizes():
  with pytest.raises(ValueError, match='1-D integer array'):
    _apply(np.ones((2, 2), np.int64))
  with pytest.raises(ValueError, match='1-D integer array'):
    _apply(np.array([1.5, 2.0]))
  with pytest.raises(ValueError, match='must be >= 0'):
    _apply(np.array([3, -1]))


# --------------------------------------------------------------------------
# Concentration.


@pytest.mark.parametrize(
  'sizes, top_fraction, expected',
  [
    ([10, 5, 3, 2], 0.25, 10 / 20),
    ([2, 10, 3, 5], 0.5, 15 / 20),
    ([1] * 10, 0.1, 0.1),
    ([7, 1, 2], 0.1, 7 / 10),  # round(0.3) = 0 -> at least one client.
    ([4, 4, 2], 1.0, 1.0),
    ([100] + [1] * 19, 0.1, 101 / 119),  # round(2.0) = 2 clients.
  ],
)
def test_size_concentration_hand_computed(sizes, top_fraction, expected):
  assert unbalance.size_concentration(np.array(sizes), top_fraction) == pytest.approx(expected)


def test_size_concentration_agrees_with_digits():
  sizes = np.random.default_rng(0).integers(1, 1_000, 137)
  for top_fraction in (0.1, 0.2, 0.5):
    assert unbalance.size_concentration(sizes, top_fraction) == pytest.approx(
      digits.size_concentration(sizes, top_fraction)
    )


def test_size_concentration_errors():
  with pytest.raises(ValueError, match='positive sum'):
    unbalance.size_concentration(np.array([]), 0.1)
  with pytest.raises(ValueError, match='positive sum'):
    unbalance.size_concentration(np.array([0, 0]), 0.1)
  with pytest.raises(ValueError, match=r'top_fraction must be in \(0, 1\]'):
    unbalance.size_concentration(np.array([1, 2]), 0.0)


# --------------------------------------------------------------------------
# Calibration.


def test_calibration_solves_a_hand_computed_case():
  # 10 clients of 100 and 90 of 10; p = 0 and upper = 10 shrink the 90 to
  # `keep` each, so the top 10% hold 1000 / (1000 + 90 keep); 0.6897 <-> keep 5.
  sizes = np.array([100] * 10 + [10] * 90)
  result = unbalance.calibrate_on_sizes(
    sizes, 0.1, 1000 / 1450, removal_probability=0.0, lower=1, keep_candidates=range(1, 10)
  )
  assert result.params == unbalance.UnbalanceParams(1, 10, 0.0, 5)
  assert result.mean_share == pytest.approx(1000 / 1450)
  assert result.unchanged_fraction == pytest.approx(0.1)
  assert result.mean_clients == 100


def test_standin_sizes_match_the_known_facts():
  for only_digits, clients, total, largest in [
    (True, 3_383, 341_873, 213),
    (False, 3_400, 671_585, 418),
  ]:
    sizes = emnist.femnist_standin_client_sizes(only_digits)
    assert sizes.shape == (clients,) and sizes.sum() == total
    assert sizes.min() >= 1 and largest - 2 <= sizes.max() <= largest
    # The truncation at `largest` lowers LEAF's coefficient of variation 0.39 a little.
    assert 0.33 <= sizes.std() / sizes.mean() <= 0.39


# The presets reach their targets on the stand-in: the mean share over
# unbalancing seeds 0-4 within 0.005, every seed within 0.02.
@pytest.mark.parametrize('unbalanced_set', [1, 2, 3])
@pytest.mark.parametrize('only_digits', [True, False])
def test_presets_reach_targets_on_standin(unbalanced_set, only_digits):
  top_fraction, target = emnist.UNBALANCED_TARGETS[unbalanced_set]
  params = emnist.UNBALANCED_PRESETS[(unbalanced_set, only_digits)]
  sizes = emnist.femnist_standin_client_sizes(only_digits)
  shares = []
  for seed in range(5):
    result = unbalance.unbalance_client_sizes(sizes, seed=seed, **params.as_dict())
    shares.append(unbalance.size_concentration(result.new_sizes[result.kept_mask], top_fraction))
  assert abs(np.mean(shares) - target) <= 0.005
  assert np.abs(np.array(shares) - target).max() <= 0.02


@pytest.mark.parametrize('unbalanced_set, only_digits', [(3, True), (1, False)])
def test_calibration_reproduces_presets(unbalanced_set, only_digits):
  top_fraction, target = emnist.UNBALANCED_TARGETS[unbalanced_set]
  result = unbalance.calibrate_on_sizes(
    emnist.femnist_standin_client_sizes(only_digits),
    top_fraction,
    target,
    removal_probability=emnist.CALIBRATION_REMOVAL_PROBABILITY,
    lower=emnist.CALIBRATION_LOWER,
  )
  assert result.params == emnist.UNBALANCED_PRESETS[(unbalanced_set, only_digits)]
  assert abs(result.mean_share - target) <= 0.005


# --------------------------------------------------------------------------
# ClientData subsets.


def _in_memory(sizes):
  values = np.arange(sum(sizes), dtype=np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  ids = [f'c{i}' for i in range(len(sizes))]
  return _common.in_memory_client_data(ids, {'v': values}, offsets), values, offsets


def test_subset_client_data_eager_and_traced():
  data, values, offsets = _in_memory([5, 3, 6])
  kept = collections.OrderedDict([('c2', np.array([0, 4, 5])), ('c0', None)])
  subset = unbalance.subset_client_data(data, kept)
  assert subset.client_ids == ['c2', 'c0']
  eager = lambda c: [int(e['v']) for e in subset.create_tf_dataset_for_client(c)]
  assert eager('c2') == [values[offsets[2] + i] for i in (0, 4, 5)]
  assert eager('c0') == list(values[:5])
  traced = tf.function(lambda c: subset.serializable_dataset_fn(c).batch(100).get_single_element())
  np.testing.assert_array_equal(traced(tf.constant('c2'))['v'], eager('c2'))
  np.testing.assert_array_equal(traced(tf.constant('c0'))['v'], eager('c0'))
  with pytest.raises(ValueError, match='Unknown client ids'):
    unbalance.subset_client_data(data, {'nope': None})


# --------------------------------------------------------------------------
# The emnist_unbalanced tasks, end to end on a tiny database.

TRAIN_SIZES = collections.OrderedDict(
  f0000=3, f0001=8, f0002=12, f0003=20, f0004=25, f0005=40, f0006=9, f0007=15
)
UNBALANCE = dict(
  unbalance_lower=5,
  unbalance_upper=25,
  unbalance_removal_probability=0.5,
  unbalance_keep_examples=4,
  unbalance_seed=2,
)


@pytest.fixture(scope='module')
def tiny_femnist(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('tff_cache'))
  rng = np.random.default_rng(0)
  train = fixtures.emnist_clients(rng, TRAIN_SIZES, 62)
  splits = collections.OrderedDict(
    digits_only_train=fixtures.emnist_clients(rng, {'f0000': 4, 'f0001': 6}, 10),
    digits_only_test=fixtures.emnist_clients(rng, {'f0000': 2}, 10),
    all_train=train,
    all_test=fixtures.emnist_clients(rng, {'f0000': 2, 'f0003': 3}, 62),
  )
  fixtures.write_tff_database(os.path.join(directory, emnist.DATABASE_FILE), splits)
  return directory, train


def _raw(task, client_id):
  return list(task.train_data.create_tf_dataset_for_client(client_id).as_numpy_iterator())


def test_unbalanced_task_end_to_end(tiny_femnist):
  cache_dir, train = tiny_femnist
  task = get_task(
    'emnist_unbalanced_1',
    cache_dir=cache_dir,
    only_digits=False,
    max_eval_examples=None,
    client_batch_size=3,
    **UNBALANCE,
  )
  sizes = np.array(list(TRAIN_SIZES.values()))
  expected = unbalance.unbalance_client_sizes(
    sizes, lower=5, upper=25, removal_probability=0.5, keep_examples=4, seed=2
  )
  ids = list(TRAIN_SIZES)
  # The seed was chosen so that the case is non-trivial: some clients are
  # removed, some shrunk, some untouched.
  removed = [c for c, k in zip(ids, expected.kept_mask) if not k]
  shrunk = [c for c, n, m in zip(ids, sizes, expected.new_sizes) if 0 < m < n]
  assert removed and shrunk and 'f0005' in task.client_ids and 'f0000' in task.client_ids
  assert task.name == 'emnist_unbalanced_1'
  assert task.client_ids == tuple(c for c in ids if c not in removed)
  np.testing.assert_array_equal(task.client_num_examples, expected.new_sizes[expected.kept_mask])
  for i, client_id in enumerate(task.client_ids):
    raw = _raw(task, client_id)
    labels = np.array([e['label'] for e in raw], np.int64)
    assert len(raw) == task.client_num_examples[i]
    np.testing.assert_array_equal(
      task.client_label_histograms[i], np.bincount(labels, minlength=62)
    )
    # The kept examples are the deterministic selection, in storage order.
    kept = unbalance.select_kept_examples(
      TRAIN_SIZES[client_id], len(raw), seed=2, client_index=ids.index(client_id)
    )
    np.testing.assert_array_equal(
      np.stack([e['pixels'] for e in raw]), train[client_id]['pixels'][kept]
    )
    np.testing.assert_array_equal(labels, train[client_id]['label'][kept])
    streamed = np.concatenate([b['y'] for b in task.client_dataset(i, 5).as_numpy_iterator()])
    np.testing.assert_array_equal(np.sort(streamed), np.sort(labels))
  # Traced use (TFF's dataset_computation path) yields the same examples.
  traced = tf.function(
    lambda c: task.train_data.serializable_dataset_fn(c).batch(100).get_single_element()
  )
  for client_id in shrunk:
    np.testing.assert_array_equal(
      traced(tf.constant(client_id))['label'], [e['label'] for e in _raw(task, client_id)]
    )
  assert sum(1 for _ in task.eval_data) == 5  # The test split is unchanged.
  assert task.options['unbalance_upper'] == 25 and task.options['unbalance_calibrate'] is False
  assert set(task.options) == set(task_options('emnist_unbalanced_1'))
  batch = next(iter(task.client_dataset(0, 0)))
  assert task.keras_model_fn(0)(batch['x']).shape == (len(batch['y']), 62)


def test_unbalanced_task_presets_and_calibration(tiny_femnist):
  cache_dir, _ = tiny_femnist
  task = get_task('emnist_unbalanced_2', cache_dir=cache_dir, only_digits=False)
  preset = emnist.UNBALANCED_PRESETS[(2, False)]
  assert task.options['unbalance_upper'] == preset.upper
  # Every tiny client is <= the preset's upper: survivors keep min(n, keep).
  np.testing.assert_array_equal(
    task.client_num_examples,
    np.minimum([TRAIN_SIZES[c] for c in task.client_ids], preset.keep_examples),
  )
  calibrated = get_task(
    'emnist_unbalanced_3', cache_dir=cache_dir, only_digits=False, unbalance_calibrate=True
  )
  expected = unbalance.calibrate_on_sizes(
    np.array(list(TRAIN_SIZES.values())), 0.5, 0.98, removal_probability=0.5, lower=1
  ).params
  assert calibrated.options['unbalance_keep_examples'] == expected.keep_examples
  assert calibrated.options['unbalance_upper'] == expected.upper
  with pytest.raises(ValueError, match='unbalance_calibrate=True chooses the parameters'):
    get_task(
      'emnist_unbalanced_1', cache_dir=cache_dir, unbalance_calibrate=True, unbalance_upper=10
    )


def test_registry_entries():
  names = task_names()
  assert {'emnist_unbalanced_1', 'emnist_unbalanced_2', 'emnist_unbalanced_3'} <= set(names)
  extra = {
    'unbalance_seed',
    'unbalance_lower',
    'unbalance_upper',
    'unbalance_removal_probability',
    'unbalance_keep_examples',
    'unbalance_calibrate',
  }
  for name in ('emnist_unbalanced_1', 'emnist_unbalanced_2', 'emnist_unbalanced_3'):
    assert set(task_options(name)) == set(task_options('emnist')) | extra


@pytest.mark.parametrize(
  'options, pattern',
  [
    (
      {'unbalance_removal_probability': 1.5},
      r'unbalance_removal_probability must be in \[0.0, 1.0\], got 1.5',
    ),
    ({'unbalance_keep_examples': 0}, 'unbalance_keep_examples must be an integer >= 1, got 0'),
    ({'unbalance_lower': 400}, r'unbalance_upper must be an integer >= lower \(400\), got 167'),
    ({'unbalance_seed': -1}, r'unbalance_seed must be an integer in \[0, 4294967295\]'),
    ({'unbalance_calibrate': 'yes'}, "unbalance_calibrate must be True or False, got 'yes'"),
  ],
)
def test_bad_unbalance_options(options, pattern, tmp_path):
  # Checked before any data is touched (the cache directory is empty).
  with pytest.raises(ValueError, match=pattern):
    get_task('emnist_unbalanced_1', cache_dir=str(tmp_path), **options)
