"""Helpers shared by the task constructors (not part of the public API).

Option validation (every error names the option and the offending value),
the `Task` assembly and seeded training-stream pipeline of every task,
in-memory `ClientData` and tasks, the cache-file check of TFF's downloaders, a
one-pass scan of a TFF SQLite database for per-client statistics, and TFDS
loading without download.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping, Sequence
import contextlib
import functools
import numbers
import os
import sqlite3
from typing import Any
import urllib.parse

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import tensorflow_federated as tff

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
  *,
  client_batch_size: Any,
  client_epochs: Any,
  max_client_examples: Any,
  seed: Any,
  eval_batch_size: Any,
) -> dict[str, Any]:
  """Validates the options every task accepts; returns them resolved."""
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
  evaluation: Mapping[str, np.ndarray],
  keras_model_fn: Callable[[int], tf.keras.Model],
  num_classes: int,
  batch_map: Callable[[Any], Any] | None = None,
) -> Task:
  """A task over in-memory ``{x, y}`` arrays, clients ``client_0``, ... in row order.

  `train` holds the clients' rows in order, `sizes` rows each; label
  histograms count ``train['y']``. Training streams: `training_stream` with a
  shuffle buffer of the largest client, then batches; every training and
  evaluation batch is mapped by `batch_map` if given.
  """
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  width = len(str(len(sizes) - 1))
  client_ids = tuple(f'client_{i:0{width}d}' for i in range(len(sizes)))
  return make_task(
    name,
    options,
    in_memory_client_data(client_ids, train, offsets),
    tf_dataset_from_arrays(evaluation),
    preprocess_client=client_preprocess(
      options,
      shuffle_buffer_size=int(sizes.max()),
      batches=functools.partial(
        batch, batch_size=options['client_batch_size'], batch_map=batch_map
      ),
    ),
    preprocess_eval=functools.partial(
      batch, batch_size=options['eval_batch_size'], batch_map=batch_map
    ),
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

_TFF_DATASETS_URL = 'https://storage.googleapis.com/tff-datasets-public/'


def default_cache_dir() -> str:
  """TFF's default cache directory (``download.get_compressed_file``)."""
  return os.path.join(os.path.expanduser('~'), '.tff')


# The tables and columns TFF's `SqlClientData` reads (the layout written by
# `tff.simulation.datasets.save_to_sql_client_data`).
TFF_DATABASE_SCHEMA = {
  'examples': ('split_name', 'client_id', 'serialized_example_proto'),
  'client_metadata': ('client_id', 'split_name', 'num_examples'),
}


def require_cached_database(dataset: str, file_name: str, cache_dir: str | None) -> str:
  """The path of TFF's decompressed database, or an error saying how to provide it.

  TFF 0.87's loaders call ``download.get_compressed_file(origin=<url>.lzma,
  cache_dir)``, which returns ``<cache_dir>/<file_name>`` when it exists and
  downloads otherwise; downloading cannot work without internet access, so we
  check first and explain how to provide the file. A file that is there but
  damaged (empty, not SQLite, without TFF's tables) is reported the same way
  (`check_tff_database`) instead of failing deep inside TFF's reader.

  Args:
    dataset: Loader module name, e.g. ``'emnist'``.
    file_name: The decompressed file name, e.g. ``'emnist_all.sqlite'``.
    cache_dir: The task's ``cache_dir`` option (``None``: TFF's default).

  Returns:
    The path TFF's loader will read.

  Raises:
    FileNotFoundError: If the file does not exist.
    ValueError: If it is not a database in TFF's format.
  """
  directory = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
  path = os.path.join(directory, file_name)
  if not tf.io.gfile.exists(path):
    url = f'{_TFF_DATASETS_URL}{file_name}.lzma'
    raise FileNotFoundError(
      f"The {dataset} task needs TFF's cached database {path!r} "
      f'(cache_dir={cache_dir!r}), which does not exist, and '
      f'tff.simulation.datasets.{dataset}.load_data would try to download it. '
      'To provide it: run '
      f'`tff.simulation.datasets.{dataset}.load_data(cache_dir=...)` once on a '
      f'machine with internet access and copy the resulting {file_name} into '
      f'{directory!r}; or download {url} and decompress it there '
      f'(`unlzma {file_name}.lzma` or `xz --format=lzma -d {file_name}.lzma`).'
    )
  if os.path.exists(path):  # A local file (gfile also reaches remote ones, not checked).
    check_tff_database(path, dataset, file_name)
  return path


def load_tff_data(
  dataset: str, file_name: str, cache_dir: str | None, **load_options: Any
) -> tuple[str, tff.simulation.datasets.ClientData, tff.simulation.datasets.ClientData]:
  """``(database path, train data, test data)`` from ``tff.simulation.datasets.<dataset>``.

  Checks the cache first (`require_cached_database`), so TFF never downloads.
  """
  database = require_cached_database(dataset, file_name, cache_dir)
  train_data, test_data = getattr(tff.simulation.datasets, dataset).load_data(
    cache_dir=cache_dir, **load_options
  )
  return database, train_data, test_data


def check_tff_database(path: str, dataset: str, file_name: str) -> None:
  """Raises a one-line ValueError unless `path` is an SQLite file in TFF's format.

  Opens the file read-only (it is never modified) and checks that it is an
  SQLite database holding the tables and columns of `TFF_DATABASE_SCHEMA`.
  The message names the path, what is wrong, and how to get a good file.

  Args:
    path: The database file.
    dataset: TFF's loader module, e.g. ``'emnist'`` (for the fix).
    file_name: The file's name in the cache, e.g. ``'emnist_all.sqlite'``.
  """
  problem = _tff_database_problem(path)
  if problem is None:
    return
  url = f'{_TFF_DATASETS_URL}{file_name}.lzma'
  raise ValueError(
    f"The {dataset} task's cache file {path!r} {problem}, so it is not the database "
    f"TFF's loader reads. To get a good file: delete it and run "
    f'`tff.simulation.datasets.{dataset}.load_data(cache_dir=...)` on a machine with internet '
    f'access, then copy its {file_name} here; or download {url} and decompress it here '
    f'(`xz --format=lzma -d {file_name}.lzma`); or convert your own data into this format '
    'with `tff.simulation.datasets.save_to_sql_client_data`.'
  )


def read_only_uri(path: str) -> str:
  """SQLite's read-only URI of `path` (quoted: a path may hold ``?``, ``#`` or ``%``)."""
  return f'file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro'


def _tff_database_problem(path: str) -> str | None:
  """What is wrong with `path` as a TFF database, or ``None`` if nothing is."""
  if os.path.isdir(path):
    return 'is a directory, not a file'
  try:
    size = os.path.getsize(path)
  except OSError as e:
    return f'cannot be read ({e.strerror})'
  if size == 0:
    return 'is empty (0 bytes)'
  uri = read_only_uri(path)
  try:
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
      tables = {
        row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table';")
      }
      for table, required in TFF_DATABASE_SCHEMA.items():
        if table not in tables:
          found = ', '.join(repr(t) for t in sorted(tables)) or 'none'
          return f'has no table {table!r} (its tables: {found})'
        columns = {row[1] for row in connection.execute(f'PRAGMA table_info({table});')}
        missing = [c for c in required if c not in columns]
        if missing:
          return f'has no column(s) {", ".join(missing)} in table {table!r}'
  except sqlite3.DatabaseError as e:  # Includes OperationalError (cannot open).
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if 'not a database' in text:
      return f'is not an SQLite database ({text})'
    return f'cannot be read as an SQLite database ({text})'
  return None


def scan_sql_split(
  database_path: str,
  split_name: str,
  client_ids: Sequence[str],
  row_statistics: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]],
  num_classes: int,
  *,
  chunk_size: int = 20_000,
) -> tuple[np.ndarray, np.ndarray]:
  """Per-client example counts and label histograms in one pass over SQLite.

  Reads ``(client_id, serialized_example_proto)`` rows of one split straight
  from the ``examples`` table of a TFF database (the layout ``SqlClientData``
  reads), in chunks, and lets `row_statistics` turn each chunk of serialised
  ``tf.train.Example``s into per-row label counts and example counts with
  vectorised parsing. Much faster than iterating every client's
  ``tf.data`` pipeline (one query instead of one ``SqlDataset`` per client).

  Args:
    database_path: The SQLite file.
    split_name: Value of the ``split_name`` column.
    client_ids: The clients, in output row order.
    row_statistics: ``protos -> (int64[n, num_classes] label counts,
      int64[n] training examples)`` for a chunk of ``n`` rows.
    num_classes: Width of the histograms.
    chunk_size: Rows per chunk.

  Returns:
    ``(client_num_examples int64[N], client_label_histograms int64[N, C])``.
  """
  num_examples = np.zeros(len(client_ids), np.int64)
  histograms = np.zeros((len(client_ids), num_classes), np.int64)
  for owners, protos in sql_split_chunks(
    database_path, split_name, client_ids, chunk_size=chunk_size
  ):
    counts, examples = row_statistics(protos)
    np.add.at(histograms, owners, counts)
    np.add.at(num_examples, owners, examples)
  return num_examples, histograms


def sql_split_chunks(
  database_path: str,
  split_name: str,
  client_ids: Sequence[str],
  *,
  chunk_size: int = 20_000,
  rowid_order: bool = False,
) -> Iterator[tuple[np.ndarray, list[bytes]]]:
  """The rows of one split, in chunks ``(int64 owners, serialised examples)``.

  ``owners`` are indices into `client_ids`. With `rowid_order` the rows come
  in storage order, the order TFF's ``SqlClientData`` yields a client's rows.
  """
  index = {client_id: i for i, client_id in enumerate(client_ids)}
  uri = read_only_uri(database_path)
  order = ' ORDER BY rowid' if rowid_order else ''
  with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
    cursor = connection.execute(
      f'SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ?{order};',
      (split_name,),
    )
    while rows := cursor.fetchmany(chunk_size):
      yield (
        np.fromiter((index[row[0]] for row in rows), np.int64, len(rows)),
        [row[1] for row in rows],
      )


def count_split_rows(database_path: str, split_name: str) -> int:
  """The number of examples (rows) of one split of a TFF database."""
  with contextlib.closing(sqlite3.connect(read_only_uri(database_path), uri=True)) as connection:
    (count,) = connection.execute(
      'SELECT COUNT(*) FROM examples WHERE split_name = ?;', (split_name,)
    ).fetchone()
  return int(count)


def parse_int_feature(protos: list[bytes], key: str) -> np.ndarray:
  """The scalar int64 feature `key` of serialised ``tf.train.Example``s."""
  parsed = tf.io.parse_example(
    tf.constant(protos, tf.string), {key: tf.io.FixedLenFeature([], tf.int64)}
  )
  return parsed[key].numpy()


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
    labels = parse_int_feature(protos, key)
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
  is `user` (e.g. ``'The cifar10 task'``), `alternative` ends its fix.
  """
  try:
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
