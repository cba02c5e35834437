"""Tests for the embedded ``synthetic`` task (tasks/synthetic.py)."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import get_task
from tasks import synthetic


@pytest.fixture(scope='module')
def task():
  return get_task('synthetic')


@pytest.fixture(scope='module')
def clients():
  return synthetic.generate_synthetic(
    alpha=0.5, beta=0.5, num_clients=30, min_client_size=20, max_client_size=1000, seed=0
  )


def _client_arrays(task, client_index):
  batch = next(
    iter(task.train_data.create_tf_dataset_for_client(task.client_ids[client_index]).batch(10_000))
  )
  return batch['x'].numpy(), batch['y'].numpy()


def test_shapes_and_statistics(task, clients):
  assert task.num_clients == 30 and task.num_classes == 10
  assert task.element_spec['x'] == tf.TensorSpec([None, 60], tf.float32)
  assert task.element_spec['y'] == tf.TensorSpec([None], tf.int32)
  sizes = np.array([len(y) for y in clients.labels])
  assert sizes.min() >= 20 and sizes.max() <= 1000
  held_out = np.round(0.2 * sizes).astype(int)
  np.testing.assert_array_equal(task.client_num_examples, sizes - held_out)
  assert sum(1 for _ in task.eval_data) == held_out.sum()
  for i in range(task.num_clients):
    x, y = _client_arrays(task, i)
    assert x.shape == (task.client_num_examples[i], 60)
    np.testing.assert_array_equal(np.bincount(y, minlength=10), task.client_label_histograms[i])
    # The task holds exactly the generated examples, minus the hold-out tail.
    np.testing.assert_array_equal(x, clients.features[i][: len(y)])


def test_labels_follow_each_clients_own_model(clients):
  own, others = [], []
  for k, (x, y) in enumerate(zip(clients.features, clients.labels)):
    np.testing.assert_array_equal(
      y, np.argmax(x.astype(np.float64) @ clients.weights[k].T + clients.biases[k], axis=1)
    )
    own.append(np.mean(y == np.argmax(x @ clients.weights[k].T + clients.biases[k], axis=1)))
    other = (k + 1) % len(clients.labels)
    others.append(np.mean(y == np.argmax(x @ clients.weights[other].T + clients.biases[other], 1)))
  assert np.mean(own) > 0.99
  assert np.mean(others) < 0.5  # Heterogeneous: another client's model disagrees.


def test_features_follow_client_means_and_covariance(clients):
  diagonal = synthetic.feature_covariance_diagonal()
  np.testing.assert_allclose(diagonal[[0, 1, 59]], [1.0, 2**-1.2, 60**-1.2])
  for k, x in enumerate(clients.features):
    n = len(x)
    # Five standard errors of the mean, coordinate-wise.
    assert np.all(np.abs(x.mean(axis=0) - clients.feature_means[k]) < 5 * np.sqrt(diagonal / n))
    if n >= 400:
      np.testing.assert_allclose(x.var(axis=0), diagonal, rtol=0.35)
  # v_k ~ N(B_k, 1) entry-wise, so its mean over 60 entries tracks B_k.
  gaps = clients.feature_means.mean(axis=1) - clients.feature_shifts
  assert np.all(np.abs(gaps) < 5 / np.sqrt(60))
  gaps = clients.weights.mean(axis=(1, 2)) - clients.model_shifts
  assert np.all(np.abs(gaps) < 5 / np.sqrt(600))


def test_alpha_beta_zero_removes_shifts():
  homogeneous = synthetic.generate_synthetic(
    alpha=0.0, beta=0.0, num_clients=5, min_client_size=20, max_client_size=50, seed=3
  )
  np.testing.assert_array_equal(homogeneous.model_shifts, 0.0)
  np.testing.assert_array_equal(homogeneous.feature_shifts, 0.0)


def test_deterministic_in_seed(task):
  again = get_task('synthetic')
  other = get_task('synthetic', seed=1)
  np.testing.assert_array_equal(_client_arrays(task, 4)[0], _client_arrays(again, 4)[0])
  np.testing.assert_array_equal(task.client_label_histograms, again.client_label_histograms)
  assert not np.array_equal(task.client_num_examples, other.client_num_examples)


def test_model_and_batches(task):
  batch = next(iter(task.client_dataset(0, 0)))
  model = task.keras_model_fn(0)
  assert model.count_params() == 610
  assert model(batch['x']).shape == (len(batch['y']), 10)
  evaluation = next(iter(task.preprocess_eval(task.eval_data)))
  assert evaluation['x'].shape[1:] == (60,)


def test_size_range_options():
  task = get_task('synthetic', num_clients=8, min_client_size=40, max_client_size=60)
  assert task.client_num_examples.min() >= 32 and task.client_num_examples.max() <= 48
  with pytest.raises(ValueError, match='max_client_size=30 is smaller than min_client_size=40'):
    get_task('synthetic', min_client_size=40, max_client_size=30)
