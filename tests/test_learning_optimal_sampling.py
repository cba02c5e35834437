"""Tests for tff_sampling/learning/optimal_sampling.py."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import learning
from tff_sampling.runtime import tff_context

tff_context.use_secure_sum_simulation()


def _sgd(lr):
  return tff.learning.optimizers.build_sgdm(lr)


def _one_round(process, task, clients, start):
  state = process.set_model_weights(process.initialize(), start)
  output = process.next(state, [task.client_dataset(c, seed=c) for c in clients])
  return process.get_model_weights(output.state), output.metrics


def test_fedavg_full_mode_equals_tff_fedavg(small_digits_task):
  task = small_digits_task
  start = task.initial_model_weights(0)
  ours, metrics = _one_round(
    learning.build_fed_avg_with_optimal_sampling(
      task.model_fn, _sgd(0.1), _sgd(1.0), expected_clients=2, mode='full'
    ),
    task,
    range(6),
    start,
  )
  reference, _ = _one_round(
    tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, client_optimizer_fn=_sgd(0.1), server_optimizer_fn=_sgd(1.0)
    ),
    task,
    range(6),
    start,
  )
  for a, b in zip(ours.trainable, reference.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert metrics['aggregator']['uploads'] == 6


def test_dsgd_full_mode_equals_tff_fedsgd(small_digits_task):
  task = small_digits_task
  start = task.initial_model_weights(0)
  ours, _ = _one_round(
    learning.build_dsgd_with_optimal_sampling(
      task.model_fn, _sgd(0.5), expected_clients=2, mode='full'
    ),
    task,
    range(5),
    start,
  )
  reference, _ = _one_round(
    tff.learning.algorithms.build_fed_sgd(task.model_fn, server_optimizer_fn=_sgd(0.5)),
    task,
    range(5),
    start,
  )
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(ours.trainable, start.trainable))
  assert moved > 1e-4
  for a, b in zip(ours.trainable, reference.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('builder', ['fedavg', 'dsgd'])
def test_optimal_round_uploads_about_m_and_reports(small_digits_task, builder):
  task = small_digits_task
  if builder == 'fedavg':
    process = learning.build_fed_avg_with_optimal_sampling(
      task.model_fn, _sgd(0.1), _sgd(1.0), expected_clients=3
    )
  else:
    process = learning.build_dsgd_with_optimal_sampling(
      task.model_fn, _sgd(0.5), expected_clients=3
    )
  weights, metrics = _one_round(process, task, range(12), task.initial_model_weights(0))
  aggregator = metrics['aggregator']
  assert aggregator['cohort_size'] == 12
  assert aggregator['expected_uploads'] == pytest.approx(3.0, abs=1e-4)
  assert 0 <= aggregator['uploads'] <= 12
  assert 0.0 <= aggregator['improvement_factor'] <= 1.0
  assert aggregator['extra_scalars_per_client'] == 18
  assert all(np.all(np.isfinite(t)) for t in weights.trainable)
