"""The ``cifar100`` task: TFF's federated CIFAR-100.

Data: ``tff.simulation.datasets.cifar100.load_data(cache_dir)``, 500 training
clients of 100 images each, partitioned by TFF with a two-level
(Pachinko-allocation) Dirichlet process over coarse and fine labels; 100 test
clients. TFF 0.87 reads the decompressed database
``<cache_dir>/cifar100.sqlite`` (default ``cache_dir``: ``~/.tff``), splits
``train``/``test``, and would download
``https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma``
when the file is missing; we check for the file first and raise a
``FileNotFoundError`` explaining how to provide it.

Preprocessing: a seeded shuffle (buffer 500, TFF's), the optional per-epoch
cap, ``client_epochs`` repetitions, then TFF's baseline image preprocessing
(``image_classification_preprocessing``: cast, centre crop to
``crop_size x crop_size`` -- 24 by default, as TFF's baseline --, per-image
standardisation, batch). With ``distort_images=True`` training images are
randomly cropped and flipped first, with *stateless* random ops seeded from
(``preprocess_client``'s seed, element position) -- TFF's own distortion uses
unseeded ops and would not be reproducible. Evaluation: the test split
(10,000 images) in a seeded random client order, at most
``max_eval_examples``, centre-cropped.

Client statistics come from one pass over the 50,000 training rows of the
SQLite file, parsing only the labels (about a second).

Models: ``'resnet18'`` (TFF's ResNet-18 with group norm,
`tasks.models.resnet18_gn`) or ``'vgg'`` (`tasks.models.small_vgg`).
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow_federated.python.simulation.baselines import client_spec
from tensorflow_federated.python.simulation.baselines.cifar100 import (
  image_classification_preprocessing,
)

from tasks import _common
from tasks import models
from tasks import tff_cache
from tff_sampling.task import Task

DATABASE_FILE = 'cifar100.sqlite'
NUM_CLASSES = 100
MODELS = ('resnet18', 'vgg')
_SHUFFLE_BUFFER_SIZE = image_classification_preprocessing.NUM_EXAMPLES_PER_CLIENT


def _tff_crop_and_batch(batch_size: int, crop_shape: tuple[int, int, int]):
  """TFF's baseline CIFAR preprocessing (centre crop, standardise, batch)."""
  tff_fn = image_classification_preprocessing.create_preprocess_fn(
    client_spec.ClientSpec(num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1),
    crop_shape=crop_shape,
    distort_image=False,
  )
  return lambda dataset: tff_fn(dataset).map(_common.as_xy)


def _seeded_distortion(
  dataset: tf.data.Dataset, seed, crop_shape: tuple[int, int, int]
) -> tf.data.Dataset:
  """Random crop + horizontal flip, reproducible from (seed, position)."""

  def distort(position, example):
    crop_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(tf.stack([tf.cast(seed, tf.int64), position]), num=2)
    )
    image = tf.image.stateless_random_crop(example['image'], crop_shape, seed=crop_seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    distorted = dict(example)
    distorted['image'] = image
    return type(example)(distorted)

  return dataset.enumerate().map(distort)


def _client_preprocess(options: dict[str, Any], crop_shape: tuple[int, int, int]):
  """``preprocess_client``: the training stream, its seeded distortion if asked, TFF's batches."""
  train_batches = _tff_crop_and_batch(options['client_batch_size'], crop_shape)

  def preprocess_client(dataset: tf.data.Dataset, shuffle_seed) -> tf.data.Dataset:
    dataset = _common.training_stream(
      dataset, shuffle_seed, options, shuffle_buffer_size=_SHUFFLE_BUFFER_SIZE
    )
    if options['distort_images']:
      # TFF's centre crop is then a no-op: the image already has crop_shape.
      dataset = _seeded_distortion(dataset, shuffle_seed, crop_shape)
    return train_batches(dataset)

  return preprocess_client


def create_cifar100_task(
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  cache_dir: str | None = None,
  crop_size: int = 24,
  distort_images: bool = False,
  max_eval_examples: int | None = 10_000,
  model: str = 'resnet18',
) -> Task:
  """Builds the ``cifar100`` task.

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`).
    seed: Seed of the evaluation clients' order.
    cache_dir: Directory holding ``cifar100.sqlite`` (``None``: ``~/.tff``).
    crop_size: Side of the square crop, 1 to 32 (the model's input size).
    distort_images: Random crops and flips (seeded) of training images
      instead of the centre crop.
    max_eval_examples: Cap on evaluation examples (``None``: all 10,000).
    model: ``'resnet18'`` or ``'vgg'``.

  Returns:
    The `Task`. Raw elements are TFF's ``OrderedDict(coarse_label=int64[],
    image=uint8[32, 32, 3], label=int64[])``; training batches
    ``OrderedDict(x=float32[B, crop, crop, 3], y=int64[B])``.

  Raises:
    FileNotFoundError: If the database is not in `cache_dir`.
    ValueError: For an invalid option, or a database file that is not in TFF's
      format (empty, not SQLite, missing tables).
  """
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  options.update(
    cache_dir=_common.check_optional_path('cache_dir', cache_dir),
    crop_size=_common.check_int('crop_size', crop_size, maximum=32),
    distort_images=_common.check_bool('distort_images', distort_images),
    max_eval_examples=_common.check_optional_int('max_eval_examples', max_eval_examples),
    model=_common.check_choice('model', model, MODELS),
  )
  database, train_data, test_data = tff_cache.load_tff_data(
    'cifar100', DATABASE_FILE, options['cache_dir']
  )
  statistics = tff_cache.scan_sql_split(
    database,
    'train',
    tuple(train_data.client_ids),
    _common.one_hot_label_statistics('label', NUM_CLASSES),
    NUM_CLASSES,
  )

  crop_shape = (options['crop_size'], options['crop_size'], 3)
  if options['model'] == 'resnet18':
    keras_model_fn = functools.partial(models.resnet18_gn, crop_shape, NUM_CLASSES)
  else:
    keras_model_fn = functools.partial(models.small_vgg, NUM_CLASSES, input_shape=crop_shape)

  return _common.make_task(
    'cifar100',
    options,
    train_data,
    _common.centralized_eval_data(test_data, options),
    preprocess_client=_client_preprocess(options, crop_shape),
    preprocess_eval=_tff_crop_and_batch(options['eval_batch_size'], crop_shape),
    keras_model_fn=keras_model_fn,
    statistics=statistics,
    num_classes=NUM_CLASSES,
  )
