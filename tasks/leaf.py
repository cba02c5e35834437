"""Real federated data on disk, read into TFF's formats: LEAF's JSON and play text.

LEAF's JSON (FEMNIST, Synthetic)
--------------------------------
LEAF's preprocessing (whose output FedProx, FedLab and FLGo also use) writes a
dataset as ``<dir>/train/*.json`` and ``<dir>/test/*.json``, each file
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
"y": [...]}}}``. `read_leaf` reads such a directory into ``{'train': {client_id:
{feature: array}}, 'test': {...}}`` (clients sorted by id, examples in file
order) and checks everything it reads: a problem is a one-line ``ValueError``
naming the file, the user and the fix. Entries of ``user_data`` that
``users`` does not list are ignored (LEAF's split leaves an empty entry for
every user it drops); other keys (``hierarchies``) are ignored too.

- ``'femnist'``: ``x`` is an example's 784 = 28x28 pixels, row-major, in
  [0, 1] with background 1.0, and ``y`` its label 0..61 (digits 0-9, upper
  case 10-35, lower case 36-61). TFF's ``emnist`` uses the same pixel
  convention (its docstring: "the value of 1.0 corresponds to the background")
  and label order, so values are copied unchanged. Features are TFF's:
  ``label`` int32 and ``pixels`` float32[28, 28] (`FEMNIST_ELEMENT_SPEC`).
- ``'synthetic'`` (LEAF's and FedProx's Synthetic): ``x`` a vector of floats
  of one length ``d`` for the whole dataset, ``y`` an integer label >= 0;
  features ``x`` float32[d] and ``y`` int32.

Every user must be in both splits, as LEAF's sample split (``preprocess.sh -t
sample``) makes them and TFF's datasets have them ("each user's examples are
split across train and test"); LEAF's user split (``-t user``) cannot be
converted. `femnist_client_data` returns the two splits as in-memory
``tff.simulation.datasets.ClientData`` with TFF's element spec.

TFF's SQLite databases
----------------------
`write_emnist_database` writes ``<cache_dir>/emnist_all.sqlite`` and
`write_shakespeare_database` ``<cache_dir>/shakespeare.sqlite``: the files
``tff.simulation.datasets.emnist.load_data(cache_dir=...)`` and
``shakespeare.load_data(cache_dir=...)`` read, and with them the ``emnist``,
``emnist_unbalanced_*`` and ``shakespeare`` tasks. ``emnist_all.sqlite``
holds TFF's four splits:

- ``all_train`` / ``all_test``: every example of every writer (LEAF's train
  and test files).
- ``digits_only_train`` / ``digits_only_test``: the examples with a label
  below 10, taken from ``all_train`` / ``all_test`` (so a digit is in the same
  split in both), of the writers that have at least one digit in each split
  (TFF keeps every client in both splits). TFF documents its digits-only data
  as the examples of the digit classes (3,383 of its 3,400 writers) but not
  how it split them; this is our rule.

`write_tff_database` writes any ``{split: {client_id: {feature: array}}}`` in
the layout of ``tff.simulation.datasets.save_to_sql_client_data`` (the same
tables and ``tf.train.Example`` encoding), several splits in one file, plus an
index on ``(client_id, split_name)`` so that reading one client does not scan
the whole table (rows of a client keep their order). Every writer refuses to
replace an existing file unless ``overwrite=True``, and writes a hidden
temporary file in the same directory that is renamed into place when
complete, so an interrupted run never leaves a partial database under the
name TFF reads (only a ``.<name>.*.partial`` file, safe to delete).

Play text (Shakespeare)
-----------------------
`read_play_roles` reads text in speaker-block form (a ``ROLE:`` line, the
speech's lines, a blank line; e.g. the "tiny Shakespeare" corpus) into
``{role: [speech, ...]}``; `shakespeare_splits` makes TFF's Shakespeare
clients from it: one client per role, one example (``snippets``) per speech.

- Client ids: the role name upper-cased, each run of characters other than
  A-Z and 0-9 replaced by ``_`` (``'First Citizen'`` -> ``FIRST_CITIZEN``),
  TFF's style. Roles whose ids coincide (``'Nurse'`` and ``'NURSE'``,
  ``'LADY CAPULET'`` and ``'LADY  CAPULET'``) are one client, its speeches
  those of the roles in order of their first appearance. Play text carries no
  play titles (TFF's ids are ``PLAY_ROLE``), so a role name used in two plays
  is one client.
- Split: a client with ``n >= 2`` speeches puts its first
  ``max(1, floor(0.9 n))`` speeches in ``train`` and the rest in ``test``
  (LEAF's default train fraction 0.9 and its "at least one example in each
  split" rule; in text order, so test speeches follow the training ones
  instead of being drawn at random, and the split needs no seed). Clients with
  fewer than two speeches are dropped, as TFF drops them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
import contextlib
import dataclasses
import glob
import json
import math
import os
import re
import sqlite3
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import _common

Clients = Mapping[str, Mapping[str, np.ndarray]]
Splits = Mapping[str, Clients]

LEAF_DATASETS = ('femnist', 'synthetic')
LEAF_SPLITS = ('train', 'test')
FEMNIST_NUM_CLASSES = 62
FEMNIST_IMAGE_SHAPE = (28, 28)
FEMNIST_ELEMENT_SPEC = collections.OrderedDict(
  label=tf.TensorSpec([], tf.int32), pixels=tf.TensorSpec(FEMNIST_IMAGE_SHAPE, tf.float32)
)
SHAKESPEARE_ELEMENT_SPEC = collections.OrderedDict(snippets=tf.TensorSpec([], tf.string))
# The file names TFF's loaders read in their cache_dir (= tasks.emnist.DATABASE_FILE and
# tasks.shakespeare.DATABASE_FILE).
EMNIST_DATABASE_FILE = 'emnist_all.sqlite'
SHAKESPEARE_DATABASE_FILE = 'shakespeare.sqlite'
EMNIST_SPLIT_NAMES = ('digits_only_train', 'digits_only_test', 'all_train', 'all_test')
SHAKESPEARE_SPLIT_NAMES = ('train', 'test')
# Shakespeare: the training share of a client's speeches, as numerator / denominator.
SHAKESPEARE_TRAIN_FRACTION = (9, 10)

_FEMNIST_PIXELS = FEMNIST_IMAGE_SHAPE[0] * FEMNIST_IMAGE_SHAPE[1]
_LEAF_FIX = "re-create it with LEAF's preprocessing, or remove that user"


# ----------------------------------------------------------------------------
# LEAF's JSON.


def _leaf_files(directory: str, split: str) -> list[str]:
  """The sorted ``*.json`` files of ``<directory>/<split>``, else a ValueError."""
  if not os.path.isdir(directory):
    raise ValueError(
      f'LEAF directory {directory!r} does not exist or is not a directory; give '
      "the folder that holds LEAF's train/ and test/ folders."
    )
  split_dir = os.path.join(directory, split)
  if not os.path.isdir(split_dir):
    raise ValueError(
      f'LEAF directory {directory!r} has no {split}/ folder; give the folder that '
      "holds LEAF's train/ and test/ folders (e.g. leaf/data/femnist/data)."
    )
  files = sorted(glob.glob(os.path.join(glob.escape(split_dir), '*.json')))
  if not files:
    raise ValueError(
      f"{split_dir!r} holds no *.json files; LEAF's preprocessing writes its {split} files there."
    )
  return files


def _load_json(path: str) -> dict:
  try:
    with open(path, 'rb') as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(
      f'{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); '
      "re-create the file with LEAF's preprocessing (was it cut short?)."
    ) from None
  except UnicodeDecodeError as e:
    raise ValueError(
      f'{path}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start}); '
      "re-create the file with LEAF's preprocessing."
    ) from None
  except OSError as e:
    raise ValueError(f'{path}: cannot be read ({e.strerror or e}).') from None
  if not isinstance(data, dict):
    raise ValueError(
      f"{path}: the JSON is a {type(data).__name__}, not LEAF's object with "
      '"users", "num_samples" and "user_data".'
    )
  missing = [key for key in ('users', 'num_samples', 'user_data') if key not in data]
  if missing:
    keys = 'key' if len(missing) == 1 else 'keys'
    raise ValueError(
      f"{path}: no {keys} {', '.join(repr(k) for k in missing)}; LEAF's files "
      'hold "users", "num_samples" and "user_data".'
    )
  return data


def _check_file_structure(path: str, data: dict) -> list[tuple[str, list, list]]:
  """``[(user, x, y)]`` of a LEAF file whose lists and counts agree, else a ValueError."""
  users, num_samples, user_data = data['users'], data['num_samples'], data['user_data']
  if not isinstance(users, list) or not isinstance(num_samples, list):
    raise ValueError(f'{path}: "users" and "num_samples" must be lists; {_LEAF_FIX}.')
  if not isinstance(user_data, dict):
    raise ValueError(f'{path}: "user_data" must be an object keyed by user; {_LEAF_FIX}.')
  if len(users) != len(num_samples):
    raise ValueError(
      f'{path}: "users" has {len(users)} entries but "num_samples" has '
      f'{len(num_samples)}; {_LEAF_FIX}.'
    )
  entries, seen = [], set()
  for user, count in zip(users, num_samples):
    if not isinstance(user, str) or not user:
      raise ValueError(f'{path}: user id {user!r} is not a non-empty string; {_LEAF_FIX}.')
    if "'" in user:
      # TFF's SqlClientData pastes the id into its SQL query between single quotes.
      raise ValueError(
        f"{path}: user {user!r}: a client id cannot contain a single quote (TFF's "
        'SQLite reader quotes ids with it); rename the user.'
      )
    if user in seen:
      raise ValueError(f'{path}: user {user!r} is listed twice in "users"; {_LEAF_FIX}.')
    seen.add(user)
    record = user_data.get(user)
    if not isinstance(record, dict) or 'x' not in record or 'y' not in record:
      problem = 'no entry' if record is None else 'an entry without "x" and "y"'
      raise ValueError(f'{path}: user {user!r} has {problem} in "user_data"; {_LEAF_FIX}.')
    x, y = record['x'], record['y']
    if not isinstance(x, list) or not isinstance(y, list):
      raise ValueError(f'{path}: user {user!r}: "x" and "y" must be lists; {_LEAF_FIX}.')
    if isinstance(count, bool) or not isinstance(count, int) or count != len(x) or count != len(y):
      raise ValueError(
        f'{path}: user {user!r}: num_samples is {count!r} but "x" has {len(x)} '
        f'and "y" {len(y)} examples; they must agree ({_LEAF_FIX}).'
      )
    if not x:
      raise ValueError(
        f"{path}: user {user!r} has no examples; TFF's datasets need at least "
        'one per client and split, so remove the user.'
      )
    entries.append((user, x, y))
  return entries


def _float_rows(path: str, user: str, x: list, width: int | None, what: str) -> np.ndarray:
  """``x`` as float64[n, width] (``width=None``: any common width), else a ValueError."""
  try:
    array = np.array(x, dtype=np.float64)
  except (ValueError, TypeError, OverflowError):
    array = None
  if array is not None and array.ndim == 2 and (width is None or array.shape[1] == width):
    return array
  expected = width if width is not None else (len(x[0]) if isinstance(x[0], list) else None)
  for i, row in enumerate(x):
    if not isinstance(row, list):
      raise ValueError(
        f'{path}: user {user!r}: example {i} of "x" is {_short(row)}, not a list of '
        f'{what}; {_LEAF_FIX}.'
      )
    if expected is not None and len(row) != expected:
      raise ValueError(
        f'{path}: user {user!r}: example {i} of "x" has {len(row)} values, expected '
        f'{expected} {what}; {_LEAF_FIX}.'
      )
    for j, value in enumerate(row):
      if isinstance(value, bool) or not (value is None or isinstance(value, (int, float))):
        raise ValueError(
          f'{path}: user {user!r}: example {i} of "x" has value {j} = '
          f'{_short(value)}, not a number; {_LEAF_FIX}.'
        )
  raise ValueError(
    f'{path}: user {user!r}: "x" is not a list of equally long lists of numbers; {_LEAF_FIX}.'
  )


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + '...'


def _labels(path: str, user: str, y: list, maximum: int) -> np.ndarray:
  """``y`` as int64[n] in ``[0, maximum]``, else a ValueError."""
  for i, value in enumerate(y):
    if isinstance(value, bool) or not isinstance(value, int):
      raise ValueError(
        f'{path}: user {user!r}: label {i} of "y" is {_short(value)}, not an integer; {_LEAF_FIX}.'
      )
    if not 0 <= value <= maximum:
      classes = ' (FEMNIST: 62 classes, digits, upper, lower case)' if maximum == 61 else ''
      raise ValueError(
        f'{path}: user {user!r}: example {i} has label {value}, outside '
        f'0..{maximum}{classes}; {_LEAF_FIX}.'
      )
  return np.array(y, np.int64)


def _check_range(
  path: str, user: str, values: np.ndarray, low: float, high: float, what: str, fix: str
) -> None:
  bad = ~np.isfinite(values) | (values < low) | (values > high)
  if bad.any():
    i, j = (int(k) for k in np.argwhere(bad)[0])
    value = float(values[i, j])
    problem = (
      f'outside [{low:g}, {high:g}]'
      if np.isfinite(value)
      else 'not a finite number (null, NaN or Infinity in the JSON)'
    )
    raise ValueError(
      f'{path}: user {user!r}: example {i} has {what} {j} = {value!r}, {problem}; {fix}.'
    )


def _femnist_features(path: str, user: str, x: list, y: list) -> collections.OrderedDict:
  pixels = _float_rows(path, user, x, _FEMNIST_PIXELS, 'pixel values (28x28 FEMNIST)')
  _check_range(
    path,
    user,
    pixels,
    0.0,
    1.0,
    'pixel',
    "LEAF's FEMNIST pixels are in [0, 1] with background 1.0 (values 0..255 must be "
    'divided by 255)',
  )
  labels = _labels(path, user, y, FEMNIST_NUM_CLASSES - 1)
  return collections.OrderedDict(
    label=labels.astype(np.int32),
    pixels=pixels.astype(np.float32).reshape((-1,) + FEMNIST_IMAGE_SHAPE),
  )


class _SyntheticReader:
  """Synthetic's features; every example must have the first one's length."""

  def __init__(self):
    self.width: int | None = None

  def __call__(self, path: str, user: str, x: list, y: list) -> collections.OrderedDict:
    features = _float_rows(path, user, x, self.width, 'features')
    if self.width is None:
      self.width = features.shape[1]
    _check_range(
      path, user, features, -math.inf, math.inf, 'feature', 'features must be finite numbers'
    )
    labels = _labels(path, user, y, np.iinfo(np.int32).max)
    return collections.OrderedDict(x=features.astype(np.float32), y=labels.astype(np.int32))


def _feature_reader(dataset: str):
  _common.check_choice('dataset', dataset, LEAF_DATASETS)
  return _femnist_features if dataset == 'femnist' else _SyntheticReader()


def _iter_leaf_split(
  directory: str, split: str, reader, owners: dict[str, str]
) -> Iterator[tuple[str, str, collections.OrderedDict]]:
  """``(file, user, features)`` of every user of one split, checked; fills `owners`."""
  for path in _leaf_files(directory, split):
    for user, x, y in _check_file_structure(path, _load_json(path)):
      if user in owners:
        raise ValueError(
          f'{path}: user {user!r} is also in {owners[user]}; a user must be in one '
          f'{split} file only (remove one of them).'
        )
      owners[user] = path
      yield path, user, reader(path, user, x, y)


def _check_both_splits(directory: str, owners: Mapping[str, Mapping[str, str]]) -> None:
  """A ValueError naming a user that is in one split only."""
  for split, other in (('train', 'test'), ('test', 'train')):
    for user in sorted(set(owners[split]) - set(owners[other])):
      raise ValueError(
        f'{owners[split][user]}: user {user!r} has no {other} examples (no file in '
        f"{os.path.join(directory, other)} lists it); TFF's datasets hold every client in both "
        f"splits, as LEAF's sample split (preprocess.sh -t sample) makes them: remove the user "
        'or re-run LEAF with -t sample.'
      )


def read_leaf(directory: str, dataset: str = 'femnist') -> collections.OrderedDict:
  """Reads and checks a LEAF directory (``train/*.json``, ``test/*.json``).

  Args:
    directory: The folder holding LEAF's ``train/`` and ``test/`` folders.
    dataset: ``'femnist'`` or ``'synthetic'`` (see the module docstring).

  Returns:
    ``OrderedDict(train={client_id: OrderedDict(feature=array)}, test=...)``,
    clients sorted by id, examples in file order. FEMNIST features:
    ``label`` int32[n], ``pixels`` float32[n, 28, 28]; Synthetic: ``x``
    float32[n, d], ``y`` int32[n].

  Raises:
    ValueError: One line naming the file, the user and the fix: a missing
      folder or file, malformed JSON, missing keys, ``num_samples`` not
      matching ``x``/``y``, a user twice in a split or in one split only,
      examples of the wrong length, non-finite or out-of-range pixels, labels
      out of range (FEMNIST: 0..61).
  """
  directory = os.fspath(directory)
  reader = _feature_reader(dataset)
  for split in LEAF_SPLITS:
    _leaf_files(directory, split)  # Both folders, before reading any file.
  owners = {split: {} for split in LEAF_SPLITS}
  splits = collections.OrderedDict()
  for split in LEAF_SPLITS:
    clients = {
      user: features
      for _, user, features in _iter_leaf_split(directory, split, reader, owners[split])
    }
    splits[split] = collections.OrderedDict(sorted(clients.items()))
  _check_both_splits(directory, owners)
  return splits


def _digits_only(labels: np.ndarray) -> np.ndarray:
  return np.flatnonzero(labels < 10)


def _digit_writers(train_digits: Mapping[str, int], test_digits: Mapping[str, int]) -> list[str]:
  """The writers of the digits-only splits: at least one digit in each split."""
  return sorted(u for u, n in train_digits.items() if n and test_digits.get(u, 0))


def femnist_splits(leaf_splits: Splits) -> collections.OrderedDict:
  """TFF's four EMNIST splits of `read_leaf`'s FEMNIST output (module docstring)."""
  digits = {
    split: {
      user: len(_digits_only(features['label'])) for user, features in leaf_splits[split].items()
    }
    for split in LEAF_SPLITS
  }
  writers = _digit_writers(digits['train'], digits['test'])
  splits = collections.OrderedDict()
  for split in LEAF_SPLITS:
    clients = leaf_splits[split]
    splits[f'digits_only_{split}'] = collections.OrderedDict(
      (
        user,
        collections.OrderedDict(
          (k, v[_digits_only(clients[user]['label'])]) for k, v in clients[user].items()
        ),
      )
      for user in writers
    )
  for split in LEAF_SPLITS:
    splits[f'all_{split}'] = leaf_splits[split]
  return splits


def client_data_from_clients(clients: Clients) -> tff.simulation.datasets.ClientData:
  """An in-memory ``ClientData`` of ``{client_id: {feature: array}}`` (ids sorted)."""
  client_ids = sorted(clients)
  if not client_ids:
    raise ValueError('client_data_from_clients needs at least one client.')
  names = list(clients[client_ids[0]])
  features = collections.OrderedDict(
    (name, np.concatenate([np.asarray(clients[c][name]) for c in client_ids])) for name in names
  )
  sizes = [len(clients[c][names[0]]) for c in client_ids]
  return _common.in_memory_client_data(client_ids, features, np.cumsum([0] + sizes))


def femnist_client_data(
  directory: str, only_digits: bool = False
) -> tuple[tff.simulation.datasets.ClientData, tff.simulation.datasets.ClientData]:
  """LEAF FEMNIST as TFF's ``emnist.load_data(only_digits)`` would give it, in memory.

  Args:
    directory: LEAF's FEMNIST folder (``train/``, ``test/``).
    only_digits: Only the digit examples (labels 0-9) of the writers with
      digits in both splits (TFF's ``digits_only_*`` splits, see the module
      docstring); default: all 62 classes.

  Returns:
    ``(train, test)`` ``ClientData`` whose elements are TFF's
    ``OrderedDict(label=int32[], pixels=float32[28, 28])``.
  """
  splits = femnist_splits(read_leaf(directory, 'femnist'))
  prefix = 'digits_only' if _common.check_bool('only_digits', only_digits) else 'all'
  return (
    client_data_from_clients(splits[f'{prefix}_train']),
    client_data_from_clients(splits[f'{prefix}_test']),
  )


# ----------------------------------------------------------------------------
# Play text (Shakespeare).


def read_play_roles(text: str, source: str = 'the play text') -> collections.OrderedDict:
  """``{role: [speech, ...]}`` of text in speaker-block form.

  A block is a role line ending with ``:`` (``ROLE NAME:``) followed by the
  speech's lines; blocks are separated by one or more blank (or whitespace)
  lines. A speech is its lines joined with ``'\\n'``; a role line without
  speech lines adds nothing (such roles are absent). Role names are kept as
  written (stripped of surrounding spaces), roles in order of first speech.

  Args:
    text: The whole text (``\\r\\n`` line ends are accepted).
    source: How errors name the text, e.g. its file name.

  Raises:
    ValueError: If a block does not start with a ``ROLE:`` line, naming the
      line number.
  """
  lines = text.replace('\r\n', '\n').replace('\r', '\n').removeprefix('\ufeff').split('\n')
  roles = collections.OrderedDict()
  block, start = [], 0
  for number, line in enumerate(lines + [''], 1):
    if line.strip():
      if not block:
        start = number
      block.append(line)
      continue
    if not block:
      continue
    head = block[0].strip()
    if not head.endswith(':') or not head[:-1].strip():
      raise ValueError(
        f'{source}: line {start}: expected a role line such as "ROMEO:" to start a speaker '
        f'block, got {_short(head)}; the text must be blocks of a "ROLE:" line and its speech '
        'lines, separated by blank lines.'
      )
    if len(block) > 1:
      roles.setdefault(head[:-1].strip(), []).append('\n'.join(block[1:]))
    block = []
  return roles


def role_client_id(role: str) -> str:
  """The client id of a role: upper case, runs of other than A-Z/0-9 -> ``_``."""
  client_id = re.sub(r'[^A-Z0-9]+', '_', role.upper()).strip('_')
  if not client_id:
    raise ValueError(f'Role {role!r} has no letter A-Z or digit to make its client id; rename it.')
  return client_id


def shakespeare_splits(roles: Mapping[str, Sequence[str]]) -> collections.OrderedDict:
  """TFF's Shakespeare ``train``/``test`` splits of `read_play_roles`'s roles.

  One client per role id (`role_client_id`; roles with the same id are
  merged), one example per speech; a client with ``n >= 2`` speeches puts
  its first ``max(1, floor(0.9 n))`` in ``train`` and the rest in ``test``,
  clients with fewer are dropped (module docstring).

  Returns:
    ``OrderedDict(train={client_id: [speech, ...]}, test={...})``, clients
    sorted by id (both splits hold the same clients).
  """
  merged = collections.OrderedDict()
  for role, speeches in roles.items():
    merged.setdefault(role_client_id(role), []).extend(speeches)
  numerator, denominator = SHAKESPEARE_TRAIN_FRACTION
  train, test = collections.OrderedDict(), collections.OrderedDict()
  for client_id in sorted(merged):
    speeches = merged[client_id]
    if len(speeches) < 2:
      continue
    cut = max(1, numerator * len(speeches) // denominator)
    train[client_id], test[client_id] = list(speeches[:cut]), list(speeches[cut:])
  return collections.OrderedDict(train=train, test=test)


def shakespeare_clients(snippets: Mapping[str, Sequence[str]]) -> collections.OrderedDict:
  """``{client_id: OrderedDict(snippets=object array of UTF-8 bytes)}``."""
  return collections.OrderedDict(
    (
      client_id,
      collections.OrderedDict(
        snippets=np.array(
          [s.encode('utf-8') if isinstance(s, str) else bytes(s) for s in texts], dtype=object
        )
      ),
    )
    for client_id, texts in snippets.items()
  )


# ----------------------------------------------------------------------------
# TFF's SQLite format.


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


def write_tff_database(path: str, splits: Splits, *, overwrite: bool = False) -> DatabaseSummary:
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
  owners = {split: {} for split in LEAF_SPLITS}
  digits = {split: {} for split in LEAF_SPLITS}
  counts = dict.fromkeys(LEAF_SPLITS, 0)
  for split in LEAF_SPLITS:
    _leaf_files(leaf_dir, split)  # Fail fast, before creating any file.
  with _DatabaseWriter(path, overwrite) as writer:
    for split in LEAF_SPLITS:
      for _, user, features in _iter_leaf_split(leaf_dir, split, _femnist_features, owners[split]):
        protos = serialize_examples(features)
        writer.add_rows(f'all_{split}', user, protos)
        writer.add_client(f'all_{split}', user, len(protos))
        kept = _digits_only(features['label'])
        writer.add_rows(f'digits_only_{split}', user, [protos[i] for i in kept])
        digits[split][user] = len(kept)
        counts[split] += len(protos)
    _check_both_splits(leaf_dir, owners)
    writers = _digit_writers(digits['train'], digits['test'])
    dropped = sorted(set(owners['train']) - set(writers))
    summary = DatabaseSummary(path, {})
    for split in LEAF_SPLITS:
      writer.delete_rows(f'digits_only_{split}', dropped)
      for user in writers:
        writer.add_client(f'digits_only_{split}', user, digits[split][user])
      summary.splits[f'digits_only_{split}'] = (
        len(writers),
        sum(digits[split][u] for u in writers),
      )
    for split in LEAF_SPLITS:
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
  roles = read_play_roles(text, source=text_path)
  if not roles:
    raise ValueError(
      f'{text_path}: no speaker blocks ("ROLE:" line, speech lines, blank line) found.'
    )
  splits = shakespeare_splits(roles)
  clients = {role_client_id(role) for role in roles}
  if not splits['train']:
    raise ValueError(
      f'{text_path}: no role has two speeches, so no client can have a train and a test example.'
    )
  summary = write_tff_database(
    path,
    collections.OrderedDict(
      (split, shakespeare_clients(snippets)) for split, snippets in splits.items()
    ),
    overwrite=overwrite,
  )
  summary.notes.append(
    f'{len(roles):,} roles in the text ({len(clients):,} client ids); '
    f'{len(clients) - len(splits["train"]):,} with fewer than two speeches left out.'
  )
  return summary
