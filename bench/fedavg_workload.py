"""The workload of the FedAvg-round benchmark and the plain-TF loop it is compared with:
client sizes and synthetic (or real LEAF FEMNIST) client arrays, the models, and `PlainFedAvg`, the
same SGD steps and example-weighted average written as a plain TensorFlow loop."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import leaf_json
from tasks import models
from tff_sampling.learning import fedavg

NUM_CLASSES = 10
FEMNIST_CLASSES = 62
# The benchmark's models: the McMahan CNN and the small models of the papers' FEMNIST runs
# (the 2NN; LEFL's 784-128 FFNN; logistic regression, a dense layer on the pixels).
MODELS: dict[str, Callable[[int, int], tf.keras.Model]] = {
  'cnn': models.mcmahan_cnn,
  '2nn': models.mcmahan_2nn,
  'ffnn': models.image_ffnn,
  'logreg': lambda num_classes, seed: models.image_ffnn(num_classes, seed, hidden=()),
}


IMAGE_SHAPE = (28, 28, 1)


def client_sizes(num_clients: int, total_examples: int, seed: int) -> np.ndarray:
  """Unequal client sizes: seeded lognormal draws rescaled to sum to `total_examples`.

  Every client gets at least one example; rounding leftovers go to the
  largest clients so that the sum is exact.
  """
  rng = np.random.default_rng([seed, 0])
  raw = rng.lognormal(mean=0.0, sigma=0.8, size=num_clients)
  sizes = np.maximum(1, np.floor(raw / raw.sum() * total_examples)).astype(np.int64)
  order = np.argsort(-sizes, kind='stable')
  surplus = int(total_examples - sizes.sum())
  step = 1 if surplus > 0 else -1
  position = 0
  while surplus != 0:
    client = order[position % num_clients]
    if sizes[client] + step >= 1:
      sizes[client] += step
      surplus -= step
    position += 1
  return sizes


def synthetic_client_arrays(
  sizes: Sequence[int], seed: int
) -> list[collections.OrderedDict[str, np.ndarray]]:
  """FEMNIST-shaped examples per client: ``x`` float32[n, 28, 28, 1] in [0, 1], ``y`` int32[n].

  Each label has a sparse prototype (a fifth of the pixels lit, like pen
  strokes on a blank page); an example is its label's prototype plus Gaussian
  noise, clipped to [0, 1]. The labels are learnable, so the loss falls during
  the round as it would on real digits.
  """
  rng = np.random.default_rng([seed, 1])
  lit = rng.uniform(size=(NUM_CLASSES, *IMAGE_SHAPE)) < 0.2
  prototypes = (lit * rng.uniform(0.5, 1.0, size=lit.shape)).astype(np.float32)
  arrays = []
  for size in sizes:
    labels = rng.integers(0, NUM_CLASSES, size=int(size)).astype(np.int32)
    noise = rng.normal(0.0, 0.2, size=(int(size), *IMAGE_SHAPE)).astype(np.float32)
    images = np.clip(prototypes[labels] + noise, 0.0, 1.0)
    arrays.append(collections.OrderedDict(x=images, y=labels))
  return arrays


def leaf_client_arrays(
  directory: str, num_clients: int
) -> list[collections.OrderedDict[str, np.ndarray]]:
  """The training examples of the first `num_clients` writers (by id) of a LEAF FEMNIST
  directory, shaped as `synthetic_client_arrays` (62 labels)."""
  writers = leaf_json.read_leaf(directory, 'femnist')['train']
  if num_clients > len(writers):
    raise ValueError(
      f'{directory} holds {len(writers)} writers, fewer than --clients={num_clients}; '
      f'choose --clients <= {len(writers)}.'
    )
  return [
    collections.OrderedDict(x=w['pixels'][..., np.newaxis], y=w['label'])
    for w in list(writers.values())[:num_clients]
  ]


def client_datasets(
  arrays: Sequence[Mapping[str, np.ndarray]], batch_size: int
) -> list[tf.data.Dataset]:
  """One batched, unshuffled dataset per client (the same batches for both sides)."""
  return [
    tf.data.Dataset.from_tensor_slices(collections.OrderedDict(a)).batch(batch_size) for a in arrays
  ]


def loss_fn() -> tf.keras.losses.Loss:
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def tff_model_fn(
  element_spec, seed: int, model: str = 'cnn', num_classes: int = NUM_CLASSES
) -> Callable[[], tff.learning.models.VariableModel]:
  """Builds the benchmark's TFF model: `MODELS[model]` with seeded initial weights."""

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
      MODELS[model](num_classes, seed), loss=loss_fn(), input_spec=element_spec
    )

  return model_fn


class Workload:
  """Synthetic clients (`client_sizes`, batched `client_datasets`), the CNN's model function
  and TFF's FedAvg round over them (client SGD 0.1), built once for every benchmark of the
  suite that runs it."""

  def __init__(self, num_clients: int, total_examples: int, seed: int, batch_size: int):
    self.client_sizes = client_sizes(num_clients, total_examples, seed)
    self.datasets = client_datasets(synthetic_client_arrays(self.client_sizes, seed), batch_size)
    self.model_fn = tff_model_fn(self.datasets[0].element_spec, seed)

  @functools.cached_property
  def process(self) -> tff.learning.templates.LearningProcess:
    return fedavg.build_fed_avg(self.model_fn, client_learning_rate=0.1)


class PlainFedAvg:
  """Example-weighted FedAvg as a plain TensorFlow loop over one Keras model.

  The global model, the weighted sum of client deltas and the sum of weights
  live in variables. Per client, one compiled function assigns the global
  weights to the model, runs every SGD step over the client's dataset in a
  graph loop (no Python per step), and adds ``n_k * (w_global - w_k)`` to the
  sum; a second compiled function applies the server SGD step to the weighted
  mean delta and clears the sums. The same arithmetic as TFF's
  ``build_weighted_fed_avg`` with ``build_sgdm`` (no momentum) on both sides.

  The loop iterates ``iter(dataset)``, which AutoGraph compiles to a
  ``while_loop`` over an iterator; ``for batch in dataset`` would compile to a
  ``Dataset.scan``/``reduce`` whose body runs inside tf.data, which measured
  ~1.4x slower on this model on a 2-core CPU (the same difference as TFF's
  ``DATASET_ITERATOR`` vs ``DATASET_REDUCE``). This is the faster of the two,
  so the ratio is against the best plain loop.
  """

  def __init__(
    self, keras_model: tf.keras.Model, *, client_learning_rate: float, server_learning_rate: float
  ):
    self._model = keras_model
    self.loss_fn = loss_fn()
    self._client_lr = tf.constant(client_learning_rate, tf.float32)
    self._server_lr = tf.constant(server_learning_rate, tf.float32)
    self._local = list(keras_model.trainable_variables)
    self._global = [tf.Variable(v, trainable=False) for v in self._local]
    self._delta_sum = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self._local]
    self._weight_sum = tf.Variable(0.0, trainable=False)
    self._client_update = tf.function(self._client_update_fn)
    self._server_update = tf.function(self._server_update_fn)

  def _client_update_fn(self, dataset: tf.data.Dataset) -> tf.Tensor:
    for local, global_ in zip(self._local, self._global):
      local.assign(global_)
    num_examples = tf.constant(0, tf.int64)
    for batch in iter(dataset):
      with tf.GradientTape() as tape:
        logits = self._model(batch['x'], training=True)
        loss = self.loss_fn(batch['y'], logits)
      gradients = tape.gradient(loss, self._local)
      for variable, gradient in zip(self._local, gradients):
        variable.assign_sub(self._client_lr * gradient)
      num_examples += tf.shape(batch['y'], out_type=tf.int64)[0]
    weight = tf.cast(num_examples, tf.float32)
    for delta_sum, global_, local in zip(self._delta_sum, self._global, self._local):
      delta_sum.assign_add(weight * (global_ - local))
    self._weight_sum.assign_add(weight)
    return num_examples

  def _server_update_fn(self) -> None:
    for global_, delta_sum in zip(self._global, self._delta_sum):
      global_.assign_sub(self._server_lr * delta_sum / self._weight_sum)
      delta_sum.assign(tf.zeros_like(delta_sum))
    self._weight_sum.assign(0.0)

  def set_global_weights(self, weights: Sequence[np.ndarray]) -> None:
    if len(weights) != len(self._global):
      raise ValueError(f'Expected {len(self._global)} weight arrays, got {len(weights)}.')
    for variable, value in zip(self._global, weights):
      variable.assign(value)

  def global_weights(self) -> list[np.ndarray]:
    return [v.numpy() for v in self._global]

  @property
  def client_update_tracing_count(self) -> int:
    """Times the client update was traced (1 if every client reused one graph)."""
    return self._client_update.experimental_get_tracing_count()

  def run_round(self, datasets: Sequence[tf.data.Dataset]) -> None:
    for dataset in datasets:
      self._client_update(dataset)
    self._server_update()
