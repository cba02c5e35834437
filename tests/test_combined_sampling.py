"""A server-side sampler followed by optimal sampling of the uploads: still unbiased.

The two stages are independent in the code: the sampler (`tff_sampling.samplers`)
chooses who trains and with which aggregation weight, then
`OptimalSamplingFactory` chooses which of those updates are uploaded and
divides each uploaded one by its probability. Conditionally on the cohort the
second stage is unbiased for the sampler's own weighted mean, so the pair is
unbiased for whatever the sampler alone is unbiased for. MD sampling (draws
∝ n_k, weight 1/m per draw) is unbiased for the full-participation update
``Σ n_k U_k / Σ n_k``; these tests check that the combination is too, by Monte
Carlo over rounds, and that the same check detects a biased pairing.
"""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import samplers
from tff_sampling.aggregators import OptimalSamplingFactory
from tff_sampling.runtime import tff_context

tff_context.use_secure_sum_simulation()

_VALUE_TYPE = tff.to_type(collections.OrderedDict(x=tff.TensorType(np.float32, [4])))
_WEIGHT_TYPE = tff.TensorType(np.float32)
_ROUNDS = 300
# Per coordinate the mean of R independent rounds is within 4.5 standard errors of its
# expectation except with probability < 7e-6 (normal approximation; R = 300 rounds of a
# bounded estimate): < 3e-5 for the 4 coordinates together.
# R is not smaller, for power: the biased pairing below shifts x[1] by only 0.41 of a round's
# standard deviation (repeated MD slots of a client share one upload draw, seeded by the
# update, which widens the rounds' spread), i.e. ~0.41·√R standard errors. A numpy
# simulation of both stages detects it with probability 0.9987 at R = 300, 0.93 at 200 and
# 0.72 at 150 (at the fixed seeds: 7.3 standard errors at 300, 4.1 at 150).
_Z = 4.5

# Ten clients: updates of very different norms, sizes from 3 to 400 examples.
_RNG = np.random.default_rng(11)
_UPDATES = (_RNG.normal(size=(10, 4)) * _RNG.lognormal(sigma=1.0, size=(10, 1))).astype(np.float32)
_SIZES = np.array([3, 7, 12, 20, 35, 60, 90, 150, 260, 400], np.int64)
_FULL_UPDATE = np.average(_UPDATES.astype(np.float64), axis=0, weights=_SIZES)


@pytest.fixture(scope='module')
def upload_process():
  """Optimal sampling of 2 expected uploads: both tests run the same one, built once."""
  return OptimalSamplingFactory(2.0, seed=7).create(_VALUE_TYPE, _WEIGHT_TYPE)


def _combined_estimates(process, weights_of, draws=6):
  """Per round: MD draws `draws` slots; the slots' updates pass optimal upload sampling."""
  sampler = samplers.MDSampler(draws, seed=3)
  sampler_state = sampler.initialize(samplers.Population(_SIZES))
  state = process.initialize()
  estimates, uploads = [], []
  for round_num in range(1, _ROUNDS + 1):
    selection = sampler.select(sampler_state, round_num, np.ones(len(_SIZES), bool))
    values = [collections.OrderedDict(x=_UPDATES[k]) for k in selection.clients]
    output = process.next(state, values, [float(w) for w in weights_of(selection)])
    state = output.state
    estimates.append(np.asarray(output.result['x'], np.float64))
    uploads.append(int(output.measurements['uploads']))
  return np.array(estimates), np.array(uploads)


def _within(estimates, expected):
  standard_error = estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))
  return np.abs(estimates.mean(axis=0) - expected) <= _Z * standard_error


@pytest.mark.slow
def test_md_then_optimal_uploads_is_unbiased_for_the_full_update(upload_process):
  estimates, uploads = _combined_estimates(upload_process, lambda selection: selection.weights)
  assert np.all(_within(estimates, _FULL_UPDATE)), (estimates.mean(axis=0), _FULL_UPDATE)
  # Fewer uploads than trainers: 2 expected of 6 (fewer when a round's cohort repeats a
  # client with a zero norm; here every norm is positive, so exactly 2 in expectation).
  assert uploads.mean() == pytest.approx(2.0, abs=_Z * uploads.std(ddof=1) / np.sqrt(_ROUNDS))
  assert uploads.max() <= 6


@pytest.mark.slow
def test_the_check_detects_a_biased_pairing(upload_process):
  # MD already draws ∝ n_k; weighting the draws by n_k again counts size twice, a
  # bias of the sampler stage that the upload stage keeps. The same test must see it.
  estimates, _ = _combined_estimates(
    upload_process, lambda selection: _SIZES[selection.clients].astype(np.float32)
  )
  assert not np.all(_within(estimates, _FULL_UPDATE))
