"""Tests for tasks/models.py: architectures, parameter counts, seeding."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tasks import models


def _weights_equal(a: tf.keras.Model, b: tf.keras.Model) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights()))


# Hand-computed: conv1 5*5*1*32+32 = 832; conv2 5*5*32*64+64 = 51,264;
# dense 7*7*64*512+512 = 1,606,144; logits 512*C+C (5,130 or 31,806).
@pytest.mark.parametrize('num_classes, expected', [(10, 1_663_370), (62, 1_690_046)])
def test_mcmahan_cnn_parameter_count_and_output(num_classes, expected):
  model = models.mcmahan_cnn(num_classes, seed=0)
  assert model.count_params() == expected
  logits = model(tf.zeros([3, 28, 28, 1]))
  assert logits.shape == (3, num_classes)


def test_char_gru_parameter_count_and_output():
  model = models.char_gru(90, seed=0)
  # Embedding 90*256; GRU (reset_after) 3*(256*256 + 256*256 + 2*256) twice;
  # Dense 256*90 + 90.
  assert model.count_params() == 90 * 256 + 2 * 3 * (2 * 256 * 256 + 2 * 256) + 256 * 90 + 90
  assert model.count_params() == 835_674
  assert model(tf.zeros([2, 5], tf.int64)).shape == (2, 5, 90)


def test_logits_not_probabilities():
  model = models.mcmahan_cnn(10, seed=0)
  logits = model(tf.random.stateless_uniform([4, 28, 28, 1], seed=[1, 2])).numpy()
  # A softmax output would be non-negative with rows summing to one.
  assert (logits < 0).any() or not np.allclose(logits.sum(axis=1), 1.0)


@pytest.mark.parametrize(
  'builder',
  [
    lambda seed: models.mcmahan_cnn(10, seed),
    lambda seed: models.mcmahan_2nn(10, seed),
    lambda seed: models.char_gru(20, seed, embedding_dim=8, units=8),
    lambda seed: models.tff_char_lstm(20, 5, seed),
    lambda seed: models.small_vgg(100, seed, input_shape=(24, 24, 3)),
    lambda seed: models.dense_mlp(64, 10, seed),
    lambda seed: models.logistic_regression(60, 10, seed),
  ],
  ids=['cnn', '2nn', 'gru', 'tff_lstm', 'vgg', 'mlp', 'logistic'],
)
def test_seeded_initialisation(builder):
  first, again, other = builder(0), builder(0), builder(1)
  assert _weights_equal(first, again)
  assert not _weights_equal(first, other)
  # Every kernel (random initialiser) differs between seeds, not just one.
  for a, c, variable in zip(first.get_weights(), other.get_weights(), first.weights):
    if 'kernel' in variable.name or 'embeddings' in variable.name:
      assert not np.array_equal(a, c), variable.name


def test_tff_char_lstm_keeps_forget_gate_bias():
  model = models.tff_char_lstm(20, 5, seed=3)
  bias = next(v for v in model.weights if 'lstm_cell/bias' in v.name).numpy()
  # Keras' unit_forget_bias: zeros except ones for the forget gate (2nd block).
  np.testing.assert_array_equal(bias[256:512], 1.0)
  np.testing.assert_array_equal(bias[:256], 0.0)


def test_seed_initial_weights_reproduces_and_rejects_unknown_layers():
  inputs = tf.keras.Input(shape=(4,))
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(3, kernel_initializer='he_normal')(inputs))
  models.seed_initial_weights(model, 5)
  first = model.get_weights()
  models.seed_initial_weights(model, 6)
  assert not np.array_equal(first[0], model.get_weights()[0])
  models.seed_initial_weights(model, 5)
  np.testing.assert_array_equal(first[0], model.get_weights()[0])

  prelu = tf.keras.Model(inputs, tf.keras.layers.PReLU()(inputs))
  with pytest.raises(ValueError, match='Cannot find the initialiser'):
    models.seed_initial_weights(prelu, 0)
  with pytest.raises(ValueError, match='seed must be a non-negative integer, got -1'):
    models.seed_initial_weights(model, -1)


def test_no_global_seeding_in_tasks_package():
  source = '\n'.join(path.read_text() for path in pathlib.Path(models.__file__).parent.glob('*.py'))
  for forbidden in ('set_seed(', 'np.random.seed(', 'set_random_seed('):
    assert forbidden not in source
