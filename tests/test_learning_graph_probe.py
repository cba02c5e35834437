"""Tests for tff_sampling/learning/graph_probe.py."""

import collections

import linear_client
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tff_sampling import program
from tff_sampling.learning import graph_probe
from tff_sampling.learning import signals

_INPUTS, _CLASSES = linear_client.INPUTS, linear_client.CLASSES
_linear_model_fn = linear_client.model_fn_with()
_linear_weights = linear_client.linear_weights
_client_arrays = linear_client.client_arrays
_dataset = linear_client.dataset
_local_sgd = linear_client.local_sgd


def _cosine(features):
  unit = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
  return unit @ unit.T


# ---------------------------------------------------------------------------
# noise_batch


def test_noise_batch_has_the_validation_mean_and_covariance():
  rng = np.random.default_rng(0)
  mixing = rng.normal(size=(6, 6))
  # Few examples, so that the unbiased covariance (divisor n - 1 = 11) differs
  # from the divisor-n one by 9%, ~13 standard errors of the estimate below.
  validation = (rng.normal(size=(12, 6)) @ mixing + np.arange(6)).astype(np.float32)
  validation[:, 2] = 0.5  # A constant coordinate: the covariance is singular.
  batch = 40_000
  noise = graph_probe.noise_batch(validation, batch, seed=[7, 1]).astype(np.float64)
  assert noise.shape == (batch, 6)
  mean = validation.mean(axis=0, dtype=np.float64)
  cov = np.cov(validation.astype(np.float64), rowvar=False)
  # Standard errors of the sample mean and covariance of `batch` Gaussian draws;
  # every entry within 5 of them (fixed seed; the largest deviations here are 2.6
  # and 1.3 standard errors).
  mean_se = np.sqrt(np.diag(cov) / batch)
  np.testing.assert_array_less(np.abs(noise.mean(axis=0) - mean), 5 * mean_se + 1e-6)
  cov_se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / batch)
  np.testing.assert_array_less(np.abs(np.cov(noise, rowvar=False) - cov), 5 * cov_se + 1e-6)
  np.testing.assert_allclose(noise[:, 2], 0.5, rtol=1e-6)  # Stays exactly constant.


def test_noise_batch_is_deterministic_in_the_seed_and_keeps_shape_and_dtype():
  validation = np.random.default_rng(1).random((20, 4, 3)).astype(np.float32)
  first = graph_probe.noise_batch(validation, 5, seed=3)
  assert first.shape == (5, 4, 3) and first.dtype == np.float32
  np.testing.assert_array_equal(first, graph_probe.noise_batch(validation, 5, seed=3))
  assert not np.allclose(first, graph_probe.noise_batch(validation, 5, seed=4))


@pytest.mark.parametrize(
  'inputs, batch_size, message',
  [
    (
      np.arange(40, dtype=np.int32).reshape(10, 4),
      5,
      r"needs real-valued inputs.*kind='update_cosine' or the 'oracle'",
    ),
    (np.ones((1, 4), np.float32), 5, 'at least 2 validation examples'),
    (np.array([[0.0, np.nan], [1.0, 2.0]], np.float32), 5, '1 non-finite values'),
    (np.ones((3, 4), np.float32), 0, 'batch_size must be a positive integer, got 0'),
  ],
)
def test_noise_batch_rejects_bad_input(inputs, batch_size, message):
  with pytest.raises(ValueError, match=message):
    graph_probe.noise_batch(inputs, batch_size, seed=0)


# ---------------------------------------------------------------------------
# build_graph_probe


def test_probe_type_signature(small_digits_task):
  probe = graph_probe.build_graph_probe(
    small_digits_task.model_fn, client_learning_rate=0.1, sketch_size=64
  )
  weights_type, noise_type, data_type = probe.type_signature.parameter
  assert weights_type.placement is tff.SERVER
  assert noise_type == tff.FederatedType(tff.TensorType(np.float32, [None, 64]), tff.SERVER)
  assert data_type.placement is tff.CLIENTS and 'meta' in dir(data_type.member)
  result = probe.type_signature.result
  assert result.placement is tff.SERVER
  assert result.member.embedding == tff.TensorType(np.float32, [None, 10])
  assert result.member.update_sketch == tff.TensorType(np.float32, [None, 64])

  sketch_only = graph_probe.build_graph_probe(
    small_digits_task.model_fn, client_learning_rate=0.1, sketch_size=64, with_embedding=False
  )
  assert len(sketch_only.type_signature.parameter) == 2
  assert dir(sketch_only.type_signature.result.member) == ['update_sketch']


def test_zero_learning_rate_gives_the_global_models_mean_output_and_zero_sketches():
  rng = np.random.default_rng(2)
  weights = _linear_weights(rng)
  noise = rng.normal(size=(9, _INPUTS)).astype(np.float32)
  probe = graph_probe.build_graph_probe(_linear_model_fn, client_learning_rate=0.0, sketch_size=16)
  data = signals.selection_client_data(
    [_dataset(*_client_arrays(rng, n)) for n in (7, 4, 1)], [1.0] * 3
  )
  output = probe(weights, noise, data)
  expected = (noise.astype(np.float64) @ weights.trainable[0] + weights.trainable[1]).mean(axis=0)
  np.testing.assert_allclose(output['embedding'], np.tile(expected, (3, 1)), atol=1e-5)
  np.testing.assert_array_equal(output['update_sketch'], np.zeros((3, 16)))


def test_each_slot_holds_its_clients_locally_trained_embedding_and_update():
  rng = np.random.default_rng(3)
  weights = _linear_weights(rng)
  noise = rng.normal(size=(6, _INPUTS)).astype(np.float32)
  clients = [_client_arrays(rng, n) for n in (7, 5, 8, 3)]
  slots = [2, 0, 3, 1]  # Client i sits in slot slots[i].
  probe = graph_probe.build_graph_probe(
    _linear_model_fn, client_learning_rate=0.5, sketch_size=16
  )  # 15 parameters: the exact update.
  data = [signals.client_data(_dataset(x, y), slot, 1.0) for (x, y), slot in zip(clients, slots)]
  output = probe(weights, noise, data)
  assert output['embedding'].shape == (4, _CLASSES)
  for (x, y), slot in zip(clients, slots):
    kernel, bias = _local_sgd(weights, x, y, 0.5)
    expected = (noise.astype(np.float64) @ kernel + bias).mean(axis=0)
    np.testing.assert_allclose(output['embedding'][slot], expected, atol=1e-5)
    update = np.concatenate(
      [(weights.trainable[0] - kernel).ravel(), weights.trainable[1] - bias, [0.0]]
    )
    np.testing.assert_allclose(output['update_sketch'][slot], update, atol=1e-6)
  assert np.ptp(output['embedding'], axis=0).max() > 0.1  # The clients differ.


def test_update_sketch_is_the_signals_client_works_sketch(small_digits_task):
  task = small_digits_task
  start = task.initial_model_weights(0)
  order = [4, 1, 9]
  process = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=256, sketch_seed=5
  )
  state = process.set_model_weights(process.initialize(), start)
  expected = process.next(
    state, signals.selection_client_data([task.client_dataset(c, seed=1) for c in order], [1.0] * 3)
  ).metrics['client_work']['signals']['update_sketch']
  probe = graph_probe.build_graph_probe(
    task.model_fn, client_learning_rate=0.1, sketch_size=256, sketch_seed=5, with_embedding=False
  )
  output = probe(
    start, signals.selection_client_data([task.client_dataset(c, seed=1) for c in order], [1.0] * 3)
  )
  np.testing.assert_allclose(output['update_sketch'], expected, atol=1e-6)


def test_probe_rejects_bad_options_and_integer_inputs():
  with pytest.raises(ValueError, match='client_learning_rate must be a finite number >= 0'):
    graph_probe.build_graph_probe(_linear_model_fn, client_learning_rate=-0.1, sketch_size=8)
  with pytest.raises(ValueError, match='sketch_size must be a positive integer, got 0'):
    graph_probe.build_graph_probe(_linear_model_fn, client_learning_rate=0.1, sketch_size=0)

  def token_model_fn():
    keras_model = tf.keras.Sequential(
      [
        tf.keras.Input(shape=(5,), dtype=tf.int32),
        tf.keras.layers.Embedding(7, 2),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(7),
      ]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(
        x=tf.TensorSpec([None, 5], tf.int32), y=tf.TensorSpec([None], tf.int32)
      ),
    )

  with pytest.raises(ValueError, match='dtype int32; it needs real-valued inputs.*update_cosine'):
    graph_probe.build_graph_probe(token_model_fn, client_learning_rate=0.1, sketch_size=8)
  # Update sketches work for any input.
  graph_probe.build_graph_probe(
    token_model_fn, client_learning_rate=0.1, sketch_size=8, with_embedding=False
  )


# ---------------------------------------------------------------------------
# client_graph_features


@pytest.mark.parametrize('kind, width', [('functional', 10), ('update_cosine', 128)])
def test_client_graph_features_are_finite_and_deterministic(small_digits_task, kind, width):
  task = small_digits_task

  def features(seed, chunk_size):
    return graph_probe.client_graph_features(
      task,
      kind=kind,
      model_weights=task.initial_model_weights(0),
      client_learning_rate=0.1,
      seed=seed,
      sketch_size=128,
      chunk_size=chunk_size,
    )

  first = features(0, 32)
  assert first.shape == (task.num_clients, width) and first.dtype == np.float64
  assert np.all(np.isfinite(first)) and np.all(first.any(axis=1))
  # Chunking (7 + 7 + 6 clients) changes nothing; another seed reshuffles.
  np.testing.assert_allclose(features(0, 7), first, rtol=1e-6, atol=1e-7)
  assert not np.allclose(features(1, 32), first)


def test_clients_train_on_the_programs_round_0_streams_with_fixed_steps(small_digits_task):
  task = small_digits_task
  start = task.initial_model_weights(0)
  features = graph_probe.client_graph_features(
    task,
    kind='update_cosine',
    model_weights=start,
    client_learning_rate=0.1,
    seed=3,
    client_steps=2,
    sketch_size=64,
    chunk_size=8,
  )
  probe = graph_probe.build_graph_probe(
    task.model_fn, client_learning_rate=0.1, sketch_size=64, with_embedding=False
  )
  clients = [0, 11, 19]
  expected = probe(
    start,
    signals.selection_client_data(
      [task.client_dataset(c, program.client_shuffle_seed(3, 0, c), steps=2) for c in clients],
      [1.0] * 3,
    ),
  )['update_sketch']
  np.testing.assert_allclose(features[clients], expected, rtol=1e-6, atol=1e-7)
  # The stream was cut at 2 batches: more steps move further.
  longer = probe(
    start,
    signals.selection_client_data(
      [task.client_dataset(c, program.client_shuffle_seed(3, 0, c), steps=4) for c in clients],
      [1.0] * 3,
    ),
  )['update_sketch']
  assert np.all(np.linalg.norm(longer, axis=1) > np.linalg.norm(expected, axis=1))


@pytest.fixture(scope='module')
def shards_task():
  return tasks.get_task('digits', num_clients=20, preset='shards', client_batch_size=10)


@pytest.mark.parametrize('kind', graph_probe.FEATURE_KINDS)
def test_same_digit_clients_are_more_similar_than_different_digit_clients(shards_task, kind):
  # Observed with seed 0, learning rate 0.1 (2 clients per digit): mean cosine of
  # same-digit pairs vs different-digit pairs, functional 1.000 vs -0.06 and
  # update_cosine 0.993 vs -0.03 (over seeds 0-2, learning rates 0.05 and 0.1,
  # 20 or 30 clients: same >= 0.99, different in [-0.07, 0.20]).
  task = shards_task
  features = graph_probe.client_graph_features(
    task, kind=kind, model_weights=task.initial_model_weights(0), client_learning_rate=0.1, seed=0
  )
  labels = task.client_label_histograms.argmax(axis=1)
  same = labels[:, None] == labels[None, :]
  cosine = _cosine(features)
  same_mean = cosine[same & ~np.eye(task.num_clients, dtype=bool)].mean()
  different_mean = cosine[~same].mean()
  assert same_mean > different_mean + 0.5, (same_mean, different_mean)


def test_client_graph_features_rejects_bad_options(small_digits_task):
  task = small_digits_task
  common = dict(model_weights=task.initial_model_weights(0), client_learning_rate=0.1, seed=0)
  with pytest.raises(ValueError, match=r"kind must be one of .*got 'oracle'.*oracle_features"):
    graph_probe.client_graph_features(task, kind='oracle', **common)
  with pytest.raises(
    ValueError, match="client_batch_size=32 differs from the task's client_batch_size=10"
  ):
    graph_probe.client_graph_features(task, kind='functional', client_batch_size=32, **common)
  with pytest.raises(ValueError, match='chunk_size must be a positive integer'):
    graph_probe.client_graph_features(task, kind='update_cosine', chunk_size=0, **common)
  with pytest.raises(ValueError, match='client_steps must be a positive integer, got 0'):
    graph_probe.client_graph_features(task, kind='update_cosine', client_steps=0, **common)


def test_validation_inputs_and_oracle_features(small_digits_task):
  task = small_digits_task
  inputs = graph_probe.validation_inputs(task, 300)
  expected = np.stack([e['x'] for e in task.eval_data.take(300).as_numpy_iterator()])
  np.testing.assert_array_equal(inputs, expected)
  oracle = graph_probe.oracle_features(task)
  np.testing.assert_allclose(oracle.sum(axis=1), 1.0)
  np.testing.assert_allclose(
    oracle * task.client_num_examples[:, None], task.client_label_histograms
  )
