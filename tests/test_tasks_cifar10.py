"""Tests for the TFDS-backed ``cifar10`` task (tasks/cifar10.py).

TFDS cannot download here, so the data comes from ``tfds.testing.mock_data``:
inside it ``tfds.load`` returns ``num_examples`` deterministic random
examples with cifar10's features (uint8 32x32x3 images, labels in [0, 10)),
the same examples for every split, without touching any file. The tasks use
scaled-down size profiles through the ``size_group_*`` options.
"""

import collections
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import cifar10
from tasks import get_task

MOCK_EXAMPLES = 1000
SMALL = dict(size_group_clients=(2, 3, 3, 2, 1), size_group_examples=(20, 50, 100, 150, 200))
SMALL_SIZES = [20] * 2 + [50] * 3 + [100] * 3 + [150] * 2 + [200]  # 990 of 1000.


def _mocked(**options):
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    return get_task('cifar10', **options)


@pytest.fixture(scope='module')
def mock_split():
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    return cifar10.load_split('train', None)


@pytest.fixture(scope='module')
def task():
  return _mocked(max_eval_examples=300, **SMALL)


def _client_arrays(task, client_index):
  batch = next(
    iter(task.train_data.create_tf_dataset_for_client(task.client_ids[client_index]).batch(10_000)),
    None,
  )
  return batch['x'].numpy(), batch['y'].numpy()


def _entropy(histograms):
  p = histograms / histograms.sum(axis=-1, keepdims=True)
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0.0), axis=-1)


def test_mock_split(mock_split):
  images, labels = mock_split
  assert images.shape == (MOCK_EXAMPLES, 32, 32, 3) and images.dtype == np.uint8
  assert labels.dtype == np.int32 and set(labels.tolist()) == set(range(10))
  # Distinct images, so the coverage test below can identify every example.
  assert len({image.tobytes() for image in images}) == MOCK_EXAMPLES


def test_sizes_exactly_as_profile(task):
  assert task.name == 'cifar10'
  assert task.client_ids == tuple(f'client_{i:02d}' for i in range(11))
  assert task.client_num_examples.dtype == np.int64
  np.testing.assert_array_equal(task.client_num_examples, SMALL_SIZES)
  assert task.client_label_histograms.shape == (11, 10)
  for i in range(task.num_clients):
    x, y = _client_arrays(task, i)
    assert x.shape == (SMALL_SIZES[i], 32, 32, 3) and x.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(y, minlength=10), task.client_label_histograms[i])


def test_fraboni_profile():
  sizes = cifar10.profile_sizes(**cifar10.SIZE_PROFILES['fraboni'])
  assert len(sizes) == 100 and sizes.sum() == 48_500
  assert collections.Counter(sizes.tolist()) == {100: 10, 250: 30, 500: 30, 750: 20, 1000: 10}
  assert cifar10.profile_sizes(**cifar10.SIZE_PROFILES['balanced']).sum() == 50_000


def test_partition_uses_each_training_example_at_most_once(task, mock_split):
  images, labels = mock_split
  index = {image.tobytes(): i for i, image in enumerate(images)}
  used = []
  for client in range(task.num_clients):
    x, y = _client_arrays(task, client)
    rows = [index[image.tobytes()] for image in x]  # KeyError: not a training image.
    np.testing.assert_array_equal(labels[rows], y)
    used.extend(rows)
  assert len(used) == sum(SMALL_SIZES)
  assert len(set(used)) == len(used)


def test_dirichlet_label_skew(mock_split):
  global_entropy = _entropy(np.bincount(mock_split[1], minlength=10))
  equal = dict(size_group_clients=(10,), size_group_examples=(90,))
  skewed = _mocked(dirichlet_alpha=0.1, max_eval_examples=1, **equal)
  near_iid = _mocked(dirichlet_alpha=1000.0, max_eval_examples=1, **equal)
  assert _entropy(skewed.client_label_histograms).mean() < 0.5 * global_entropy
  assert _entropy(near_iid.client_label_histograms).mean() > 0.85 * global_entropy
  dominant_share = lambda h: np.mean(h.max(axis=1) / h.sum(axis=1))
  assert dominant_share(skewed.client_label_histograms) > 0.6
  assert dominant_share(near_iid.client_label_histograms) < 0.25


def test_deterministic_in_seed(task):
  again = _mocked(max_eval_examples=300, **SMALL)
  other = _mocked(max_eval_examples=300, seed=1, **SMALL)
  np.testing.assert_array_equal(task.client_label_histograms, again.client_label_histograms)
  np.testing.assert_array_equal(_client_arrays(task, 4)[0], _client_arrays(again, 4)[0])
  assert not np.array_equal(task.client_label_histograms, other.client_label_histograms)
  first_eval = lambda t: next(iter(t.eval_data.batch(300)))['x'].numpy()
  np.testing.assert_array_equal(first_eval(task), first_eval(again))
  assert not np.array_equal(first_eval(task), first_eval(other))


def test_element_spec_scaling_and_model(task):
  spec = task.element_spec
  assert list(spec) == ['x', 'y']
  assert spec['x'] == tf.TensorSpec([None, 32, 32, 3], tf.float32)
  assert spec['y'] == tf.TensorSpec([None], tf.int32)
  batches = list(task.client_dataset(10, 0).as_numpy_iterator())
  assert [len(b['y']) for b in batches] == [50, 50, 50, 50]
  raw_x, _ = _client_arrays(task, 10)
  scaled = np.concatenate([b['x'] for b in batches])
  assert scaled.min() >= 0.0 and scaled.max() <= 1.0
  # A seeded permutation of the client's images, divided by 255.
  np.testing.assert_allclose(
    np.sort(scaled.reshape(200, -1), axis=0),
    np.sort(raw_x.reshape(200, -1).astype(np.float32) / 255, axis=0),
  )

  lenet = task.keras_model_fn(0)
  assert lenet.count_params() == 62_006
  assert lenet(batches[0]['x']).shape == (50, 10)
  np.testing.assert_array_equal(lenet.get_weights()[0], task.keras_model_fn(0).get_weights()[0])
  assert not np.array_equal(lenet.get_weights()[0], task.keras_model_fn(1).get_weights()[0])
  vgg = _mocked(model='vgg', max_eval_examples=1, **SMALL)
  assert vgg.keras_model_fn(0)(batches[0]['x']).shape == (50, 10)


def test_evaluation_data(task, mock_split):
  batches = list(task.preprocess_eval(task.eval_data).as_numpy_iterator())
  assert [len(b['y']) for b in batches] == [256, 44]
  assert batches[0]['x'].dtype == np.float32 and batches[0]['x'].max() <= 1.0
  # A subset of the (mocked) test split, without repetition.
  images, _ = mock_split
  index = {image.tobytes(): i for i, image in enumerate(images)}
  raw = np.concatenate([b['x'] for b in batches])
  rows = [index[np.round(image * 255).astype(np.uint8).tobytes()] for image in raw]
  assert len(set(rows)) == 300


def test_profile_larger_than_split():
  with pytest.raises(ValueError, match='needs 990 training examples .* train split has 500'):
    with tfds.testing.mock_data(num_examples=500):
      get_task('cifar10', **SMALL)


def test_missing_data_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError) as error:
    get_task('cifar10', data_dir=str(tmp_path), **SMALL)
  message = str(error.value)
  assert f"data_dir='{tmp_path}'" in message
  assert 'could not find data' in message  # TFDS's own reason.
  assert 'tfds build cifar10 --data_dir=DIR' in message


def test_missing_data_leaves_nothing_in_the_temp_directory(tmp_path, monkeypatch):
  # TFDS makes a directory there each time it looks for data that are not prepared.
  temp = tmp_path / 'temp'
  temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp))
  with pytest.raises(FileNotFoundError):
    get_task('cifar10', data_dir=str(tmp_path / 'data'), **SMALL)
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    cifar10.load_split('train', str(tmp_path / 'data'))
  left = [path.name for path in temp.iterdir()]
  assert [name for name in left if not name.startswith('__autograph_generated_file')] == []
  assert tempfile.gettempdir() == str(temp)
