"""Tests for tasks/public.py (public unlabeled inputs, LEFL's D_p).

TFDS cannot download here: the ``fashion_mnist`` and ``cifar10`` sources are
read through ``tfds.testing.mock_data``, which gives deterministic random
examples with the datasets' features (uint8 images) for every split. The
EMNIST, CIFAR-100 and Shakespeare tasks are built from tiny databases in
TFF's SQLite format (`tff_sqlite_fixtures`).
"""

import collections
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_federated.python.simulation.baselines.cifar100 import (
  image_classification_preprocessing,
)
import tff_sqlite_fixtures as fixtures

import tasks
from tasks import public
from tff_sampling.runtime import files

MOCK_EXAMPLES = 60


def _mock_images(name):
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES), files.scratch_tempdir():
    dataset = tfds.load(name, split='train', download=False)
    return np.concatenate([b['image'] for b in dataset.batch(1000).as_numpy_iterator()])


def _public(task, source, **kwargs):
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    return public.public_inputs(task, source, **kwargs)


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('tff_cache'))
  rng = np.random.default_rng(0)
  fixtures.write_tff_database(
    os.path.join(directory, 'emnist_all.sqlite'),
    collections.OrderedDict(
      digits_only_train=fixtures.emnist_clients(rng, {'f0': 5, 'f1': 3}, 10),
      digits_only_test=fixtures.emnist_clients(rng, {'f0': 4, 'f1': 3}, 10),
    ),
  )
  fixtures.write_tff_database(
    os.path.join(directory, 'cifar100.sqlite'),
    {
      'train': fixtures.cifar_clients(rng, {'0': 4, '1': 6}),
      'test': fixtures.cifar_clients(rng, {'0': 3, '1': 4}),
    },
  )
  fixtures.write_tff_database(
    os.path.join(directory, 'shakespeare.sqlite'),
    {
      'train': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TRAIN),
      'test': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TEST),
    },
  )
  return directory


@pytest.fixture(scope='module')
def cifar10_task():
  with tfds.testing.mock_data(num_examples=200):
    return tasks.get_task(
      'cifar10', size_group_clients=(2,), size_group_examples=(50,), max_eval_examples=100
    )


# ---------------------------------------------------------------------------
# 'noise'


def _eval_inputs(task, count):
  return np.concatenate([b['x'] for b in task.preprocess_eval(task.eval_data).as_numpy_iterator()])[
    :count
  ].astype(np.float64)


@pytest.mark.parametrize('task_name', ['digits', 'synthetic', 'cifar10'])
def test_noise_shape_dtype_determinism_and_moments(task_name, small_digits_task, cifar10_task):
  task = {'digits': small_digits_task, 'cifar10': cifar10_task, 'synthetic': None}[
    task_name
  ] or tasks.get_task('synthetic', num_clients=5)
  shape = tuple(task.element_spec['x'].shape[1:])
  noise = public.public_inputs(task, 'noise', num_examples=300, seed=1)
  assert noise.shape == (300,) + shape and noise.dtype == np.float32
  np.testing.assert_array_equal(
    noise, public.public_inputs(task, 'noise', num_examples=300, seed=1)
  )
  assert not np.allclose(noise, public.public_inputs(task, 'noise', num_examples=300, seed=2))
  # The evaluation inputs' moments (the first 1,024 of them), up to sampling error.
  reference = _eval_inputs(task, public.NOISE_MOMENT_EXAMPLES).reshape(-1, np.prod(shape))
  flat = noise.reshape(300, -1).astype(np.float64)
  scale = reference.std(axis=0).mean()
  assert np.abs(flat.mean(axis=0) - reference.mean(axis=0)).mean() < 0.15 * scale
  assert np.abs(flat.std(axis=0).mean() / scale - 1) < 0.1


def test_token_noise_is_uniform_characters(cache_dir):
  task = tasks.get_task('shakespeare', cache_dir=cache_dir, sequence_length=5)
  noise = public.public_inputs(task, 'noise', num_examples=400, seed=0)
  assert noise.shape == (400, 5) and noise.dtype == np.int64
  # Character ids 1..86 only (no pad 0, OOV 87, BOS 88, EOS 89), all of them drawn.
  assert set(np.unique(noise).tolist()) == set(range(1, 87))
  np.testing.assert_array_equal(
    noise, public.public_inputs(task, 'noise', num_examples=400, seed=0)
  )


# ---------------------------------------------------------------------------
# 'fashion_mnist' and 'cifar10' (mocked TFDS)


def _rows_in(rows, candidates):
  """Index of each row in `candidates` (exact match), or an assertion error."""
  index = {candidate.tobytes(): i for i, candidate in enumerate(candidates)}
  return [index[row.tobytes()] for row in rows]


def test_fashion_mnist_for_digits_is_an_area_downscaled_seeded_subset(small_digits_task):
  images = _mock_images('fashion_mnist')
  assert images.shape == (MOCK_EXAMPLES, 28, 28, 1) and len({i.tobytes() for i in images}) > 50
  inputs = _public(small_digits_task, 'fashion_mnist', num_examples=20, seed=3)
  assert inputs.shape == (20, 64) and inputs.dtype == np.float32
  assert inputs.min() >= 0.0 and inputs.max() <= 1.0 and np.ptp(inputs) > 0.1
  # Every row is one mocked image, /255 and averaged over 3.5x3.5-pixel areas.
  candidates = tf.reshape(
    tf.image.resize(images.astype(np.float32) / 255, (8, 8), method='area'), [-1, 64]
  ).numpy()
  rows = _rows_in(inputs, candidates)
  assert rows == sorted(set(rows))  # Distinct, in TFDS order.
  # One image's block by hand: rows 0-3, columns 0-3 (a full 3.5x3.5 area
  # covers pixels 0-2 fully and pixel 3 by half in each direction).
  weights = np.array([1, 1, 1, 0.5])
  patch = images[rows[0], :4, :4, 0].astype(np.float64) / 255
  np.testing.assert_allclose(inputs[0, 0], weights @ patch @ weights / 3.5**2, atol=1e-6)
  again = _public(small_digits_task, 'fashion_mnist', num_examples=20, seed=3)
  np.testing.assert_array_equal(inputs, again)
  other = _rows_in(_public(small_digits_task, 'fashion_mnist', num_examples=20, seed=4), candidates)
  assert other != rows


def test_fashion_mnist_for_emnist_keeps_28x28_with_tffs_background(cache_dir):
  task = tasks.get_task('emnist', cache_dir=cache_dir)
  inputs = _public(task, 'fashion_mnist', num_examples=10, seed=0)
  assert inputs.shape == (10, 28, 28, 1) and inputs.dtype == np.float32
  assert task.element_spec['x'].shape[1:] == (28, 28, 1)
  rows = _rows_in(inputs, 1.0 - _mock_images('fashion_mnist').astype(np.float32) / 255)
  assert len(set(rows)) == 10


def test_cifar10_for_cifar100_matches_the_tasks_crop_and_standardisation(cache_dir):
  task = tasks.get_task('cifar100', cache_dir=cache_dir, crop_size=20, model='vgg')
  inputs = _public(task, 'cifar10', num_examples=15, seed=0)
  assert inputs.shape == (15, 20, 20, 3) and inputs.dtype == np.float32
  np.testing.assert_allclose(inputs.mean(axis=(1, 2, 3)), 0.0, atol=1e-4)
  np.testing.assert_allclose(inputs.std(axis=(1, 2, 3)), 1.0, atol=1e-3)
  image_map = image_classification_preprocessing.build_image_map((20, 20, 3))
  candidates = np.stack(
    [image_map({'image': image, 'label': 0})[0].numpy() for image in _mock_images('cifar10')]
  )
  rows = _rows_in(inputs, candidates)
  assert rows == sorted(set(rows))
  # The shape of the task's own (centre-cropped) evaluation inputs.
  eval_batch = next(task.preprocess_eval(task.eval_data).as_numpy_iterator())['x']
  assert eval_batch.shape[1:] == inputs.shape[1:]


# ---------------------------------------------------------------------------
# 'leaf_femnist' (real writers outside the population)


def _leaf_image(example: int) -> list[float]:
  """LEAF's convention (background 1.0); pixel `example` is ink."""
  pixels = [1.0] * 784
  pixels[example] = 0.0
  return pixels


def _write_leaf_writers(root, writers: dict) -> str:
  """A LEAF FEMNIST folder: writer -> (train examples, test examples); example ids
  count up over the writers' train images first, then their test images."""
  example = 0
  for split, column in (('train', 0), ('test', 1)):
    data = {'users': [], 'num_samples': [], 'user_data': {}}
    for writer, counts in writers.items():
      count = counts[column]
      data['users'].append(writer)
      data['num_samples'].append(count)
      data['user_data'][writer] = {
        'x': [_leaf_image(example + i) for i in range(count)],
        'y': [1] * count,
      }
      example += count
    os.makedirs(os.path.join(root, split), exist_ok=True)
    with open(os.path.join(root, split, f'{split}.json'), 'w') as f:
      json.dump(data, f)
  return str(root)


def test_leaf_femnist_draws_held_out_writers_training_images(cache_dir, tmp_path):
  task = tasks.get_task('emnist', cache_dir=cache_dir)
  folder = _write_leaf_writers(tmp_path / 'public', {'p0': (3, 1), 'p1': (2, 2)})
  inputs = public.public_inputs(task, 'leaf_femnist', num_examples=4, seed=0, data_dir=folder)
  assert inputs.shape == (4, 28, 28, 1) and inputs.dtype == np.float32
  assert inputs.shape[1:] == tuple(task.element_spec['x'].shape[1:])
  # Only the 5 training images (ids 0..4), distinct, in folder order; never a test image.
  train_images = np.float32([_leaf_image(i) for i in range(5)]).reshape(5, 28, 28, 1)
  rows = _rows_in(inputs, train_images)
  assert rows == sorted(set(rows))
  np.testing.assert_array_equal(
    inputs, public.public_inputs(task, 'leaf_femnist', num_examples=4, seed=0, data_dir=folder)
  )
  every = public.public_inputs(task, 'leaf_femnist', num_examples=5, seed=3, data_dir=folder)
  np.testing.assert_array_equal(every, train_images)


def test_leaf_femnist_refuses_a_client_of_the_task(cache_dir, tmp_path):
  task = tasks.get_task('emnist', cache_dir=cache_dir)
  folder = _write_leaf_writers(tmp_path / 'public', {'p0': (3, 1), 'f1': (2, 1)})
  with pytest.raises(
    ValueError,
    match=r"include 1 client\(s\) of the task \(e.g. 'f1'\).*"
    'must not be any client',
  ):
    public.public_inputs(task, 'leaf_femnist', num_examples=2, seed=0, data_dir=folder)


def test_leaf_femnist_errors(cache_dir, small_digits_task, tmp_path):
  task = tasks.get_task('emnist', cache_dir=cache_dir)
  with pytest.raises(ValueError, match="'leaf_femnist' needs data_dir"):
    public.public_inputs(task, 'leaf_femnist', num_examples=2, seed=0)
  with pytest.raises(ValueError, match=r"'leaf_femnist' .*task 'digits'.*source='noise'"):
    public.public_inputs(
      small_digits_task, 'leaf_femnist', num_examples=2, seed=0, data_dir=str(tmp_path)
    )
  folder = _write_leaf_writers(tmp_path / 'public', {'p0': (3, 1)})
  with pytest.raises(
    ValueError, match="num_examples=4 exceeds the 3 training images of 'leaf_femnist'"
  ):
    public.public_inputs(task, 'leaf_femnist', num_examples=4, seed=0, data_dir=folder)


# ---------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
  'task_name, source, message',
  [
    (
      'synthetic',
      'fashion_mnist',
      r"'fashion_mnist' \(examples of shape \(28, 28, 1\)\) cannot be mapped to task "
      r"'synthetic', whose model takes float32 examples of shape \(60,\).*source='noise'",
    ),
    ('digits', 'cifar10', r"'cifar10' .*task 'digits'.*shape \(64,\).*source='noise'"),
    ('cifar10', 'cifar10', "another distribution than the task's.*source='noise'"),
    ('cifar10', 'fashion_mnist', r"task 'cifar10'.*shape \(32, 32, 3\).*source='noise'"),
  ],
)
def test_unmappable_sources(task_name, source, message, small_digits_task, cifar10_task):
  task = {'digits': small_digits_task, 'cifar10': cifar10_task, 'synthetic': None}[
    task_name
  ] or tasks.get_task('synthetic', num_clients=5)
  with pytest.raises(ValueError, match=message):
    _public(task, source, num_examples=5, seed=0)


def test_image_sources_do_not_map_to_token_tasks(cache_dir):
  task = tasks.get_task('shakespeare', cache_dir=cache_dir)
  with pytest.raises(
    ValueError,
    match=r"task 'shakespeare', whose model takes int64 examples "
    r"of shape \(5,\).*source='noise'",
  ):
    _public(task, 'fashion_mnist', num_examples=5, seed=0)


def test_missing_data_is_a_clear_error(small_digits_task, tmp_path):
  with pytest.raises(FileNotFoundError) as error:
    public.public_inputs(
      small_digits_task, 'fashion_mnist', num_examples=5, seed=0, data_dir=str(tmp_path)
    )
  message = str(error.value)
  assert "'fashion_mnist'" in message and f"data_dir='{tmp_path}'" in message
  assert 'could not find data' in message  # TFDS's own reason.
  assert 'tfds build fashion_mnist --data_dir=DIR' in message


@pytest.mark.parametrize(
  'num_examples, message',
  [
    (0, 'num_examples must be a positive integer, got 0'),
    (2.5, 'num_examples must be a positive integer, got 2.5'),
    (True, 'num_examples must be a positive integer, got True'),
    (
      MOCK_EXAMPLES + 1,
      f'num_examples={MOCK_EXAMPLES + 1} exceeds the {MOCK_EXAMPLES} training '
      "images of 'fashion_mnist'",
    ),
  ],
)
def test_bad_num_examples(num_examples, message, small_digits_task):
  with pytest.raises(ValueError, match=message):
    _public(small_digits_task, 'fashion_mnist', num_examples=num_examples, seed=0)


def test_unknown_source(small_digits_task):
  with pytest.raises(
    ValueError,
    match=r"source must be one of \['noise', 'fashion_mnist', "
    r"'leaf_femnist', 'cifar10'\], got 'tiny_imagenet'",
  ):
    public.public_inputs(small_digits_task, 'tiny_imagenet', num_examples=5, seed=0)
