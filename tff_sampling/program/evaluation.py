"""Evaluation of the global model on the task's centralised evaluation data."""

from __future__ import annotations

import collections

import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling.task import Task


class CentralEvaluator:
  """Evaluates global model weights on the task's centralised evaluation data.

  The Keras model and a compiled evaluation step are built once and the batched
  evaluation data is cached after the first pass, so repeated evaluations only
  pay for the forward passes. The loop is our own rather than
  ``Model.evaluate``: Keras swaps the training engine of *all* functional
  models to its v1 (graph) class once any model is built in a graph, which TFF
  computations do, and that engine's ``evaluate`` differs.
  """

  def __init__(self, task: Task):
    self._model = task.keras_model_fn(0)
    self._loss = task.loss_fn()
    self._metrics = list(task.metrics_fn())
    self._data = task.preprocess_eval(task.eval_data).cache()

    @tf.function(reduce_retracing=True)  # The last batch is usually smaller.
    def step(batch):
      predictions = self._model(batch['x'], training=False)
      for metric in self._metrics:
        metric.update_state(batch['y'], predictions)
      count = tf.cast(tf.shape(batch['y'])[0], tf.float32)
      return tf.cast(self._loss(batch['y'], predictions), tf.float32) * count, count

    self._step = step

  def __call__(self, model_weights: tff.learning.models.ModelWeights) -> dict[str, float]:
    model_weights.assign_weights_to(self._model)
    for metric in self._metrics:
      metric.reset_state()
    loss_sum, count = 0.0, 0.0
    for batch in self._data:
      batch_loss, batch_count = self._step(batch)
      loss_sum += float(batch_loss)
      count += float(batch_count)
    results = {metric.name: float(metric.result()) for metric in self._metrics}
    results['loss'] = loss_sum / max(count, 1.0)
    return collections.OrderedDict(sorted(results.items()))
