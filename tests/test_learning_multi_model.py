"""Tests for tff_sampling/learning/multi_model.py (the MMFL process).

Oracles: TFF's own FedAvg (the full-participation step), Keras losses, and the
NumPy probabilities of `tff_sampling.probabilities`; statistical tests state
their confidence.
"""

import copy

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import tree_analysis

from tasks import multi_model as suites
from tff_sampling import probabilities
from tff_sampling.learning import fedavg
from tff_sampling.learning import multi_model
from tff_sampling.learning import multi_model_types
from tff_sampling.runtime import tff_context

tff_context.use_secure_sum_simulation()

N = 8
LR = 0.05


@pytest.fixture(scope='module')
def suite():
  """Two digits tasks (Dirichlet 0.05 and 10) over 8 clients, one local epoch."""
  return suites.create_suite(
    'digits_noniid', num_models=2, num_clients=N, client_epochs=1, client_batch_size=20
  )


def _shares(tasks):
  return multi_model_types.data_shares(np.stack([t.client_num_examples for t in tasks], axis=1))


def _data(tasks, shares, clients=range(N)):
  return [
    multi_model_types.client_data([t.client_dataset(i, seed=7) for t in tasks], i, shares[i])
    for i in clients
  ]


def _flat(weights):
  return np.concatenate([np.ravel(t) for t in weights.trainable])


def _state(process, tasks, round_num=0):
  state = process.initialize()
  state['models'] = tuple(t.initial_model_weights(s) for s, t in enumerate(tasks))
  state['round'] = np.int64(round_num)
  return state


@pytest.fixture(scope='module')
def full_participation_steps(suite):
  """`_full_participation_steps` of the module's suite: deterministic, so computed once (read
  only, as the tests share it)."""
  steps = _full_participation_steps(suite)
  for step in steps:
    step.flags.writeable = False
  return steps


@pytest.fixture(scope='module')
def keras_losses(suite):
  """`_keras_losses` of the module's suite: deterministic, so computed once (read only, as the
  tests share it)."""
  losses = _keras_losses(suite)
  losses.flags.writeable = False
  return losses


@pytest.fixture(scope='module')
def build(suite):
  """`build_multi_model_process` over the suite's models, memoised per argument set.

  Building a process and its first call take seconds each; tests that need the same
  process (same sampling, m and options) share one. The processes are stateless.
  """
  built = {}

  def get(sampling, expected_clients=3, **kwargs):
    key = (sampling, float(expected_clients), tuple(sorted(kwargs.items())))
    if key not in built:
      built[key] = multi_model.build_multi_model_process(
        [t.model_fn for t in suite],
        sampling=sampling,
        expected_clients=expected_clients,
        client_learning_rates=LR,
        **kwargs,
      )
    return built[key]

  return get


def _full_participation_steps(tasks):
  """Σ_i d_{i,s} U_{i,s} per model, from TFF's FedAvg over every client (server lr 1)."""
  steps = []
  for s, task in enumerate(tasks):
    process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=LR)
    start = task.initial_model_weights(s)
    state = process.set_model_weights(process.initialize(), start)
    output = process.next(state, [task.client_dataset(i, seed=7) for i in range(N)])
    steps.append(_flat(start) - _flat(process.get_model_weights(output.state)))
  return steps


def _keras_losses(tasks):
  """``f_{i,s}(w_s)``: each model's mean loss on each client's data, with plain Keras."""
  losses = np.zeros([N, len(tasks)])
  for s, task in enumerate(tasks):
    model = task.keras_model_fn(0)
    task.initial_model_weights(s).assign_weights_to(model)
    loss_fn = task.loss_fn()
    for i in range(N):
      total, count = 0.0, 0
      for batch in task.client_dataset(i, seed=7):
        total += float(loss_fn(batch['y'], model(batch['x'], training=False))) * len(batch['y'])
        count += len(batch['y'])
      losses[i, s] = total / max(count, 1)
  return losses


@pytest.mark.slow
def test_full_participation_with_one_model_is_tffs_fedavg(suite, full_participation_steps):
  # S = 1 and m = N: every client has p = 1 and weight d_i, so the step is
  # FedAvg's example-weighted mean of the updates, whichever signal is used.
  # (Model 0's FedAvg step does not depend on the other models.)
  tasks = suite[:1]
  shares = _shares(tasks)
  expected = full_participation_steps[0]
  for sampling in ('optimal', 'optimal_loss', 'optimal_secure'):
    process = multi_model.build_multi_model_process(
      [tasks[0].model_fn], sampling=sampling, expected_clients=N, client_learning_rates=LR
    )
    state = _state(process, tasks)
    output = process.next(state, _data(tasks, shares))
    step = _flat(state['models'][0]) - _flat(output.state['models'][0])
    np.testing.assert_allclose(step, expected, atol=2e-6, err_msg=sampling)
    assert output.measurements['uploads'].tolist() == [N]
    assert output.measurements['full_participation'] == 1.0
    assert output.state['round'] == 1


@pytest.mark.parametrize(
  'sampling,steps', [('optimal_loss', None), ('optimal_loss_secure', 0), ('optimal_loss_secure', 1)]
)
def test_loss_signal_probabilities_match_numpy(suite, keras_losses, build, sampling, steps):
  # The process's α and Σp come from the probabilities it drew with; the
  # NumPy functions on the Keras losses give the same numbers.
  shares = _shares(suite)
  signal = shares * keras_losses
  m = 3.0
  if steps is None:
    p = probabilities.multi_model_probabilities(signal, m)
  else:
    p = probabilities.approximate_multi_model_probabilities(signal, m, steps)
  # The exact sampling with the default max_rescaling_steps (4): the process that
  # test_each_model_is_chosen_as_often_as_its_probabilities_say runs too.
  if steps is None:
    process = build(sampling, m)
  else:
    process = build(sampling, m, max_rescaling_steps=steps)
  output = process.next(_state(process, suite), _data(suite, shares))
  measured = output.measurements
  assert measured['expected_uploads'] == pytest.approx(p.sum(), rel=1e-5)
  assert measured['improvement_factor'] == pytest.approx(
    probabilities.multi_model_improvement_factor(signal, p, m), rel=1e-4
  )
  assert measured['cohort_size'] == N
  if steps is None:  # The exact process reports what the secure one would have had.
    exact = probabilities.multi_model_sampling_variance(signal, p)
    ratios = [
      probabilities.multi_model_sampling_variance(
        signal, probabilities.approximate_multi_model_probabilities(signal, m, j)
      )
      / exact
      for j in range(5)
    ]
    np.testing.assert_allclose(measured['secure_variance_ratio'], ratios, rtol=1e-4)
    assert measured['secure_variance_ratio'][0] >= 1.0


def _mean_steps(process, suite, shares, rounds):
  """Per-round model steps over `rounds` rounds from the same models (only the draw changes)."""
  steps = [[] for _ in suite]
  uploads = []
  data = _data(suite, shares)
  # Every round starts from the same models; only the round number (the draw) changes.
  start = _state(process, suite)
  start_flat = [_flat(w) for w in start['models']]
  for r in range(rounds):
    state = copy.copy(start)
    state['round'] = np.int64(r)
    output = process.next(state, data)
    uploads.append(output.measurements['uploads'])
    for s in range(len(suite)):
      steps[s].append(start_flat[s] - _flat(output.state['models'][s]))
  return [np.array(x) for x in steps], np.array(uploads)


@pytest.mark.parametrize('sampling', ['optimal', 'random', 'round_robin'])
@pytest.mark.slow
def test_the_step_is_unbiased_for_full_participation(
  suite, full_participation_steps, build, sampling
):
  # E[step_s] = Σ_i d_{i,s} U_{i,s}. Over K = 60 draws from fixed models, the
  # mean step projected on the target direction and on a fixed random one
  # must be within 4.5 standard errors (two-sided p < 1e-5 each under a
  # normal approximation). Round robin is unbiased over its rotation: K is a
  # multiple of S.
  shares = _shares(suite)
  targets = full_participation_steps
  process = build(sampling)
  rounds = 60
  steps, uploads = _mean_steps(process, suite, shares, rounds)
  assert 1.0 < uploads.sum(axis=1).mean() < 5.0  # m = 3 expected trainers.
  rng = np.random.default_rng(0)
  for s, target in enumerate(targets):
    for direction in (target / np.linalg.norm(target), rng.standard_normal(target.size)):
      projected = steps[s] @ direction
      error = projected.mean() - target @ direction
      standard_error = projected.std(ddof=1) / np.sqrt(rounds)
      assert abs(error) < 4.5 * standard_error + 1e-7, (sampling, s, error, standard_error)
  # A biased estimator (no 1/p) would miss by far: the projections carry signal.
  assert abs(np.mean(steps[0] @ targets[0]) - targets[0] @ targets[0]) < 0.5 * (
    targets[0] @ targets[0]
  )


@pytest.mark.slow
def test_each_model_is_chosen_as_often_as_its_probabilities_say(suite, keras_losses, build):
  # Loss signals from fixed models: p_{s|i} is fixed, so uploads of model s
  # over K rounds are a sum of independent Bernoullis with mean K Σ_i p_{s|i}.
  shares = _shares(suite)
  m = 3.0
  p = probabilities.multi_model_probabilities(shares * keras_losses, m)
  process = build('optimal_loss', m)
  rounds = 40
  _, uploads = _mean_steps(process, suite, shares, rounds)
  mean = rounds * p.sum(axis=0)
  std = np.sqrt(rounds * (p * (1 - p)).sum(axis=0))
  np.testing.assert_array_less(np.abs(uploads.sum(axis=0) - mean), 4.5 * std)  # p < 1e-5 each.
  assert uploads.sum(axis=1).max() <= N  # At most one model per client.


def test_a_model_without_data_on_a_client_is_never_trained_there(suite):
  # Client 0 has no data for model 1 (empty dataset, share 0): it may train
  # model 0 only, and model 1's step must not depend on it.
  tasks = suite
  shares = _shares(tasks).copy()
  shares[0, 1] = 0.0
  shares[:, 1] /= shares[:, 1].sum()
  data = _data(tasks, shares)
  data[0]['data'] = (data[0]['data'][0], tasks[1].client_dataset(0, seed=7).take(0))
  process = multi_model.build_multi_model_process(
    [t.model_fn for t in tasks], sampling='random', expected_clients=N, client_learning_rates=LR
  )
  for r in range(6):
    state = _state(process, tasks, round_num=r)
    with_client = process.next(state, data)
    without = process.next(state, data[1:])
    assert with_client.measurements['uploads'][0] == without.measurements['uploads'][0] + 1
    np.testing.assert_allclose(
      _flat(with_client.state['models'][1]), _flat(without.state['models'][1]), atol=1e-6
    )


@pytest.mark.parametrize('baseline', ['random', 'round_robin'])
def test_training_every_model_first_does_not_change_a_baseline(suite, build, baseline):
  # `<baseline>_train_all` trains every client-model pair, as optimal does, then makes the
  # baseline's draw: the same uploads, weights and model steps as the baseline, which trains
  # only the pair it drew (a trained update nobody uploads never reaches the server).
  shares = _shares(suite)
  data = _data(suite, shares)
  outputs, maps = {}, {}
  for sampling in (baseline, f'{baseline}_train_all'):
    process = build(sampling)
    maps[sampling] = _intrinsic_uris(process.next).count('federated_map')
    outputs[sampling] = [process.next(_state(process, suite, round_num=r), data) for r in range(3)]
  # The baseline's clients train in one map (the drawn model); with train_all, one training map
  # per model runs before the draw (and TFF's zip of their results adds maps of its own).
  assert maps[f'{baseline}_train_all'] >= maps[baseline] + len(suite)
  for r, (alone, trained_all) in enumerate(
    zip(outputs[baseline], outputs[f'{baseline}_train_all'])
  ):
    np.testing.assert_array_equal(
      alone.measurements['uploads'], trained_all.measurements['uploads']
    )
    assert np.sum(alone.measurements['uploads']) > 0, r
    # Neither uploads a signal: the bits accounted are the same.
    assert (
      alone.measurements['extra_scalars_per_client']
      == trained_all.measurements['extra_scalars_per_client']
    )
    for s in range(len(suite)):
      np.testing.assert_allclose(
        _flat(alone.state['models'][s]), _flat(trained_all.state['models'][s]), atol=1e-6
      )


def _intrinsic_uris(computation):
  uris = []

  def record(node):
    if isinstance(node, building_blocks.Intrinsic):
      uris.append(node.uri)
    return False

  tree_analysis.count(computation.to_building_block(), record)
  return uris


def test_secure_samplings_sum_client_values_only_securely(suite, build):
  # Every client value but the model updates (one plain sum per model) goes
  # through secure sums; the exact sampling gathers the individual M_i.
  for sampling in ('optimal_secure', 'optimal_loss_secure'):
    uris = _intrinsic_uris(build(sampling).next)
    assert uris.count('federated_sum') == len(suite), sampling
    assert 'federated_aggregate' not in uris and 'federated_mean' not in uris
    assert 'federated_secure_sum_bitwidth' in uris
  exact = _intrinsic_uris(build('optimal').next)
  assert 'federated_aggregate' in exact


def test_state_and_measurements_keep_their_structure(suite):
  # What the program loop reads: a state <round, models> whose models are
  # assignable ModelWeights, and the measurements by name and shape.
  head = ['cohort_size', 'uploads', 'expected_uploads', 'rescaling_steps', 'full_participation']
  tail = ['clipped_signals', 'non_finite_signals', 'non_finite_updates', 'extra_scalars_per_client']
  for sampling, signal_names in (
    ('optimal', ['improvement_factor', 'secure_variance_ratio']),
    ('random', []),
  ):
    process = multi_model.build_multi_model_process(
      [t.model_fn for t in suite],
      sampling=sampling,
      expected_clients=3,
      client_learning_rates=LR,
      max_rescaling_steps=2,
    )
    measurements = process.next.type_signature.result.measurements.member
    assert structure.name_list(measurements) == head + signal_names + tail, sampling
    assert str(measurements.uploads) == 'int32[2]'
    if signal_names:
      assert str(measurements.secure_variance_ratio) == 'float32[3]'
    state = process.initialize()
    assert list(state) == ['round', 'models'] and state['round'] == 0
    assert all(isinstance(w, tff.learning.models.ModelWeights) for w in state['models'])


def test_bad_arguments_name_the_value():
  fns = [lambda: None]
  with pytest.raises(ValueError, match='sampling must be one of'):
    multi_model.build_multi_model_process(
      fns, sampling='best', expected_clients=1, client_learning_rates=0.1
    )
  with pytest.raises(ValueError, match='expected_clients must be a positive'):
    multi_model.build_multi_model_process(
      fns, sampling='random', expected_clients=0, client_learning_rates=0.1
    )
  with pytest.raises(ValueError, match='2 client learning rates for 1 models'):
    multi_model.build_multi_model_process(
      fns, sampling='random', expected_clients=1, client_learning_rates=[0.1, 0.2]
    )
  with pytest.raises(ValueError, match='model_fns is empty'):
    multi_model.build_multi_model_process(
      [], sampling='random', expected_clients=1, client_learning_rates=0.1
    )
  with pytest.raises(ValueError, match=r'Model\(s\) \[1\] have no training examples'):
    multi_model_types.data_shares([[3, 0], [1, 0]])
  with pytest.raises(ValueError, match='one per model'):
    multi_model_types.client_data([tf.data.Dataset.range(1)], 0, [0.5, 0.5])


def test_data_shares_by_hand():
  np.testing.assert_allclose(
    multi_model_types.data_shares([[1, 0], [3, 2]]), [[0.25, 0.0], [0.75, 1.0]]
  )
