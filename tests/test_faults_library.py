"""Silent wrong answers of the library, each now an exact answer or an error that says why.

* An inner factory that returns a mean (1/n of the update) is refused.
* A sampler whose weights a plain FedAvg process would replace is refused.
* Zero norms get p = 0 in NumPy, TF and the aggregator, also for m ≥ n.
* Secure sums outside TFF's test context say what to call (fresh interpreter).
* The README's sampler table shows the required ``seed=``.
"""

import inspect
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_sampling import probabilities
from tff_sampling import samplers
from tff_sampling.aggregators import OptimalSamplingFactory
from tff_sampling.samplers import weighting

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
  'make_inner',
  [
    tff.aggregators.UnweightedMeanFactory,
    lambda: tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.1, clients_per_round=10.0, clip=1.0
    ),
  ],
)
def test_inner_factory_returning_a_mean_is_refused(make_inner):
  with pytest.raises(TypeError, match='inner_factory must return the SUM'):
    OptimalSamplingFactory(3, inner_factory=make_inner())


@pytest.mark.parametrize(
  'sampler',
  [samplers.MDSampler(4, seed=0), samplers.ClusteredSampler(4, seed=0)],
  ids=['md', 'clustered'],
)
def test_sampler_weights_dropped_by_example_weighting_is_an_error(sampler):
  # build_weighted_fed_avg's default weighting would replace the 1/m weights.
  assert weighting.sampler_sets_weights(sampler)
  with pytest.raises(ValueError, match='replaces those weights'):
    weighting.check_fed_avg_weighting(sampler, tff.learning.ClientWeighting.NUM_EXAMPLES)
  assert weighting.required_client_weighting(sampler) is tff.learning.ClientWeighting.UNIFORM


def test_zero_norm_with_m_at_least_n_gets_p_zero_everywhere():
  # The case: n = 2, m = 2, one zero norm; the sum of p was 2.
  norms = np.array([0.0, 2.5])
  for probs in (
    probabilities.optimal_probabilities(norms, 2),
    probabilities.approximate_optimal_probabilities(norms, 2, 4),
    probabilities.optimal_probabilities_tf(norms, 2),
    probabilities.approximate_optimal_probabilities_tf(norms, 2, 4),
  ):
    np.testing.assert_array_equal(np.asarray(probs), [0.0, 1.0])
  process = OptimalSamplingFactory(2, secure=False).create(
    tff.TensorType(np.float32, [2]), tff.TensorType(np.float32)
  )
  output = process.next(
    process.initialize(), [np.zeros(2, np.float32), np.array([1.5, 2.0], np.float32)], [1.0, 1.0]
  )
  assert output.measurements['expected_uploads'] == pytest.approx(1.0, abs=1e-6)
  assert output.measurements['uploads'] == 1
  np.testing.assert_allclose(output.result, [0.75, 1.0], rtol=1e-6)


_SECURE_SCRIPT = textwrap.dedent("""
    import collections
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff
    from tff_sampling import aggregators, learning
    from tff_sampling.runtime import tff_context

    process = aggregators.OptimalSamplingFactory(2.0).create(
        tff.TensorType(np.float32, [2]), tff.TensorType(np.float32))
    values, weights = [np.ones(2, np.float32)] * 3, [1.0] * 3

    def model_fn():
      keras_model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(2,)),
                                         tf.keras.layers.Dense(1)])
      return tff.learning.models.from_keras_model(
          keras_model, loss=tf.keras.losses.MeanSquaredError(),
          input_spec=(tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 1], tf.float32)))

    sgd = tff.learning.optimizers.build_sgdm(0.1)
    composed = aggregators.with_secure_sum_hint(tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, sgd, sgd, model_aggregator=aggregators.OptimalSamplingFactory(1.0)))
    built = learning.build_fed_avg_with_optimal_sampling(model_fn, sgd, sgd, expected_clients=1)
    data = [tf.data.Dataset.from_tensors((np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)))
            for _ in range(2)]
    for name, call in (('aggregator', lambda: process.next(process.initialize(), values, weights)),
                       ('composed', lambda: composed.next(composed.initialize(), data)),
                       ('builder', lambda: built.next(built.initialize(), data))):
      try:
        call()
        print(name, 'ran')
      except aggregators.SecureSumContextError as e:
        print(name, 'hint', 'tff_context.use_secure_sum_simulation()' in str(e))
    tff_context.use_secure_sum_simulation()
    after = process.next(process.initialize(), values, weights).measurements
    print('after', int(after['cohort_size']),
          int(built.next(built.initialize(), data).metrics['aggregator']['cohort_size']))
""")


@pytest.mark.slow
def test_secure_sums_outside_the_test_context_say_what_to_call():
  proc = subprocess.run(
    [sys.executable, '-c', _SECURE_SCRIPT], cwd=_REPO, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines == [
    'aggregator hint True',
    'composed hint True',
    'builder hint True',
    'after 3 2',
  ], proc.stdout + proc.stderr[-2000:]


def _sampler_table_rows():
  with open(os.path.join(_REPO, 'README.md')) as f:
    text = f.read()
  section = text.split('## Server-side samplers', 1)[1].split('\n## ', 1)[0]
  return [line for line in section.splitlines() if re.match(r'\| `\w+Sampler\(', line)]


def test_readme_sampler_table_shows_the_required_seed():
  rows = _sampler_table_rows()
  assert len(rows) >= 6
  for row in rows:
    name = re.match(r'\| `(\w+Sampler)\(', row).group(1)
    seed = inspect.signature(getattr(samplers, name).__init__).parameters.get('seed')
    if seed is not None and seed.default is inspect.Parameter.empty:
      assert 'seed=' in row.split('|')[1], row
  with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'seed'"):
    samplers.MDSampler(4)  # pylint: disable=missing-kwoa
