"""Tests for tff_sampling/learning/signals.py."""

import numpy as np
import pytest
import tensorflow as tf

from tff_sampling.learning import signals


def _flat(weights):
  return np.concatenate([np.ravel(t) for t in weights.trainable])


@pytest.fixture(scope='module')
def process(small_digits_task):
  # 4,810 parameters ≤ 5,000: the sketch is the update itself (zero-padded).
  return signals.build_fed_avg_with_signals(
    small_digits_task.model_fn, client_learning_rate=0.1, sketch_size=5000, client_losses=True
  )


def test_each_slot_holds_its_clients_update_and_sampler_weights_aggregate(
  small_digits_task, process
):
  task = small_digits_task
  start = task.initial_model_weights(0)
  alone = {}
  for client in (3, 5, 7):  # Each client's update, from a one-client round.
    state = process.set_model_weights(process.initialize(), start)
    output = process.next(
      state, signals.selection_client_data([task.client_dataset(client, seed=1)], [1.0])
    )
    alone[client] = _flat(start) - _flat(process.get_model_weights(output.state))

  order, weights = [7, 3, 5, 3], [0.25, 0.25, 0.25, 0.25]  # Client 3 drawn twice.
  state = process.set_model_weights(process.initialize(), start)
  output = process.next(
    state, signals.selection_client_data([task.client_dataset(c, seed=1) for c in order], weights)
  )
  sketches = output.metrics['client_work']['signals']['update_sketch']
  assert sketches.shape == (4, 5000)
  for slot, client in enumerate(order):
    np.testing.assert_allclose(sketches[slot, :4810], alone[client], atol=1e-7)
    np.testing.assert_array_equal(sketches[slot, 4810:], 0.0)
  # Each slot's loss is the start model's loss on that client's data (the probe).
  probe = signals.build_loss_probe(
    task.model_fn, process.get_model_weights.type_signature.result, task.element_spec
  )
  expected_losses = probe(
    start, signals.selection_client_data([task.client_dataset(c, seed=1) for c in order], [1.0] * 4)
  )
  np.testing.assert_allclose(
    output.metrics['client_work']['signals']['loss'], expected_losses, rtol=1e-6
  )
  assert output.metrics['client_work']['signals']['loss'][1] == pytest.approx(
    output.metrics['client_work']['signals']['loss'][3]
  )  # Client 3 twice.
  # The model moved by the sampler-weighted mean (1/m per draw, duplicates count).
  expected = sum(w * alone[c] for c, w in zip(order, weights))
  np.testing.assert_allclose(
    _flat(start) - _flat(process.get_model_weights(output.state)), expected, atol=1e-6
  )


def test_count_sketch_matches_a_numpy_reference_and_is_linear():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=1000).astype(np.float32), rng.normal(size=1000).astype(np.float32)
  sketch = signals.count_sketch_tf(tf.constant(a), 64, seed=3).numpy()
  buckets = tf.random.stateless_uniform(
    [1000], seed=[3, 0], minval=0, maxval=64, dtype=tf.int32
  ).numpy()
  signs = (
    tf.random.stateless_uniform([1000], seed=[3, 1], minval=0, maxval=2, dtype=tf.int32).numpy() * 2
    - 1
  )
  reference = np.zeros(64)
  np.add.at(reference, buckets, signs * a)
  np.testing.assert_allclose(sketch, reference, rtol=1e-5, atol=1e-5)
  both = signals.count_sketch_tf(tf.constant(a + b), 64, seed=3).numpy()
  np.testing.assert_allclose(
    both, sketch + signals.count_sketch_tf(tf.constant(b), 64, seed=3).numpy(), atol=1e-4
  )
  assert len(set(buckets.tolist())) == 64  # Every bucket used: the hash spreads.
  # Small inputs are kept exactly.
  np.testing.assert_array_equal(
    signals.count_sketch_tf(tf.constant([1.0, 2.0]), 4, seed=3).numpy(), [1, 2, 0, 0]
  )


def test_without_signals_the_round_is_the_same_and_reports_none(small_digits_task, process):
  # sketch_size=None and no losses: the same training step, no per-client signals.
  task = small_digits_task
  bare = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=None
  )
  losses_only = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=None, client_losses=True
  )
  start = task.initial_model_weights(0)
  data = signals.selection_client_data([task.client_dataset(c, seed=1) for c in (2, 9)], [0.5, 0.5])
  outputs = {
    name: p.next(p.set_model_weights(p.initialize(), start), data)
    for name, p in (('full', process), ('bare', bare), ('losses', losses_only))
  }
  assert 'signals' not in outputs['bare'].metrics['client_work']
  assert list(outputs['losses'].metrics['client_work']['signals']) == ['loss']
  np.testing.assert_allclose(
    outputs['losses'].metrics['client_work']['signals']['loss'],
    outputs['full'].metrics['client_work']['signals']['loss'],
    rtol=1e-6,
  )
  for name in ('bare', 'losses'):
    np.testing.assert_allclose(
      _flat(process.get_model_weights(outputs[name].state)),
      _flat(process.get_model_weights(outputs['full'].state)),
      atol=1e-7,
    )


@pytest.mark.parametrize('bad', [0, -5, 2.5, True])
def test_rejects_bad_sketch_size(small_digits_task, bad):
  with pytest.raises(ValueError, match='sketch_size must be a positive integer'):
    signals.build_signals_client_work(small_digits_task.model_fn, None, sketch_size=bad)


def test_mismatched_weights_are_an_error(small_digits_task):
  with pytest.raises(ValueError, match='2 datasets but 1 weights'):
    signals.selection_client_data([small_digits_task.client_dataset(0, 0)] * 2, [1.0])


def test_proximal_strength_makes_the_signals_process_fedprox(small_digits_task):
  """Same clients, example-count weights: the signals process with μ = 0.3
  lands on the model of `learning.build_fed_prox` (μ = 0.3), not FedAvg's."""
  from tff_sampling import learning

  task, start = small_digits_task, small_digits_task.initial_model_weights(0)
  clients = (2, 4, 6)
  batches = {c: list(task.client_dataset(c, seed=3)) for c in clients}

  def fixed(c):  # The task's datasets reshuffle on each iteration: freeze them.
    ds = tf.data.Dataset.from_tensors(batches[c][0])
    for b in batches[c][1:]:
      ds = ds.concatenate(tf.data.Dataset.from_tensors(b))
    return ds

  sizes = [float(task.client_num_examples[c]) for c in clients]
  prox_signals = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=16, proximal_strength=0.3
  )
  state = prox_signals.set_model_weights(prox_signals.initialize(), start)
  got = prox_signals.get_model_weights(
    prox_signals.next(
      state, signals.selection_client_data([fixed(c) for c in clients], sizes)
    ).state
  )
  for mu, should_match in ((0.3, True), (0.0, False)):
    reference = learning.build_fed_prox(
      task.model_fn, proximal_strength=mu, client_learning_rate=0.1
    )
    state = reference.set_model_weights(reference.initialize(), start)
    expected = reference.get_model_weights(reference.next(state, [fixed(c) for c in clients]).state)
    close = np.allclose(_flat(got), _flat(expected), rtol=1e-5, atol=1e-6)
    assert close == should_match, mu


def _keras_mean_loss(task, weights, dataset):
  """Independent oracle: the mean loss of `weights` on `dataset`, with plain Keras."""
  model = task.keras_model_fn(0)
  weights.assign_weights_to(model)
  loss_fn = task.loss_fn()
  total, count = 0.0, 0
  for batch in dataset:
    total += float(loss_fn(batch['y'], model(batch['x'], training=False))) * len(batch['y'])
    count += len(batch['y'])
  return total / count


def test_loss_probe_evaluates_the_weights_it_is_given(small_digits_task, process):
  # Regression: the probe once assigned the weights without running the
  # assignments, so every call returned the freshly built model's loss.
  task = small_digits_task
  probe = signals.build_loss_probe(
    task.model_fn, process.get_model_weights.type_signature.result, task.element_spec
  )
  clients = [2, 9]
  seeded = task.initial_model_weights(3)
  zero = tf.nest.map_structure(np.zeros_like, task.initial_model_weights(0))
  for weights in (seeded, zero):
    losses = probe(
      weights,
      signals.selection_client_data(
        [task.client_dataset(c, seed=1) for c in clients], [1.0] * len(clients)
      ),
    )
    expected = [_keras_mean_loss(task, weights, task.client_dataset(c, seed=1)) for c in clients]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
  # All-zero weights predict uniformly over 10 labels: the loss is ln 10 exactly.
  np.testing.assert_allclose(losses, np.log(10.0), rtol=1e-6)


def test_the_client_learning_rate_is_a_tff_hyperparameter(process):
  # TFF's get_hparams/set_hparams reach the clients' optimizer (what a decaying rate uses).
  state = process.initialize()
  hparams = process.get_hparams(state)
  assert float(hparams['client_work']['learning_rate']) == pytest.approx(0.1)
  hparams['client_work']['learning_rate'] = np.float32(0.025)
  state = process.set_hparams(state, hparams)
  assert float(process.get_hparams(state)['client_work']['learning_rate']) == pytest.approx(0.025)
