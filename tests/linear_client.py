"""A linear softmax model and its clients, shared by the probe tests (graph_probe, soft_labels).

`local_sgd` replicates the probes' local training in plain TensorFlow, the
independent oracle those tests compare against.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

INPUTS, CLASSES = 4, 3
BATCH_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, INPUTS], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def model_fn_with(activation=None):
  """A TFF model-function of Dense(CLASSES) (logits, or `activation`'s outputs)."""

  def model_fn():
    keras_model = tf.keras.Sequential(
      [tf.keras.Input(shape=(INPUTS,)), tf.keras.layers.Dense(CLASSES, activation=activation)]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=activation is None),
      input_spec=BATCH_SPEC,
    )

  return model_fn


def linear_weights(rng):
  return tff.learning.models.ModelWeights(
    trainable=[
      rng.normal(size=(INPUTS, CLASSES)).astype(np.float32),
      rng.normal(size=CLASSES).astype(np.float32),
    ],
    non_trainable=[],
  )


def client_arrays(rng, count):
  return (
    rng.normal(size=(count, INPUTS)).astype(np.float32),
    rng.integers(CLASSES, size=count).astype(np.int32),
  )


def dataset(x, y, batch_size=3):
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(batch_size)


def local_sgd(weights, x, y, learning_rate, batch_size=3):
  """A plain-TF replica of the probes' local training: SGD on the mean CE of each batch."""
  kernel = tf.Variable(weights.trainable[0])
  bias = tf.Variable(weights.trainable[1])
  for start in range(0, len(y), batch_size):
    xb, yb = x[start : start + batch_size], y[start : start + batch_size]
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=yb, logits=tf.matmul(xb, kernel) + bias
        )
      )
    for variable, gradient in zip((kernel, bias), tape.gradient(loss, (kernel, bias))):
      variable.assign_sub(learning_rate * gradient)
  return kernel.numpy(), bias.numpy()
