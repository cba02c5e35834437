"""TFF's dataset caches: the SQLite files TFF's loaders read (`load_tff_data`), checked before
TFF would try to download them (`require_cached_database`, one line naming the file and how to
get it), and scanned in one pass for per-client statistics (`scan_sql_split`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import contextlib
import os
import sqlite3
from typing import Any
import urllib.parse

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

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
