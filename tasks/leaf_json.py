"""LEAF's JSON (FEMNIST, Synthetic) read into client data: ``<dir>/{train,test}/*.json``, each
``{"users", "num_samples", "user_data"}``; every value checked, a problem one ``ValueError``
line naming the file, the user and the fix (docs/data.md)."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
import glob
import json
import math
import os

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


_FEMNIST_PIXELS = FEMNIST_IMAGE_SHAPE[0] * FEMNIST_IMAGE_SHAPE[1]


_LEAF_FIX = "re-create it with LEAF's preprocessing, or remove that user"


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
        f'{path}: user {user!r}: example {i} of "x" is {shorten(row)}, not a list of '
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
          f'{shorten(value)}, not a number; {_LEAF_FIX}.'
        )
  raise ValueError(
    f'{path}: user {user!r}: "x" is not a list of equally long lists of numbers; {_LEAF_FIX}.'
  )


def shorten(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + '...'


def _labels(path: str, user: str, y: list, maximum: int) -> np.ndarray:
  """``y`` as int64[n] in ``[0, maximum]``, else a ValueError."""
  for i, value in enumerate(y):
    if isinstance(value, bool) or not isinstance(value, int):
      raise ValueError(
        f'{path}: user {user!r}: label {i} of "y" is {shorten(value)}, not an integer; {_LEAF_FIX}.'
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
