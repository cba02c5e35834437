"""Client work that also emits per-client signals (update sketches, the loss probe), gathered at
the server by cohort slot for server-side samplers; ``docs/samplers.md`` has the layout."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.aggregators import protocol
from tff_sampling.learning import fedavg
from tff_sampling.learning import proximal

# The type of one element of a client's ``meta`` dataset (see `client_data`).
META_TYPE = tff.StructWithPythonType(
  [('slot', tff.TensorType(np.int32)), ('weight', tff.TensorType(np.float32))],
  collections.OrderedDict,
)


def client_data(dataset: tf.data.Dataset, slot, weight) -> collections.OrderedDict:
  """One client's input to the signals client work (see the module docstring); `slot`
  and `weight` are numbers or scalar tensors (inside a TFF computation)."""
  meta = tf.data.Dataset.from_tensors(
    collections.OrderedDict(slot=tf.cast(slot, tf.int32), weight=tf.cast(weight, tf.float32))
  )
  return collections.OrderedDict(data=dataset, meta=meta)


def count_sketch_tf(flat: tf.Tensor, sketch_size: int, seed: int) -> tf.Tensor:
  """The count sketch of a 1-D float32 tensor (exact zero-padding when it fits)."""
  num_values = flat.shape[0]
  if num_values <= sketch_size:
    return tf.pad(flat, [[0, sketch_size - num_values]])
  buckets = tf.random.stateless_uniform(
    [num_values], seed=[seed, 0], minval=0, maxval=sketch_size, dtype=tf.int32
  )
  signs = tf.cast(
    tf.random.stateless_uniform([num_values], seed=[seed, 1], minval=0, maxval=2, dtype=tf.int32)
    * 2
    - 1,
    flat.dtype,
  )
  return tf.math.unsorted_segment_sum(flat * signs, buckets, sketch_size)


def gather_by_slot(slots, values, width: int, dtype=np.float32):
  """Stacks client-placed ``[width]`` values into ``[cohort, width]`` @SERVER by slot.

  Args:
    slots: ``{int32}@CLIENTS``, each client's cohort slot (0..cohort−1, each once).
    values: ``{dtype[width]}@CLIENTS``.
    width: The length of each value.
    dtype: The values' dtype.

  Returns:
    ``dtype[cohort, width]@SERVER``: row ``k`` is the value of the client in slot ``k``.
  """
  rows_type = tff.TensorType(dtype, [None, width])
  slots_type = tff.TensorType(np.int32, [None])

  @tff.tensorflow.computation
  def zero():
    return (tf.zeros([0], tf.int32), tf.zeros([0, width], dtype))

  @tff.tensorflow.computation(
    (slots_type, rows_type), (tff.TensorType(np.int32), tff.TensorType(dtype, [width]))
  )
  def accumulate(accumulator, value):
    return (tf.concat([accumulator[0], [value[0]]], 0), tf.concat([accumulator[1], [value[1]]], 0))

  @tff.tensorflow.computation((slots_type, rows_type), (slots_type, rows_type))
  def merge(a, b):
    return (tf.concat([a[0], b[0]], 0), tf.concat([a[1], b[1]], 0))

  @tff.tensorflow.computation((slots_type, rows_type))
  def report(accumulator):
    slots, rows = accumulator
    # Every slot 0..cohort-1 arrives exactly once; the scatter orders rows by slot.
    return tf.scatter_nd(tf.expand_dims(slots, 1), rows, [tf.shape(slots)[0], width])

  return tff.federated_aggregate(
    tff.federated_zip((slots, values)), zero(), accumulate, merge, report
  )


def gather_scalars_by_slot(slots, values, dtype=np.float32):
  """``dtype[cohort]@SERVER`` from client-placed ``dtype[1]`` values, by slot (`gather_by_slot`)."""
  gathered = gather_by_slot(slots, values, 1, dtype)
  return tff.federated_map(tff.tensorflow.computation(lambda g: g[:, 0]), gathered)


def slot_client_data(data_type) -> tuple[tff.StructWithPythonType, tff.Computation]:
  """The type of `client_data` structs over `data_type`, and the computation
  that reads a client's ``<slot, weight>`` from its ``meta`` dataset.

  Args:
    data_type: The `tff.SequenceType` of a client's training data.
  """
  meta_type = tff.SequenceType(META_TYPE)
  client_data_type = tff.StructWithPythonType(
    [('data', data_type), ('meta', meta_type)], collections.OrderedDict
  )
  return client_data_type, read_meta_computation(meta_type)


def read_meta_computation(meta_type):
  """A computation that reads the one ``<slot, weight>`` element of a client's meta dataset."""

  @tff.tensorflow.computation(meta_type)
  def read_meta(meta):
    # Not a ``meta.reduce``: TFF's worker would instantiate its function at every call.
    return meta.get_single_element()

  return read_meta


def client_loss_computation(model_fn, weights_type, data_type) -> tff.Computation:
  """``(W, B*) -> float32[1]``: the mean loss of the given weights on a client's data."""

  @tff.tensorflow.computation(weights_type, data_type)
  def client_loss(weights, dataset):
    model = model_fn()

    # A tf.function orders the assignments before the forward passes (automatic
    # control dependencies); in the computation's plain graph an assignment
    # whose result is unused never runs, and the loss would be the fresh
    # model's. The loop is an iterator loop, as the clients' training loop
    # (`fedavg.CLIENT_LOOP`): a ``dataset.reduce`` instantiates its function, the
    # whole forward pass, anew in TFF's worker at every call, which took half of a
    # probe over 105 FEMNIST writers (2NN; the same losses, bit for bit).
    @tf.function
    def mean_loss():
      tf.nest.map_structure(
        lambda v, t: v.assign(t), tff.learning.models.ModelWeights.from_model(model), weights
      )
      loss_sum, count = tf.constant(0.0), tf.constant(0.0)
      for batch in iter(dataset):
        output = model.forward_pass(batch, training=False)
        batch_count = tf.cast(output.num_examples, tf.float32)
        loss_sum += tf.cast(output.loss, tf.float32) * batch_count
        count += batch_count
      return tf.reshape(tf.math.divide_no_nan(loss_sum, count), [1])

    return mean_loss()

  return client_loss


def build_loss_probe(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  model_weights_type: tff.Type,
  element_spec,
) -> tff.Computation:
  """A computation giving each client's loss under given model weights, by slot.

  ``(<W@SERVER, {<data=B*, meta=…*>}@CLIENTS> -> float32[cohort]@SERVER)``: the
  mean loss of a forward pass (no training) over each client's data, as
  power-of-choice needs for its candidates. Reveals per-client losses to the
  server.

  Args:
    model_fn: Builds a fresh `tff.learning.models.VariableModel`.
    model_weights_type: The type of its `tff.learning.models.ModelWeights`
      (e.g. ``process.get_model_weights.type_signature.result``).
    element_spec: The spec of one batch of client data.
  """
  weights_type = model_weights_type
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
  client_data_type, read_meta = slot_client_data(data_type)

  client_loss = client_loss_computation(model_fn, weights_type, data_type)

  @tff.federated_computation(
    tff.FederatedType(weights_type, tff.SERVER), tff.FederatedType(client_data_type, tff.CLIENTS)
  )
  def probe(weights, data):
    losses = tff.federated_map(client_loss, (tff.federated_broadcast(weights), data.data))
    meta = tff.federated_map(read_meta, data.meta)
    return gather_scalars_by_slot(meta.slot, losses)

  return probe


def sketch_computation(update_type, sketch_size: int, sketch_seed: int) -> tff.Computation:
  """``U -> float32[sketch_size]``: the count sketch of a model update, flattened."""

  @tff.tensorflow.computation(update_type)
  def sketch(update):
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tf.nest.flatten(update)], 0)
    return count_sketch_tf(flat, sketch_size, sketch_seed)

  return sketch


def fingerprint_computation(update_type) -> tff.Computation:
  """``U -> int64[1]``: the update's fingerprint (`protocol.update_fingerprint`)."""
  return tff.tensorflow.computation(
    lambda update: tf.reshape(protocol.update_fingerprint(update), [1]), update_type
  )


def build_signals_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  *,
  sketch_size: int | None,
  sketch_seed: int = 0,
  client_losses: bool = False,
  update_fingerprints: bool = False,
) -> tff.learning.templates.ClientWorkProcess:
  """Local SGD whose clients also report signals, gathered by cohort slot.

  ``(<S@SERVER, {W}@CLIENTS, {<data=B*, meta=<slot, weight>*>}@CLIENTS>) -> <state, result,
  measurements=<train=…, signals=…>>``; row ``k`` of each signal is the client in slot ``k``:
  ``update_sketch`` (``float32[?, sketch_size]``), ``loss`` (``float32[?]``, the broadcast
  model's mean loss on the client's data before training: one extra forward pass) and
  ``update_fingerprint`` (``int64[?]``, `protocol.update_fingerprint`, which matches slots to
  an ``OptimalSamplingFactory(report_uploaders=True)``'s uploads), each only when asked.

  Args:
    model_fn: Builds a fresh `tff.learning.models.VariableModel`.
    client_optimizer_fn: The clients' local optimizer.
    sketch_size: ``d`` (> 0), the length of each client's sketch, or ``None`` for none.
    sketch_seed: Seed of the sketch's hash and sign functions.
    client_losses: Whether clients also report their loss before training.
    update_fingerprints: Whether clients also report their update's fingerprint.

  Raises:
    ValueError: For a non-positive `sketch_size`.
  """
  validation.positive_int('sketch_size', sketch_size, optional=True)
  inner = tff.learning.templates.build_model_delta_client_work(
    model_fn,
    client_optimizer_fn,
    tff.learning.ClientWeighting.NUM_EXAMPLES,
    loop_implementation=fedavg.CLIENT_LOOP,
  )
  weights_type = inner.next.type_signature.parameter[1].member
  data_type = inner.next.type_signature.parameter[2].member
  client_data_type, read_meta = slot_client_data(data_type)
  update_type = inner.next.type_signature.result.result.member.update
  client_loss = (
    client_loss_computation(model_fn, weights_type, data_type) if client_losses else None
  )
  sketch = sketch_computation(update_type, sketch_size, sketch_seed) if sketch_size else None
  fingerprint = fingerprint_computation(update_type) if update_fingerprints else None

  @tff.federated_computation(
    inner.initialize.type_signature.result,
    tff.FederatedType(weights_type, tff.CLIENTS),
    tff.FederatedType(client_data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, data):
    inner_output = inner.next(state, weights, data.data)
    meta = tff.federated_map(read_meta, data.meta)
    update = inner_output.result.update
    signals = collections.OrderedDict()
    if sketch_size:
      sketches = tff.federated_map(sketch, update)
      signals[contract.UPDATE_SKETCH] = gather_by_slot(meta.slot, sketches, sketch_size)
    if client_loss is not None:
      losses = tff.federated_map(client_loss, (weights, data.data))
      signals[contract.LOSS] = gather_scalars_by_slot(meta.slot, losses)
    if fingerprint is not None:
      fingerprints = tff.federated_map(fingerprint, update)
      signals[contract.UPDATE_FINGERPRINT] = gather_scalars_by_slot(
        meta.slot, fingerprints, np.int64
      )
    result = tff.federated_zip(
      tff.learning.templates.ClientResult(update=update, update_weight=meta.weight)
    )
    measurements = collections.OrderedDict(train=inner_output.measurements)
    if signals:
      measurements[contract.SIGNALS] = tff.federated_zip(signals)
    measurements = tff.federated_zip(measurements)
    return tff.templates.MeasuredProcessOutput(inner_output.state, result, measurements)

  # TFF's own hyper-parameters of the client work (the optimizer's learning rate).
  return tff.learning.templates.ClientWorkProcess(
    inner.initialize, next_fn, get_hparams_fn=inner.get_hparams, set_hparams_fn=inner.set_hparams
  )


def build_fed_avg_with_signals(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  *,
  client_learning_rate: float,
  server_learning_rate: float = 1.0,
  sketch_size: int | None,
  sketch_seed: int = 0,
  proximal_strength: float = 0.0,
  client_losses: bool = False,
  update_fingerprints: bool = False,
  model_aggregator: tff.aggregators.WeightedAggregationFactory | None = None,
) -> tff.learning.templates.LearningProcess:
  """FedAvg whose clients use sampler weights and report signals by slot.

  Composed with `tff.learning.templates.compose_learning_process` from TFF's
  broadcast distributor, `build_signals_client_work`, `model_aggregator`
  (default: TFF's weighted mean), and TFF's SGD finalizer. With
  ``model_aggregator=OptimalSamplingFactory(m)`` the sampler's cohort trains
  and only about ``m`` of its updates are uploaded (optimal sampling of the
  uploads, unbiased for the sampler's weighted mean).
  ``next(state, [client_data(ds, slot, weight), …])``;
  the sketches are ``metrics['client_work']['signals']['update_sketch']``
  (``sketch_size=None``: no sketches), the losses before training
  ``…['signals']['loss']`` (with `client_losses`), the updates' fingerprints
  ``…['signals']['update_fingerprint']`` (with `update_fingerprints`, for timing
  optimal uploads per client); see `build_signals_client_work`.
  With ``proximal_strength = μ > 0`` the clients run FedProx's local problem
  (`tff_sampling.learning.proximal.build_proximal_sgd`).
  """
  client_optimizer = (
    proximal.build_proximal_sgd(client_learning_rate, proximal_strength)
    if proximal_strength
    else tff.learning.optimizers.build_sgdm(client_learning_rate)
  )
  client_work = build_signals_client_work(
    model_fn,
    client_optimizer,
    sketch_size=sketch_size,
    sketch_seed=sketch_seed,
    client_losses=client_losses,
    update_fingerprints=update_fingerprints,
  )
  model_weights_type = client_work.next.type_signature.parameter[1].member
  update_type = client_work.next.type_signature.result.result.member.update

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return tff.learning.templates.compose_learning_process(
    initial_model_weights_fn,
    tff.learning.templates.build_broadcast_process(model_weights_type),
    client_work,
    (model_aggregator or tff.aggregators.MeanFactory()).create(
      update_type, tff.TensorType(np.float32)
    ),
    tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(server_learning_rate), model_weights_type
    ),
  )


def selection_client_data(
  datasets: Sequence[tf.data.Dataset], weights: Sequence[float]
) -> list[collections.OrderedDict]:
  """Client data for a whole cohort: slot ``k`` gets ``datasets[k]`` and ``weights[k]``."""
  if len(datasets) != len(weights):
    raise ValueError(f'{len(datasets)} datasets but {len(weights)} weights.')
  return [client_data(d, k, w) for k, (d, w) in enumerate(zip(datasets, weights))]
