"""FedGS end to end: every availability mode, every 3DG kind, every FedGS task.

Each run goes through `program.train_model` (the loop every binary uses) for
two rounds, and checks what must hold whatever the data: only active clients
are picked, exactly ``min(K, |A_t|)`` of them, the masks do not depend on the
sampler, and the sampling counts add up.
"""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tasks import get_task
from tff_sampling import availability
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import graph_probe
from tff_sampling.learning import signals
from tff_sampling.runtime import results

_PAPER_BETA = {'IDL': 0.0, 'LN': 0.5, 'SLN': 0.5, 'LDF': 0.7, 'MDF': 0.7, 'YMF': 0.9, 'YC': 0.9}


def _run(task, sampler, path, mode, *, rounds=2, process=None):
  process = process or signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.05, sketch_size=1
  )
  model = (
    None
    if mode == 'IDL'
    else availability.build_availability(
      mode,
      _PAPER_BETA[mode],
      client_sizes=task.client_num_examples,
      client_labels=task.client_label_histograms,
      seed=0,
    )
  )
  config = program.RunConfig(
    output_dir=str(path), rounds=rounds, seed=0, client_steps=2, hparams={'mode': mode}
  )
  program.train_model(task, process, sampler, config, availability=model)
  return results.load_run(path)


def _check_run(run, budget, num_clients):
  active = run.metrics['availability/active_clients'][1:]
  cohort = run.metrics['cohort_size'][1:]
  assert np.all(active >= 1) and np.all(active <= num_clients)
  np.testing.assert_array_equal(cohort, np.minimum(budget, active))
  assert run.selection_counts.sum() == cohort.sum()


@pytest.fixture(scope='module')
def synthetic():
  return get_task('synthetic', num_clients=30, client_batch_size=10)


@pytest.fixture(scope='module')
def synthetic_process(synthetic):
  return signals.build_fed_avg_with_signals(
    synthetic.model_fn, client_learning_rate=0.05, sketch_size=1
  )


@pytest.mark.parametrize('mode', list(_PAPER_BETA))
def test_every_mode_on_synthetic(synthetic, synthetic_process, tmp_path, mode):
  sampler = samplers.FedGSSampler(6, seed=0, features=graph_probe.oracle_features(synthetic))
  run = _run(synthetic, sampler, tmp_path / 'fedgs', mode, process=synthetic_process)
  _check_run(run, 6, 30)
  # The solver's per-round report reaches the metrics.
  for flag in ('solver_ran', 'proven_optimal', 'timed_out'):
    assert set(run.metrics[f'selection/fedgs_{flag}'][1:]) <= {0.0, 1.0}
  assert np.all(np.isfinite(run.metrics['selection/fedgs_objective'][1:]))
  # The same mode gives the same masks to another sampler.
  uniform = _run(
    synthetic,
    samplers.UniformSampler(6, seed=3),
    tmp_path / 'uniform',
    mode,
    process=synthetic_process,
  )
  np.testing.assert_array_equal(
    uniform.metrics['availability/active_clients'], run.metrics['availability/active_clients']
  )
  if mode == 'IDL':
    np.testing.assert_array_equal(run.metrics['availability/active_clients'][1:], 30)


@pytest.mark.parametrize('kind', ['functional', 'update_cosine'])
def test_model_based_graphs_on_two_label_digits(tmp_path, kind):
  task = get_task('digits', preset='two_labels', num_clients=40, client_batch_size=10)
  features = graph_probe.client_graph_features(
    task,
    kind=kind,
    model_weights=task.initial_model_weights(0),
    client_learning_rate=0.1,
    seed=0,
    client_steps=2,
  )
  assert features.shape[0] == 40 and np.all(np.isfinite(features))
  sampler = samplers.FedGSSampler(4, seed=0, features=features)
  _check_run(_run(task, sampler, tmp_path / kind, 'YC'), 4, 40)


def test_fedgs_on_cifar10(tmp_path):
  """The TFDS task (mocked data, 11 clients) with the functional graph under LN."""
  with tfds.testing.mock_data(num_examples=1000):
    task = get_task(
      'cifar10',
      size_group_clients=(2, 3, 3, 2, 1),
      size_group_examples=(20, 50, 100, 150, 200),
      max_eval_examples=200,
      client_batch_size=16,
    )
  features = graph_probe.client_graph_features(
    task,
    kind='functional',
    model_weights=task.initial_model_weights(0),
    client_learning_rate=0.03,
    seed=0,
    client_steps=2,
    validation_examples=64,
    noise_batch_size=16,
  )
  assert features.shape == (11, 10)
  sampler = samplers.FedGSSampler(3, seed=0, features=features)
  _check_run(_run(task, sampler, tmp_path / 'cifar10', 'LN'), 3, 11)
