"""Keras model builders with seeded initialisation.

Every builder takes a ``seed`` and returns an *uncompiled* ``tf.keras.Model``
whose outputs are logits (train with
``tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)``). The same
seed gives bit-identical initial weights and a different seed different ones,
without touching any global random state: every random initialiser gets its
own seed derived from ``seed`` through ``np.random.SeedSequence`` (Keras 2.14
draws seeded initialisers with stateless random ops, so the values do not
depend on what ran before in the process).

Our own models are built with seeded initialisers directly. TensorFlow
Federated's builders (the ResNet-18 with group norm of
``tff.simulation.models.resnet_models`` and the Shakespeare LSTM of
``tff.simulation.baselines.shakespeare``) take no seed, so they are built as TFF
defines them and then re-initialised in place by `seed_initial_weights`, which
redraws every randomly initialised variable from a seeded copy of the very
initialiser the layer declared (same distribution, same scale) and leaves
deterministically initialised ones (zeros, ones, LSTM forget-gate bias) as
they are.

Parameter counts (checked in the tests): `mcmahan_cnn` has 1,663,370
parameters for 10 classes and 1,690,046 for 62 classes; `char_gru` has 835,674
for the 90-token Shakespeare vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_models
from tensorflow_federated.python.simulation.models import resnet_models

# Layer attribute holding a variable -> attribute holding its initialiser
# (Keras 2.14 naming, shared by Dense, Conv*, Embedding, RNN cells, *Norm).
_INITIALIZER_OF = (
  ('kernel', 'kernel_initializer'),
  ('recurrent_kernel', 'recurrent_initializer'),
  ('depthwise_kernel', 'depthwise_initializer'),
  ('pointwise_kernel', 'pointwise_initializer'),
  ('bias', 'bias_initializer'),
  ('embeddings', 'embeddings_initializer'),
  ('gamma', 'gamma_initializer'),
  ('beta', 'beta_initializer'),
  ('moving_mean', 'moving_mean_initializer'),
  ('moving_variance', 'moving_variance_initializer'),
)


def _check_seed(seed: int) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'seed must be a non-negative integer, got {seed!r}.')
  return int(seed)


def _derived_seeds(seed: int, count: int) -> list[int]:
  """`count` independent 31-bit seeds derived from `seed` (no global state)."""
  state = np.random.SeedSequence(_check_seed(seed)).generate_state(count)
  return [int(s) & 0x7FFFFFFF for s in state]


class _SeedStream:
  """Hands out a fresh derived seed per initialiser, in construction order."""

  def __init__(self, seed: int, capacity: int = 64):
    self._seeds = iter(_derived_seeds(seed, capacity))

  def glorot(self) -> tf.keras.initializers.Initializer:
    return tf.keras.initializers.GlorotUniform(seed=next(self._seeds))

  def orthogonal(self) -> tf.keras.initializers.Initializer:
    return tf.keras.initializers.Orthogonal(seed=next(self._seeds))

  def uniform(self, limit: float) -> tf.keras.initializers.Initializer:
    return tf.keras.initializers.RandomUniform(-limit, limit, seed=next(self._seeds))


def seed_initial_weights(model: tf.keras.Model, seed: int) -> tf.keras.Model:
  """Re-initialises `model`'s random variables deterministically from `seed`.

  For every layer (recursing into nested layers and RNN cells) and every
  variable it owns, the initialiser the layer declared for that variable is
  cloned with an explicit seed -- derived from `seed` and the variable's
  position in ``model.weights`` -- and its draw is assigned to the variable.
  Initialisers without a ``seed`` in their config (zeros, ones, constants, and
  the callable Keras uses for the LSTM forget-gate bias) are deterministic
  already and are left alone.

  Args:
    model: A built Keras model.
    seed: A non-negative integer.

  Returns:
    `model` itself, re-initialised in place.

  Raises:
    ValueError: If `seed` is invalid, or a variable's initialiser cannot be
      found (a layer type this function does not know), since its initial
      value would then depend on unseeded global state.
  """
  _check_seed(seed)
  if not model.built:
    raise ValueError('seed_initial_weights needs a built model (call build first).')
  initializers = {}
  for layer in [model, *model.submodules]:
    if not isinstance(layer, tf.keras.layers.Layer):
      continue
    for variable_attr, initializer_attr in _INITIALIZER_OF:
      variable = getattr(layer, variable_attr, None)
      initializer = getattr(layer, initializer_attr, None)
      if isinstance(variable, tf.Variable) and initializer is not None:
        initializers[variable.ref()] = initializer
  variables = model.weights
  seeds = _derived_seeds(seed, len(variables))
  for variable, variable_seed in zip(variables, seeds):
    initializer = initializers.get(variable.ref())
    if initializer is None:
      raise ValueError(
        f'Cannot find the initialiser of variable {variable.name!r}; '
        'seed_initial_weights supports layers whose variables are '
        f'{[name for name, _ in _INITIALIZER_OF]}.'
      )
    config = initializer.get_config() if hasattr(initializer, 'get_config') else {}
    if 'seed' not in config:
      continue  # Deterministic initialiser: the current value is reproducible.
    seeded = type(initializer).from_config({**config, 'seed': variable_seed})
    variable.assign(seeded(variable.shape, dtype=variable.dtype))
  return model


def mcmahan_cnn(num_classes: int, seed: int) -> tf.keras.Model:
  """The CNN of McMahan et al. (AISTATS 2017) for 28x28x1 images, logits out.

  Conv 5x5x32 (same, ReLU) -> max-pool 2x2 -> conv 5x5x64 (same, ReLU) ->
  max-pool 2x2 -> flatten -> dense 512 (ReLU) -> dense `num_classes`. The same
  architecture as TFF's ``create_original_fedavg_cnn_model`` but without its
  final softmax (our losses take logits). 1,663,370 parameters for 10 classes,
  1,690,046 for 62.

  Args:
    num_classes: Number of output logits (10 for EMNIST digits, 62 for all).
    seed: Seed of the initial weights.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, 28, 28, 1]`` to logits.
  """
  seeds = _SeedStream(seed)
  conv = lambda filters: tf.keras.layers.Conv2D(
    filters, 5, padding='same', activation='relu', kernel_initializer=seeds.glorot()
  )
  pool = lambda: tf.keras.layers.MaxPooling2D(pool_size=2, padding='same')
  inputs = tf.keras.Input(shape=(28, 28, 1), dtype=tf.float32)
  x = pool()(conv(32)(inputs))
  x = pool()(conv(64)(x))
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(512, activation='relu', kernel_initializer=seeds.glorot())(x)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=seeds.glorot())(x)
  return tf.keras.Model(inputs, logits, name='mcmahan_cnn')


def mcmahan_2nn(num_classes: int, seed: int) -> tf.keras.Model:
  """The "2NN" of McMahan et al. (AISTATS 2017) for 28x28x1 images, logits out.

  Flatten -> dense 200 (ReLU) -> dense 200 (ReLU) -> dense `num_classes`:
  199,210 parameters for 10 classes, 209,662 for 62 (an eighth of the CNN's).

  Args:
    num_classes: Number of output logits.
    seed: Seed of the initial weights.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, 28, 28, 1]`` to logits.
  """
  return _image_dense(num_classes, seed, (200, 200), 'mcmahan_2nn')


def image_ffnn(num_classes: int, seed: int, hidden: Sequence[int] = (128,)) -> tf.keras.Model:
  """A fully connected ReLU network on 28x28x1 images (flattened), logits out.

  With ``hidden=(128,)``, LEFL's FEMNIST model (784-128-62): 108,478
  parameters for 62 classes.

  Args:
    num_classes: Number of output logits.
    seed: Seed of the initial weights.
    hidden: Widths of the hidden layers.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, 28, 28, 1]`` to logits.
  """
  return _image_dense(num_classes, seed, tuple(hidden), 'image_ffnn')


def _image_dense(num_classes: int, seed: int, hidden: tuple[int, ...], name: str) -> tf.keras.Model:
  """Flatten a 28x28x1 image, ReLU dense layers of widths `hidden`, dense logits."""
  seeds = _SeedStream(seed)
  inputs = tf.keras.Input(shape=(28, 28, 1), dtype=tf.float32)
  x = tf.keras.layers.Flatten()(inputs)
  for width in hidden:
    x = tf.keras.layers.Dense(width, activation='relu', kernel_initializer=seeds.glorot())(x)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=seeds.glorot())(x)
  return tf.keras.Model(inputs, logits, name=name)


def char_gru(
  vocab_size: int, seed: int, embedding_dim: int = 256, units: int = 256
) -> tf.keras.Model:
  """Next-character model: Embedding, two stacked GRUs, Dense (logits).

  The character model of the optimal client sampling paper's code (Chen et
  al.): Embedding(vocab, 256) -> GRU(256) -> GRU(256) -> Dense(vocab), every
  GRU returning sequences so there is one prediction per input position.
  835,674 parameters for the 90-token Shakespeare vocabulary.

  Args:
    vocab_size: Number of tokens (inputs and logits).
    seed: Seed of the initial weights.
    embedding_dim: Embedding width.
    units: Units of each GRU.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``int[B, T]`` token ids to
    ``float32[B, T, vocab_size]`` logits.
  """
  seeds = _SeedStream(seed)
  inputs = tf.keras.Input(shape=(None,), dtype=tf.int64)
  x = tf.keras.layers.Embedding(
    vocab_size, embedding_dim, embeddings_initializer=seeds.uniform(0.05)
  )(inputs)
  for _ in range(2):
    x = tf.keras.layers.GRU(
      units,
      return_sequences=True,
      kernel_initializer=seeds.glorot(),
      recurrent_initializer=seeds.orthogonal(),
    )(x)
  logits = tf.keras.layers.Dense(vocab_size, kernel_initializer=seeds.glorot())(x)
  return tf.keras.Model(inputs, logits, name='char_gru')


def tff_char_lstm(vocab_size: int, sequence_length: int, seed: int) -> tf.keras.Model:
  """TFF's Shakespeare baseline LSTM, deterministically initialised.

  ``tff.simulation.baselines.shakespeare``'s ``create_recurrent_model``
  (Embedding 8 with ``mask_zero``, two LSTMs of 256, Dense vocab, logits)
  takes no seed; it is built as is and re-initialised by
  `seed_initial_weights`.

  Args:
    vocab_size: Number of tokens.
    sequence_length: Input length (the model's Embedding fixes it).
    seed: Seed of the initial weights.

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  model = char_prediction_models.create_recurrent_model(
    vocab_size=vocab_size, sequence_length=sequence_length
  )
  return seed_initial_weights(model, seed)


def resnet18_gn(input_shape: Sequence[int], num_classes: int, seed: int) -> tf.keras.Model:
  """TFF's ResNet-18 with group normalisation, logits out, seeded.

  Built by ``tff.simulation.models.resnet_models.create_resnet18`` (which
  takes no seed and ends in a softmax). Its softmax head is replaced by a
  Dense layer of the same shape, initialiser (normal, stddev 0.01) and L2
  regularisation, without the activation; then every random variable is
  redrawn by `seed_initial_weights`.

  Args:
    input_shape: ``(height, width, channels)``.
    num_classes: Number of output logits.
    seed: Seed of the initial weights.

  Returns:
    An uncompiled `tf.keras.Model` mapping images to logits.
  """
  base = resnet_models.create_resnet18(
    tuple(input_shape), num_classes, norm_layer=resnet_models.NormLayer.GROUP_NORM
  )
  head = base.layers[-1]
  features = head.input  # Output of the global average pooling.
  logits = tf.keras.layers.Dense(
    num_classes,
    # A fresh copy: Keras warns when one unseeded instance initialises twice.
    kernel_initializer=type(head.kernel_initializer).from_config(
      head.kernel_initializer.get_config()
    ),
    kernel_regularizer=head.kernel_regularizer,
    bias_regularizer=head.bias_regularizer,
    name='logits',
  )(features)
  model = tf.keras.Model(base.input, logits, name='resnet18_gn')
  return seed_initial_weights(model, seed)


def small_vgg(
  num_classes: int, seed: int, input_shape: Sequence[int] = (32, 32, 3)
) -> tf.keras.Model:
  """A small VGG-style CNN: two conv blocks (32, 64 filters) and dense 128.

  [conv 3x3x32, conv 3x3x32, max-pool] -> [conv 3x3x64, conv 3x3x64,
  max-pool] -> flatten -> dense 128 (ReLU) -> dense `num_classes` (logits).
  Much cheaper than ResNet-18 for CIFAR-100 experiments on CPUs.

  Args:
    num_classes: Number of output logits.
    seed: Seed of the initial weights.
    input_shape: ``(height, width, channels)`` of the (cropped) images.

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  seeds = _SeedStream(seed)
  conv = lambda filters: tf.keras.layers.Conv2D(
    filters, 3, padding='same', activation='relu', kernel_initializer=seeds.glorot()
  )
  inputs = tf.keras.Input(shape=tuple(input_shape), dtype=tf.float32)
  x = inputs
  for filters in (32, 64):
    x = conv(filters)(x)
    x = conv(filters)(x)
    x = tf.keras.layers.MaxPooling2D(pool_size=2)(x)
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(128, activation='relu', kernel_initializer=seeds.glorot())(x)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=seeds.glorot())(x)
  return tf.keras.Model(inputs, logits, name='small_vgg')


def dense_mlp(
  input_dim: int, num_classes: int, seed: int, hidden: Sequence[int] = (64,)
) -> tf.keras.Model:
  """A fully connected ReLU network (one hidden layer of 64 by default).

  Args:
    input_dim: Number of input features.
    num_classes: Number of output logits.
    seed: Seed of the initial weights.
    hidden: Widths of the hidden layers.

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, input_dim]`` to logits.
  """
  seeds = _SeedStream(seed)
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  x = inputs
  for width in hidden:
    x = tf.keras.layers.Dense(width, activation='relu', kernel_initializer=seeds.glorot())(x)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=seeds.glorot())(x)
  return tf.keras.Model(inputs, logits, name='dense_mlp')


def logistic_regression(input_dim: int, num_classes: int, seed: int) -> tf.keras.Model:
  """Multinomial logistic regression: one Dense layer, logits out.

  Args:
    input_dim: Number of input features.
    num_classes: Number of output logits.
    seed: Seed of the initial weights (Glorot-uniform kernel, zero bias).

  Returns:
    An uncompiled `tf.keras.Model` mapping ``float32[B, input_dim]`` to logits.
  """
  seeds = _SeedStream(seed)
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=seeds.glorot())(inputs)
  return tf.keras.Model(inputs, logits, name='logistic_regression')
