"""Model-based client features for FedGS's graph, computed once before training in TFF (a
functional embedding or an update sketch per client); ``docs/fedgs.md`` has the details."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import randomness
from tff_sampling import validation
from tff_sampling.learning import signals
from tff_sampling.samplers import base as samplers_base
from tff_sampling.task import Task

FEATURE_KINDS = ('functional', 'update_cosine')

# Stream id of `samplers_base.round_rng(seed, 0, stream)` for the noise batch
# (round 0 is never a training round; the program's shuffles use stream 1).
_NOISE_STREAM = 1001


check_positive_int = validation.positive_int


def noise_batch(validation_inputs: np.ndarray, batch_size: int, *, seed) -> np.ndarray:
  """Gaussian noise with the mean and covariance of a validation set.

  With ``X`` the ``n`` validation inputs flattened to ``[n, D]``, ``μ`` their
  mean and ``X_c = X − μ``, the sample covariance is
  ``Σ = X_cᵀ X_c / (n − 1)``. The noise is ``ε = μ + Z X_c / √(n − 1)`` with
  ``Z`` a ``[batch_size, n]`` standard normal matrix: each row is exactly
  ``N(μ, Σ)`` (a linear map of a Gaussian with ``E[ZᵀZ] = batch_size·I``),
  without forming or factorising the ``D × D`` matrix. A singular ``Σ`` (e.g.
  a pixel that is constant in every example, or ``n ≤ D``) needs no jitter:
  the noise then lies in the span of the centred examples, and constant
  coordinates stay exactly constant.

  Args:
    validation_inputs: ``float[n, ...]``, ``n ≥ 2`` real-valued model inputs
      (already preprocessed as the model sees them).
    batch_size: Number of noise examples (> 0).
    seed: Anything `np.random.default_rng` accepts (an int or a sequence of
      ints); the same seed gives the same batch.

  Returns:
    ``[batch_size, ...]`` noise of the input's shape and floating dtype.

  Raises:
    ValueError: For non-real (integer, boolean) inputs, e.g. character ids,
      for which a Gaussian is meaningless; for fewer than two examples,
      non-finite values or a non-positive `batch_size`.
  """
  batch_size = check_positive_int('batch_size', batch_size)
  inputs = np.asarray(validation_inputs)
  if not np.issubdtype(inputs.dtype, np.floating):
    raise ValueError(
      f'The functional graph feeds Gaussian noise to the model, so it needs '
      f'real-valued inputs; got inputs of dtype {inputs.dtype} (e.g. token ids). '
      "Use kind='update_cosine' or the 'oracle' features for this task."
    )
  if inputs.ndim < 1 or inputs.shape[0] < 2:
    raise ValueError(
      f'The noise moments need at least 2 validation examples, got inputs of shape '
      f'{inputs.shape}; pass more validation examples.'
    )
  if not np.all(np.isfinite(inputs)):
    raise ValueError(
      f'The validation inputs hold {int(np.size(inputs) - np.isfinite(inputs).sum())} '
      'non-finite values; clean the evaluation data or pass other examples.'
    )
  count = inputs.shape[0]
  flat = inputs.reshape(count, -1).astype(np.float64)
  mean = flat.mean(axis=0)
  centred = flat - mean
  rng = np.random.default_rng(seed)
  z = rng.standard_normal((batch_size, count))
  noise = mean + (z @ centred) / np.sqrt(count - 1)
  return noise.reshape((batch_size,) + inputs.shape[1:]).astype(inputs.dtype)


def oracle_features(task: Task) -> np.ndarray:
  """``float64[N, num_classes]``: each client's label distribution (the oracle).

  The oracle features of FedGS's simulations: label histograms normalised to
  sum to 1 (an empty client's row stays zero). Simulation only — a real
  server does not know its clients' labels.
  """
  histograms = np.asarray(task.client_label_histograms, np.float64)
  return histograms / np.maximum(histograms.sum(axis=1, keepdims=True), 1.0)


def check_client_learning_rate(value) -> float:
  """`value` as a float if it is a finite number >= 0, else a ValueError naming it."""
  if (
    isinstance(value, (bool, np.bool_))
    or not isinstance(value, (int, float, np.integer, np.floating))
    or not np.isfinite(value)
    or value < 0
  ):
    raise ValueError(f'client_learning_rate must be a finite number >= 0, got {value!r}.')
  return float(value)


def model_inputs_spec(batch_spec) -> tf.TensorSpec:
  """The model-input part (``x``) of a batch spec ``{x, y}`` or ``(x, y)``.

  Raises:
    ValueError: If the spec has no such part, or it is not a single tensor.
  """
  if isinstance(batch_spec, Mapping) and 'x' in batch_spec:
    spec = batch_spec['x']
  elif isinstance(batch_spec, (tuple, list)) and len(batch_spec) == 2:
    spec = batch_spec[0]
  else:
    raise ValueError(
      f'Cannot find the model inputs in the batch spec {batch_spec!r}; probes that '
      "feed inputs to the model need batches {'x': ..., 'y': ...} or (x, y)."
    )
  if not isinstance(spec, tf.TensorSpec):
    raise ValueError(
      f'Probes that feed inputs to the model need a single input tensor, got {spec!r}.'
    )
  return spec


def model_output_shape(
  model: tff.learning.models.VariableModel, inputs_spec: tf.TensorSpec
) -> tuple[tf.TensorShape, tf.TensorShape]:
  """``(example_shape, output_shape)`` of one example's input and model output.

  Runs the model once on a zero batch of one example (call it in a throwaway
  graph, as the model's variables are created there).

  Raises:
    ValueError: If either shape is not fully known.
  """
  example_shape = inputs_spec.shape[1:]
  if not example_shape.is_fully_defined():
    raise ValueError(f'The probe needs a fixed model input shape, got {inputs_spec.shape}.')
  output = model.predict_on_batch(
    tf.zeros([1] + example_shape.as_list(), inputs_spec.dtype), training=False
  )
  output_shape = tf.TensorShape(output.shape[1:])
  if not output_shape.is_fully_defined():
    raise ValueError(f'The model output has an unknown shape {output.shape}.')
  return example_shape, output_shape


def assign_model_weights(model: tff.learning.models.VariableModel, weights) -> None:
  """Sets `model`'s variables to `weights` (a `ModelWeights` structure)."""
  tf.nest.map_structure(
    lambda v, t: v.assign(t), tff.learning.models.ModelWeights.from_model(model), weights
  )


def local_sgd(
  model: tff.learning.models.VariableModel, weights, dataset: tf.data.Dataset, learning_rate: float
) -> tf.Tensor:
  """Plain local SGD from `weights` over `dataset`; call inside a `tf.function`.

  Sets `model`'s variables to `weights`, then for every batch takes one step
  ``w ← w − learning_rate · ∇loss`` on the trainable variables (the model's
  ``forward_pass(batch, training=True)`` loss). The model is left holding the
  locally trained weights.

  Returns:
    ``float32[D]``: the flattened trainable update ``global − local`` (TFF's
    model-delta sign convention).
  """
  assign_model_weights(model, weights)
  trainable = tf.nest.flatten(tff.learning.models.ModelWeights.from_model(model).trainable)
  for batch in iter(dataset):
    with tf.GradientTape() as tape:
      loss = model.forward_pass(batch, training=True).loss
    for variable, gradient in zip(trainable, tape.gradient(loss, trainable)):
      if gradient is not None:
        variable.assign_sub(tf.cast(learning_rate, variable.dtype) * gradient)
  return tf.concat(
    [
      tf.reshape(tf.cast(new - old, tf.float32), [-1])
      for new, old in zip(tf.nest.flatten(weights.trainable), trainable)
    ],
    0,
  )


class ProbeTypes(NamedTuple):
  """The TFF types of a probe of one model (`probe_types`)."""

  weights: tff.Type  # W, the model weights.
  data: tff.SequenceType  # B*, a client's training data.
  client_data: tff.Type  # `signals.client_data` structs over B*.
  read_meta: tff.Computation  # Reads a client's <slot, weight> (`signals.slot_client_data`).
  inputs: tff.TensorType | None  # X = dtype[?, *input_shape], a batch of model inputs.
  output_shape: tf.TensorShape | None  # The model's output for one example.

  def federated_parameters(self) -> list[tff.FederatedType]:
    """The probe's parameters: ``W@SERVER``, ``X@SERVER`` (if any), the client data @CLIENTS."""
    server = [self.weights] if self.inputs is None else [self.weights, self.inputs]
    clients = tff.FederatedType(self.client_data, tff.CLIENTS)
    return [tff.FederatedType(t, tff.SERVER) for t in server] + [clients]


def probe_types(model_fn, *, model_inputs: bool, check_inputs=None) -> ProbeTypes:
  """The types of a probe of `model_fn`'s model, ``X`` and its output only with `model_inputs`.

  `check_inputs`, if given, is called on the model's input spec before the
  model runs (to raise a ValueError for inputs the probe cannot use).
  """
  with tf.Graph().as_default():  # Keep the probe model's variables out of the eager context.
    model = model_fn()
    batch_spec = model.input_spec
    weights_type = tff.learning.models.weights_type_from_model(model)
    inputs_type = output_shape = None
    if model_inputs:
      inputs_spec = model_inputs_spec(batch_spec)
      if check_inputs is not None:
        check_inputs(inputs_spec)
      example_shape, output_shape = model_output_shape(model, inputs_spec)
      inputs_type = tff.TensorType(
        inputs_spec.dtype.as_numpy_dtype, [None] + example_shape.as_list()
      )
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(batch_spec))
  client_data_type, read_meta = signals.slot_client_data(data_type)
  return ProbeTypes(weights_type, data_type, client_data_type, read_meta, inputs_type, output_shape)


def on_fresh_model(model_fn, probe_fn, *args):
  """``probe_fn(model, *args)`` in a `tf.function` on a fresh model; call in a computation."""
  model = model_fn()

  @tf.function
  def run(*args):
    return probe_fn(model, *args)

  return run(*args)


def build_graph_probe(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  *,
  client_learning_rate: float,
  sketch_size: int,
  sketch_seed: int = 0,
  with_embedding: bool = True,
) -> tff.Computation:
  """The federated computation giving every client's graph features by slot.

  With ``with_embedding=True`` its type signature is

      (<W@SERVER, X@SERVER, {<data=B*, meta=<slot=int32,weight=float32>*>}@CLIENTS>
       -> <embedding=float32[?, E], update_sketch=float32[?, d]>@SERVER)

  where ``W`` is the model-weights type, ``X = float32[?, *input_shape]`` the
  noise batch (`noise_batch`), ``E`` the number of entries of one example's
  model output and ``d = sketch_size``; with ``with_embedding=False`` (update
  sketches only, e.g. for integer-input models) it is
  ``(<W@SERVER, {…}@CLIENTS> -> <update_sketch=float32[?, d]>@SERVER)``. The
  client data are `tff_sampling.learning.signals.client_data` structs (the
  weight is ignored). Every client starts from the broadcast weights and runs
  plain SGD (``w ← w − client_learning_rate · ∇loss``, the model's
  ``forward_pass`` loss) over its whole dataset; it then reports

  * ``embedding``: the mean over the noise batch of its locally trained
    model's ``predict_on_batch(noise, training=False)``, flattened;
  * ``update_sketch``: the count sketch (`signals.count_sketch_tf`, seed
    `sketch_seed`) of ``global − local`` trainable weights, flattened.

  Row ``k`` of each result is the client in slot ``k`` (slots ``0..cohort−1``,
  each once). A client whose local model becomes non-finite reports zero rows
  (as TFF's model-delta client work zeroes such an update). The server sees
  every row individually (no secure aggregation).

  Args:
    model_fn: Builds a fresh `tff.learning.models.VariableModel`.
    client_learning_rate: Local SGD step size (≥ 0; 0 leaves the global model,
      so every embedding is the global model's and every sketch zero).
    sketch_size: ``d``, the length of each update sketch (> 0).
    sketch_seed: Seed of the sketch's hash and sign functions.
    with_embedding: Whether to broadcast a noise batch and return embeddings.

  Returns:
    The `tff.Computation`.

  Raises:
    ValueError: For a negative or non-finite learning rate, a non-positive
      `sketch_size`, or (with embeddings) a model whose input is not a single
      real-valued tensor of known shape.
  """
  learning_rate = check_client_learning_rate(client_learning_rate)
  sketch_size = check_positive_int('sketch_size', sketch_size)
  types = probe_types(model_fn, model_inputs=with_embedding, check_inputs=_check_real_inputs)
  embedding_size = None if types.output_shape is None else types.output_shape.num_elements()

  def local_probe(model, weights, dataset, noise):
    """Local SGD from `weights`, then (embedding or None, sketch); zeros if non-finite."""
    update = local_sgd(model, weights, dataset, learning_rate)
    finite = tf.reduce_all(tf.math.is_finite(update))
    embedding = None
    if noise is not None:
      outputs = tf.cast(model.predict_on_batch(noise, training=False), tf.float32)
      embedding = tf.reshape(tf.reduce_mean(outputs, axis=0), [embedding_size])
      finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(embedding)))
      embedding = tf.where(finite, embedding, tf.zeros_like(embedding))
    sketch = signals.count_sketch_tf(
      tf.where(finite, update, tf.zeros_like(update)), sketch_size, sketch_seed
    )
    return embedding, sketch

  if embedding_size is not None:
    return _embedding_probe(model_fn, types, local_probe, embedding_size, sketch_size)
  return _sketch_probe(model_fn, types, local_probe, sketch_size)


def _check_real_inputs(inputs_spec: tf.TensorSpec) -> None:
  """A ValueError unless the model's inputs are real-valued (they receive Gaussian noise)."""
  if not inputs_spec.dtype.is_floating:
    raise ValueError(
      f'The functional graph feeds Gaussian noise to the model, whose input has '
      f'dtype {inputs_spec.dtype.name}; it needs real-valued inputs. Use '
      "kind='update_cosine' or the 'oracle' features for this model."
    )


def _sketch_probe(model_fn, types: ProbeTypes, local_probe, sketch_size: int) -> tff.Computation:
  """`build_graph_probe` without embeddings: ``<W, {…}> -> <update_sketch>``."""

  @tff.tensorflow.computation(types.weights, types.data)
  def client_sketch(weights, dataset):
    return on_fresh_model(model_fn, local_probe, weights, dataset, None)[1]

  @tff.federated_computation(*types.federated_parameters())
  def sketch_probe(weights, data):
    sketches = tff.federated_map(client_sketch, (tff.federated_broadcast(weights), data.data))
    meta = tff.federated_map(types.read_meta, data.meta)
    return tff.federated_zip(
      collections.OrderedDict(
        update_sketch=signals.gather_by_slot(meta.slot, sketches, sketch_size)
      )
    )

  return sketch_probe


def _embedding_probe(
  model_fn, types: ProbeTypes, local_probe, embedding_size: int, sketch_size: int
) -> tff.Computation:
  """`build_graph_probe` with embeddings: ``<W, X, {…}> -> <embedding, update_sketch>``."""

  @tff.tensorflow.computation(types.weights, types.data, types.inputs)
  def client_probe(weights, dataset, noise):
    embedding, sketch = on_fresh_model(model_fn, local_probe, weights, dataset, noise)
    return collections.OrderedDict(embedding=embedding, update_sketch=sketch)

  @tff.federated_computation(*types.federated_parameters())
  def probe(weights, noise, data):
    outputs = tff.federated_map(
      client_probe, (tff.federated_broadcast(weights), data.data, tff.federated_broadcast(noise))
    )
    meta = tff.federated_map(types.read_meta, data.meta)
    return tff.federated_zip(
      collections.OrderedDict(
        embedding=signals.gather_by_slot(meta.slot, outputs.embedding, embedding_size),
        update_sketch=signals.gather_by_slot(meta.slot, outputs.update_sketch, sketch_size),
      )
    )

  return probe


def validation_inputs(task: Task, count: int) -> np.ndarray:
  """The first `count` model inputs of the task's evaluation data, preprocessed.

  Taken from ``task.preprocess_eval(task.eval_data)`` (so e.g. reshaped as the
  model sees them); fewer when the evaluation data are smaller.
  """
  count = check_positive_int('validation_examples', count)
  parts, taken = [], 0
  for batch in task.preprocess_eval(task.eval_data):
    inputs = batch['x'] if isinstance(batch, Mapping) else batch[0]
    parts.append(np.asarray(inputs)[: count - taken])
    taken += parts[-1].shape[0]
    if taken >= count:
      break
  if not parts:
    raise ValueError(f'Task {task.name!r} has no evaluation data to draw the noise moments from.')
  return np.concatenate(parts)


def check_chunk_and_steps(chunk_size, client_steps) -> tuple[int, int | None]:
  """`chunk_size` and `client_steps` (None, or the fixed local steps) checked as positive ints."""
  chunk_size = check_positive_int('chunk_size', chunk_size)
  if client_steps is not None:
    client_steps = check_positive_int('client_steps', client_steps)
  return chunk_size, client_steps


def probe_population(task: Task, probe, server_values, seed, chunk_size, *, steps=None, passes=1):
  """``probe(*server_values, data)`` for each chunk of clients; see `client_graph_features`.

  Each client's round-0 stream is cut to `steps` batches if set, else repeated `passes` times.
  """

  def stream(client):
    shuffle_seed = randomness.client_shuffle_seed(seed, 0, client)
    if steps is not None:
      return task.client_dataset(client, shuffle_seed, steps=steps)
    dataset = task.client_dataset(client, shuffle_seed)
    return dataset.repeat(passes) if passes > 1 else dataset

  outputs = []
  for start in range(0, task.num_clients, chunk_size):
    clients = range(start, min(start + chunk_size, task.num_clients))
    data = signals.selection_client_data([stream(c) for c in clients], [1.0] * len(clients))
    outputs.append(probe(*server_values, data))
  return outputs


def client_graph_features(
  task: Task,
  *,
  kind: str,
  model_weights: tff.learning.models.ModelWeights,
  client_learning_rate: float,
  seed: int,
  client_steps: int | None = None,
  client_epochs: int | None = None,
  client_batch_size: int | None = None,
  sketch_size: int = 1024,
  sketch_seed: int = 0,
  validation_examples: int = 256,
  noise_batch_size: int = 128,
  chunk_size: int = 32,
) -> np.ndarray:
  """Model-based FedGS features of **all** clients of `task` (see the module docstring).

  Runs `build_graph_probe` over clients ``0..N−1`` in chunks of `chunk_size`
  (slots ``0..chunk−1`` per TFF call). Client ``c`` trains on
  ``task.client_dataset(c, randomness.client_shuffle_seed(seed, 0, c),
  steps=client_steps)``: the stream the program loop would give it (pass the
  run's ``RunConfig.client_steps``), with the task's batching and epochs,
  shuffled as for round 0 (a round in which nobody trains). For
  ``'functional'``, the noise is `noise_batch` of the first
  `validation_examples` preprocessed evaluation inputs, drawn with
  ``samplers_base.round_rng(seed, 0, 1001)``. Deterministic given the
  arguments.

  Cost: every client trains once (a full round of local work for the whole
  population) and, for ``'functional'``, predicts once on the noise batch.

  Args:
    task: The task.
    kind: ``'functional'`` (mean embeddings, ``F = E``) or
      ``'update_cosine'`` (update sketches, ``F = sketch_size``). The
      ``'oracle'`` features are `oracle_features`.
    model_weights: The global model to start from (e.g.
      ``task.initial_model_weights(seed)``).
    client_learning_rate: Local SGD step size (≥ 0).
    seed: The run's seed (client shuffles and noise).
    client_steps: If set, every client takes exactly this many local batches
      (`Task.client_dataset`'s ``steps``), as the program does with
      ``RunConfig.client_steps``; ``None`` keeps the task's epochs.
    client_epochs: Optional check: the task's datasets already carry its
      ``client_epochs`` option; a different value is an error.
    client_batch_size: Optional check, like `client_epochs`.
    sketch_size: Update-sketch length for ``'update_cosine'``.
    sketch_seed: Seed of the sketch's hash functions.
    validation_examples: Evaluation examples whose moments the noise takes.
    noise_batch_size: Noise examples per batch.
    chunk_size: Clients per TFF call (memory vs. call overhead).

  Returns:
    ``float64[N, F]``, row ``i`` for ``task.client_ids[i]``. A client whose
    local model became non-finite has a zero row (logged as a warning).

  Raises:
    ValueError: For an unknown `kind`, an integer-input task with
      ``'functional'``, epochs or batch size that differ from the task's, or
      invalid sizes.
  """
  _check_feature_options(task, kind, client_epochs, client_batch_size)
  chunk_size, client_steps = check_chunk_and_steps(chunk_size, client_steps)
  functional = kind == 'functional'
  noise = _probe_noise(task, seed, validation_examples, noise_batch_size) if functional else None
  probe = build_graph_probe(
    task.model_fn,
    client_learning_rate=client_learning_rate,
    sketch_size=sketch_size,
    sketch_seed=sketch_seed,
    with_embedding=functional,
  )
  server_values = (model_weights, noise) if functional else (model_weights,)
  outputs = probe_population(task, probe, server_values, seed, chunk_size, steps=client_steps)
  key = 'embedding' if functional else 'update_sketch'
  features = np.concatenate([np.asarray(output[key], np.float64) for output in outputs])
  _warn_zero_features(task, kind, features, client_learning_rate)
  return features


def _check_feature_options(task: Task, kind: str, client_epochs, client_batch_size) -> None:
  """A ValueError for an unknown `kind`, or client epochs or batch size other than the task's."""
  if kind not in FEATURE_KINDS:
    raise ValueError(
      f'kind must be one of {list(FEATURE_KINDS)}, got {kind!r} (the oracle features '
      'come from oracle_features(task)).'
    )
  for name, value in (('client_epochs', client_epochs), ('client_batch_size', client_batch_size)):
    if value is not None and task.options.get(name) != value:
      raise ValueError(
        f"{name}={value!r} differs from the task's {name}={task.options.get(name)!r}, "
        f'which its client datasets already apply; build the task with {name}={value!r} '
        'or leave this argument out.'
      )


def _probe_noise(task: Task, seed: int, validation_examples, noise_batch_size) -> np.ndarray:
  """The noise batch of the functional features (see `client_graph_features`)."""
  inputs = validation_inputs(task, validation_examples)
  return noise_batch(inputs, noise_batch_size, seed=samplers_base.round_rng(seed, 0, _NOISE_STREAM))


def _warn_zero_features(task: Task, kind: str, features: np.ndarray, client_learning_rate) -> None:
  """Logs clients with all-zero features (every sketch is zero for a learning rate of 0)."""
  zero = np.flatnonzero(~features.any(axis=1))
  if zero.size and client_learning_rate > 0:
    logging.warning(
      '%d of %d clients have all-zero %s features (a non-finite local model, or, '
      'for update sketches, no training data), e.g. %s; lower the client '
      'learning rate if local training diverged.',
      zero.size,
      task.num_clients,
      kind,
      task.client_ids[zero[0]],
    )
