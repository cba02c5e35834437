"""The `shakespeare` task: one client per role through TFF's loader and cache, next-character
prediction; ``docs/tasks.md`` has the details."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines import client_spec
from tensorflow_federated.python.simulation.baselines import keras_metrics
from tensorflow_federated.python.simulation.baselines.shakespeare import (
  char_prediction_preprocessing,
)

from tasks import _common
from tasks import models
from tasks import tff_cache
from tff_sampling.task import Task

DATABASE_FILE = 'shakespeare.sqlite'
VOCAB = tuple(char_prediction_preprocessing.CHAR_VOCAB)
PAD, OOV, BOS, EOS = char_prediction_preprocessing.get_special_tokens()
NUM_CLASSES = len(VOCAB) + 4
MODELS = ('gru', 'tff_lstm')
_SHUFFLE_BUFFER_SIZE = char_prediction_preprocessing.DEFAULT_SHUFFLE_BUFFER_SIZE
# TFF's pipeline batches sequences before splitting inputs from targets; we
# unbatch right after (to cap and repeat per sequence), so this only sets
# how many sequences TFF's split handles per call.
_TFF_PACK_SIZE = 256


def _byte_to_token() -> np.ndarray:
  """TFF's lookup (``bytes_split`` + vocabulary table + 1) as a 256-entry table."""
  table = np.full(256, OOV, np.int64)
  for position, character in enumerate(VOCAB):
    table[ord(character)] = position + 1  # 0 is reserved for pad.
  return table


_BYTE_TO_TOKEN = _byte_to_token()


def snippet_statistics(
  snippets: list[bytes], sequence_length: int
) -> tuple[np.ndarray, np.ndarray]:
  """Target histograms and sequence counts of snippets, as TFF tokenises them.

  Args:
    snippets: Raw snippets (bytes).
    sequence_length: The task's ``sequence_length``.

  Returns:
    ``(int64[n, 90] next-token target counts, int64[n] sequences)``.
  """
  period = sequence_length + 1
  counts = np.zeros((len(snippets), NUM_CLASSES), np.int64)
  sequences = np.zeros(len(snippets), np.int64)
  for row, snippet in enumerate(snippets):
    tokens = np.concatenate([[BOS], _BYTE_TO_TOKEN[np.frombuffer(snippet, np.uint8)], [EOS]])
    tokens = np.concatenate([tokens, np.zeros(-len(tokens) % period, np.int64)])
    sequences[row] = len(tokens) // period
    # Every token is a target except the first of each sequence.
    counts[row] = np.bincount(tokens, minlength=NUM_CLASSES) - np.bincount(
      tokens[::period], minlength=NUM_CLASSES
    )
  return counts, sequences


def _parse_snippets(protos: list[bytes]) -> list[bytes]:
  parsed = tf.io.parse_example(
    tf.constant(protos, tf.string), {'snippets': tf.io.FixedLenFeature([], tf.string)}
  )
  return list(parsed['snippets'].numpy())


def shakespeare_metrics() -> list[tf.keras.metrics.Metric]:
  """Accuracy over non-pad targets (TFF's masked accuracy, named 'accuracy')."""
  return [keras_metrics.MaskedCategoricalAccuracy(masked_tokens=[PAD], name='accuracy')]


def _tff_sequences(batch_size: int, sequence_length: int):
  """TFF's baseline tokenisation into (input, target) batches, as ``{x, y}``."""
  tff_fn = char_prediction_preprocessing.create_preprocess_fn(
    client_spec.ClientSpec(num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1),
    sequence_length=sequence_length,
  )
  return lambda dataset: tff_fn(dataset).map(_common.as_xy)


def _client_preprocess(options: dict[str, Any]):
  """``preprocess_client``: snippets shuffled, cut into sequences, capped, repeated, batched."""
  to_sequences = _tff_sequences(_TFF_PACK_SIZE, options['sequence_length'])

  def preprocess_client(dataset: tf.data.Dataset, shuffle_seed) -> tf.data.Dataset:
    # The shuffle is upstream of repeat, so each epoch reshuffles (seeded).
    dataset = dataset.shuffle(
      _SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
    )
    dataset = _common.cap_and_repeat(to_sequences(dataset).unbatch(), options)
    return dataset.batch(options['client_batch_size'])

  return preprocess_client


def create_shakespeare_task(
  *,
  client_batch_size: int = 8,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  cache_dir: str | None = None,
  sequence_length: int = 5,
  max_eval_examples: int | None = 10_000,
  model: str = 'gru',
) -> Task:
  """Builds the ``shakespeare`` task.

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`), counting sequences (the paper's batch: 8).
    seed: Seed of the evaluation clients' order.
    cache_dir: Directory holding ``shakespeare.sqlite`` (``None``:
      ``~/.tff``).
    sequence_length: Input characters per example.
    max_eval_examples: Cap on evaluation *snippets* (``None``: all).
    model: ``'gru'`` or ``'tff_lstm'``.

  Returns:
    The `Task`. Raw elements are TFF's ``OrderedDict(snippets=string[])``;
    training batches ``OrderedDict(x=int64[B, L], y=int64[B, L])``.

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
    sequence_length=_common.check_int('sequence_length', sequence_length),
    max_eval_examples=_common.check_optional_int('max_eval_examples', max_eval_examples),
    model=_common.check_choice('model', model, MODELS),
  )
  database, train_data, test_data = tff_cache.load_tff_data(
    'shakespeare', DATABASE_FILE, options['cache_dir']
  )
  sequence_length = options['sequence_length']
  statistics = tff_cache.scan_sql_split(
    database,
    'train',
    tuple(train_data.client_ids),
    lambda protos: snippet_statistics(_parse_snippets(protos), sequence_length),
    NUM_CLASSES,
  )

  if options['model'] == 'gru':
    keras_model_fn = functools.partial(models.char_gru, NUM_CLASSES)
  else:
    keras_model_fn = functools.partial(models.tff_char_lstm, NUM_CLASSES, sequence_length)

  return _common.make_task(
    'shakespeare',
    options,
    train_data,
    _common.centralized_eval_data(test_data, options),
    preprocess_client=_client_preprocess(options),
    preprocess_eval=_tff_sequences(options['eval_batch_size'], sequence_length),
    keras_model_fn=keras_model_fn,
    statistics=statistics,
    num_classes=NUM_CLASSES,
    metrics_fn=shakespeare_metrics,
  )
