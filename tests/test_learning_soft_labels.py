"""Tests for tff_sampling/learning/soft_labels.py (LEFL's pre-processing round)."""

import collections

import linear_client
import numpy as np
import pytest
import scipy.special
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import public
from tff_sampling import communication
from tff_sampling import program
from tff_sampling.learning import signals
from tff_sampling.learning import soft_labels

_INPUTS, _CLASSES = linear_client.INPUTS, linear_client.CLASSES
_linear_model_fn = linear_client.model_fn_with
_linear_weights = linear_client.linear_weights
_client_arrays = linear_client.client_arrays
_dataset = linear_client.dataset
_local_sgd = linear_client.local_sgd


def _softmax_of_linear(x, kernel, bias):
  return scipy.special.softmax(x.astype(np.float64) @ kernel + bias, axis=-1)


# ---------------------------------------------------------------------------
# build_soft_label_probe


def test_probe_type_signature(small_digits_task):
  probe = soft_labels.build_soft_label_probe(small_digits_task.model_fn, client_learning_rate=0.1)
  weights_type, public_type, data_type = probe.type_signature.parameter
  assert weights_type.placement is tff.SERVER
  assert public_type == tff.FederatedType(tff.TensorType(np.float32, [None, 64]), tff.SERVER)
  assert data_type.placement is tff.CLIENTS and 'meta' in dir(data_type.member)
  assert probe.type_signature.result == tff.FederatedType(
    tff.TensorType(np.float32, [None, None, 10]), tff.SERVER
  )


def test_zero_learning_rate_gives_the_global_models_softmax():
  rng = np.random.default_rng(2)
  weights = _linear_weights(rng)
  inputs = rng.normal(size=(9, _INPUTS)).astype(np.float32)
  probe = soft_labels.build_soft_label_probe(_linear_model_fn(), client_learning_rate=0.0)
  data = signals.selection_client_data(
    [_dataset(*_client_arrays(rng, n)) for n in (7, 4, 1)], [1.0] * 3
  )
  output = probe(weights, inputs, data)
  expected = _softmax_of_linear(inputs, *weights.trainable)
  assert output.shape == (3, 9, _CLASSES) and output.dtype == np.float32
  np.testing.assert_allclose(output, np.tile(expected, (3, 1, 1)), atol=1e-6)


def test_each_slot_holds_its_clients_locally_trained_soft_labels():
  rng = np.random.default_rng(3)
  weights = _linear_weights(rng)
  inputs = rng.normal(size=(6, _INPUTS)).astype(np.float32)
  clients = [_client_arrays(rng, n) for n in (7, 5, 8, 3)]
  slots = [2, 0, 3, 1]  # Client i sits in slot slots[i].
  probe = soft_labels.build_soft_label_probe(_linear_model_fn(), client_learning_rate=0.5)
  output = probe(
    weights,
    inputs,
    [signals.client_data(_dataset(x, y), slot, 1.0) for (x, y), slot in zip(clients, slots)],
  )
  assert output.shape == (4, 6, _CLASSES)
  for (x, y), slot in zip(clients, slots):
    expected = _softmax_of_linear(inputs, *_local_sgd(weights, x, y, 0.5))
    np.testing.assert_allclose(output[slot], expected, atol=1e-5)
  np.testing.assert_allclose(output.sum(axis=-1), 1.0, atol=1e-6)
  assert np.ptp(output, axis=0).max() > 0.1  # The clients differ.


def test_probability_outputs_are_not_softmaxed_twice():
  rng = np.random.default_rng(4)
  weights = _linear_weights(rng)
  inputs = rng.normal(size=(5, _INPUTS)).astype(np.float32)
  data = signals.selection_client_data([_dataset(*_client_arrays(rng, 4))], [1.0])
  probe = soft_labels.build_soft_label_probe(
    _linear_model_fn('softmax'), client_learning_rate=0.0, model_outputs='probabilities'
  )
  np.testing.assert_allclose(
    probe(weights, inputs, data)[0], _softmax_of_linear(inputs, *weights.trainable), atol=1e-6
  )


def test_a_diverging_client_reports_the_global_models_soft_labels():
  rng = np.random.default_rng(5)
  weights = _linear_weights(rng)
  inputs = rng.normal(size=(5, _INPUTS)).astype(np.float32)
  x, y = _client_arrays(rng, 6)
  probe = soft_labels.build_soft_label_probe(_linear_model_fn(), client_learning_rate=1e38)
  output = probe(
    weights,
    inputs,
    signals.selection_client_data([_dataset(x * 1e30, y), _dataset(x[:0], y[:0])], [1.0, 1.0]),
  )  # Diverges; no data.
  expected = _softmax_of_linear(inputs, *weights.trainable)
  np.testing.assert_allclose(output, np.stack([expected, expected]), atol=1e-6)


def test_token_models_give_one_distribution_per_position():
  vocab, length = 7, 5

  def token_model_fn():
    keras_model = tf.keras.Sequential(
      [
        tf.keras.Input(shape=(length,), dtype=tf.int64),
        tf.keras.layers.Embedding(vocab, 3),
        tf.keras.layers.Dense(vocab),
      ]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=collections.OrderedDict(
        x=tf.TensorSpec([None, length], tf.int64), y=tf.TensorSpec([None, length], tf.int64)
      ),
    )

  rng = np.random.default_rng(6)
  tokens = rng.integers(vocab, size=(4, length))
  data = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=tokens, y=tokens)).batch(2)
  probe = soft_labels.build_soft_label_probe(token_model_fn, client_learning_rate=0.1)
  assert probe.type_signature.result.member == tff.TensorType(
    np.float32, [None, None, length, vocab]
  )
  weights = tff.learning.models.ModelWeights.from_model(token_model_fn())
  output = probe(
    weights,
    rng.integers(vocab, size=(3, length)),
    signals.selection_client_data([data, data], [1.0, 1.0]),
  )
  assert output.shape == (2, 3, length, vocab)
  np.testing.assert_allclose(output.sum(axis=-1), 1.0, atol=1e-6)


def test_probe_rejects_bad_options():
  with pytest.raises(ValueError, match='client_learning_rate must be a finite number >= 0'):
    soft_labels.build_soft_label_probe(_linear_model_fn(), client_learning_rate=float('nan'))
  with pytest.raises(ValueError, match=r"model_outputs must be one of .*got 'softmax'"):
    soft_labels.build_soft_label_probe(
      _linear_model_fn(), client_learning_rate=0.1, model_outputs='softmax'
    )


# ---------------------------------------------------------------------------
# client_soft_labels


def _inputs(task, count=12, seed=0):
  return public.public_inputs(task, 'noise', num_examples=count, seed=seed)


def test_client_soft_labels_are_deterministic_and_chunking_changes_nothing(small_digits_task):
  task = small_digits_task
  inputs = _inputs(task)

  def labels(seed, chunk_size):
    return soft_labels.client_soft_labels(
      task,
      public_inputs=inputs,
      model_weights=task.initial_model_weights(0),
      client_learning_rate=0.1,
      seed=seed,
      chunk_size=chunk_size,
    )

  first = labels(0, 32)
  assert first.shape == (task.num_clients, 12, 10) and first.dtype == np.float32
  np.testing.assert_allclose(first.sum(axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(labels(0, 7), first, rtol=1e-6, atol=1e-7)  # 7 + 7 + 6 clients.
  np.testing.assert_array_equal(labels(0, 32), first)
  assert not np.allclose(labels(1, 32), first)  # Another seed reshuffles the streams.


def test_clients_train_on_the_programs_round_0_streams(small_digits_task):
  task = small_digits_task
  start = task.initial_model_weights(0)
  inputs = _inputs(task, 8)
  probe = soft_labels.build_soft_label_probe(task.model_fn, client_learning_rate=0.1)
  clients = [0, 11, 19]

  def direct(**kwargs):
    streams = []
    for c in clients:
      stream = task.client_dataset(
        c, program.client_shuffle_seed(3, 0, c), steps=kwargs.get('steps')
      )
      streams.append(stream.repeat(kwargs['epochs']) if 'epochs' in kwargs else stream)
    return probe(start, inputs, signals.selection_client_data(streams, [1.0] * 3))

  def probed(**kwargs):
    return soft_labels.client_soft_labels(
      task,
      public_inputs=inputs,
      model_weights=start,
      client_learning_rate=0.1,
      seed=3,
      chunk_size=8,
      **kwargs,
    )[clients]

  one_epoch = probed()
  np.testing.assert_allclose(one_epoch, direct(), rtol=1e-6, atol=1e-7)
  two_epochs = probed(pretrain_epochs=2)
  np.testing.assert_allclose(two_epochs, direct(epochs=2), rtol=1e-6, atol=1e-7)
  two_steps = probed(client_steps=2)
  np.testing.assert_allclose(two_steps, direct(steps=2), rtol=1e-6, atol=1e-7)
  # E_p rounds' worth of fixed steps: 3 x 2 batches of the cycled stream.
  np.testing.assert_allclose(
    probed(client_steps=2, pretrain_epochs=3), direct(steps=6), rtol=1e-6, atol=1e-7
  )
  # The second pass and the cut change the local models (the comparisons above
  # would also pass if the options were ignored on both sides).
  assert np.abs(two_epochs - one_epoch).max() > 0.01
  assert np.abs(two_steps - one_epoch).max() > 0.01


@pytest.fixture(scope='module')
def shards_task():
  return tasks.get_task('digits', num_clients=20, preset='shards', client_batch_size=10)


def test_single_digit_clients_label_the_public_set_as_their_digit(shards_task):
  # Observed (noise public set of 200 examples, 2 clients per digit, seeds 0-2,
  # learning rates 0.05 and 0.1, 1 or 2 pretrain epochs): every client's model
  # labels all 200 public examples as its own digit (argmax share 1.000 for the
  # own digit, 0.000 for every other), with a mean probability of 0.71-0.96 for
  # its digit against 0.005-0.033 for each other digit (means over clients). Per
  # client, this run: own-digit mean probability >= 0.66, any other <= 0.056.
  task = shards_task
  labels = soft_labels.client_soft_labels(
    task,
    public_inputs=_inputs(task, 200),
    model_weights=task.initial_model_weights(0),
    client_learning_rate=0.05,
    seed=0,
  )
  digit = task.client_label_histograms.argmax(axis=1)
  argmax_share = np.stack([(labels.argmax(axis=-1) == d).mean(axis=1) for d in range(10)], 1)
  own = argmax_share[np.arange(task.num_clients), digit]
  others = np.where(np.eye(10, dtype=bool)[digit], -1.0, argmax_share).max(axis=1)
  assert own.min() > 0.9 and others.max() < 0.1, (own, others)
  mean_probability = labels.mean(axis=1)
  own_probability = mean_probability[np.arange(task.num_clients), digit]
  other_probability = np.where(np.eye(10, dtype=bool)[digit], 0.0, mean_probability).max(axis=1)
  assert own_probability.min() > 0.5 and other_probability.max() < 0.1


def test_client_soft_labels_rejects_bad_inputs(small_digits_task):
  task = small_digits_task
  common = dict(model_weights=task.initial_model_weights(0), client_learning_rate=0.1, seed=0)
  with pytest.raises(
    ValueError,
    match=r'public_inputs of shape \(5, 8, 8\) do not fit task '
    r"'digits', whose model takes examples of shape \(64,\)",
  ):
    soft_labels.client_soft_labels(task, public_inputs=np.zeros((5, 8, 8), np.float32), **common)
  with pytest.raises(ValueError, match='public_inputs hold no examples'):
    soft_labels.client_soft_labels(task, public_inputs=np.zeros((0, 64), np.float32), **common)
  with pytest.raises(ValueError, match='1 non-finite values'):
    soft_labels.client_soft_labels(task, public_inputs=np.array([[np.inf] + [0.0] * 63]), **common)
  with pytest.raises(ValueError, match='client_steps must be a positive integer, got 0'):
    soft_labels.client_soft_labels(task, public_inputs=_inputs(task), client_steps=0, **common)
  with pytest.raises(ValueError, match='pretrain_epochs must be a positive integer, got 0'):
    soft_labels.client_soft_labels(task, public_inputs=_inputs(task), pretrain_epochs=0, **common)
  with pytest.raises(ValueError, match='chunk_size must be a positive integer'):
    soft_labels.client_soft_labels(task, public_inputs=_inputs(task), chunk_size=0, **common)


# ---------------------------------------------------------------------------
# preprocessing_bits


def test_preprocessing_bits_by_hand():
  # 100 clients, 200 public digits inputs of 64 floats, 10 classes.
  bits = soft_labels.preprocessing_bits(
    num_clients=100, public_examples=200, input_size=64, num_classes=10
  )
  assert bits == {'upload_bits': 100 * 200 * 10 * 32, 'download_bits': 100 * 200 * 64 * 32}
  assert bits == {'upload_bits': 6_400_000, 'download_bits': 40_960_000}
  assert all(type(v) is int for v in bits.values())
  assert communication.PreprocessingBits(**bits).upload_bits == 6_400_000
  assert soft_labels.preprocessing_bits(
    num_clients=3, public_examples=2, input_size=5, num_classes=4, bits_per_value=16
  ) == {'upload_bits': 384, 'download_bits': 480}
  with pytest.raises(ValueError, match='public_examples must be a positive integer, got 0'):
    soft_labels.preprocessing_bits(num_clients=3, public_examples=0, input_size=5, num_classes=4)
