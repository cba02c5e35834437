"""Tests for the embedded ``digits`` task (tasks/digits.py)."""

import collections

import numpy as np
import pytest
import sklearn.datasets
import tensorflow as tf

from tasks import digits
from tasks import get_task


@pytest.fixture(scope='module')
def task():
  return get_task('digits')


def _client_arrays(task, client_index):
  elements = list(
    task.train_data.create_tf_dataset_for_client(task.client_ids[client_index]).as_numpy_iterator()
  )
  return (np.stack([e['x'] for e in elements]), np.array([e['y'] for e in elements]))


def _entropy(histograms):
  p = histograms / histograms.sum(axis=-1, keepdims=True)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0.0), axis=-1)


def _rows_multiset(features, labels):
  rows = np.concatenate([features, labels[:, None].astype(np.float32)], axis=1)
  return rows[np.lexsort(rows.T[::-1])]


def test_partition_covers_every_example_exactly_once(task):
  _assert_covers_every_example_once(task)


def _assert_covers_every_example_once(task):
  per_client = [_client_arrays(task, i) for i in range(task.num_clients)]
  evaluation = list(task.eval_data.as_numpy_iterator())
  features = np.concatenate([x for x, _ in per_client] + [np.stack([e['x'] for e in evaluation])])
  labels = np.concatenate([y for _, y in per_client] + [np.array([e['y'] for e in evaluation])])
  data = sklearn.datasets.load_digits()
  expected = _rows_multiset((data.data / 16.0).astype(np.float32), data.target)
  # Same multiset of (image, label) rows: nothing lost, nothing duplicated.
  np.testing.assert_array_equal(_rows_multiset(features, labels), expected)


def test_statistics_match_client_data(task):
  assert task.client_num_examples.dtype == np.int64
  assert task.client_label_histograms.shape == (100, 10)
  for i in range(task.num_clients):
    x, y = _client_arrays(task, i)
    assert x.shape == (task.client_num_examples[i], 64)
    np.testing.assert_array_equal(np.bincount(y, minlength=10), task.client_label_histograms[i])
  assert task.client_num_examples.min() >= 2
  assert task.client_num_examples.sum() == 1438


def test_evaluation_split_is_stratified(task):
  eval_labels = np.array([e['y'] for e in task.eval_data.as_numpy_iterator()])
  class_counts = np.bincount(sklearn.datasets.load_digits().target)
  np.testing.assert_array_equal(
    np.bincount(eval_labels, minlength=10), np.round(0.2 * class_counts).astype(int)
  )


def test_dirichlet_label_skew(task):
  global_entropy = _entropy(task.client_label_histograms.sum(axis=0))
  assert global_entropy > 2.29  # Nearly uniform over 10 classes.
  assert _entropy(task.client_label_histograms).mean() < 0.7 * global_entropy
  # Equal sizes (72 examples each) so small-sample entropy bias is small.
  skewed = get_task('digits', size_sigma=0.0, num_clients=20)
  near_iid = get_task('digits', size_sigma=0.0, num_clients=20, dirichlet_alpha=1000.0)
  assert _entropy(skewed.client_label_histograms).mean() < 0.7 * global_entropy
  assert _entropy(near_iid.client_label_histograms).mean() > 0.9 * global_entropy


def test_deterministic_in_seed_and_different_across_seeds(task):
  again = get_task('digits')
  other = get_task('digits', seed=1)
  np.testing.assert_array_equal(task.client_label_histograms, again.client_label_histograms)
  np.testing.assert_array_equal(_client_arrays(task, 7)[0], _client_arrays(again, 7)[0])
  assert not np.array_equal(task.client_label_histograms, other.client_label_histograms)
  assert not np.array_equal(task.client_num_examples, other.client_num_examples)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_unbalanced_preset_concentration(seed):
  unbalanced = get_task('digits', preset='unbalanced', seed=seed)
  balanced = get_task('digits', seed=seed)
  assert 0.75 <= digits.size_concentration(unbalanced.client_num_examples) <= 0.9
  assert digits.size_concentration(balanced.client_num_examples) <= 0.5
  assert unbalanced.client_num_examples.min() >= 2
  assert unbalanced.options['size_sigma'] == 3.0


def test_explicit_size_sigma_overrides_preset():
  task = get_task('digits', preset='unbalanced', size_sigma=0.0)
  # Equal weights: sizes differ by at most one (largest-remainder rounding).
  assert np.ptp(task.client_num_examples) <= 1
  assert task.options['size_sigma'] == 0.0


def test_preprocess_client_is_seeded_capped_and_repeated(task):
  index = int(np.argmax(task.client_num_examples))
  size = int(task.client_num_examples[index])
  labels = lambda ds: np.concatenate([b['y'] for b in ds.as_numpy_iterator()])
  xs = lambda ds: np.concatenate([b['x'] for b in ds.as_numpy_iterator()])
  first = xs(task.client_dataset(index, 5))
  np.testing.assert_array_equal(first, xs(task.client_dataset(index, 5)))
  assert not np.array_equal(first, xs(task.client_dataset(index, 6)))
  batches = list(task.client_dataset(index, 0).as_numpy_iterator())
  assert all(len(b['y']) == 20 for b in batches[:-1])
  assert len(labels(task.client_dataset(index, 0))) == size

  capped = get_task('digits', max_client_examples=3, client_epochs=2, client_batch_size=4)
  batches = list(capped.client_dataset(index, 0).as_numpy_iterator())
  assert [len(b['y']) for b in batches] == [4, 2]  # 3 per epoch, 2 epochs.


def test_element_spec_and_model(task):
  spec = task.element_spec
  assert list(spec) == ['x', 'y']
  assert spec['x'] == tf.TensorSpec([None, 64], tf.float32)
  assert spec['y'] == tf.TensorSpec([None], tf.int32)
  batch = next(iter(task.client_dataset(0, 0)))
  assert task.keras_model_fn(0)(batch['x']).shape == (len(batch['y']), 10)
  logistic = get_task('digits', model='logistic', num_clients=10)
  assert logistic.keras_model_fn(0).count_params() == 650


def test_serializable_dataset_fn_matches_eager(task):
  client_id = task.client_ids[3]
  traced = tf.function(lambda cid: task.train_data.serializable_dataset_fn(cid).batch(1000))
  batch = next(iter(traced(tf.constant(client_id))))
  eager = next(iter(task.train_data.create_tf_dataset_for_client(client_id).batch(1000)))
  np.testing.assert_array_equal(batch['x'], eager['x'])
  np.testing.assert_array_equal(batch['y'], eager['y'])


def test_one_fedavg_round_runs(task):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
  )
  state = process.initialize()
  state = process.set_model_weights(state, task.initial_model_weights(0))
  output = process.next(state, [task.client_dataset(i, 0) for i in range(3)])
  train = output.metrics['client_work']['train']
  assert train['num_examples'] == int(task.client_num_examples[:3].sum())
  assert np.isfinite(train['loss'])


def test_lognormal_sizes_and_partition_helpers():
  rng = np.random.default_rng(0)
  sizes = digits.lognormal_sizes(50, 20, 2.0, 2, rng)
  assert sizes.sum() == 50 and sizes.min() >= 2
  with pytest.raises(ValueError, match='cannot give 30 clients 2 examples'):
    digits.lognormal_sizes(50, 30, 1.0, 2, rng)
  labels = np.repeat(np.arange(3), [5, 7, 8])
  parts = digits.dirichlet_partition(labels, np.array([10, 6, 4]), 0.1, rng, 3)
  assert sorted(np.concatenate(parts).tolist()) == list(range(20))
  assert [len(p) for p in parts] == [10, 6, 4]
  assert collections.Counter(np.concatenate(parts).tolist()).most_common(1)[0][1] == 1


def test_too_many_clients_is_a_clear_error():
  with pytest.raises(ValueError, match='use num_clients <= 719'):
    get_task('digits', num_clients=800)


@pytest.fixture(scope='module')
def shards():
  return get_task('digits', preset='shards')


def test_shards_one_digit_per_client_ten_clients_per_digit(shards):
  histograms = shards.client_label_histograms
  assert histograms.shape == (100, 10)
  np.testing.assert_array_equal(np.count_nonzero(histograms, axis=1), np.ones(100))
  np.testing.assert_array_equal(histograms.sum(axis=1), shards.client_num_examples)
  labels = digits.shard_labels(shards)
  assert labels.dtype == np.int64
  np.testing.assert_array_equal(labels, histograms.argmax(axis=1))
  np.testing.assert_array_equal(np.bincount(labels, minlength=10), np.full(10, 10))
  for i in (0, 37, 99):  # The data itself, not only the statistics, is one digit.
    _, y = _client_arrays(shards, i)
    np.testing.assert_array_equal(y, np.full(len(y), labels[i]))
  # Within a digit sizes differ by at most one; a digit's shards share its
  # 139-146 training examples, so all sizes are 13-15.
  sizes = shards.client_num_examples
  assert sizes.sum() == 1438
  for digit in range(10):
    own = sizes[labels == digit]
    assert np.ptp(own) <= 1
    assert own.sum() == histograms[:, digit].sum()
  assert sizes.min() == 13 and sizes.max() == 15
  assert shards.options['preset'] == 'shards'
  assert shards.options['dirichlet_alpha'] is None and shards.options['size_sigma'] is None


def test_shards_cover_every_example_exactly_once(shards):
  _assert_covers_every_example_once(shards)


def test_shards_are_seeded(shards):
  again = get_task('digits', preset='shards')
  other = get_task('digits', preset='shards', seed=1)
  np.testing.assert_array_equal(digits.shard_labels(again), digits.shard_labels(shards))
  np.testing.assert_array_equal(_client_arrays(again, 5)[0], _client_arrays(shards, 5)[0])
  assert not np.array_equal(digits.shard_labels(other), digits.shard_labels(shards))
  # Same digit, different examples: the shard contents are seeded too.
  digit_zero = lambda t: _client_arrays(t, int(np.flatnonzero(digits.shard_labels(t) == 0)[0]))[0]
  assert not np.array_equal(digit_zero(other), digit_zero(shards))


def test_shards_with_other_client_counts():
  task = get_task('digits', preset='shards', num_clients=25)
  per_digit = np.bincount(digits.shard_labels(task), minlength=10)
  # 2 per digit; the 5 extras go to the digits with the most training
  # examples (1, 3, 5: 146 each; then 4, 6: 145; ties to the smaller digit).
  np.testing.assert_array_equal(per_digit, [2, 3, 2, 3, 3, 3, 3, 2, 2, 2])
  assert get_task('digits', preset='shards', num_clients=10).client_num_examples.min() == 139
  with pytest.raises(ValueError, match='num_clients >= 10'):
    get_task('digits', preset='shards', num_clients=9)
  with pytest.raises(ValueError, match='use num_clients <= 699'):
    get_task('digits', preset='shards', num_clients=700)


@pytest.mark.parametrize('option', ['dirichlet_alpha', 'size_sigma'])
def test_shards_reject_options_that_do_not_apply(option):
  with pytest.raises(ValueError, match=f"{option} does not apply to preset='shards'"):
    get_task('digits', preset='shards', **{option: 1.0})


def test_shard_labels_rejects_mixed_clients(task):
  with pytest.raises(ValueError, match="Task 'digits' is not single-label"):
    digits.shard_labels(task)


def test_shard_partition_by_hand():
  labels = np.repeat(np.arange(3), [5, 3, 4])
  parts = digits.shard_partition(labels, 5, np.random.default_rng(0), 3)
  # One client per label, the 2 extras to labels 0 (5 examples) and 2 (4):
  # label 0 -> 3 + 2, label 1 -> 3, label 2 -> 2 + 2.
  shapes = sorted((int(labels[p[0]]), len(p)) for p in parts)
  assert shapes == [(0, 2), (0, 3), (1, 3), (2, 2), (2, 2)]
  assert all(len(set(labels[p].tolist())) == 1 for p in parts)
  assert sorted(np.concatenate(parts).tolist()) == list(range(12))
  with pytest.raises(ValueError, match='labels \\[1\\] have no examples'):
    digits.shard_partition(np.array([0, 0, 2]), 3, np.random.default_rng(0), 3)


@pytest.fixture(scope='module')
def two_labels():
  return get_task('digits', preset='two_labels')


def test_two_labels_every_client_holds_two_digits_in_equal_shares(two_labels):
  histograms = two_labels.client_label_histograms
  assert histograms.shape == (100, 10)
  np.testing.assert_array_equal(np.count_nonzero(histograms, axis=1), np.full(100, 2))
  # 200 shards, 20 per digit, so every digit is held by 20 clients.
  np.testing.assert_array_equal(np.count_nonzero(histograms, axis=0), np.full(10, 20))
  # A digit's 139-146 examples in 20 shards of 6-8: each client's two shares
  # are 6-8 examples, and sizes are 13-15 (equal up to shard rounding).
  shares = histograms[histograms > 0]
  assert shares.min() >= 6 and shares.max() <= 8
  sizes = two_labels.client_num_examples
  assert sizes.sum() == 1438 and sizes.min() >= 13 and sizes.max() <= 16
  for i in (0, 50, 99):  # The data itself holds the two digits of the histogram.
    _, y = _client_arrays(two_labels, i)
    np.testing.assert_array_equal(np.bincount(y, minlength=10), histograms[i])
  assert two_labels.options['dirichlet_alpha'] is None


def test_two_labels_cover_every_example_exactly_once(two_labels):
  _assert_covers_every_example_once(two_labels)


def test_two_labels_pairing_is_seeded_and_repairs_same_label_pairs():
  labels = np.repeat(np.arange(3), 40)  # 3 labels: random pairs often collide.
  for seed in range(20):
    members = digits.label_pair_partition(labels, 30, np.random.default_rng(seed), 3)
    assert sorted(np.concatenate(members).tolist()) == list(range(120))
    assert all(np.unique(labels[m]).size == 2 for m in members)
  again = digits.label_pair_partition(labels, 30, np.random.default_rng(0), 3)
  first = digits.label_pair_partition(labels, 30, np.random.default_rng(0), 3)
  assert all(np.array_equal(a, b) for a, b in zip(again, first))


def test_two_labels_bad_input():
  with pytest.raises(ValueError, match='halve that bound'):
    get_task('digits', preset='two_labels', num_clients=700)
  with pytest.raises(ValueError, match='does not apply'):
    get_task('digits', preset='two_labels', dirichlet_alpha=0.5)
  with pytest.raises(ValueError, match='num_classes >= 2'):
    digits.label_pair_partition(np.zeros(10, np.int64), 2, np.random.default_rng(0), 1)


def test_two_labels_with_two_labels_pairs_every_client_across_them():
  # Unequal labels still get equal shard counts, so every pair is (0, 1).
  labels = np.array([0] * 30 + [1] * 10)
  for seed in range(10):
    members = digits.label_pair_partition(labels, 4, np.random.default_rng(seed), 2)
    assert all(sorted(np.unique(labels[m]).tolist()) == [0, 1] for m in members)
