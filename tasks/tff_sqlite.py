"""Federated data written as TFF's SQLite client data (`tff.simulation.datasets`'s schema:
``examples`` and ``client_metadata``), so that TFF's own loaders (``emnist.load_data``,
``shakespeare.load_data``) read LEAF's FEMNIST and the plays."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import contextlib
import dataclasses
import os
import sqlite3
import tempfile

import numpy as np
import tensorflow as tf

from tasks import leaf_json
from tasks import leaf_plays

# The file names TFF's loaders read in their cache_dir (= tasks.emnist.DATABASE_FILE and
# tasks.shakespeare.DATABASE_FILE).
EMNIST_DATABASE_FILE = 'emnist_all.sqlite'


SHAKESPEARE_DATABASE_FILE = 'shakespeare.sqlite'


EMNIST_SPLIT_NAMES = ('digits_only_train', 'digits_only_test', 'all_train', 'all_test')


SHAKESPEARE_SPLIT_NAMES = ('train', 'test')


@dataclasses.dataclass
class DatabaseSummary:
  """What a writer wrote: ``splits`` maps split name -> (clients, examples)."""

  path: str
  splits: dict[str, tuple[int, int]]
  notes: list[str] = dataclasses.field(default_factory=list)

  def lines(self) -> list[str]:
    """``Wrote <path>:``, one line per split, then the notes."""
    return (
      [f'Wrote {self.path}:']
      + [
        f'  {split}: {clients:,} clients, {examples:,} examples'
        for split, (clients, examples) in self.splits.items()
      ]
      + [f'  {note}' for note in self.notes]
    )


def check_absent(path: str, overwrite: bool) -> None:
  """A one-line FileExistsError if `path` exists and not `overwrite`."""
  if not overwrite and os.path.lexists(path):
    raise FileExistsError(
      f'{path} already exists; delete or move it first, or pass '
      'overwrite=True (bin.convert_leaf: --overwrite) to replace it.'
    )


class _DatabaseWriter:
  """A TFF-format SQLite file, written to a temporary file and renamed when complete."""

  def __init__(self, path: str, overwrite: bool):
    self.path = os.fspath(path)
    self._overwrite = overwrite
    if os.path.isdir(self.path):
      raise ValueError(f'{self.path!r} is a directory; the database must be a file.')
    self._check_absent()
    directory = os.path.dirname(os.path.abspath(self.path))
    try:
      os.makedirs(directory, exist_ok=True)
      fd, self._temp = tempfile.mkstemp(
        prefix=f'.{os.path.basename(self.path)}.', suffix='.partial', dir=directory
      )
    except OSError as e:
      raise ValueError(f'Cannot write in {directory!r}: {e.strerror or e}.') from None
    os.close(fd)
    self._connection = sqlite3.connect(self._temp)
    self._connection.execute('PRAGMA journal_mode = OFF;')  # Atomicity comes from the rename.
    self._connection.execute('PRAGMA synchronous = OFF;')
    # The tables of tff.simulation.datasets.save_to_sql_client_data.
    self._connection.execute(
      'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
      'serialized_example_proto BLOB NOT NULL);'
    )
    self._connection.execute(
      'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
      'num_examples INTEGER NOT NULL);'
    )

  def _check_absent(self) -> None:
    check_absent(self.path, self._overwrite)

  def add_rows(self, split: str, client_id: str, protos: Sequence[bytes]) -> None:
    self._connection.executemany(
      'INSERT INTO examples (split_name, client_id, serialized_example_proto) VALUES (?, ?, ?);',
      ((split, client_id, proto) for proto in protos),
    )

  def add_client(self, split: str, client_id: str, num_examples: int) -> None:
    self._connection.execute(
      'INSERT INTO client_metadata (client_id, split_name, num_examples) VALUES (?, ?, ?);',
      (client_id, split, num_examples),
    )

  def delete_rows(self, split: str, client_ids: Sequence[str]) -> None:
    self._connection.executemany(
      'DELETE FROM examples WHERE split_name = ? AND client_id = ?;',
      ((split, c) for c in client_ids),
    )

  def finish(self) -> None:
    self._connection.execute('CREATE INDEX examples_by_client ON examples (client_id, split_name);')
    self._connection.commit()
    self._connection.close()
    with open(self._temp, 'rb+') as f:
      os.fsync(f.fileno())
    umask = os.umask(0)  # mkstemp made the file private; give it the usual mode.
    os.umask(umask)
    os.chmod(self._temp, 0o666 & ~umask)
    self._check_absent()
    os.replace(self._temp, self.path)

  def abort(self) -> None:
    with contextlib.suppress(sqlite3.Error):
      self._connection.close()
    with contextlib.suppress(OSError):
      os.remove(self._temp)

  def __enter__(self) -> _DatabaseWriter:
    return self

  def __exit__(self, exc_type, exc, traceback) -> None:
    if exc_type is None:
      try:
        self.finish()
      except BaseException:
        self.abort()
        raise
    else:
      self.abort()


def _feature_kind(array: np.ndarray) -> str:
  kind = array.dtype.kind
  if kind == 'f':
    return 'float'
  if kind in 'iub':
    return 'int'
  if kind in 'SUO':
    return 'bytes'
  raise ValueError(f'Unsupported feature dtype {array.dtype}.')


def _feature_spec(features: Mapping[str, np.ndarray]) -> tuple:
  return tuple(
    (name, _feature_kind(np.asarray(a)), np.asarray(a).shape[1:]) for name, a in features.items()
  )


def _bytes_value(value) -> bytes:
  return value.encode('utf-8') if isinstance(value, str) else bytes(value)


def serialize_examples(features: Mapping[str, np.ndarray]) -> list[bytes]:
  """One serialised ``tf.train.Example`` per row, encoded as TFF's writer does.

  ``save_to_sql_client_data``'s encoding: float features as a flattened
  ``float_list`` (float32), integer and bool features as a flattened
  ``int64_list``, string features (scalars only) as a one-value
  ``bytes_list`` (``str`` as UTF-8).
  """
  arrays = collections.OrderedDict((name, np.asarray(a)) for name, a in features.items())
  lengths = {len(a) for a in arrays.values()}
  if len(lengths) > 1:
    raise ValueError(
      f'Features have different numbers of examples: '
      f'{ {name: len(a) for name, a in arrays.items()} }.'
    )
  columns = []
  for name, array in arrays.items():
    kind = _feature_kind(array)
    if kind == 'float':
      values = array.astype(np.float32).reshape(len(array), -1).tolist()
      columns.append(
        (name, [tf.train.Feature(float_list=tf.train.FloatList(value=v)) for v in values])
      )
    elif kind == 'int':
      values = array.astype(np.int64).reshape(len(array), -1).tolist()
      columns.append(
        (name, [tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for v in values])
      )
    else:
      if array.ndim != 1:
        raise ValueError(
          f'String feature {name!r} must hold one string per example, got shape '
          f'{array.shape[1:]} per example.'
        )
      columns.append(
        (
          name,
          [tf.train.Feature(bytes_list=tf.train.BytesList(value=[_bytes_value(v)])) for v in array],
        )
      )
  size = lengths.pop() if lengths else 0
  return [
    tf.train.Example(
      features=tf.train.Features(feature={name: column[i] for name, column in columns})
    ).SerializeToString()
    for i in range(size)
  ]


def write_tff_database(
  path: str, splits: leaf_json.Splits, *, overwrite: bool = False
) -> DatabaseSummary:
  """Writes ``{split_name: {client_id: {feature: array}}}`` to one TFF SQLite file.

  The layout and encoding of ``tff.simulation.datasets.save_to_sql_client_data``
  (tables ``examples`` and ``client_metadata``), with several splits in one
  file as TFF's own databases have them, so a client can be in several
  splits; a client's rows keep their order. Every client must have the same
  features (names, kinds, per-example shapes), as TFF requires.

  Args:
    path: The file to write (its directory is created).
    splits: Split name -> client id -> feature name -> array (first axis:
      examples).
    overwrite: Replace an existing file (default: refuse).

  Returns:
    A `DatabaseSummary` (clients and examples per split).

  Raises:
    FileExistsError: If `path` exists and not `overwrite`.
    ValueError: For a client whose features differ from the first client's,
      an invalid client id, or no splits.
  """
  if not splits:
    raise ValueError('write_tff_database needs at least one split.')
  expected, first = None, None
  summary = DatabaseSummary(os.fspath(path), {})
  with _DatabaseWriter(path, overwrite) as writer:
    for split, clients in splits.items():
      examples = 0
      for client_id, features in clients.items():
        if not isinstance(client_id, str) or not client_id or "'" in client_id:
          raise ValueError(
            f'Split {split!r}: client id {client_id!r} must be a non-empty string '
            "without single quotes (TFF's SQLite reader quotes ids with them)."
          )
        spec = _feature_spec(features)
        if expected is None:
          expected, first = spec, (split, client_id)
        elif spec != expected:
          raise ValueError(
            f'Split {split!r}, client {client_id!r}: features {spec} differ from '
            f'those of client {first[1]!r} in split {first[0]!r}: {expected}; '
            'TFF needs one element spec for all clients.'
          )
        protos = serialize_examples(features)
        writer.add_rows(split, client_id, protos)
        writer.add_client(split, client_id, len(protos))
        examples += len(protos)
      summary.splits[split] = (len(clients), examples)
  return summary


def write_emnist_database(
  leaf_dir: str, cache_dir: str, *, overwrite: bool = False
) -> DatabaseSummary:
  """Converts LEAF FEMNIST into ``<cache_dir>/emnist_all.sqlite`` (TFF's four splits).

  Streams the JSON files one at a time (memory: one file), checking them as
  `read_leaf` does; nothing is written under the final name unless all of
  them are good.

  Args:
    leaf_dir: LEAF's FEMNIST folder (``train/``, ``test/``).
    cache_dir: The ``cache_dir`` of TFF's loader and of the ``emnist`` tasks
      (created if missing).
    overwrite: Replace an existing database (default: refuse).

  Returns:
    A `DatabaseSummary` with clients and examples of the four splits.

  Raises:
    ValueError: For bad LEAF data (see `read_leaf`).
    FileExistsError: If the database exists and not `overwrite`.
  """
  leaf_dir = os.fspath(leaf_dir)
  path = os.path.join(os.fspath(cache_dir), EMNIST_DATABASE_FILE)
  owners = {split: {} for split in leaf_json.LEAF_SPLITS}
  digits = {split: {} for split in leaf_json.LEAF_SPLITS}
  counts = dict.fromkeys(leaf_json.LEAF_SPLITS, 0)
  for split in leaf_json.LEAF_SPLITS:
    leaf_json._leaf_files(leaf_dir, split)  # Fail fast, before creating any file.
  with _DatabaseWriter(path, overwrite) as writer:
    for split in leaf_json.LEAF_SPLITS:
      for _, user, features in leaf_json._iter_leaf_split(
        leaf_dir, split, leaf_json._femnist_features, owners[split]
      ):
        protos = serialize_examples(features)
        writer.add_rows(f'all_{split}', user, protos)
        writer.add_client(f'all_{split}', user, len(protos))
        kept = leaf_json._digits_only(features['label'])
        writer.add_rows(f'digits_only_{split}', user, [protos[i] for i in kept])
        digits[split][user] = len(kept)
        counts[split] += len(protos)
    leaf_json._check_both_splits(leaf_dir, owners)
    writers = leaf_json._digit_writers(digits['train'], digits['test'])
    dropped = sorted(set(owners['train']) - set(writers))
    summary = DatabaseSummary(path, {})
    for split in leaf_json.LEAF_SPLITS:
      writer.delete_rows(f'digits_only_{split}', dropped)
      for user in writers:
        writer.add_client(f'digits_only_{split}', user, digits[split][user])
      summary.splits[f'digits_only_{split}'] = (
        len(writers),
        sum(digits[split][u] for u in writers),
      )
    for split in leaf_json.LEAF_SPLITS:
      summary.splits[f'all_{split}'] = (len(owners[split]), counts[split])
    if dropped:
      summary.notes.append(
        f'digits_only_*: {len(dropped)} writer(s) without a digit in both splits left out '
        f'(e.g. {dropped[0]}).'
      )
  return summary


def write_shakespeare_database(
  text_path: str, cache_dir: str, *, overwrite: bool = False
) -> DatabaseSummary:
  """Converts play text into ``<cache_dir>/shakespeare.sqlite`` (splits ``train``/``test``).

  Args:
    text_path: A UTF-8 text file in speaker-block form (`read_play_roles`).
    cache_dir: The ``cache_dir`` of TFF's loader and of the ``shakespeare``
      task (created if missing).
    overwrite: Replace an existing database (default: refuse).

  Returns:
    A `DatabaseSummary`; its notes count the roles dropped for having fewer
    than two speeches.

  Raises:
    ValueError: For an unreadable or malformed text, or one without a role
      of two speeches.
    FileExistsError: If the database exists and not `overwrite`.
  """
  text_path = os.fspath(text_path)
  path = os.path.join(os.fspath(cache_dir), SHAKESPEARE_DATABASE_FILE)
  check_absent(path, overwrite)
  try:
    with open(text_path, encoding='utf-8') as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise ValueError(
      f'{text_path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8.'
    ) from None
  except OSError as e:
    raise ValueError(f'Cannot read the play text {text_path!r}: {e.strerror or e}.') from None
  roles = leaf_plays.read_play_roles(text, source=text_path)
  if not roles:
    raise ValueError(
      f'{text_path}: no speaker blocks ("ROLE:" line, speech lines, blank line) found.'
    )
  splits = leaf_plays.shakespeare_splits(roles)
  clients = {leaf_plays.role_client_id(role) for role in roles}
  if not splits['train']:
    raise ValueError(
      f'{text_path}: no role has two speeches, so no client can have a train and a test example.'
    )
  summary = write_tff_database(
    path,
    collections.OrderedDict(
      (split, leaf_plays.shakespeare_clients(snippets)) for split, snippets in splits.items()
    ),
    overwrite=overwrite,
  )
  summary.notes.append(
    f'{len(roles):,} roles in the text ({len(clients):,} client ids); '
    f'{len(clients) - len(splits["train"]):,} with fewer than two speeches left out.'
  )
  return summary
