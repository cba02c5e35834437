"""LEFL's pre-processing round in TFF: every client trains locally and uploads its soft labels
on a public dataset, once; ``docs/lefl.md`` has the details."""

from __future__ import annotations

from collections.abc import Callable
import functools

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling.learning import graph_probe
from tff_sampling.task import Task

MODEL_OUTPUTS = ('logits', 'probabilities')


def _gather_flat_by_slot(slots, values, row_shape: tf.TensorShape):
  """Stacks client-placed ``float32[?]`` rows into ``float32[cohort, ?, *row_shape]`` @SERVER.

  Like `signals.gather_by_slot`, for rows whose length (a multiple of
  ``row_shape``'s size) is only known at run time: every client's flattened
  ``[P, *row_shape]`` value is appended to one flat accumulator, and the
  report scatters the rows to their slots and restores the shape.

  Args:
    slots: ``{int32}@CLIENTS``, each client's cohort slot (0..cohort−1, each once).
    values: ``{float32[?]}@CLIENTS``, the flattened ``[P, *row_shape]`` values
      (the same ``P`` for every client).
    row_shape: The fixed trailing shape of each value.

  Returns:
    ``float32[cohort, P, *row_shape]@SERVER``; row ``k`` is the value of the
    client in slot ``k``.
  """
  row_size = row_shape.num_elements()
  slots_type = tff.TensorType(np.int32, [None])
  flat_type = tff.TensorType(np.float32, [None])

  @tff.tensorflow.computation
  def zero():
    return (tf.zeros([0], tf.int32), tf.zeros([0], tf.float32))

  @tff.tensorflow.computation((slots_type, flat_type), (tff.TensorType(np.int32), flat_type))
  def accumulate(accumulator, value):
    return (tf.concat([accumulator[0], [value[0]]], 0), tf.concat([accumulator[1], value[1]], 0))

  @tff.tensorflow.computation((slots_type, flat_type), (slots_type, flat_type))
  def merge(a, b):
    return (tf.concat([a[0], b[0]], 0), tf.concat([a[1], b[1]], 0))

  @tff.tensorflow.computation((slots_type, flat_type))
  def report(accumulator):
    slots, flat = accumulator
    count = tf.shape(slots)[0]
    width = tf.size(flat) // tf.maximum(count, 1)
    rows = tf.reshape(flat, tf.stack([count, width]))
    # Every slot 0..cohort-1 arrives exactly once; the scatter orders rows by slot.
    ordered = tf.scatter_nd(tf.expand_dims(slots, 1), rows, tf.stack([count, width]))
    return tf.reshape(ordered, [-1, width // row_size] + row_shape.as_list())

  return tff.federated_aggregate(
    tff.federated_zip((slots, values)), zero(), accumulate, merge, report
  )


def build_soft_label_probe(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  *,
  client_learning_rate: float,
  model_outputs: str = 'logits',
) -> tff.Computation:
  """The federated computation of LEFL's pre-processing round for one cohort.

  Its type signature is

      (<W@SERVER, X@SERVER, {<data=B*, meta=<slot=int32,weight=float32>*>}@CLIENTS>
       -> float32[?, P, C]@SERVER)

  where ``W`` is the model-weights type, ``X = dtype[?, *input_shape]`` the
  public batch of ``P`` examples (the model's input dtype and example shape;
  ``P`` is known at run time only, so the result's type reads
  ``float32[?, ?, C]``) and ``C`` the model's output per example (the number
  of classes; a model with a multi-dimensional output ``O`` per example, e.g.
  a character model's ``[L, V]``, gives ``float32[?, P, *O]``). The client data
  are `tff_sampling.learning.signals.client_data` structs (the weight is
  ignored). Every client starts from the broadcast weights and runs plain SGD
  (``w ← w − client_learning_rate · ∇loss``, the model's ``forward_pass``
  loss, one step per batch) over its whole dataset, then reports
  ``softmax(predict_on_batch(X, training=False))`` over the last axis
  (`model_outputs`). Row ``k`` of the result is the client in slot ``k``
  (slots ``0..cohort−1``, each once).

  A client whose local model becomes non-finite reports the broadcast
  model's soft labels instead: TFF's model-delta client work zeroes such an
  update, and a zero update leaves the global model. (So does a client with
  no data.) The server sees every row individually (no secure aggregation).

  Args:
    model_fn: Builds a fresh `tff.learning.models.VariableModel`.
    client_learning_rate: Local SGD step size (≥ 0; 0 leaves the global model,
      so every client reports the global model's soft labels).
    model_outputs: ``'logits'`` (the default; the tasks' models output logits)
      to apply a softmax, or ``'probabilities'`` for a model whose outputs are
      already probabilities (they are returned as they are).

  Returns:
    The `tff.Computation`.

  Raises:
    ValueError: For a negative or non-finite learning rate, an unknown
      `model_outputs`, or a model whose input is not a single tensor of known
      shape.
  """
  learning_rate = graph_probe.check_client_learning_rate(client_learning_rate)
  if model_outputs not in MODEL_OUTPUTS:
    raise ValueError(
      f'model_outputs must be one of {list(MODEL_OUTPUTS)}, got {model_outputs!r}: '
      "'logits' for models whose loss takes logits (from_logits=True), "
      "'probabilities' for models that end in a softmax."
    )
  types = graph_probe.probe_types(model_fn, model_inputs=True)
  local_soft_labels = functools.partial(
    _local_soft_labels, learning_rate=learning_rate, model_outputs=model_outputs
  )

  @tff.tensorflow.computation(types.weights, types.data, types.inputs)
  def client_soft_labels_fn(weights, dataset, public):
    return graph_probe.on_fresh_model(model_fn, local_soft_labels, weights, dataset, public)

  @tff.federated_computation(*types.federated_parameters())
  def probe(weights, public, data):
    soft_labels = tff.federated_map(
      client_soft_labels_fn,
      (tff.federated_broadcast(weights), data.data, tff.federated_broadcast(public)),
    )
    meta = tff.federated_map(types.read_meta, data.meta)
    return _gather_flat_by_slot(meta.slot, soft_labels, types.output_shape)

  return probe


def _probabilities(model, inputs, model_outputs: str) -> tf.Tensor:
  """The model's ``float32`` probabilities on `inputs` (a softmax of its logits, by default)."""
  outputs = tf.cast(model.predict_on_batch(inputs, training=False), tf.float32)
  return tf.nn.softmax(outputs, axis=-1) if model_outputs == 'logits' else outputs


def _local_soft_labels(model, weights, dataset, public, *, learning_rate, model_outputs):
  """A client's flattened soft labels after `graph_probe.local_sgd`; call in a `tf.function`.

  The broadcast model's soft labels if the local model is non-finite.
  """
  update = graph_probe.local_sgd(model, weights, dataset, learning_rate)
  local = _probabilities(model, public, model_outputs)
  finite = tf.logical_and(
    tf.reduce_all(tf.math.is_finite(update)), tf.reduce_all(tf.math.is_finite(local))
  )

  def global_probabilities():
    graph_probe.assign_model_weights(model, weights)
    return _probabilities(model, public, model_outputs)

  soft_labels = tf.cond(finite, lambda: local, global_probabilities)
  return tf.reshape(soft_labels, [-1])


def _task_model_outputs(task: Task) -> str:
  """``'probabilities'`` if the task's loss takes probabilities, else ``'logits'``."""
  loss = task.loss_fn()
  config = loss.get_config() if hasattr(loss, 'get_config') else {}
  return 'probabilities' if config.get('from_logits') is False else 'logits'


def check_public_inputs(task: Task, public_inputs) -> np.ndarray:
  """`public_inputs` as an array of the task's model-input dtype, or a ValueError.

  Args:
    task: The task whose model the inputs are for.
    public_inputs: ``[P, *input_shape]`` inputs, ``P ≥ 1``, where
      ``input_shape`` is the task's ``element_spec`` ``x`` without the batch
      dimension. Real-valued for real-valued inputs (cast to the model's float
      dtype, all finite); integers (token ids) for integer inputs.

  Raises:
    ValueError: For a wrong shape (naming both shapes), no examples, a dtype
      the model cannot take, or non-finite values.
  """
  spec = graph_probe.model_inputs_spec(task.element_spec)
  example_shape = tuple(spec.shape[1:].as_list())
  inputs = np.asarray(public_inputs)
  if inputs.ndim < 1 or tuple(inputs.shape[1:]) != example_shape:
    raise ValueError(
      f'public_inputs of shape {inputs.shape} do not fit task {task.name!r}, whose model '
      f'takes examples of shape {example_shape} (batches {spec.shape}); pass '
      f'[num_examples, {", ".join(map(str, example_shape))}] inputs, e.g. from '
      'tasks.public.public_inputs(task, ...).'
    )
  if inputs.shape[0] == 0:
    raise ValueError('public_inputs hold no examples; pass at least one.')
  if spec.dtype.is_floating:
    if not (np.issubdtype(inputs.dtype, np.floating) or np.issubdtype(inputs.dtype, np.integer)):
      raise ValueError(
        f'public_inputs of dtype {inputs.dtype} cannot feed task {task.name!r}, whose '
        f'model takes {spec.dtype.name} inputs; pass real-valued inputs.'
      )
    inputs = inputs.astype(spec.dtype.as_numpy_dtype)
    if not np.all(np.isfinite(inputs)):
      raise ValueError(
        f'public_inputs hold {int(inputs.size - np.isfinite(inputs).sum())} non-finite '
        'values; pass finite inputs.'
      )
  else:
    if not np.issubdtype(inputs.dtype, np.integer):
      raise ValueError(
        f'public_inputs of dtype {inputs.dtype} cannot feed task {task.name!r}, whose '
        f'model takes {spec.dtype.name} inputs (token ids); pass integer inputs.'
      )
    inputs = inputs.astype(spec.dtype.as_numpy_dtype)
  return inputs


def client_soft_labels(
  task: Task,
  *,
  public_inputs: np.ndarray,
  model_weights: tff.learning.models.ModelWeights,
  client_learning_rate: float,
  seed: int,
  pretrain_epochs: int = 1,
  client_steps: int | None = None,
  chunk_size: int = 32,
) -> np.ndarray:
  """LEFL's soft labels of **all** clients of `task` (see the module docstring).

  Runs `build_soft_label_probe` over clients ``0..N−1`` in chunks of
  `chunk_size` (slots ``0..chunk−1`` per TFF call). Client ``c`` trains on
  the stream the program loop would give it in round 0 (a round in which
  nobody trains): ``task.client_dataset(c, randomness.client_shuffle_seed(seed,
  0, c))``, the task's batching, ``client_epochs`` and seeded shuffle,

  * repeated `pretrain_epochs` times (``E_p`` passes over that stream; each
    pass reshuffles, deterministically, and may end in a smaller batch; with
    the task's ``client_epochs = e`` that is ``E_p · e`` epochs of data), or,
  * with `client_steps` set (the program's fixed local steps per round), cut
    to exactly ``E_p · client_steps`` batches of the cycled stream
    (`Task.client_dataset`'s ``steps``): ``E_p`` rounds' worth of fixed-step
    local work, so just `client_steps` batches with the default ``E_p = 1``.

  Whether the model outputs logits (softmax applied) or probabilities comes
  from the task's loss (``from_logits``; logits for every task here).
  Deterministic given the arguments.

  Args:
    task: The task.
    public_inputs: ``[P, *input_shape]`` public inputs (`check_public_inputs`;
      e.g. `tasks.public.public_inputs`).
    model_weights: The global model to start from (e.g.
      ``task.initial_model_weights(seed)``).
    client_learning_rate: Local SGD step size (≥ 0).
    seed: The run's seed (client shuffles).
    pretrain_epochs: ``E_p`` (≥ 1), passes over the client's stream (or
      multiples of `client_steps`).
    client_steps: If set, every client takes exactly ``pretrain_epochs ·
      client_steps`` local batches; ``None`` uses `pretrain_epochs` passes.
    chunk_size: Clients per TFF call (memory vs. call overhead).

  Returns:
    ``float32[N, P, C]`` (``C``: the model's outputs per example; ``[N, P,
    *O]`` for a multi-dimensional output ``O``), row ``i`` for
    ``task.client_ids[i]``; every ``[i, p]`` sums to 1 over the last axis. A
    client without data or whose local model became non-finite reports the
    global model's soft labels (logged as a warning, as is any client whose
    soft labels stayed within 1e-6 of the global model's).

  Raises:
    ValueError: For public inputs that do not fit the task's model, or
      invalid sizes or learning rate.
  """
  learning_rate = graph_probe.check_client_learning_rate(client_learning_rate)
  pretrain_epochs = graph_probe.check_positive_int('pretrain_epochs', pretrain_epochs)
  chunk_size, client_steps = graph_probe.check_chunk_and_steps(chunk_size, client_steps)
  inputs = check_public_inputs(task, public_inputs)
  model_outputs = _task_model_outputs(task)
  probe = build_soft_label_probe(
    task.model_fn, client_learning_rate=learning_rate, model_outputs=model_outputs
  )
  steps = None if client_steps is None else pretrain_epochs * client_steps
  outputs = graph_probe.probe_population(
    task, probe, (model_weights, inputs), seed, chunk_size, steps=steps, passes=pretrain_epochs
  )
  soft_labels = np.concatenate([np.asarray(output, np.float32) for output in outputs])
  if learning_rate > 0:
    _warn_unchanged_clients(task, model_weights, inputs, soft_labels, model_outputs)
  return soft_labels


def _warn_unchanged_clients(task: Task, model_weights, inputs, soft_labels, model_outputs) -> None:
  """Logs clients whose soft labels are within 1e-6 of the global model's."""
  keras_model = task.keras_model_fn(0)
  model_weights.assign_weights_to(keras_model)
  outputs = np.asarray(keras_model(inputs, training=False), np.float32)
  global_labels = tf.nn.softmax(outputs, axis=-1).numpy() if model_outputs == 'logits' else outputs
  unchanged = np.flatnonzero(
    np.all(np.abs(soft_labels - global_labels).reshape(task.num_clients, -1) <= 1e-6, axis=1)
  )
  if unchanged.size:
    logging.warning(
      "%d of %d clients report the global model's soft labels (within 1e-6), e.g. %s: "
      'no training data, a non-finite local model (lower the client learning rate), '
      'or too little local training to move the model.',
      unchanged.size,
      task.num_clients,
      task.client_ids[unchanged[0]],
    )


def preprocessing_bits(
  *,
  num_clients: int,
  public_examples: int,
  input_size: int,
  num_classes: int,
  bits_per_value: int = communication.BITS_PER_FLOAT32,
) -> dict[str, int]:
  """The traffic of LEFL's pre-processing round.

  * ``download_bits = N · P · input_size · bits_per_value``: the public set
    sent to every client. The broadcast of the initial model is not counted
    (downloads of the model are not counted anywhere in this library; the
    round's model broadcast is the same one round 1 would send).
  * ``upload_bits = N · P · C · bits_per_value``: every client's soft labels.

  The result fits ``communication.PreprocessingBits(**bits)``.

  Args:
    num_clients: ``N``, the clients taking part (all of them for LEFL).
    public_examples: ``P``, examples in the public set.
    input_size: Values per public example (e.g. 64 for ``digits``,
      ``28·28 = 784`` for EMNIST, ``24·24·3`` for CIFAR-100's crops).
    num_classes: ``C``, values of one soft label (the model's outputs per
      example).
    bits_per_value: Bits per transmitted value (32: float32).

  Returns:
    ``{'upload_bits': int, 'download_bits': int}``.

  Raises:
    ValueError: For a non-positive count.
  """
  values = {
    name: graph_probe.check_positive_int(name, value)
    for name, value in (
      ('num_clients', num_clients),
      ('public_examples', public_examples),
      ('input_size', input_size),
      ('num_classes', num_classes),
      ('bits_per_value', bits_per_value),
    )
  }
  per_client = values['num_clients'] * values['public_examples'] * values['bits_per_value']
  return dict(
    upload_bits=per_client * values['num_classes'], download_bits=per_client * values['input_size']
  )
