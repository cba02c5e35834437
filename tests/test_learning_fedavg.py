"""Tests for tff_sampling/learning/fedavg.py."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import learning


def test_same_type_and_same_round_as_tff_default_loop(small_digits_task):
  task = small_digits_task
  ours = learning.build_fed_avg(task.model_fn, client_learning_rate=0.1)
  reference = tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  assert ours.next.type_signature.is_equivalent_to(reference.next.type_signature)

  datasets = [task.client_dataset(c, seed=c) for c in range(4)]
  start = task.initial_model_weights(0)
  results = []
  for process in (ours, reference):
    state = process.set_model_weights(process.initialize(), start)
    results.append(process.get_model_weights(process.next(state, datasets).state))
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(results[0].trainable, start.trainable))
  assert moved > 1e-3  # The round did train.
  for a, b in zip(results[0].trainable, results[1].trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  'kwargs,match',
  [
    (
      dict(client_learning_rate=0.0),
      'client_learning_rate must be a positive finite number, got 0.0',
    ),
    (
      dict(client_learning_rate=0.1, server_learning_rate=-1.0),
      'server_learning_rate must be a positive finite number, got -1.0',
    ),
  ],
)
def test_rejects_non_positive_learning_rates(small_digits_task, kwargs, match):
  with pytest.raises(ValueError, match=match):
    learning.build_fed_avg(small_digits_task.model_fn, **kwargs)


def _fixed_batches(task, client):
  """A client's batches, and a dataset yielding exactly them (the task's
  datasets reshuffle on every iteration)."""
  batches = list(task.client_dataset(client, seed=client))
  dataset = tf.data.Dataset.from_tensors(batches[0])
  for batch in batches[1:]:
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
  return batches, dataset


def _one_round(process, start, dataset):
  state = process.set_model_weights(process.initialize(), start)
  return process.get_model_weights(process.next(state, [dataset]).state).trainable


def _proximal_sgd_replica(task, start, batches, *, lr, mu, sign):
  """Local SGD on the gradient ``∇F(w) + sign · μ (w − w_global)`` in plain TF."""
  model = task.keras_model_fn(0)
  for variable, value in zip(model.trainable_variables, start.trainable):
    variable.assign(value)
  loss_fn = task.loss_fn()
  for batch in batches:
    with tf.GradientTape() as tape:
      loss = loss_fn(batch['y'], model(batch['x'], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    for variable, grad, anchor in zip(model.trainable_variables, grads, start.trainable):
      variable.assign_sub(lr * (grad + sign * mu * (variable - anchor)))
  return [v.numpy() for v in model.trainable_variables]


def _distance(weights, start):
  return float(np.sqrt(sum(np.sum((w - s) ** 2) for w, s in zip(weights, start.trainable))))


def test_fedprox_is_sgd_on_the_proximal_objective_and_tff_0_87_has_the_sign_reversed(
  small_digits_task,
):
  """One client, μ = 0.5, server lr 1: our FedProx equals local SGD on
  ``loss + μ/2 ‖w − w_global‖²`` done by hand; TFF 0.87's
  ``build_weighted_fed_prox`` equals the same replica with ``−μ (w − w_global)``
  (the reason `build_fed_prox` does not use it). Ours moves less than FedAvg,
  TFF's more (measured: 0.81× and 1.29× FedAvg's distance)."""
  task, mu, lr = small_digits_task, 0.5, 0.1
  start = task.initial_model_weights(0)
  batches, dataset = _fixed_batches(task, 2)
  ours = _one_round(
    learning.build_fed_prox(task.model_fn, proximal_strength=mu, client_learning_rate=lr),
    start,
    dataset,
  )
  tff_prox = _one_round(
    tff.learning.algorithms.build_weighted_fed_prox(
      task.model_fn,
      proximal_strength=mu,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
    ),
    start,
    dataset,
  )
  avg = _one_round(learning.build_fed_avg(task.model_fn, client_learning_rate=lr), start, dataset)
  for got, sign in ((ours, 1.0), (tff_prox, -1.0)):
    replica = _proximal_sgd_replica(task, start, batches, lr=lr, mu=mu, sign=sign)
    for a, b in zip(got, replica):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert _distance(ours, start) < _distance(avg, start) < _distance(tff_prox, start)

  # μ = 0 is FedAvg.
  zero = _one_round(
    learning.build_fed_prox(task.model_fn, proximal_strength=0.0, client_learning_rate=lr),
    start,
    dataset,
  )
  for a, b in zip(zero, avg):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_proximal_sgd_anchors_each_client_at_its_own_start(small_digits_task):
  """Two clients in one round: each client's anchor is the broadcast model
  (TFF initialises the optimizer per client), so the round's mean equals the
  mean of two one-client replicas."""
  task, mu, lr = small_digits_task, 0.5, 0.1
  start = task.initial_model_weights(0)
  (b1, d1), (b2, d2) = _fixed_batches(task, 1), _fixed_batches(task, 3)
  process = learning.build_fed_prox(task.model_fn, proximal_strength=mu, client_learning_rate=lr)
  state = process.set_model_weights(process.initialize(), start)
  both = process.get_model_weights(process.next(state, [d1, d2]).state).trainable
  r1 = _proximal_sgd_replica(task, start, b1, lr=lr, mu=mu, sign=1.0)
  r2 = _proximal_sgd_replica(task, start, b2, lr=lr, mu=mu, sign=1.0)
  n1, n2 = sum(len(b['y']) for b in b1), sum(len(b['y']) for b in b2)
  for got, a, b in zip(both, r1, r2):
    np.testing.assert_allclose(got, (n1 * a + n2 * b) / (n1 + n2), rtol=1e-4, atol=1e-5)


def test_fedprox_rejects_negative_strength(small_digits_task):
  with pytest.raises(ValueError, match='proximal_strength must be non-negative, got -0.1'):
    learning.build_fed_prox(
      small_digits_task.model_fn, proximal_strength=-0.1, client_learning_rate=0.1
    )
