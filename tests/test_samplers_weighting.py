"""Tests for tff_sampling/samplers/weighting.py: a sampler's weights through plain FedAvg."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import samplers
from tff_sampling.samplers import weighting

_UNIFORM = tff.learning.ClientWeighting.UNIFORM
_NUM_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES

# Population of the statistical tests: M = 100, the largest client holds 30 %.
_SIZES = np.array([30, 20, 20, 10, 10, 5, 5], np.int64)
_POPULATION = samplers.Population(num_examples=_SIZES)
_ALL = np.ones(_SIZES.size, bool)


def _power_of_choice():
  return samplers.PowerOfChoiceSampler(2, num_candidates=3, seed=0)


def _fedgs():
  rng = np.random.default_rng([7, 0])
  points = rng.normal(size=(_SIZES.size, 2))
  distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
  return samplers.FedGSSampler(3, seed=0, distances=distances, method='heuristic')


_DECLARED = [
  (lambda: samplers.UniformSampler(3, seed=0), 'process'),
  (_power_of_choice, 'process'),
  (lambda: samplers.MDSampler(4, seed=0), 'equal'),
  (lambda: samplers.ClusteredSampler(4, seed=0), 'equal'),
  (lambda: samplers.TargetSampler(np.array([0, 0, 1, 1, 2, 2, 2]), seed=0), 'equal'),
  (_fedgs, 'num_examples'),
  (
    lambda: samplers.LeflSampler(3, clusters=np.array([0, 0, 1, 1, 2, 2, 2]), seed=0),
    'num_examples',
  ),
]


@pytest.mark.parametrize('make,kind', _DECLARED)
def test_each_sampler_declares_the_weights_it_returns(make, kind):
  sampler = make()
  assert weighting.sampler_weighting(sampler) == kind
  assert weighting.sampler_sets_weights(sampler) == (kind != 'process')
  state = sampler.initialize(_POPULATION)
  for round_num in range(1, 6):
    if sampler.probe_signal is not None:
      selection = sampler.select(
        state, round_num, _ALL, probe=lambda c: np.arange(len(c), dtype=float)
      )
    else:
      selection = sampler.select(state, round_num, _ALL)
    clients = np.asarray(selection.clients)
    if kind == 'process':
      assert selection.weights is None
      continue
    weights = np.asarray(selection.weights, np.float64)
    if kind == 'equal':
      np.testing.assert_allclose(weights, 1.0 / clients.size, rtol=1e-6)
    else:  # n_k / Σ_S n, each client once.
      assert np.unique(clients).size == clients.size
      np.testing.assert_allclose(weights, _SIZES[clients] / _SIZES[clients].sum(), rtol=1e-6)
    # And the helper accepts it with the weighting it names.
    needed = weighting.required_client_weighting(sampler)
    examples = _SIZES[clients] * 3  # Three whole epochs.
    assert (
      weighting.fed_avg_datasets(selection, lambda c: c, needed, examples_trained=examples)
      == clients.tolist()
    )


def test_required_client_weighting():
  assert weighting.required_client_weighting(samplers.UniformSampler(3, seed=0)) is None
  assert weighting.required_client_weighting(samplers.MDSampler(4, seed=0)) is _UNIFORM
  assert weighting.required_client_weighting(_fedgs()) is _NUM_EXAMPLES

  class Custom(samplers.MDSampler):
    weighting = 'custom'

  with pytest.raises(
    ValueError, match='Custom sets aggregation weights that no built-in.*build_fed_avg_with_signals'
  ):
    weighting.required_client_weighting(Custom(4, seed=0))

  class Typo(samplers.MDSampler):
    weighting = 'uniform'

  with pytest.raises(ValueError, match='Typo.weighting must be one of'):
    weighting.sampler_sets_weights(Typo(4, seed=0))


def test_check_fed_avg_weighting_refuses_a_process_that_drops_the_weights():
  md = samplers.MDSampler(4, seed=0)
  with pytest.raises(
    ValueError,
    match=r'MDSampler weights each slot equally \(1/m\), but a '
    'FedAvg process built with client_weighting='
    'NUM_EXAMPLES replaces',
  ):
    weighting.check_fed_avg_weighting(md, _NUM_EXAMPLES)
  weighting.check_fed_avg_weighting(md, _UNIFORM)
  weighting.check_fed_avg_weighting(md, 'UNIFORM')  # The enum's name works too.
  with pytest.raises(ValueError, match='FedGSSampler weights each slot by n_k'):
    weighting.check_fed_avg_weighting(_fedgs(), _UNIFORM)
  weighting.check_fed_avg_weighting(_fedgs(), _NUM_EXAMPLES)
  with pytest.raises(ValueError, match='fixed number of local steps'):
    weighting.check_fed_avg_weighting(_fedgs(), _NUM_EXAMPLES, fixed_local_steps=True)
  for client_weighting in (_UNIFORM, _NUM_EXAMPLES):  # Weights left to the process.
    weighting.check_fed_avg_weighting(samplers.UniformSampler(3, seed=0), client_weighting)
  with pytest.raises(ValueError, match='client_weighting must be'):
    weighting.check_fed_avg_weighting(md, lambda metrics: 1.0)


def test_fed_avg_datasets_checks_every_selection():
  md = samplers.Selection(clients=np.array([0, 3, 0]), weights=np.full(3, 1 / 3, np.float32))
  # One dataset per slot, in slot order, duplicates repeated.
  assert weighting.fed_avg_datasets(md, lambda c: f'data{c}', _UNIFORM) == [
    'data0',
    'data3',
    'data0',
  ]
  with pytest.raises(
    ValueError, match='not what a FedAvg process with client_weighting=NUM_EXAMPLES applies'
  ):
    weighting.fed_avg_datasets(md, lambda c: c, _NUM_EXAMPLES, examples_trained=[30, 10, 30])
  by_size = samplers.Selection(clients=np.array([0, 3]), weights=np.array([0.75, 0.25], np.float32))
  assert weighting.fed_avg_datasets(
    by_size, lambda c: c, _NUM_EXAMPLES, examples_trained=[30, 10]
  ) == [0, 3]
  with pytest.raises(ValueError, match='pass examples_trained'):
    weighting.fed_avg_datasets(by_size, lambda c: c, _NUM_EXAMPLES)
  with pytest.raises(ValueError, match='UNIFORM gives every slot the same share'):
    weighting.fed_avg_datasets(by_size, lambda c: c, _UNIFORM)
  # Fixed local steps: every slot trains on as many examples, so ∝ n_k fails.
  with pytest.raises(ValueError, match='NUM_EXAMPLES'):
    weighting.fed_avg_datasets(by_size, lambda c: c, _NUM_EXAMPLES, examples_trained=[20, 20])
  # No weights: the process's own weighting, whatever it is.
  plain = samplers.Selection(clients=np.array([2, 1]))
  for client_weighting in (_UNIFORM, _NUM_EXAMPLES):
    assert weighting.fed_avg_datasets(plain, lambda c: c, client_weighting) == [2, 1]
  with pytest.raises(ValueError, match='one positive count per slot'):
    weighting.fed_avg_datasets(by_size, lambda c: c, _NUM_EXAMPLES, examples_trained=[1])


def test_realised_and_selection_shares_hand_computed():
  selection = samplers.Selection(
    clients=np.array([0, 3, 0, 1]), weights=np.full(4, 0.25, np.float32)
  )
  np.testing.assert_allclose(
    weighting.realised_weights(selection, _UNIFORM, 5), [0.5, 0.25, 0, 0.25, 0]
  )
  np.testing.assert_allclose(weighting.selection_shares(selection, 5), [0.5, 0.25, 0, 0.25, 0])
  # NUM_EXAMPLES with sizes 30, 10, 30, 20: slots get 30/90, 10/90, 30/90, 20/90.
  np.testing.assert_allclose(
    weighting.realised_weights(selection, _NUM_EXAMPLES, 5, examples_trained=[30, 10, 30, 20]),
    [60 / 90, 20 / 90, 0, 10 / 90, 0],
  )


def test_md_sampling_through_the_helper_is_unbiased():
  # E[ω_i] = n_i / M for MD sampling with weights 1/m (Fraboni et al.); ω_i is
  # (draws of i)/m, so over R independent rounds its mean has standard error
  # sqrt(p_i (1 − p_i) / (m R)). 5 standard errors on 7 clients: a false alarm
  # has probability < 7 · 5.8e-7.
  m, rounds = 4, 4000
  sampler = samplers.MDSampler(m, seed=11)
  state = sampler.initialize(_POPULATION)
  needed = weighting.required_client_weighting(sampler)
  assert needed is _UNIFORM
  uniform = np.zeros(_SIZES.size)
  by_examples = np.zeros(_SIZES.size)
  for round_num in range(1, rounds + 1):
    selection = sampler.select(state, round_num, _ALL)
    slots = weighting.fed_avg_datasets(selection, lambda c: c, needed)
    assert slots == np.asarray(selection.clients).tolist()
    shares = weighting.realised_weights(selection, needed, _SIZES.size)
    np.testing.assert_allclose(
      shares, weighting.selection_shares(selection, _SIZES.size), rtol=1e-6
    )
    uniform += shares
    # What a NUM_EXAMPLES process (TFF's default) would have applied instead.
    by_examples += weighting.realised_weights(
      selection, _NUM_EXAMPLES, _SIZES.size, examples_trained=_SIZES[selection.clients]
    )
  p = _SIZES / _SIZES.sum()
  standard_error = np.sqrt(p * (1 - p) / (m * rounds))
  assert np.all(np.abs(uniform / rounds - p) <= 5 * standard_error), (uniform / rounds, p)
  # The dropped weights are a bias, far outside the noise: the largest client
  # (30 %) gets about half of the aggregate.
  assert by_examples[0] / rounds - p[0] > 20 * standard_error[0]
  assert 0.40 < by_examples[0] / rounds < 0.55


# --- Through TFF: the process applies exactly what `realised_weights` says. --------


def _one_hot_fed_avg(num_clients, client_weighting):
  """FedAvg on a linear model whose one-round update from 0 is each client's e_i.

  Client i's data is one batch of n_i copies of (x = e_i, y = 1). The loss
  mean((w·x − 1)²) has gradient −2 e_i at w = 0; one SGD step of 0.5 gives
  w = e_i, TFF's model delta is 0 − e_i, and server SGD with rate 1 (w − Δ)
  moves the global model to Σ_k share_k e_{c_k} = the realised shares.
  """

  def model_fn():
    keras_model = tf.keras.Sequential(
      [
        tf.keras.layers.InputLayer(input_shape=(num_clients,)),
        tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
      ]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.MeanSquaredError(),
      input_spec=(
        tf.TensorSpec([None, num_clients], tf.float32),
        tf.TensorSpec([None, 1], tf.float32),
      ),
    )

  return tff.learning.algorithms.build_weighted_fed_avg(
    model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    client_weighting=client_weighting,
  )


def _client_dataset(client):
  x = np.zeros((_SIZES[client], _SIZES.size), np.float32)
  x[:, client] = 1.0
  return tf.data.Dataset.from_tensors((x, np.ones((_SIZES[client], 1), np.float32)))


def test_tff_fed_avg_applies_the_realised_weights():
  sampler = samplers.MDSampler(4, seed=3)
  state = sampler.initialize(_POPULATION)
  selections = [sampler.select(state, r, _ALL) for r in range(1, 40)]
  # Rounds with a client drawn twice and one with two distinct large clients.
  chosen = [s for s in selections if np.unique(s.clients).size < s.clients.size][:2]
  chosen += [s for s in selections if np.unique(s.clients).size == s.clients.size][:1]
  assert len(chosen) == 3
  for client_weighting in (_UNIFORM, _NUM_EXAMPLES):
    process = _one_hot_fed_avg(_SIZES.size, client_weighting)
    for selection in chosen:
      if client_weighting is _UNIFORM:
        data = weighting.fed_avg_datasets(selection, _client_dataset, client_weighting)
      else:  # The helper refuses this pairing; feed the process directly.
        with pytest.raises(ValueError, match='NUM_EXAMPLES'):
          weighting.fed_avg_datasets(
            selection, _client_dataset, client_weighting, examples_trained=_SIZES[selection.clients]
          )
        data = [_client_dataset(int(c)) for c in selection.clients]
      output = process.next(process.initialize(), data)
      model = process.get_model_weights(output.state).trainable[0][:, 0]
      expected = weighting.realised_weights(
        selection, client_weighting, _SIZES.size, examples_trained=_SIZES[selection.clients]
      )
      # float32 arithmetic on values ≤ 1: 1e-6.
      np.testing.assert_allclose(model, expected, rtol=0, atol=1e-6)
      intended = weighting.selection_shares(selection, _SIZES.size)
      if client_weighting is _UNIFORM:
        np.testing.assert_allclose(model, intended, rtol=0, atol=1e-6)
      else:
        assert np.max(np.abs(model - intended)) > 0.05  # The sampler's weights were dropped.
