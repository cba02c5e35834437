"""The `cifar10` task through TensorFlow Datasets, split into clients by Fraboni et al.'s size
profile or a balanced one; ``docs/tasks.md`` has the details."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from tasks import _common
from tasks import digits
from tasks import models
from tff_sampling.task import Task

DATASET = 'cifar10'
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
TRAIN_EXAMPLES = 50_000
SIZE_PROFILES = collections.OrderedDict(
  fraboni=collections.OrderedDict(
    size_group_clients=(10, 30, 30, 20, 10), size_group_examples=(100, 250, 500, 750, 1000)
  ),
  balanced=collections.OrderedDict(size_group_clients=(100,), size_group_examples=(500,)),
)
MODELS = ('lenet', 'vgg')
_READ_BATCH = 10_000


def lenet_cnn(num_classes: int, seed: int) -> tf.keras.Model:
  """A LeNet-5-style CNN for 32x32x3 images, logits out, seeded.

  Conv 5x5x6 (valid, ReLU) -> max-pool 2x2 -> conv 5x5x16 (valid, ReLU) ->
  max-pool 2x2 -> flatten -> dense 120 (ReLU) -> dense 84 (ReLU) -> dense
  `num_classes`: 62,006 parameters for 10 classes. Built with Keras's
  default initialisers, then redrawn from `seed` by
  `tasks.models.seed_initial_weights`.

  Args:
    num_classes: Number of output logits.
    seed: Seed of the initial weights.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, 32, 32, 3]`` to
    logits.
  """
  inputs = tf.keras.Input(shape=IMAGE_SHAPE, dtype=tf.float32)
  x = inputs
  for filters in (6, 16):
    x = tf.keras.layers.Conv2D(filters, 5, activation='relu')(x)
    x = tf.keras.layers.MaxPooling2D(pool_size=2)(x)
  x = tf.keras.layers.Flatten()(x)
  for width in (120, 84):
    x = tf.keras.layers.Dense(width, activation='relu')(x)
  logits = tf.keras.layers.Dense(num_classes)(x)
  return models.seed_initial_weights(tf.keras.Model(inputs, logits, name='lenet_cnn'), seed)


def load_split(split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
  """One TFDS ``cifar10`` split as ``(uint8[M, 32, 32, 3], int32[M])``.

  Args:
    split: ``'train'`` or ``'test'``.
    data_dir: TFDS data directory (``None``: TFDS's default).

  Returns:
    The images and labels, in TFDS's (fixed) order.

  Raises:
    FileNotFoundError: If the prepared dataset is not in `data_dir`.
  """
  dataset = _common.load_tfds(
    DATASET, data_dir, user='The cifar10 task', split=split, as_supervised=True
  )
  images, labels = [], []
  for image_batch, label_batch in dataset.batch(_READ_BATCH).as_numpy_iterator():
    images.append(image_batch)
    labels.append(label_batch)
  images = np.concatenate(images).astype(np.uint8, copy=False)
  labels = np.concatenate(labels).astype(np.int32)
  if images.shape[1:] != IMAGE_SHAPE or labels.min() < 0 or labels.max() >= NUM_CLASSES:
    raise ValueError(
      f'Unexpected {DATASET} {split!r} data: images {images.shape}, labels in '
      f'[{labels.min()}, {labels.max()}].'
    )
  return images, labels


def profile_sizes(
  size_group_clients: Sequence[int], size_group_examples: Sequence[int]
) -> np.ndarray:
  """``int64[N]`` client sizes: group ``g``'s count repeated, group by group."""
  return np.repeat(
    np.asarray(size_group_examples, np.int64), np.asarray(size_group_clients, np.int64)
  )


def _check_total(sizes: np.ndarray, available: int) -> None:
  if sizes.sum() > available:
    raise ValueError(
      f'The size profile needs {sizes.sum()} training examples '
      f'({len(sizes)} clients), but the cifar10 train split has {available}; '
      'reduce size_group_clients or size_group_examples.'
    )


def _scale_images(batch: collections.OrderedDict) -> collections.OrderedDict:
  """``uint8`` images to float32 in [0, 1]; labels unchanged."""
  return _common.as_xy(tf.cast(batch['x'], tf.float32) / 255.0, batch['y'])


def _size_groups(
  size_profile: str, size_group_clients: Any, size_group_examples: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """``(size_group_clients, size_group_examples)`` checked, the profile's for ``None``."""
  profile = SIZE_PROFILES[size_profile]
  group_clients = _common.check_int_tuple(
    'size_group_clients',
    profile['size_group_clients'] if size_group_clients is None else size_group_clients,
  )
  group_examples = _common.check_int_tuple(
    'size_group_examples',
    profile['size_group_examples'] if size_group_examples is None else size_group_examples,
  )
  if len(group_clients) != len(group_examples):
    raise ValueError(
      f'size_group_clients and size_group_examples must have the same length, got '
      f'{list(group_clients)} and {list(group_examples)}.'
    )
  return group_clients, group_examples


def _training_examples(
  sizes: np.ndarray, options: dict[str, Any]
) -> collections.OrderedDict[str, np.ndarray]:
  """A seeded random subset of the train split dealt to clients of `sizes`, in client order."""
  images, labels = load_split('train', options['data_dir'])
  _check_total(sizes, len(labels))
  rng = np.random.default_rng([options['seed'], 0])
  selected = rng.permutation(len(labels))[: sizes.sum()]
  members = digits.dirichlet_partition(
    labels[selected], sizes, options['dirichlet_alpha'], rng, NUM_CLASSES
  )
  order = selected[np.concatenate(members)]
  return collections.OrderedDict(x=images[order], y=labels[order])


def _evaluation_examples(options: dict[str, Any]) -> collections.OrderedDict[str, np.ndarray]:
  """The test split, or a seeded random subset of ``max_eval_examples`` in split order."""
  images, labels = load_split('test', options['data_dir'])
  cap = options['max_eval_examples']
  if cap is not None and cap < len(labels):
    kept = np.sort(np.random.default_rng([options['seed'], 1]).permutation(len(labels))[:cap])
    images, labels = images[kept], labels[kept]
  return collections.OrderedDict(x=images, y=labels)


def create_cifar10_task(
  *,
  client_batch_size: int = 50,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  data_dir: str | None = None,
  dirichlet_alpha: float = 0.1,
  size_profile: str = 'fraboni',
  size_group_clients: Sequence[int] | None = None,
  size_group_examples: Sequence[int] | None = None,
  max_eval_examples: int | None = 10_000,
  model: str = 'lenet',
) -> Task:
  """Builds the ``cifar10`` task.

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`).
    seed: Seed of the partition and of the evaluation subset.
    data_dir: TFDS data directory holding the prepared ``cifar10``
      (``None``: TFDS's default).
    dirichlet_alpha: Dirichlet concentration of the clients' label
      proportions (the paper uses 0.001, 0.01, 0.1 and 10).
    size_profile: ``'fraboni'`` or ``'balanced'`` (see the module docstring).
    size_group_clients: Clients in each size group (``None``: the
      profile's).
    size_group_examples: Examples of every client in each size group
      (``None``: the profile's); same length as the clients list, and at
      most 50,000 examples in all.
    max_eval_examples: Cap on evaluation examples (``None``: all 10,000).
    model: ``'lenet'`` or ``'vgg'``.

  Returns:
    The `Task`. Raw elements are ``OrderedDict(x=uint8[32, 32, 3],
    y=int32[])``; training and evaluation batches
    ``OrderedDict(x=float32[B, 32, 32, 3] in [0, 1], y=int32[B])``.

  Raises:
    ValueError: For an invalid option, or a profile larger than the split.
    FileNotFoundError: If the TFDS data is not in `data_dir`.
  """
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  if data_dir is not None and not isinstance(data_dir, str):
    raise ValueError(f'data_dir must be a string or None, got {data_dir!r}.')
  size_profile = _common.check_choice('size_profile', size_profile, tuple(SIZE_PROFILES))
  group_clients, group_examples = _size_groups(
    size_profile, size_group_clients, size_group_examples
  )
  options.update(
    data_dir=data_dir,
    dirichlet_alpha=_common.check_float('dirichlet_alpha', dirichlet_alpha),
    size_profile=size_profile,
    size_group_clients=group_clients,
    size_group_examples=group_examples,
    max_eval_examples=_common.check_optional_int('max_eval_examples', max_eval_examples),
    model=_common.check_choice('model', model, MODELS),
  )
  sizes = profile_sizes(group_clients, group_examples)
  _check_total(sizes, TRAIN_EXAMPLES)
  if options['model'] == 'lenet':
    keras_model_fn = functools.partial(lenet_cnn, NUM_CLASSES)
  else:
    keras_model_fn = functools.partial(models.small_vgg, NUM_CLASSES, input_shape=IMAGE_SHAPE)
  return _common.in_memory_task(
    'cifar10',
    options,
    train=_training_examples(sizes, options),
    sizes=sizes,
    eval_data=_common.tf_dataset_from_arrays(_evaluation_examples(options)),
    keras_model_fn=keras_model_fn,
    num_classes=NUM_CLASSES,
    batch_map=_scale_images,
  )
