"""Tests for tff_sampling/learning/fedavg.py."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import learning


def test_same_type_and_same_round_as_tff_default_loop(small_digits_task):
  task = small_digits_task
  ours = learning.build_fedavg(task.model_fn, client_learning_rate=0.1)
  reference = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
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


@pytest.mark.parametrize('kwargs,match', [
    (dict(client_learning_rate=0.0), 'client_learning_rate must be positive, got 0.0'),
    (dict(client_learning_rate=0.1, server_learning_rate=-1.0),
     'server_learning_rate must be positive, got -1.0'),
])
def test_rejects_non_positive_learning_rates(small_digits_task, kwargs, match):
  with pytest.raises(ValueError, match=match):
    learning.build_fedavg(small_digits_task.model_fn, **kwargs)
