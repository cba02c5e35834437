"""Tests of the TFF-backed tasks through TFF's real loaders.

Tiny databases in TFF's own format (``save_to_sql_client_data``) are placed
where ``tff.simulation.datasets.{emnist,shakespeare,cifar100}.load_data``
look for them in a temporary ``cache_dir``; the tasks must load them without
any download, preprocess them to the right element spec, and feed a model.
"""

import collections
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tff_sqlite_fixtures as fixtures

from tasks import digits
from tasks import emnist
from tasks import get_task
from tasks import models
from tasks import shakespeare

EMNIST_DIGITS_TRAIN = {'f0000_14': 5, 'f0001_41': 3, 'f0002_07': 23}
EMNIST_ALL_TRAIN = {'f0000_14': 4, 'f0001_41': 6}
CIFAR_TRAIN = {'0': 4, '1': 6, '2': 12}


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('tff_cache'))
  rng = np.random.default_rng(0)
  splits = collections.OrderedDict(
    digits_only_train=fixtures.emnist_clients(rng, EMNIST_DIGITS_TRAIN, 10),
    digits_only_test=fixtures.emnist_clients(rng, {'f0000_14': 2, 'f0002_07': 3}, 10),
    all_train=fixtures.emnist_clients(rng, EMNIST_ALL_TRAIN, 62),
    all_test=fixtures.emnist_clients(rng, {'f0000_14': 2, 'f0001_41': 3}, 62),
  )
  fixtures.write_tff_database(os.path.join(directory, 'emnist_all.sqlite'), splits)
  fixtures.write_tff_database(
    os.path.join(directory, 'cifar100.sqlite'),
    {
      'train': fixtures.cifar_clients(rng, CIFAR_TRAIN),
      'test': fixtures.cifar_clients(rng, {'0': 3, '1': 4}),
    },
  )
  fixtures.write_tff_database(
    os.path.join(directory, 'shakespeare.sqlite'),
    {
      'train': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TRAIN),
      'test': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TEST),
    },
  )
  return directory


def _labels_of(task, client_id):
  return np.array(
    [
      int(e['label'])
      for e in task.train_data.create_tf_dataset_for_client(client_id).as_numpy_iterator()
    ]
  )


@pytest.mark.parametrize(
  'only_digits, sizes, num_classes',
  [(True, EMNIST_DIGITS_TRAIN, 10), (False, EMNIST_ALL_TRAIN, 62)],
)
def test_emnist_loads_through_tff(cache_dir, only_digits, sizes, num_classes):
  task = get_task('emnist', cache_dir=cache_dir, only_digits=only_digits, max_eval_examples=None)
  assert task.client_ids == tuple(sorted(sizes))
  assert task.num_classes == num_classes
  np.testing.assert_array_equal(task.client_num_examples, [sizes[c] for c in task.client_ids])
  for i, client_id in enumerate(task.client_ids):
    np.testing.assert_array_equal(
      task.client_label_histograms[i],
      np.bincount(_labels_of(task, client_id), minlength=num_classes),
    )
  assert task.element_spec == collections.OrderedDict(
    x=tf.TensorSpec([None, 28, 28, 1], tf.float32), y=tf.TensorSpec([None], tf.int32)
  )
  assert sum(1 for _ in task.eval_data) == 5
  batch = next(iter(task.client_dataset(0, 0)))
  assert task.keras_model_fn(0)(batch['x']).shape == (len(batch['y']), num_classes)
  evaluation = next(iter(task.preprocess_eval(task.eval_data)))
  assert evaluation['x'].shape == (5, 28, 28, 1)


def test_emnist_preprocessing_is_seeded_and_keeps_pixels(cache_dir):
  task = get_task(
    'emnist', cache_dir=cache_dir, client_batch_size=4, client_epochs=2, max_client_examples=10
  )
  client = task.client_ids.index('f0002_07')
  stream = lambda seed: np.concatenate(
    [b['x'] for b in task.client_dataset(client, seed).as_numpy_iterator()]
  )
  first = stream(1)
  np.testing.assert_array_equal(first, stream(1))
  assert not np.array_equal(first, stream(2))
  assert first.shape == (20, 28, 28, 1)  # Capped at 10 per epoch, 2 epochs.
  raw = np.stack(
    [
      e['pixels']
      for e in task.train_data.create_tf_dataset_for_client('f0002_07').as_numpy_iterator()
    ]
  )
  # Every streamed image is one of the client's images, reshaped unchanged.
  for image in first[:, :, :, 0]:
    assert np.any(np.all(raw == image, axis=(1, 2)))
  # Each epoch draws 10 distinct examples (a fresh, seeded subset per epoch).
  for epoch in (first[:10], first[10:]):
    assert len({image.tobytes() for image in epoch}) == 10


@pytest.mark.parametrize('only_digits', [True, False])
def test_a_small_emnist_split_is_held_in_memory_with_tffs_elements(
  cache_dir, monkeypatch, only_digits
):
  tff_train, _ = tff.simulation.datasets.emnist.load_data(
    cache_dir=cache_dir, only_digits=only_digits
  )
  held = get_task('emnist', cache_dir=cache_dir, only_digits=only_digits)
  total = sum((EMNIST_DIGITS_TRAIN if only_digits else EMNIST_ALL_TRAIN).values())
  monkeypatch.setattr(emnist, 'IN_MEMORY_MAX_EXAMPLES', total - 1)  # One example too many.
  read = get_task('emnist', cache_dir=cache_dir, only_digits=only_digits)
  assert type(read.train_data) is type(tff_train)  # TFF's SQL-backed clients.
  assert type(held.train_data) is not type(tff_train)
  assert held.train_data.element_type_structure == tff_train.element_type_structure
  assert held.client_ids == read.client_ids == tuple(tff_train.client_ids)
  for i, client_id in enumerate(tff_train.client_ids):
    expected = list(tff_train.create_tf_dataset_for_client(client_id).as_numpy_iterator())
    got = list(held.train_data.create_tf_dataset_for_client(client_id).as_numpy_iterator())
    assert len(got) == len(expected) > 0
    for e, g in zip(expected, got):  # Same examples, same order.
      assert e['label'] == g['label'] and np.array_equal(e['pixels'], g['pixels'])
    for a, b in zip(
      held.client_dataset(i, 3).as_numpy_iterator(), read.client_dataset(i, 3).as_numpy_iterator()
    ):
      np.testing.assert_array_equal(a['x'], b['x'])
      np.testing.assert_array_equal(a['y'], b['y'])
  np.testing.assert_array_equal(held.client_label_histograms, read.client_label_histograms)


def test_emnist_eval_cap(cache_dir):
  task = get_task('emnist', cache_dir=cache_dir, max_eval_examples=2)
  assert sum(1 for _ in task.eval_data) == 2


def test_shakespeare_statistics_match_tff_pipeline(cache_dir):
  task = get_task('shakespeare', cache_dir=cache_dir)
  assert task.num_classes == 90
  assert task.element_spec == collections.OrderedDict(
    x=tf.TensorSpec([None, 5], tf.int64), y=tf.TensorSpec([None, 5], tf.int64)
  )
  assert task.client_ids == tuple(sorted(fixtures.SHAKESPEARE_TRAIN))
  for i in range(task.num_clients):
    targets = np.concatenate([b['y'] for b in task.client_dataset(i, 0).as_numpy_iterator()])
    assert len(targets) == task.client_num_examples[i]
    np.testing.assert_array_equal(
      np.bincount(targets.ravel(), minlength=90), task.client_label_histograms[i]
    )
  # Out-of-vocabulary bytes ('é' is two bytes, '~' and tab are not in TFF's
  # vocabulary) become the OOV token. Tokens: [bos C a f é é | ~ tab _ o k eos],
  # two sequences of 6; the first token of each ('bos', '~') is no target.
  counts, sequences = shakespeare.snippet_statistics([b'Caf\xc3\xa9~\t ok'], 5)
  assert sequences[0] == 2
  assert counts.sum() == 10
  assert counts[0, shakespeare.OOV] == 3
  assert counts[0, shakespeare.EOS] == 1 and counts[0, shakespeare.BOS] == 0


@pytest.mark.parametrize('model, num_params', [('gru', 835_674), ('tff_lstm', 820_522)])
def test_shakespeare_models_forward(cache_dir, model, num_params):
  task = get_task('shakespeare', cache_dir=cache_dir, model=model)
  batch = next(iter(task.client_dataset(0, 0)))
  keras_model = task.keras_model_fn(0)
  assert keras_model.count_params() == num_params
  assert keras_model(batch['x']).shape == (len(batch['y']), 5, 90)
  metric = task.metrics_fn()[0]
  assert isinstance(metric, tf.keras.metrics.SparseCategoricalAccuracy)
  assert metric.name == 'accuracy'


def test_shakespeare_cap_and_sequence_length(cache_dir):
  task = get_task(
    'shakespeare',
    cache_dir=cache_dir,
    sequence_length=3,
    max_client_examples=4,
    client_epochs=3,
    client_batch_size=5,
  )
  batches = list(task.client_dataset(0, 7).as_numpy_iterator())
  assert sum(len(b['x']) for b in batches) == 12
  assert batches[0]['x'].shape == (5, 3)
  np.testing.assert_array_equal(batches[0]['x'][:, 1:], batches[0]['y'][:, :-1])


def test_cifar100_resnet_and_preprocessing(cache_dir):
  task = get_task('cifar100', cache_dir=cache_dir, max_eval_examples=None)
  assert task.client_ids == ('0', '1', '2')
  np.testing.assert_array_equal(task.client_num_examples, [4, 6, 12])
  for i, client_id in enumerate(task.client_ids):
    np.testing.assert_array_equal(
      task.client_label_histograms[i], np.bincount(_labels_of(task, client_id), minlength=100)
    )
  assert task.element_spec == collections.OrderedDict(
    x=tf.TensorSpec([None, 24, 24, 3], tf.float32), y=tf.TensorSpec([None], tf.int64)
  )
  batch = next(iter(task.client_dataset(2, 0)))
  # TFF's per-image standardisation.
  np.testing.assert_allclose(batch['x'].numpy().mean(axis=(1, 2, 3)), 0.0, atol=1e-4)
  assert sum(1 for _ in task.eval_data) == 7

  # The only ResNet-18 built in the test suite.
  resnet = task.keras_model_fn(0)
  assert resnet.count_params() == 11_227_812
  logits = resnet(batch['x']).numpy()
  assert logits.shape == (len(batch['y']), 100)
  assert not np.allclose(logits.sum(axis=1), 1.0)  # Logits, not TFF's softmax.
  initial = resnet.get_weights()
  models.seed_initial_weights(resnet, 1)
  assert not np.array_equal(initial[0], resnet.get_weights()[0])
  models.seed_initial_weights(resnet, 0)
  for a, b in zip(initial, resnet.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_cifar100_seeded_distortion_and_vgg(cache_dir):
  task = get_task(
    'cifar100',
    cache_dir=cache_dir,
    model='vgg',
    distort_images=True,
    crop_size=20,
    client_batch_size=12,
  )
  first = next(iter(task.client_dataset(2, 3)))['x'].numpy()
  np.testing.assert_array_equal(first, next(iter(task.client_dataset(2, 3)))['x'].numpy())
  assert not np.array_equal(first, next(iter(task.client_dataset(2, 4)))['x'].numpy())
  assert first.shape == (12, 20, 20, 3)
  assert task.keras_model_fn(0)(first).shape == (12, 100)
  evaluation = next(iter(task.preprocess_eval(task.eval_data)))
  assert evaluation['x'].shape[1:] == (20, 20, 3)


@pytest.mark.parametrize(
  'name, file_name',
  [
    ('emnist', 'emnist_all.sqlite'),
    ('shakespeare', 'shakespeare.sqlite'),
    ('cifar100', 'cifar100.sqlite'),
  ],
)
def test_missing_cache_file_is_a_clear_error(tmp_path, name, file_name):
  expected = os.path.join(str(tmp_path), file_name)
  with pytest.raises(FileNotFoundError) as error:
    get_task(name, cache_dir=str(tmp_path))
  message = str(error.value)
  assert expected in message
  assert f'{file_name}.lzma' in message
  assert f'tff.simulation.datasets.{name}.load_data' in message
  assert os.listdir(str(tmp_path)) == []  # Nothing was downloaded or created.


def test_femnist_models_suite_is_two_model_sizes_on_the_same_writers(cache_dir):
  from tasks import multi_model as suites

  cnn, two_nn = suites.create_suite('femnist_models', num_clients=2, cache_dir=cache_dir)
  assert (cnn.name, two_nn.name) == ('emnist', 'emnist')
  assert (cnn.options['model'], two_nn.options['model']) == ('cnn', '2nn')
  assert cnn.num_classes == two_nn.num_classes == 62
  assert cnn.client_ids == two_nn.client_ids and len(cnn.client_ids) == 2
  np.testing.assert_array_equal(cnn.client_num_examples, two_nn.client_num_examples)
  # 784·200 + 200 + 200·200 + 200 + 200·62 + 62 parameters (McMahan et al.'s 2NN).
  sizes = [sum(int(np.prod(w.shape)) for w in t.keras_model_fn(0).weights) for t in (cnn, two_nn)]
  assert sizes == [1_690_046, 209_662]
  with pytest.raises(ValueError, match="Suite 'femnist_models' has 2-2 models"):
    suites.create_suite('femnist_models', num_models=3, num_clients=2, cache_dir=cache_dir)


@pytest.mark.slow
def test_leaf_multi_model_suite_shares_one_population(cache_dir):
  from tasks import multi_model as suites
  from tff_sampling.learning import multi_model
  from tff_sampling.learning import multi_model_types
  from tff_sampling.runtime import tff_context

  tasks = suites.create_suite('leaf', num_clients=2, cache_dir=cache_dir)
  assert [t.name for t in tasks] == ['emnist', 'shakespeare', 'cifar100']
  assert [t.num_clients for t in tasks] == [2, 2, 2]
  with pytest.raises(
    ValueError,
    match=r'task\(s\) emnist \(3\), shakespeare \(3\) have '
    r'fewer; lower --clients to at most 3',
  ):
    suites.create_suite('leaf', num_models=2, num_clients=4, cache_dir=cache_dir)
  # One round of the secure loss-based process over FEMNIST + Shakespeare.
  tasks = tasks[:2]
  tff_context.use_secure_sum_simulation()
  shares = multi_model_types.data_shares(np.stack([t.client_num_examples for t in tasks], axis=1))
  process = multi_model.build_multi_model_process(
    [t.model_fn for t in tasks],
    sampling='optimal_loss_secure',
    expected_clients=2,
    client_learning_rates=0.1,
  )
  state = process.initialize()
  output = process.next(
    state,
    [
      multi_model_types.client_data([t.client_dataset(i, seed=0) for t in tasks], i, shares[i])
      for i in range(2)
    ],
  )
  assert output.measurements['cohort_size'] == 2
  assert output.measurements['uploads'].sum() == 2  # m = N: every client trains one model.
  assert output.measurements['full_participation'] == 1.0


def test_a_cache_path_with_uri_characters_loads(cache_dir, tmp_path):
  # SQLite reads the cache through a URI, where '?', '#' and '%' have meanings.
  odd = tmp_path / 'cache #1?%20'
  odd.mkdir()
  shutil.copy(os.path.join(cache_dir, 'emnist_all.sqlite'), odd / 'emnist_all.sqlite')
  task = get_task('emnist', cache_dir=str(odd), only_digits=True)
  reference = get_task('emnist', cache_dir=cache_dir, only_digits=True)
  assert list(task.client_ids) == list(reference.client_ids)
  np.testing.assert_array_equal(task.client_label_histograms, reference.client_label_histograms)


def _examples(dataset, x='x', y='y'):
  return sorted(
    (np.asarray(e[x]).reshape(-1).tobytes(), int(e[y])) for e in dataset.as_numpy_iterator()
  )


def test_emnist_skewed_redeals_every_real_example_once(cache_dir):
  task = get_task(
    'emnist_skewed',
    cache_dir=cache_dir,
    only_digits=True,
    num_clients=4,
    partition='dirichlet',
    dirichlet_alpha=0.5,
    model='ffnn',
    seed=3,
  )
  writers = get_task('emnist', cache_dir=cache_dir, only_digits=True, max_eval_examples=None)
  assert task.num_clients == 4 and task.num_classes == 10
  assert sorted(task.client_num_examples) == [7, 8, 8, 8]  # 31 examples, equal shares.
  dealt = []
  for i, client_id in enumerate(task.client_ids):
    rows = _examples(task.train_data.create_tf_dataset_for_client(client_id))
    np.testing.assert_array_equal(
      task.client_label_histograms[i], np.bincount([y for _, y in rows], minlength=10)
    )
    dealt += rows
  pooled = [
    row
    for c in writers.client_ids
    for row in _examples(writers.train_data.create_tf_dataset_for_client(c), 'pixels', 'label')
  ]
  assert sorted(dealt) == sorted(pooled)  # The writers' own images and labels, each once.
  # Evaluation is the writers' test split, as for `emnist`.
  assert _examples(task.eval_data, 'pixels', 'label') == _examples(
    writers.eval_data, 'pixels', 'label'
  )
  batch = next(iter(task.client_dataset(0, 0)))
  assert batch['x'].shape[1:] == (28, 28, 1)
  assert task.keras_model_fn(0)(batch['x']).shape == (len(batch['y']), 10)
  assert task.keras_model_fn(0).count_params() == 784 * 128 + 128 + 128 * 10 + 10
  again = get_task(
    'emnist_skewed',
    cache_dir=cache_dir,
    only_digits=True,
    num_clients=4,
    partition='dirichlet',
    dirichlet_alpha=0.5,
    seed=3,
  )
  np.testing.assert_array_equal(again.client_label_histograms, task.client_label_histograms)


def test_emnist_skewed_log_normal_sizes(cache_dir):
  task = get_task(
    'emnist_skewed', cache_dir=cache_dir, only_digits=True, num_clients=3, size_sigma=1.55, seed=1
  )
  sizes = np.asarray(task.client_num_examples)
  rng = np.random.default_rng([1, 2])  # The task's partition generator.
  np.testing.assert_array_equal(sizes, digits.lognormal_sizes(31, 3, 1.55, 10, rng))
  assert sizes.sum() == 31 and sizes.min() >= 10  # Every pooled example, 10 at least each.
  with pytest.raises(ValueError, match='size_sigma=1.0 applies to partition=dirichlet'):
    get_task('emnist_skewed', cache_dir=cache_dir, partition='shards', size_sigma=1.0)


def test_femnist_noniid_suite_deals_each_task_with_its_own_skew(cache_dir):
  from tasks import multi_model as suites  # pylint: disable=g-import-not-at-top

  tasks = suites.create_suite('femnist_noniid', num_models=2, num_clients=3, cache_dir=cache_dir)
  assert [t.options['dirichlet_alpha'] for t in tasks] == [0.05, 10.0]
  assert [t.options['seed'] for t in tasks] == [0, 1]
  assert all(t.num_clients == 3 and sum(t.client_num_examples) == 31 for t in tasks)
  assert all(t.options['size_sigma'] == 1.55 and t.options['model'] == 'ffnn' for t in tasks)


def test_emnist_skewed_refuses_options_that_do_not_apply(cache_dir):
  with pytest.raises(ValueError, match='dirichlet_alpha applies to partition=dirichlet only'):
    get_task('emnist_skewed', cache_dir=cache_dir, partition='shards', dirichlet_alpha=0.1)
  with pytest.raises(ValueError, match='num_clients=99 exceeds the 10 pooled examples'):
    get_task('emnist_skewed', cache_dir=cache_dir, num_clients=99)


def test_emnist_skewed_size_profile(cache_dir):
  task = get_task(
    'emnist_skewed',
    cache_dir=cache_dir,
    only_digits=True,
    num_clients=3,
    size_group_clients=(2, 1),
    size_group_examples=(4, 10),
  )
  np.testing.assert_array_equal(task.client_num_examples, [4, 4, 10])
  assert task.options['size_group_clients'] == (2, 1)
  with pytest.raises(ValueError, match='needs 40 training examples, the pool has 31'):
    get_task(
      'emnist_skewed',
      cache_dir=cache_dir,
      only_digits=True,
      num_clients=2,
      size_group_clients=(2,),
      size_group_examples=(20,),
    )
  with pytest.raises(ValueError, match='num_clients is 100; make them agree'):
    get_task(
      'emnist_skewed', cache_dir=cache_dir, size_group_clients=(2,), size_group_examples=(2,)
    )
  with pytest.raises(ValueError, match='Give both'):
    get_task('emnist_skewed', cache_dir=cache_dir, size_group_clients=(2,))
