"""The ``emnist`` task: federated EMNIST (LEAF's FEMNIST) through TFF's loader.

Data: ``tff.simulation.datasets.emnist.load_data(only_digits, cache_dir)``,
clients are writers (3,383 with 341,873 training examples for digits only,
3,400 with 671,585 for all 62 classes). TFF 0.87 reads the decompressed
database ``<cache_dir>/emnist_all.sqlite`` (default ``cache_dir``:
``~/.tff``), splits ``digits_only_train``/``digits_only_test`` or
``all_train``/``all_test``, and would download
``https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma``
when the file is missing; we check for the file first and raise a
``FileNotFoundError`` explaining how to provide it.

Preprocessing: a seeded shuffle (TFF's buffer of 418, the largest client),
the optional per-epoch cap, ``client_epochs`` repetitions, then TFF's own
baseline preprocessing (``emnist_preprocessing.create_preprocess_fn``: batch,
reshape pixels to 28x28x1). Pixels keep TFF's convention (1.0 = background).
Evaluation: the test split of all writers concatenated in a seeded random
writer order, at most ``max_eval_examples`` examples.

Client statistics (sizes, label histograms) come from one vectorised pass
over the training rows of the SQLite file, parsing only the labels: 0.8 s
per 100,000 examples on the 2-core development machine with the file in the
page cache, so ~3 s (digits) or ~6 s (all classes) at task construction,
more on a cold disk (every training row's bytes are read once).

Model: ``'cnn'``, the CNN of McMahan et al. (`tasks.models.mcmahan_cnn`).
"""

from __future__ import annotations

import functools
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.simulation.baselines import client_spec
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing
from tasks import _common
from tasks import models
from tasks.base import Task

DATABASE_FILE = 'emnist_all.sqlite'
MODELS = ('cnn',)
# TFF's default shuffle buffer for EMNIST clients (their largest size).
_SHUFFLE_BUFFER_SIZE = emnist_preprocessing.MAX_CLIENT_DATASET_SIZE


def _tff_batch_and_reshape(batch_size: int):
  """TFF's baseline EMNIST preprocessing, reduced to batch + reshape.

  Shuffling and repetition are ours (seeded). TFF's ``debug_seed`` is set only
  because it also makes TFF's parallel ``map`` keep element order
  (``deterministic=True``); with shuffling off it seeds nothing.
  """
  tff_fn = emnist_preprocessing.create_preprocess_fn(
      client_spec.ClientSpec(num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1),
      emnist_task='character_recognition',
      debug_seed=0)
  return lambda dataset: tff_fn(dataset).map(_common.as_xy)


def create_emnist_task(
    *,
    client_batch_size: int = 20,
    client_epochs: int = 1,
    max_client_examples: Optional[int] = None,
    seed: int = 0,
    eval_batch_size: int = 256,
    cache_dir: Optional[str] = None,
    only_digits: bool = True,
    max_eval_examples: Optional[int] = 10_000,
    model: str = 'cnn',
) -> Task:
  """Builds the ``emnist`` task.

  Args:
    client_batch_size: Local batch size.
    client_epochs: Local epochs per round.
    max_client_examples: Optional cap on examples per client per epoch.
    seed: Seed of the evaluation writers' order.
    eval_batch_size: Batch size of the evaluation data.
    cache_dir: Directory holding ``emnist_all.sqlite`` (``None``: ``~/.tff``).
    only_digits: ``True``: 10 digit classes; ``False``: all 62 classes.
    max_eval_examples: Cap on evaluation examples (``None``: the whole test
      split, 40,832 or 77,483 examples).
    model: ``'cnn'``.

  Returns:
    The `Task`. Raw elements are TFF's ``OrderedDict(label=int32[],
    pixels=float32[28, 28])``; training batches
    ``OrderedDict(x=float32[B, 28, 28, 1], y=int32[B])``.

  Raises:
    FileNotFoundError: If the database is not in `cache_dir`.
  """
  options = _common.check_common_options(
      client_batch_size=client_batch_size, client_epochs=client_epochs,
      max_client_examples=max_client_examples, seed=seed, eval_batch_size=eval_batch_size)
  options.update(
      cache_dir=cache_dir,
      only_digits=_common.check_bool('only_digits', only_digits),
      max_eval_examples=_common.check_optional_int('max_eval_examples', max_eval_examples),
      model=_common.check_choice('model', model, MODELS),
  )
  database = _common.require_cached_database('emnist', DATABASE_FILE, cache_dir)
  train_data, test_data = tff.simulation.datasets.emnist.load_data(
      only_digits=options['only_digits'], cache_dir=cache_dir)
  num_classes = 10 if options['only_digits'] else 62
  client_ids = tuple(train_data.client_ids)
  num_examples, histograms = _common.scan_sql_split(
      database, 'digits_only_train' if options['only_digits'] else 'all_train', client_ids,
      _common.one_hot_label_statistics('label', num_classes), num_classes)

  train_batches = _tff_batch_and_reshape(options['client_batch_size'])

  def preprocess_client(dataset: tf.data.Dataset, shuffle_seed) -> tf.data.Dataset:
    return train_batches(_common.training_stream(
        dataset, shuffle_seed, shuffle_buffer_size=_SHUFFLE_BUFFER_SIZE,
        max_examples=options['max_client_examples'], epochs=options['client_epochs']))

  return Task(
      name='emnist',
      train_data=train_data,
      eval_data=_common.centralized_eval_data(
          test_data, options['seed'], options['max_eval_examples']),
      preprocess_client=preprocess_client,
      preprocess_eval=_tff_batch_and_reshape(options['eval_batch_size']),
      keras_model_fn=functools.partial(models.mcmahan_cnn, num_classes),
      loss_fn=_common.sparse_categorical_loss,
      metrics_fn=_common.accuracy_metrics,
      client_ids=client_ids,
      client_num_examples=num_examples,
      client_label_histograms=histograms,
      num_classes=num_classes,
      options=options,
  )
