"""Helpers shared by the task constructors (not part of the public API).

Option validation (every error names the option and the offending value),
the `Task` assembly and seeded training-stream pipeline of every task,
in-memory `ClientData` and tasks, the cache-file check of TFF's downloaders, a
one-pass scan of a TFF SQLite database for per-client statistics, and TFDS
loading without download (TFDS itself loads only when a task asks for its data).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
import functools
import numbers
import os
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import tff_cache
from tff_sampling.runtime import files
from tff_sampling.task import Task

Preprocess = Callable[[tf.data.Dataset], tf.data.Dataset]

# --------------------------------------------------------------------------
# Option validation. Options arrive from command-line flags, so a wrong type
# is reported like a wrong value: ValueError naming option and value.


def check_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
  """`value` as an int in ``[minimum, maximum]``, else a ValueError naming it."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f'{name} must be an integer, got {value!r}.')
  if value < minimum or (maximum is not None and value > maximum):
    bound = f'>= {minimum}' if maximum is None else f'in [{minimum}, {maximum}]'
    raise ValueError(f'{name} must be an integer {bound}, got {value!r}.')
  return int(value)


def check_optional_int(name: str, value: Any, *, minimum: int = 1) -> int | None:
  return None if value is None else check_int(name, value, minimum=minimum)


def check_float(
  name: str,
  value: Any,
  *,
  minimum: float = 0.0,
  maximum: float = float('inf'),
  min_inclusive: bool = False,
  max_inclusive: bool = True,
) -> float:
  """`value` as a finite float within the given bounds, else a ValueError."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
    raise ValueError(f'{name} must be a finite number, got {value!r}.')
  low_ok = value >= minimum if min_inclusive else value > minimum
  high_ok = value <= maximum if max_inclusive else value < maximum
  if not (low_ok and high_ok):
    low = '[' if min_inclusive else '('
    high = ']' if max_inclusive else ')'
    raise ValueError(f'{name} must be in {low}{minimum}, {maximum}{high}, got {value!r}.')
  return float(value)


def check_int_tuple(name: str, values: Any, *, minimum: int = 1) -> tuple[int, ...]:
  """`values` as a non-empty tuple of ints >= `minimum`, else a ValueError naming `name`."""
  if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
    raise ValueError(f'{name} must be a non-empty list of integers >= {minimum}, got {values!r}.')
  return tuple(check_int(name, v, minimum=minimum) for v in values)


def check_optional_path(name: str, value: Any) -> str | None:
  """`value` if it is ``None`` or a path string, else a ValueError naming `name`."""
  if value is not None and not isinstance(value, (str, os.PathLike)):
    raise ValueError(f'{name} must be a directory path or None, got {value!r}.')
  return None if value is None else os.fspath(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
  if value not in choices:
    raise ValueError(f'{name} must be one of {list(choices)}, got {value!r}.')
  return value


def check_bool(name: str, value: Any) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'{name} must be True or False, got {value!r}.')
  return bool(value)


def check_common_options(
  client_batch_size: Any,
  client_epochs: Any,
  max_client_examples: Any,
  seed: Any,
  eval_batch_size: Any,
) -> dict[str, Any]:
  """Validates the options every task accepts (`tasks.registry`); returns them resolved."""
  return collections.OrderedDict(
    client_batch_size=check_int('client_batch_size', client_batch_size),
    client_epochs=check_int('client_epochs', client_epochs),
    max_client_examples=check_optional_int('max_client_examples', max_client_examples),
    seed=check_int('seed', seed, minimum=0, maximum=2**32 - 1),
    eval_batch_size=check_int('eval_batch_size', eval_batch_size),
  )


# --------------------------------------------------------------------------
# Losses and metrics (module-level functions so tasks stay picklable).


def sparse_categorical_loss() -> tf.keras.losses.Loss:
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def accuracy_metrics() -> list[tf.keras.metrics.Metric]:
  return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


def as_xy(x: tf.Tensor, y: tf.Tensor) -> collections.OrderedDict:
  """The batch structure of every task: ``OrderedDict(x=..., y=...)``."""
  return collections.OrderedDict(x=x, y=y)


# --------------------------------------------------------------------------
# Task assembly and the clients' training streams.


def make_task(
  name: str,
  options: Mapping[str, Any],
  train_data: tff.simulation.datasets.ClientData,
  eval_data: tf.data.Dataset,
  *,
  preprocess_client: Callable[[tf.data.Dataset, Any], tf.data.Dataset],
  preprocess_eval: Preprocess,
  keras_model_fn: Callable[[int], tf.keras.Model],
  statistics: tuple[np.ndarray, np.ndarray],
  num_classes: int,
  metrics_fn: Callable[[], list[tf.keras.metrics.Metric]] = accuracy_metrics,
) -> Task:
  """A `Task` with the sparse categorical loss, clients in `train_data`'s order.

  `statistics` is ``(client_num_examples, client_label_histograms)``.
  """
  num_examples, histograms = statistics
  return Task(
    name=name,
    train_data=train_data,
    eval_data=eval_data,
    preprocess_client=preprocess_client,
    preprocess_eval=preprocess_eval,
    keras_model_fn=keras_model_fn,
    loss_fn=sparse_categorical_loss,
    metrics_fn=metrics_fn,
    client_ids=tuple(train_data.client_ids),
    client_num_examples=num_examples,
    client_label_histograms=histograms,
    num_classes=num_classes,
    options=options,
  )


def cap_and_repeat(dataset: tf.data.Dataset, options: Mapping[str, Any]) -> tf.data.Dataset:
  """The per-epoch cap ``max_client_examples``, then ``client_epochs`` repetitions."""
  if options['max_client_examples'] is not None:
    dataset = dataset.take(options['max_client_examples'])
  if options['client_epochs'] > 1:
    dataset = dataset.repeat(options['client_epochs'])
  return dataset


def training_stream(
  dataset: tf.data.Dataset, seed, options: Mapping[str, Any], *, shuffle_buffer_size: int
) -> tf.data.Dataset:
  """Seeded shuffle, then `cap_and_repeat` (batching is left to the caller).

  The shuffle sits upstream of ``repeat`` with ``reshuffle_each_iteration``,
  so every epoch sees a new order (and, with a cap, a new subset of at most
  ``max_client_examples`` examples); all orders are a deterministic function
  of `seed`.
  """
  if shuffle_buffer_size > 1:
    dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
  return cap_and_repeat(dataset, options)


def client_preprocess(
  options: Mapping[str, Any], *, shuffle_buffer_size: int, batches: Preprocess
) -> Callable[[tf.data.Dataset, Any], tf.data.Dataset]:
  """``preprocess_client``: `training_stream`, then `batches`."""

  def preprocess_client(dataset: tf.data.Dataset, seed) -> tf.data.Dataset:
    return batches(training_stream(dataset, seed, options, shuffle_buffer_size=shuffle_buffer_size))

  return preprocess_client


def batch(
  dataset: tf.data.Dataset, *, batch_size: int, batch_map: Callable[[Any], Any] | None = None
) -> tf.data.Dataset:
  """Batches of `batch_size`, each mapped by `batch_map` if given."""
  dataset = dataset.batch(batch_size)
  return dataset if batch_map is None else dataset.map(batch_map)


# --------------------------------------------------------------------------
# In-memory federated data.


def in_memory_client_data(
  client_ids: Sequence[str], features: Mapping[str, np.ndarray], offsets: np.ndarray
) -> tff.simulation.datasets.ClientData:
  """A `ClientData` over arrays sorted by client.

  Client ``i`` owns rows ``offsets[i]:offsets[i + 1]`` of every array in
  `features`. Unlike ``TestClientData`` (which unrolls a branch per client in
  its serialisable function), the serialisable function here is one slice,
  so it stays cheap for hundreds of clients.

  Args:
    client_ids: The client ids, in row order.
    features: Feature name -> array whose first axis is the example axis.
    offsets: ``int64[len(client_ids) + 1]`` row boundaries.

  Returns:
    A `tff.simulation.datasets.ClientData` whose elements are
    ``OrderedDict`` of the features, one example each.
  """
  client_ids = list(client_ids)
  index = {client_id: i for i, client_id in enumerate(client_ids)}
  features = collections.OrderedDict((k, np.asarray(v)) for k, v in features.items())
  offsets = np.asarray(offsets, np.int64)

  def dataset_fn(client_id) -> tf.data.Dataset:
    if isinstance(client_id, str):
      # Eager use (create_tf_dataset_for_client): slice in NumPy so only this
      # client's rows become tensors.
      start, stop = offsets[index[client_id]], offsets[index[client_id] + 1]
      return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict((k, v[start:stop]) for k, v in features.items())
      )
    # Traced use (inside tf.function / TFF): the constants are created in the
    # tracing graph, never captured from eager mode.
    matches = tf.equal(client_id, tf.constant(client_ids))
    with tf.control_dependencies(
      [tf.debugging.Assert(tf.reduce_any(matches), ['Unknown client id:', client_id])]
    ):
      position = tf.argmax(tf.cast(matches, tf.int32))
    bounds = tf.constant(offsets)
    start, stop = bounds[position], bounds[position + 1]
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict((k, tf.constant(v)[start:stop]) for k, v in features.items())
    )

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(client_ids, dataset_fn)


def tf_dataset_from_arrays(arrays: Mapping[str, np.ndarray]) -> tf.data.Dataset:
  """Unbatched dataset of ``OrderedDict`` elements from equal-length arrays."""
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict((k, np.asarray(v)) for k, v in arrays.items())
  )


def in_memory_task(
  name: str,
  options: Mapping[str, Any],
  *,
  train: Mapping[str, np.ndarray],
  sizes: np.ndarray,
  eval_data: tf.data.Dataset,
  keras_model_fn: Callable[[int], tf.keras.Model],
  num_classes: int,
  batch_map: Callable[[Any], Any] | None = None,
  preprocess_eval: Preprocess | None = None,
) -> Task:
  """A task over in-memory ``{x, y}`` arrays, clients ``client_0``, ... in row order.

  `train` holds the clients' rows in order, `sizes` rows each; label
  histograms count ``train['y']``. Training streams: `training_stream` with a
  shuffle buffer of the largest client, then batches; every training batch is
  mapped by `batch_map` if given. `eval_data` is preprocessed by
  `preprocess_eval`, by default batched and mapped as the training batches.
  """
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  width = len(str(len(sizes) - 1))
  client_ids = tuple(f'client_{i:0{width}d}' for i in range(len(sizes)))
  if preprocess_eval is None:
    preprocess_eval = functools.partial(
      batch, batch_size=options['eval_batch_size'], batch_map=batch_map
    )
  return make_task(
    name,
    options,
    in_memory_client_data(client_ids, train, offsets),
    eval_data,
    preprocess_client=client_preprocess(
      options,
      shuffle_buffer_size=int(sizes.max()),
      batches=functools.partial(
        batch, batch_size=options['client_batch_size'], batch_map=batch_map
      ),
    ),
    preprocess_eval=preprocess_eval,
    keras_model_fn=keras_model_fn,
    statistics=(np.asarray(sizes, np.int64), label_histograms(train['y'], offsets, num_classes)),
    num_classes=num_classes,
  )


def label_histograms(labels: np.ndarray, offsets: np.ndarray, num_classes: int) -> np.ndarray:
  """``int64[N, num_classes]`` label counts of clients given by row offsets."""
  owners = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
  flat = np.bincount(owners * num_classes + labels, minlength=(len(offsets) - 1) * num_classes)
  return flat.reshape(len(offsets) - 1, num_classes).astype(np.int64)


# --------------------------------------------------------------------------
# TFF's downloaded SQLite databases.


def check_label_range(labels: np.ndarray, key: str, num_classes: int) -> None:
  """Raises a ValueError unless every label `key` read from a database is a class."""
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(
      f'Label {key!r} outside [0, {num_classes}) in the database: '
      f'found values in [{labels.min()}, {labels.max()}].'
    )


def one_hot_label_statistics(key: str, num_classes: int):
  """`row_statistics` for one scalar label per example."""

  def statistics(protos: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    labels = tff_cache.parse_int_feature(protos, key)
    check_label_range(labels, key, num_classes)
    counts = np.zeros((len(protos), num_classes), np.int64)
    counts[np.arange(len(protos)), labels] = 1
    return counts, np.ones(len(protos), np.int64)

  return statistics


def centralized_eval_data(
  test_data: tff.simulation.datasets.ClientData, options: Mapping[str, Any]
) -> tf.data.Dataset:
  """The test split as one dataset, at most ``max_eval_examples`` raw elements.

  Clients are concatenated in a random order seeded by ``seed`` (TFF's
  ``create_tf_dataset_from_all_clients``), so a cap keeps whole clients drawn
  at random rather than, say, the first writers in id order.
  """
  dataset = test_data.create_tf_dataset_from_all_clients(seed=options['seed'])
  if options['max_eval_examples'] is not None:
    dataset = dataset.take(options['max_eval_examples'])
  return dataset


# --------------------------------------------------------------------------
# TensorFlow Datasets, never downloaded.


def load_tfds(
  name: str, data_dir: str | None, *, user: str, alternative: str = '', **load_options: Any
) -> tf.data.Dataset:
  """``tfds.load(name, data_dir=data_dir, download=False, **load_options)``.

  Missing data is a FileNotFoundError saying how to provide it; its subject
  is `user` (e.g. ``'The cifar10 task'``), `alternative` ends its fix. The
  directory TFDS leaves in the system temp directory when the data are not
  prepared (it looks for their description online) is removed.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    with files.scratch_tempdir():
      return tfds.load(name, data_dir=data_dir, download=False, **load_options)
  except AssertionError as error:  # TFDS's "could not find data in ..." check.
    default = " (TFDS's default: $TFDS_DATA_DIR or ~/tensorflow_datasets)"
    raise FileNotFoundError(
      f"{user} needs TensorFlow Datasets' prepared {name!r} dataset in "
      f'data_dir={data_dir!r}{default if data_dir is None else ""}, which TFDS could not '
      f'find ({error}); it is not downloaded here. To provide it: on a machine with '
      f'internet access run `tfds build {name} --data_dir=DIR` (or `tfds.load({name!r}, '
      f'data_dir=DIR)` in Python), copy DIR/{name} into a directory here and pass that '
      f'directory as data_dir{alternative}.'
    ) from error
