"""The multi-model process's client work: each client trains the one model it was assigned
(or none), its update weighted by the inverse probability; non-finite updates dropped."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import model_delta_client_work

from tff_sampling.learning import fedavg
from tff_sampling.learning import multi_model_types
from tff_sampling.learning import signals as signals_lib


class ClientWork(NamedTuple):
  """The clients' side of a round (`build_client_work`); functions of federated values."""

  weights_types: tuple[tff.Type, ...]  # Each model's `ModelWeights` type.
  data_type: tff.StructWithPythonType  # <B_1*, …, B_S*>.
  # (models, datasets) -> (S raw signals: norms or [1]-shaped losses, trained results or None).
  signal: Callable[..., Any]
  # (models, datasets, choice, meta, trained) -> S × <update (weighted), non_finite>.
  train: Callable[..., list[Any]]


def build_client_work(model_fns, learning_rates: Sequence[float], signal: str) -> ClientWork:
  """The client work: each client's signals, then its assigned model's weighted update.

  With the update-norm signal, every client trains every model before the
  assignment (the norms are the signal) and uploads the chosen one's update.
  Otherwise it computes the losses (a forward pass per model) or nothing, and
  after the assignment trains only the model it was assigned, in one
  TensorFlow call (`_train_chosen_model`).
  """
  num_models = len(model_fns)
  weights_types, data_types = zip(*(_model_types(fn) for fn in model_fns))

  if signal == 'update_norm':
    train_fns = [
      _train_computation(*args)
      for args in zip(model_fns, learning_rates, weights_types, data_types)
    ]

    weigh = tff.tensorflow.computation(
      lambda trained, choice, meta: tuple(
        _weighted_and_non_finite(result, choice, meta, s) for s, result in enumerate(trained)
      )
    )

    def signal_fn(models, datasets):
      trained = [
        tff.federated_map(train_fns[s], (models[s], datasets[s])) for s in range(num_models)
      ]
      return [t.norm for t in trained], tff.federated_zip(tuple(trained))

    def train_fn(models, datasets, choice, meta, trained):
      del models, datasets  # Trained in `signal_fn`.
      results = tff.federated_map(weigh, (trained, choice, meta))
      return [results[s] for s in range(num_models)]

  else:
    loss_fns = (
      [
        signals_lib.client_loss_computation(*args)
        for args in zip(model_fns, weights_types, data_types)
      ]
      if signal == 'loss'
      else []
    )
    train_chosen = tff.tensorflow.computation(_train_chosen_model(model_fns, learning_rates))

    def signal_fn(models, datasets):
      if loss_fns:
        return [
          tff.federated_map(loss_fns[s], (models[s], datasets[s])) for s in range(num_models)
        ], None
      return [tff.federated_value(multi_model_types.FLOAT(0.0), tff.CLIENTS)] * num_models, None

    def train_fn(models, datasets, choice, meta, trained):
      del trained  # None.
      results = tff.federated_map(train_chosen, (models, datasets, choice, meta))
      return [results[s] for s in range(num_models)]

  return ClientWork(weights_types, tff.StructWithPythonType(data_types, tuple), signal_fn, train_fn)


def _model_types(model_fn) -> tuple[tff.Type, tff.SequenceType]:
  """A model's `ModelWeights` type and the type of a client's dataset for it."""
  with tf.Graph().as_default():
    model = model_fn()
    weights_type = tff.types.tensorflow_to_type(
      tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype),
        tff.learning.models.ModelWeights.from_model(model),
      )
    )
    return weights_type, tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))


def _client_update(model_fn):
  """TFF's model-delta local SGD for one model (example-weighted, our client loop).

  Builds the model: call it at the top of a TF computation, not in a branch.
  """
  return model_delta_client_work.build_model_delta_update_with_tff_optimizer(
    model_fn,
    weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    loop_implementation=fedavg.CLIENT_LOOP,
  )


def _train_result(client_update, optimizer, weights, dataset) -> collections.OrderedDict:
  """``<update, norm, weight>`` of local SGD from `weights` on `dataset`.

  ``weight`` is TFF's: the examples trained on, or 0 if the update was
  non-finite (TFF then zeroes it).
  """
  result, _ = client_update(optimizer, weights, dataset)
  # The dataset is iterated once only: a second pass (e.g. to count batches)
  # may run first and reshuffle the training order.
  return collections.OrderedDict(
    update=result.update,
    norm=tf.linalg.global_norm(tf.nest.flatten(result.update)),
    weight=result.update_weight,
  )


def _train_computation(model_fn, learning_rate: float, weights_type, data_type):
  """``(W, B*) -> <update, norm, weight>``: `_train_result` as a computation."""
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate)

  @tff.tensorflow.computation(weights_type, data_type)
  def train(weights, dataset):
    return _train_result(_client_update(model_fn), optimizer, weights, dataset)

  return train


def _weighted_and_non_finite(result, choice, meta, model: int) -> collections.OrderedDict:
  """``factor_s · update`` (zero unless model `model` was chosen), and 1 if the
  client trained the model on data (share > 0) and TFF zeroed its non-finite
  update (weight 0)."""
  factor = choice['factor'][model]
  return collections.OrderedDict(
    update=tf.nest.map_structure(lambda t: tf.cast(factor, t.dtype) * t, result['update']),
    non_finite=tf.cast(
      (meta['shares'][model] > 0.0) & tf.equal(result['weight'], 0.0), multi_model_types.COUNT
    ),
  )


def _train_chosen_model(model_fns, learning_rates):
  """``(<W_1..W_S>, <B_1*..B_S*>, choice, meta) -> <<update, non_finite>_1..S>``.

  The client trains only the model it chose (a `tf.switch_case` over the
  choice; none if it chose none); every other model's entry is a zero update.
  One TensorFlow call per client instead of one per client and model: the
  per-call cost of TFF's runtime dominated MMFL rounds on small models.
  """
  num_models = len(model_fns)

  def train_chosen(models, datasets, choice, meta):
    optimizers = [tff.learning.optimizers.build_sgdm(r) for r in learning_rates]
    client_updates = [_client_update(fn) for fn in model_fns]

    def zero(s):
      return collections.OrderedDict(
        update=tf.nest.map_structure(tf.zeros_like, models[s].trainable),
        non_finite=tf.constant(0, multi_model_types.COUNT),
      )

    def branch(chosen):
      def run():
        outputs = []
        for s in range(num_models):
          if s != chosen:
            outputs.append(zero(s))
            continue
          result = _train_result(client_updates[s], optimizers[s], models[s], datasets[s])
          outputs.append(_weighted_and_non_finite(result, choice, meta, s))
        return tuple(outputs)

      return run

    selected = choice['selected'] > 0
    index = tf.where(
      tf.reduce_any(selected),
      tf.argmax(tf.cast(selected, tf.int32), output_type=tf.int32),
      num_models,
    )
    return tf.switch_case(index, [branch(s) for s in range(num_models + 1)])

  return train_chosen
