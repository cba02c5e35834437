"""Tests of `tasks.leaf_json`, `tasks.leaf_plays`, `tasks.tff_sqlite` and `bin.convert_leaf`.

Small LEAF directories and play texts written here check the readers value by
value, every validation error, and the databases through TFF's own loaders
(``tff.simulation.datasets.emnist/shakespeare.load_data``) as the oracle. The
real data (a LEAF FEMNIST slice of 105 writers and the Tiny Shakespeare text)
is read from ``../shared/data/`` beside the project when it is there (CI);
those tests skip otherwise, saying so.
"""

import collections
import copy
import json
import os
import re
import sqlite3
import tarfile

import fault_harness
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tff_sqlite_fixtures

from bin import convert_leaf
from tasks import emnist
from tasks import get_task
from tasks import leaf_json
from tasks import leaf_plays
from tasks import shakespeare
from tasks import tff_sqlite

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared', 'data')
FEMNIST_SLICE = os.path.join(SHARED_DATA, 'femnist_leaf_slice.tar.gz')
TINY_SHAKESPEARE = os.path.join(SHARED_DATA, 'tinyshakespeare.txt')

# ---------------------------------------------------------------------------
# A small LEAF FEMNIST directory: split -> file -> [(user, labels)], in file order.
FEMNIST = {
  'train': {
    'a_train.json': [('f0001_11', [0, 35, 61]), ('f0000_00', [10, 7])],
    'b_train.json': [('f0002_22', [12, 40])],
  },
  'test': {
    'a_test.json': [('f0000_00', [3]), ('f0001_11', [9, 20])],
    'b_test.json': [('f0002_22', [5])],
  },
}
# f0002_22 has no digit in train, so the digits-only splits leave it out.
DIGIT_WRITERS = ['f0000_00', 'f0001_11']


def _pixels(example: int) -> list[float]:
  """Background 1.0; pixel `example` is 0.0 and pixel `example + 100` is 5/255."""
  x = [1.0] * 784
  x[example] = 0.0
  x[example + 100] = 5 / 255
  return x


def _femnist_json() -> dict:
  """File name -> LEAF JSON object of `FEMNIST`; example ids count up in file order."""
  files, example = {}, 0
  for split, split_files in FEMNIST.items():
    for name, users in split_files.items():
      data = {'users': [], 'num_samples': [], 'user_data': {}}
      for user, labels in users:
        data['users'].append(user)
        data['num_samples'].append(len(labels))
        data['user_data'][user] = {
          'x': [_pixels(example + i) for i in range(len(labels))],
          'y': list(labels),
        }
        example += len(labels)
      files[f'{split}/{name}'] = data
  # LEAF's split leaves an empty entry for every user it drops; it must be ignored.
  files['train/b_train.json']['user_data']['f0009_99'] = {'x': [], 'y': []}
  return files


def _expected_examples() -> dict:
  """split -> user -> (labels, example ids), from `FEMNIST` alone."""
  expected, example = {'train': {}, 'test': {}}, 0
  for split, split_files in FEMNIST.items():
    for users in split_files.values():
      for user, labels in users:
        expected[split][user] = (labels, list(range(example, example + len(labels))))
        example += len(labels)
  return expected


def _expected_pixels(example: int) -> np.ndarray:
  return np.float32(_pixels(example)).reshape(28, 28)


def _write_json_dir(root, files: dict) -> str:
  for name, data in files.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(data if isinstance(data, str) else json.dumps(data))
  return str(root)


@pytest.fixture
def femnist_dir(tmp_path):
  return _write_json_dir(tmp_path / 'femnist', _femnist_json())


@pytest.fixture(scope='module')
def femnist_cache(tmp_path_factory):
  """The small FEMNIST directory and its ``emnist_all.sqlite`` (written once)."""
  root = tmp_path_factory.mktemp('leaf')
  directory = _write_json_dir(root / 'femnist', _femnist_json())
  cache_dir = str(root / 'cache')
  summary = tff_sqlite.write_emnist_database(directory, cache_dir)
  return directory, cache_dir, summary


# ---------------------------------------------------------------------------
# Reading LEAF FEMNIST.


def test_read_leaf_femnist(femnist_dir):
  splits = leaf_json.read_leaf(femnist_dir)
  expected = _expected_examples()
  assert list(splits) == ['train', 'test']
  for split in ('train', 'test'):
    assert list(splits[split]) == ['f0000_00', 'f0001_11', 'f0002_22']  # Sorted; f0009_99 ignored.
    for user, (labels, examples) in expected[split].items():
      features = splits[split][user]
      assert list(features) == ['label', 'pixels']
      assert features['label'].dtype == np.int32 and features['pixels'].dtype == np.float32
      np.testing.assert_array_equal(features['label'], labels)
      np.testing.assert_array_equal(
        features['pixels'], np.stack([_expected_pixels(e) for e in examples])
      )
  # Row-major 28x28: example 0 of f0001_11 is example id 0 -> pixel (0, 0) is 0.0 and pixel
  # 100 = (3, 16) is 5/255 as float32.
  first = splits['train']['f0001_11']['pixels'][0]
  assert first[0, 0] == 0.0 and first[3, 16] == np.float32(5 / 255) and first[0, 1] == 1.0


def test_femnist_client_data_has_tffs_element_spec(femnist_dir, femnist_cache):
  train, test = leaf_json.femnist_client_data(femnist_dir)
  tff_train, _ = tff.simulation.datasets.emnist.load_data(
    only_digits=False, cache_dir=femnist_cache[1]
  )
  assert train.element_type_structure == tff_train.element_type_structure
  assert train.element_type_structure == leaf_json.FEMNIST_ELEMENT_SPEC
  assert (
    test.element_type_structure
    == tff.simulation.datasets.emnist.get_synthetic().element_type_structure
  )
  assert train.client_ids == test.client_ids == ['f0000_00', 'f0001_11', 'f0002_22']
  elements = list(train.create_tf_dataset_for_client('f0000_00').as_numpy_iterator())
  assert [int(e['label']) for e in elements] == [10, 7]
  np.testing.assert_array_equal(elements[1]['pixels'], _expected_pixels(4))
  digits_train, digits_test = leaf_json.femnist_client_data(femnist_dir, only_digits=True)
  assert digits_train.client_ids == digits_test.client_ids == DIGIT_WRITERS
  assert [int(e['label']) for e in digits_train.create_tf_dataset_for_client('f0001_11')] == [0]


def test_read_leaf_synthetic(tmp_path):
  files = {
    'train/s_train.json': {
      'users': ['u1', 'u0'],
      'num_samples': [2, 1],
      'user_data': {
        'u1': {'x': [[0.5, -1.0, 2.0], [0.0, 0.0, 1e3]], 'y': [4, 0]},
        'u0': {'x': [[1.0, 2.0, 3.0]], 'y': [9]},
      },
    },
    'test/s_test.json': {
      'users': ['u0', 'u1'],
      'num_samples': [1, 1],
      'user_data': {
        'u0': {'x': [[-2.5, 0.0, 0.0]], 'y': [1]},
        'u1': {'x': [[3.0, 3.0, 3.0]], 'y': [2]},
      },
    },
  }
  splits = leaf_json.read_leaf(_write_json_dir(tmp_path, files), 'synthetic')
  assert list(splits['train']) == ['u0', 'u1']
  np.testing.assert_array_equal(splits['train']['u1']['x'], [[0.5, -1.0, 2.0], [0.0, 0.0, 1e3]])
  assert splits['train']['u1']['x'].dtype == np.float32
  np.testing.assert_array_equal(splits['train']['u1']['y'], [4, 0])
  np.testing.assert_array_equal(splits['test']['u0']['x'], [[-2.5, 0.0, 0.0]])
  data = leaf_json.client_data_from_clients(splits['train'])
  assert data.element_type_structure == collections.OrderedDict(
    x=tf.TensorSpec([3], tf.float32), y=tf.TensorSpec([], tf.int32)
  )
  files['test/s_test.json']['user_data']['u1']['x'] = [[3.0, 3.0]]
  with pytest.raises(
    ValueError,
    match=r"s_test\.json: user 'u1': example 0 of \"x\" has 2 "
    r'values, expected 3 features',
  ):
    leaf_json.read_leaf(_write_json_dir(tmp_path / 'bad', files), 'synthetic')


# ---------------------------------------------------------------------------
# Validation: every error is one line naming the file, the user and a fix.


def _set_user(user, x, y, num_samples=None):
  """Adds `user` with examples `x`, `y` (``num_samples``: their number unless given)."""

  def change(data):
    if user not in data['users']:
      data['users'].append(user)
      data['num_samples'].append(0)
      data['user_data'][user] = {'x': [], 'y': []}
    index = data['users'].index(user)
    data['user_data'][user] = {'x': x, 'y': y}
    data['num_samples'][index] = len(x) if num_samples is None else num_samples

  return change


def _set_value(user, example, key, index, value):
  """Sets ``x[example][index]`` or ``y[example]`` of `user`."""

  def change(data):
    if key == 'x':
      data['user_data'][user]['x'][example][index] = value
    else:
      data['user_data'][user]['y'][example] = value

  return change


def _remove_user(user):
  def change(data):
    index = data['users'].index(user)
    del data['users'][index], data['num_samples'][index]
    del data['user_data'][user]

  return change


def _short_row(data):
  data['user_data']['f0001_11']['x'][1] = data['user_data']['f0001_11']['x'][1][:783]


def _drop_y(data):
  data['user_data']['f0001_11']['y'].pop()


def _delete_key(key):
  def change(data):
    del data[key]

  return change


A, B = 'train/a_train.json', 'train/b_train.json'
VALIDATION_CASES = {
  'malformed JSON': (
    A,
    '{"users": ["f0001_11"], "num_samples": [3',
    (r'a_train\.json: not valid JSON \(Expecting .* at line 1 column \d+\); re-create'),
  ),
  'not an object': (A, '[1, 2]', r"a_train\.json: the JSON is a list, not LEAF's object"),
  'missing key': (
    A,
    _delete_key('num_samples'),
    r"a_train\.json: no key 'num_samples'; LEAF's files hold",
  ),
  'num_samples mismatch': (
    A,
    lambda d: d['num_samples'].__setitem__(0, 5),
    (
      r"a_train\.json: user 'f0001_11': num_samples is 5 but \"x\" has 3 and \"y\" 3 "
      r'examples; they must agree'
    ),
  ),
  'x and y lengths differ': (
    A,
    _drop_y,
    (r"a_train\.json: user 'f0001_11': num_samples is 3 but \"x\" has 3 and \"y\" 2"),
  ),
  'no user_data entry': (
    A,
    lambda d: d['user_data'].pop('f0000_00'),
    r"a_train\.json: user 'f0000_00' has no entry in \"user_data\"",
  ),
  'user only in train': (
    'test/b_test.json',
    _remove_user('f0002_22'),
    (
      r"b_train\.json: user 'f0002_22' has no test examples \(no file in .*test lists it\).*"
      r'-t sample'
    ),
  ),
  'user only in test': (
    'test/b_test.json',
    _set_user('f0003_33', [_pixels(0)], [1]),
    r"b_test\.json: user 'f0003_33' has no train examples",
  ),
  'user in two train files': (
    B,
    _set_user('f0000_00', [_pixels(0)], [1]),
    (
      r"b_train\.json: user 'f0000_00' is also in .*a_train\.json; a user must be in one "
      r'train file only'
    ),
  ),
  'user listed twice': (
    B,
    lambda d: (d['users'].append('f0002_22'), d['num_samples'].append(2)),
    r"b_train\.json: user 'f0002_22' is listed twice",
  ),
  'wrong example length': (
    A,
    _short_row,
    (
      r"a_train\.json: user 'f0001_11': example 1 of \"x\" has 783 values, expected 784 "
      r'pixel values \(28x28 FEMNIST\)'
    ),
  ),
  'pixel above 1': (
    A,
    _set_value('f0000_00', 1, 'x', 7, 1.5),
    (
      r"a_train\.json: user 'f0000_00': example 1 has pixel 7 = 1\.5, outside \[0, 1\]; "
      r"LEAF's FEMNIST pixels are in \[0, 1\] with background 1\.0"
    ),
  ),
  'pixels 0..255': (
    B,
    _set_value('f0002_22', 0, 'x', 3, 255),
    r"b_train\.json: user 'f0002_22': example 0 has pixel 3 = 255\.0, .*"
    r'divided by 255',
  ),
  'negative pixel': (
    A,
    _set_value('f0001_11', 2, 'x', 0, -0.5),
    r"user 'f0001_11': example 2 has pixel 0 = -0\.5, outside \[0, 1\]",
  ),
  'NaN pixel': (
    A,
    _set_value('f0001_11', 0, 'x', 9, float('nan')),
    (r"a_train\.json: user 'f0001_11': example 0 has pixel 9 = nan, not a finite number"),
  ),
  'string pixel': (
    A,
    _set_value('f0001_11', 0, 'x', 5, 'a'),
    (r"a_train\.json: user 'f0001_11': example 0 of \"x\" has value 5 = 'a', not a number"),
  ),
  'label 62': (
    A,
    _set_value('f0001_11', 2, 'y', None, 62),
    (
      r"a_train\.json: user 'f0001_11': example 2 has label 62, outside 0\.\.61 \(FEMNIST: "
      r'62 classes'
    ),
  ),
  'negative label': (
    'test/a_test.json',
    _set_value('f0000_00', 0, 'y', None, -1),
    r"a_test\.json: user 'f0000_00': example 0 has label -1, outside 0\.\.61",
  ),
  'float label': (
    A,
    _set_value('f0000_00', 0, 'y', None, 3.0),
    r"a_train\.json: user 'f0000_00': label 0 of \"y\" is 3\.0, not an integer",
  ),
  'user without examples': (
    B,
    _set_user('f0004_44', [], [], 0),
    r"b_train\.json: user 'f0004_44' has no examples",
  ),
  'quote in user id': (
    B,
    _set_user("f'5", [_pixels(0)], [1]),
    r"b_train\.json: user \"f'5\": a client id cannot contain a single quote",
  ),
}


@pytest.mark.parametrize('case', list(VALIDATION_CASES))
def test_leaf_validation_errors(tmp_path, case):
  name, change, pattern = VALIDATION_CASES[case]
  files = _femnist_json()
  if isinstance(change, str):
    files[name] = change
  else:
    files[name] = copy.deepcopy(files[name])
    change(files[name])
  directory = _write_json_dir(tmp_path / 'femnist', files)
  with pytest.raises(ValueError) as error:
    leaf_json.read_leaf(directory)
  message = str(error.value)
  assert '\n' not in message
  assert re.search(pattern, message), (pattern, message)
  # The database writer stops with the same error and leaves nothing behind.
  cache_dir = tmp_path / 'cache'
  with pytest.raises(ValueError) as error:
    tff_sqlite.write_emnist_database(directory, str(cache_dir))
  assert str(error.value) == message
  assert not cache_dir.exists() or os.listdir(cache_dir) == []


@pytest.mark.parametrize(
  'layout, pattern',
  [
    ({}, r"LEAF directory '.*femnist' has no train/ folder"),
    ({'train/x.json': '{}'}, r"LEAF directory '.*femnist' has no test/ folder"),
    ({'train/notes.txt': 'x', 'test/x.json': '{}'}, r"'.*femnist/train' holds no \*\.json files"),
  ],
)
def test_leaf_directory_errors(tmp_path, layout, pattern):
  directory = tmp_path / 'femnist'
  directory.mkdir()
  _write_json_dir(directory, layout)
  with pytest.raises(ValueError, match=pattern):
    leaf_json.read_leaf(str(directory))
  with pytest.raises(ValueError, match=r"LEAF directory '.*missing' does not exist"):
    leaf_json.read_leaf(str(tmp_path / 'missing'))


# ---------------------------------------------------------------------------
# TFF's emnist_all.sqlite, read by TFF's own loader.


def test_tff_emnist_loader_reads_converted_femnist(femnist_cache):
  _, cache_dir, summary = femnist_cache
  assert summary.splits == {
    'digits_only_train': (2, 2),
    'digits_only_test': (2, 2),
    'all_train': (3, 7),
    'all_test': (3, 4),
  }
  assert summary.notes == [
    'digits_only_*: 1 writer(s) without a digit in both splits left out (e.g. f0002_22).'
  ]
  expected = _expected_examples()
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=cache_dir)
  for split, data in (('train', train), ('test', test)):
    assert data.client_ids == ['f0000_00', 'f0001_11', 'f0002_22']
    for user, (labels, examples) in expected[split].items():
      elements = list(data.create_tf_dataset_for_client(user).as_numpy_iterator())
      assert [int(e['label']) for e in elements] == labels  # In file order.
      for element, example in zip(elements, examples):
        np.testing.assert_array_equal(element['pixels'], _expected_pixels(example))
  digits_train, digits_test = tff.simulation.datasets.emnist.load_data(
    only_digits=True, cache_dir=cache_dir
  )
  assert digits_train.client_ids == digits_test.client_ids == DIGIT_WRITERS
  labels = lambda data, user: [int(e['label']) for e in data.create_tf_dataset_for_client(user)]
  assert labels(digits_train, 'f0000_00') == [7] and labels(digits_test, 'f0000_00') == [3]
  assert labels(digits_train, 'f0001_11') == [0] and labels(digits_test, 'f0001_11') == [9]
  element = next(iter(digits_train.create_tf_dataset_for_client('f0000_00')))
  np.testing.assert_array_equal(element['pixels'], _expected_pixels(4))


@pytest.mark.parametrize(
  'only_digits, client_ids, sizes',
  [(False, ['f0000_00', 'f0001_11', 'f0002_22'], [2, 3, 2]), (True, DIGIT_WRITERS, [1, 1])],
)
def test_emnist_task_reads_converted_femnist(femnist_cache, only_digits, client_ids, sizes):
  task = get_task(
    'emnist', cache_dir=femnist_cache[1], only_digits=only_digits, max_eval_examples=None
  )
  assert task.client_ids == tuple(client_ids)
  np.testing.assert_array_equal(task.client_num_examples, sizes)
  if not only_digits:
    np.testing.assert_array_equal(np.flatnonzero(task.client_label_histograms[1]), [0, 35, 61])
  batch = next(iter(task.client_dataset(0, 0)))
  assert task.keras_model_fn(0)(batch['x']).shape == (len(batch['y']), task.num_classes)


def test_database_writers_refuse_to_overwrite(femnist_dir, tmp_path):
  cache_dir = str(tmp_path / 'cache')
  summary = tff_sqlite.write_emnist_database(femnist_dir, cache_dir)
  assert tuple(summary.splits) == tff_sqlite.EMNIST_SPLIT_NAMES
  path = os.path.join(cache_dir, emnist.DATABASE_FILE)
  assert tff_sqlite.EMNIST_DATABASE_FILE == emnist.DATABASE_FILE == 'emnist_all.sqlite'
  assert tff_sqlite.SHAKESPEARE_DATABASE_FILE == shakespeare.DATABASE_FILE
  before = (tmp_path / 'cache' / 'emnist_all.sqlite').read_bytes()
  with pytest.raises(FileExistsError) as error:
    tff_sqlite.write_emnist_database(femnist_dir, cache_dir)
  assert str(error.value) == (
    f'{path} already exists; delete or move it first, or pass '
    'overwrite=True (bin.convert_leaf: --overwrite) to replace it.'
  )
  # A failing overwrite keeps the old file and leaves no temporary file.
  bad = _write_json_dir(tmp_path / 'bad', {**_femnist_json(), 'test/b_test.json': '{'})
  with pytest.raises(ValueError, match='not valid JSON'):
    tff_sqlite.write_emnist_database(bad, cache_dir, overwrite=True)
  assert os.listdir(cache_dir) == ['emnist_all.sqlite']
  assert (tmp_path / 'cache' / 'emnist_all.sqlite').read_bytes() == before
  # overwrite=True replaces it.
  files = _femnist_json()
  files['test/b_test.json']['user_data']['f0002_22']['y'] = [6]
  other = _write_json_dir(tmp_path / 'other', files)
  tff_sqlite.write_emnist_database(other, cache_dir, overwrite=True)
  _, test = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=cache_dir)
  assert [int(e['label']) for e in test.create_tf_dataset_for_client('f0002_22')] == [6]
  assert os.listdir(cache_dir) == ['emnist_all.sqlite']
  assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def test_nothing_appears_under_the_final_name_before_the_rename(femnist_dir, tmp_path, monkeypatch):
  cache_dir = tmp_path / 'cache'
  seen = []

  def interrupted_replace(source, destination):
    seen.append((os.path.basename(source), sorted(os.listdir(cache_dir))))
    raise KeyboardInterrupt

  monkeypatch.setattr(tff_sqlite.os, 'replace', interrupted_replace)
  with pytest.raises(KeyboardInterrupt):
    tff_sqlite.write_emnist_database(femnist_dir, str(cache_dir))
  monkeypatch.undo()
  [(temporary, listing)] = seen
  assert re.fullmatch(r'\.emnist_all\.sqlite\.\w+\.partial', temporary)
  assert listing == [temporary]  # Complete, but only under the temporary name.
  assert os.listdir(cache_dir) == []  # And removed when the rename fails.


def test_write_tff_database_encodes_as_tffs_writer(tmp_path):
  """Row for row, the same tf.train.Example messages as save_to_sql_client_data."""
  rng = np.random.default_rng(3)
  clients = tff_sqlite_fixtures.cifar_clients(rng, {'0': 2, '1': 3})
  for client in clients.values():
    client['note'] = np.array(
      [b'caf\xc3\xa9', b''] + [b'x'] * (len(client['label']) - 2), dtype=object
    )
  ours = str(tmp_path / 'ours.sqlite')
  summary = tff_sqlite.write_tff_database(ours, {'train': clients})
  assert summary.splits == {'train': (2, 5)}
  theirs = str(tmp_path / 'theirs.sqlite')
  tff.simulation.datasets.save_to_sql_client_data(
    list(clients),
    lambda c: tf.data.Dataset.from_tensor_slices(clients[c]),
    theirs,
    split_names_by_client_id=dict.fromkeys(clients, 'train'),
  )

  def rows(path):
    with sqlite3.connect(path) as connection:
      return [
        (split, client, tf.train.Example.FromString(proto))
        for split, client, proto in connection.execute(
          'SELECT split_name, client_id, serialized_example_proto FROM examples ORDER BY rowid;'
        )
      ], sorted(connection.execute('SELECT * FROM client_metadata;'))

  assert rows(ours) == rows(theirs)
  assert tff_sqlite_fixtures.write_tff_database is tff_sqlite.write_tff_database


def test_write_tff_database_rejects_mixed_features(tmp_path):
  clients = {'a': {'label': np.zeros(2, np.int32)}, 'b': {'label': np.zeros(2, np.float32)}}
  with pytest.raises(
    ValueError,
    match=r"Split 'train', client 'b': features .* differ from "
    r"those of client 'a'",
  ):
    tff_sqlite.write_tff_database(str(tmp_path / 'x.sqlite'), {'train': clients})
  assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------
# Play text -> Shakespeare.

PLAY = """ROMEO:
But soft! what light
through yonder window breaks?

JULIET:
Ay me!

Nurse:
Madam!

ROMEO:
She speaks.
\t

JULIET:
O Romeo, Romeo!
wherefore art thou Romeo?

First Watchman:

NURSE:
Anon!

ROMEO:
Third.

Tybalt:
Alone.
"""
PLAY_ROLES = collections.OrderedDict(
  [
    ('ROMEO', ['But soft! what light\nthrough yonder window breaks?', 'She speaks.', 'Third.']),
    ('JULIET', ['Ay me!', 'O Romeo, Romeo!\nwherefore art thou Romeo?']),
    ('Nurse', ['Madam!']),
    ('NURSE', ['Anon!']),
    ('Tybalt', ['Alone.']),
  ]
)


def test_read_play_roles():
  assert leaf_plays.read_play_roles(PLAY) == PLAY_ROLES  # 'First Watchman' has no speech.
  assert leaf_plays.read_play_roles(PLAY.replace('\n', '\r\n')) == PLAY_ROLES
  assert leaf_plays.read_play_roles('\n\n' + PLAY + '\n\n\n') == PLAY_ROLES
  assert leaf_plays.read_play_roles('') == {}


@pytest.mark.parametrize(
  'text, pattern',
  [
    (
      'Hello there\nfriend\n',
      r'play\.txt: line 1: expected a role line such as "ROMEO:" to start '
      r"a speaker block, got 'Hello there'",
    ),
    ('A:\nx\n\n\nno colon\nhere\n', r"play\.txt: line 5: .*got 'no colon'"),
    ('A:\nx\n\n :\ny\n', r"play\.txt: line 4: .*got ':'"),
  ],
)
def test_read_play_roles_errors(text, pattern):
  with pytest.raises(ValueError, match=pattern) as error:
    leaf_plays.read_play_roles(text, source='play.txt')
  assert '\n' not in str(error.value)


def test_shakespeare_splits():
  splits = leaf_plays.shakespeare_splits(PLAY_ROLES)
  # Nurse and NURSE are one client; Tybalt (one speech) is dropped.
  assert splits == collections.OrderedDict(
    train={
      'JULIET': ['Ay me!'],
      'NURSE': ['Madam!'],
      'ROMEO': ['But soft! what light\nthrough yonder window breaks?', 'She speaks.'],
    },
    test={
      'JULIET': ['O Romeo, Romeo!\nwherefore art thou Romeo?'],
      'NURSE': ['Anon!'],
      'ROMEO': ['Third.'],
    },
  )
  assert list(splits['train']) == ['JULIET', 'NURSE', 'ROMEO']
  assert [
    leaf_plays.role_client_id(r)
    for r in (
      'First Citizen',
      'Senators, &C',
      'LADY  CAPULET',
      'ALL SERVING-MEN',
      'Ghost of King Henry VI',
    )
  ] == ['FIRST_CITIZEN', 'SENATORS_C', 'LADY_CAPULET', 'ALL_SERVING_MEN', 'GHOST_OF_KING_HENRY_VI']
  with pytest.raises(ValueError, match=r"Role '\?\?\?' has no letter A-Z or digit"):
    leaf_plays.shakespeare_splits({'???': ['a', 'b']})


@pytest.mark.parametrize(
  'speeches, train',
  [(2, 1), (3, 2), (4, 3), (9, 8), (10, 9), (11, 9), (19, 17), (20, 18), (21, 18)],
)
def test_shakespeare_split_sizes(speeches, train):
  splits = leaf_plays.shakespeare_splits({'A': [str(i) for i in range(speeches)]})
  assert splits['train']['A'] == [str(i) for i in range(train)]  # The first ones.
  assert splits['test']['A'] == [str(i) for i in range(train, speeches)]


@pytest.fixture(scope='module')
def shakespeare_cache(tmp_path_factory):
  root = tmp_path_factory.mktemp('play')
  text = root / 'play.txt'
  text.write_text(PLAY)
  summary = tff_sqlite.write_shakespeare_database(str(text), str(root / 'cache'))
  return str(root / 'cache'), summary


def test_tff_shakespeare_loader_reads_converted_play(shakespeare_cache):
  cache_dir, summary = shakespeare_cache
  assert summary.splits == {'train': (3, 4), 'test': (3, 3)}
  assert summary.notes == [
    '5 roles in the text (4 client ids); 1 with fewer than two speeches left out.'
  ]
  train, test = tff.simulation.datasets.shakespeare.load_data(cache_dir=cache_dir)
  assert train.client_ids == test.client_ids == ['JULIET', 'NURSE', 'ROMEO']
  snippets = lambda data, c: [
    e['snippets'] for e in data.create_tf_dataset_for_client(c).as_numpy_iterator()
  ]
  assert snippets(train, 'ROMEO') == [
    b'But soft! what light\nthrough yonder window breaks?',
    b'She speaks.',
  ]
  assert snippets(test, 'ROMEO') == [b'Third.']
  assert snippets(test, 'NURSE') == [b'Anon!']
  assert train.element_type_structure == leaf_plays.SHAKESPEARE_ELEMENT_SPEC
  task = get_task('shakespeare', cache_dir=cache_dir)
  assert task.client_ids == ('JULIET', 'NURSE', 'ROMEO')


def test_write_shakespeare_database_errors(tmp_path):
  text = tmp_path / 'play.txt'
  text.write_text('A:\nonly one\n\nB:\nalso one\n')
  with pytest.raises(ValueError, match=r'play\.txt: no role has two speeches'):
    tff_sqlite.write_shakespeare_database(str(text), str(tmp_path / 'cache'))
  text.write_bytes(b'A:\n\xff\xfe\n')
  with pytest.raises(ValueError, match=r'play\.txt: not UTF-8 text'):
    tff_sqlite.write_shakespeare_database(str(text), str(tmp_path / 'cache'))
  with pytest.raises(ValueError, match=r"Cannot read the play text '.*missing\.txt'"):
    tff_sqlite.write_shakespeare_database(str(tmp_path / 'missing.txt'), str(tmp_path / 'cache'))
  assert not (tmp_path / 'cache').exists()


# ---------------------------------------------------------------------------
# bin.convert_leaf.


def test_convert_leaf_binary(femnist_dir, tmp_path, capsys):
  text = tmp_path / 'play.txt'
  text.write_text(PLAY)
  cache_dir = tmp_path / 'cache'
  outcome = fault_harness.run_main(
    convert_leaf.main, femnist_leaf_dir=femnist_dir, play_text=str(text), cache_dir=str(cache_dir)
  )
  assert outcome.exit_code == 0, outcome
  out = capsys.readouterr().out
  assert f'Wrote {cache_dir}/emnist_all.sqlite:\n' in out
  assert '  all_train: 3 clients, 7 examples\n' in out
  assert '  digits_only_test: 2 clients, 2 examples\n' in out
  assert f'Wrote {cache_dir}/shakespeare.sqlite:\n  train: 3 clients, 4 examples\n' in out
  assert f'python -m bin.fedavg --task=shakespeare --cache_dir={cache_dir}' in out
  assert sorted(os.listdir(cache_dir)) == ['emnist_all.sqlite', 'shakespeare.sqlite']
  # Again: refused before any work, then allowed with --overwrite.
  fault_harness.assert_one_line_error(
    fault_harness.run_main(convert_leaf.main, play_text=str(text), cache_dir=str(cache_dir)),
    r'^Error: .*shakespeare\.sqlite already exists; .*--overwrite',
  )
  outcome = fault_harness.run_main(
    convert_leaf.main, play_text=str(text), cache_dir=str(cache_dir), overwrite='true'
  )
  assert outcome.exit_code == 0, outcome


@pytest.mark.parametrize(
  'flag_values, pattern',
  [
    ({}, r'^Error: nothing to convert; give --femnist_leaf_dir=DIR'),
    ({'play_text': 'x.txt'}, r'^Error: --cache_dir is required'),
    (
      {'femnist_leaf_dir': 'BAD'},
      r"^Error: .*a_train\.json: user 'f0001_11': example 2 has "
      r'label 62, outside 0\.\.61',
    ),
  ],
)
def test_convert_leaf_binary_errors(tmp_path, flag_values, pattern):
  files = _femnist_json()
  files[A]['user_data']['f0001_11']['y'][2] = 62
  bad = _write_json_dir(tmp_path / 'bad', files)
  flag_values = {k: (bad if v == 'BAD' else v) for k, v in flag_values.items()}
  if 'femnist_leaf_dir' in flag_values:
    flag_values['cache_dir'] = str(tmp_path / 'cache')
  fault_harness.assert_one_line_error(
    fault_harness.run_main(convert_leaf.main, **flag_values), pattern
  )
  assert not (tmp_path / 'cache').exists() or os.listdir(tmp_path / 'cache') == []


def test_convert_leaf_binary_reports_what_it_wrote_before_an_error(femnist_dir, tmp_path, capsys):
  text = tmp_path / 'play.txt'
  text.write_text('A:\nx\n\nno role line\n')
  cache_dir = tmp_path / 'cache'
  outcome = fault_harness.run_main(
    convert_leaf.main, femnist_leaf_dir=femnist_dir, play_text=str(text), cache_dir=str(cache_dir)
  )
  fault_harness.assert_one_line_error(
    outcome, r'^Error: .*play\.txt: line 4: expected a role line such as "ROMEO:"'
  )
  assert f'Wrote {cache_dir}/emnist_all.sqlite:\n' in capsys.readouterr().out
  assert os.listdir(cache_dir) == ['emnist_all.sqlite']


# ---------------------------------------------------------------------------
# The real data (beside the project in CI; skipped elsewhere).


@pytest.fixture(scope='session')
def real_femnist_dir(tmp_path_factory):
  if not os.path.exists(FEMNIST_SLICE):
    pytest.skip(
      'needs the real LEAF FEMNIST slice ../shared/data/femnist_leaf_slice.tar.gz '
      '(present in CI and on development machines)'
    )
  directory = tmp_path_factory.mktemp('femnist_leaf_slice')
  with tarfile.open(FEMNIST_SLICE) as archive:
    archive.extractall(directory, filter='data')
  return str(directory)


@pytest.fixture(scope='session')
def real_femnist_json(real_femnist_dir):
  """split -> user -> (file, labels), straight from the JSON (the independent oracle)."""
  users = {'train': {}, 'test': {}}
  for split in users:
    for name in sorted(os.listdir(os.path.join(real_femnist_dir, split))):
      path = os.path.join(real_femnist_dir, split, name)
      with open(path) as f:
        data = json.load(f)
      for user, count in zip(data['users'], data['num_samples']):
        assert len(data['user_data'][user]['y']) == count
        users[split][user] = (path, data['user_data'][user]['y'])
  return users


@pytest.fixture(scope='session')
def real_emnist_cache(real_femnist_dir, tmp_path_factory):
  cache_dir = str(tmp_path_factory.mktemp('real_cache'))
  return cache_dir, tff_sqlite.write_emnist_database(real_femnist_dir, cache_dir)


def test_real_femnist_slice_counts(real_femnist_dir, real_femnist_json):
  splits = leaf_json.read_leaf(real_femnist_dir)
  for split, examples in (('train', 14_708), ('test', 1_685)):
    assert len(splits[split]) == 105
    assert sum(len(c['label']) for c in splits[split].values()) == examples
    assert {u: len(c['label']) for u, c in splits[split].items()} == {
      u: len(labels) for u, (_, labels) in real_femnist_json[split].items()
    }
  labels = np.concatenate([c['label'] for c in splits['train'].values()])
  assert labels.min() == 0 and labels.max() == 61
  assert client_spec(splits['train']) == leaf_json.FEMNIST_ELEMENT_SPEC


def client_spec(clients):
  return leaf_json.client_data_from_clients(clients).element_type_structure


def test_tff_loader_reads_real_femnist(real_emnist_cache, real_femnist_json):
  cache_dir, summary = real_emnist_cache
  expected_digits = {
    split: {u: sum(1 for y in labels if y < 10) for u, (_, labels) in users.items()}
    for split, users in real_femnist_json.items()
  }
  writers = [
    u
    for u in sorted(real_femnist_json['train'])
    if expected_digits['train'][u] and expected_digits['test'][u]
  ]
  assert summary.splits == {
    'digits_only_train': (len(writers), sum(expected_digits['train'][u] for u in writers)),
    'digits_only_test': (len(writers), sum(expected_digits['test'][u] for u in writers)),
    'all_train': (105, 14_708),
    'all_test': (105, 1_685),
  }
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=cache_dir)
  assert train.client_ids == test.client_ids == sorted(real_femnist_json['train'])
  assert train.element_type_structure == leaf_json.FEMNIST_ELEMENT_SPEC
  # Every client's example count and labels, read through TFF's loader.
  with sqlite3.connect(os.path.join(cache_dir, 'emnist_all.sqlite')) as connection:
    counts = dict(
      connection.execute(
        "SELECT client_id, COUNT(*) FROM examples WHERE split_name = 'all_test' GROUP BY client_id;"
      )
    )
  assert counts == {u: len(labels) for u, (_, labels) in real_femnist_json['test'].items()}
  for user in train.client_ids[::20]:
    labels = [int(e['label']) for e in train.create_tf_dataset_for_client(user)]
    assert labels == real_femnist_json['train'][user][1]
  # One example's values, against the JSON.
  path, _ = real_femnist_json['test'][test.client_ids[7]]
  with open(path) as f:
    record = json.load(f)['user_data'][test.client_ids[7]]
  element = list(test.create_tf_dataset_for_client(test.client_ids[7]).as_numpy_iterator())[-1]
  assert int(element['label']) == record['y'][-1]
  np.testing.assert_array_equal(element['pixels'], np.float32(record['x'][-1]).reshape(28, 28))
  assert element['pixels'].max() == 1.0  # Background 1.0, as in TFF's emnist.
  digits_train, _ = tff.simulation.datasets.emnist.load_data(only_digits=True, cache_dir=cache_dir)
  assert digits_train.client_ids == writers


@pytest.fixture(scope='session')
def tiny_shakespeare():
  if not os.path.exists(TINY_SHAKESPEARE):
    pytest.skip(
      'needs the real Tiny Shakespeare text ../shared/data/tinyshakespeare.txt '
      '(present in CI and on development machines)'
    )
  with open(TINY_SHAKESPEARE, encoding='utf-8') as f:
    return f.read()


def test_real_tiny_shakespeare(tiny_shakespeare, tmp_path):
  roles = leaf_plays.read_play_roles(tiny_shakespeare)
  assert len(roles) == 299  # Roles as written, with at least one speech.
  assert sum(len(s) for s in roles.values()) == 7_097
  assert round(sum(len(x) for s in roles.values() for x in s) / 1e4) == 102  # 1.02 M characters.
  assert sum(len(s) >= 2 for s in roles.values()) == 247
  # Client ids merge 7 case/spacing variants ('Nurse'/'NURSE', 'LADY  CAPULET'): 292 clients,
  # 245 of them with at least two speeches.
  merged = collections.Counter()
  for role, speeches in roles.items():
    merged[leaf_plays.role_client_id(role)] += len(speeches)
  assert len(merged) == 292
  kept = {client_id: n for client_id, n in merged.items() if n >= 2}
  assert len(kept) == 245
  splits = leaf_plays.shakespeare_splits(roles)
  assert list(splits['train']) == list(splits['test']) == sorted(kept)
  assert {c: len(s) for c, s in splits['train'].items()} == {
    c: max(1, 9 * n // 10) for c, n in kept.items()
  }
  assert {c: len(s) for c, s in splits['test'].items()} == {
    c: n - max(1, 9 * n // 10) for c, n in kept.items()
  }
  assert splits['train']['FIRST_CITIZEN'][0] == 'Before we proceed any further, hear me speak.'
  text = tmp_path / 'tiny.txt'
  text.write_text(tiny_shakespeare)
  summary = tff_sqlite.write_shakespeare_database(str(text), str(tmp_path))
  train_examples = sum(max(1, 9 * n // 10) for n in kept.values())
  assert summary.splits == {
    'train': (245, train_examples),
    'test': (245, sum(kept.values()) - train_examples),
  }
  train, test = tff.simulation.datasets.shakespeare.load_data(cache_dir=str(tmp_path))
  assert train.client_ids == test.client_ids == sorted(splits['train'])
  assert [
    e['snippets'].decode()
    for e in test.create_tf_dataset_for_client('FIRST_CITIZEN').as_numpy_iterator()
  ] == splits['test']['FIRST_CITIZEN']
