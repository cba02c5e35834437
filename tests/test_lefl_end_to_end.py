"""LEFL end to end: pre-processing round, clusters, stratified rounds, restart.

The offline tasks run as they are; the TFF tasks (EMNIST, CIFAR100,
Shakespeare) run on tiny caches in TFF's own SQLite format
(`tff_sqlite_fixtures`), which is all that differs from the real data.
"""

import collections
import os

import fault_harness
import numpy as np
import pytest
import tff_sqlite_fixtures as fixtures

import tasks
from tasks import public
from tff_sampling import communication
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import signals
from tff_sampling.learning import soft_labels
from tff_sampling.runtime import results


def _lefl_sampler(task, clients_per_round, *, seed=0, public_examples=20, **kwargs):
  inputs = public.public_inputs(task, 'noise', num_examples=public_examples, seed=seed)
  labels = soft_labels.client_soft_labels(
    task,
    public_inputs=inputs,
    model_weights=task.initial_model_weights(seed),
    client_learning_rate=0.05,
    seed=seed,
    client_steps=2,
  )
  per_example = labels.reshape(labels.shape[0], -1, labels.shape[-1])
  bits = communication.PreprocessingBits(
    **soft_labels.preprocessing_bits(
      num_clients=task.num_clients,
      public_examples=inputs.shape[0],
      input_size=int(np.prod(inputs.shape[1:])),
      num_classes=int(np.prod(labels.shape[2:])),
    )
  )
  return samplers.LeflSampler(clients_per_round, soft_labels=per_example, seed=seed, **kwargs), bits


def _run(task, sampler, path, rounds, bits=None, **config):
  process = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.05, sketch_size=1
  )
  program.train_model(
    task,
    process,
    sampler,
    program.RunConfig(
      output_dir=str(path), rounds=rounds, seed=0, client_steps=2, hparams={'seed': 0}, **config
    ),
    preprocessing_bits=bits,
  )
  return results.load_run(path)


_rows = fault_harness.metrics_rows


def test_lefl_on_digits_restarts_identically(small_digits_task, tmp_path):
  task = small_digits_task
  sampler, bits = _lefl_sampler(task, 4)
  full = _run(task, sampler, tmp_path / 'full', 4, bits, checkpoint_every=2)
  # The same run stopped after round 2, then extended: every cell the same.
  _run(task, sampler, tmp_path / 'cut', 2, bits, checkpoint_every=2)
  _run(task, sampler, tmp_path / 'cut', 4, bits, checkpoint_every=2)
  assert _rows(tmp_path / 'cut') == _rows(tmp_path / 'full')
  state = sampler.initialize(samplers.Population(num_examples=task.client_num_examples))
  per_round = sampler.cluster_counts(state, np.ones(task.num_clients, bool)).sum()
  np.testing.assert_array_equal(full.metrics['cohort_size'][1:], per_round)
  assert full.metrics['uplink/round_bits'][0] == bits.upload_bits == 20 * 20 * 10 * 32
  assert np.all(np.isfinite(full.metrics['selection/label_kl'][1:]))


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('tff_cache'))
  rng = np.random.default_rng(0)
  fixtures.write_tff_database(
    os.path.join(directory, 'emnist_all.sqlite'),
    collections.OrderedDict(
      digits_only_train=fixtures.emnist_clients(rng, {'f0': 5, 'f1': 3, 'f2': 4}, 10),
      digits_only_test=fixtures.emnist_clients(rng, {'f0': 4, 'f1': 3}, 10),
    ),
  )
  fixtures.write_tff_database(
    os.path.join(directory, 'cifar100.sqlite'),
    {
      'train': fixtures.cifar_clients(rng, {'0': 4, '1': 6, '2': 3}),
      'test': fixtures.cifar_clients(rng, {'0': 3, '1': 4}),
    },
  )
  fixtures.write_tff_database(
    os.path.join(directory, 'shakespeare.sqlite'),
    {
      'train': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TRAIN),
      'test': fixtures.shakespeare_clients(fixtures.SHAKESPEARE_TEST),
    },
  )
  return directory


@pytest.mark.parametrize(
  'name,options',
  [('emnist', dict(only_digits=True)), ('cifar100', dict(model='vgg')), ('shakespeare', dict())],
)
@pytest.mark.slow
def test_lefl_on_tff_tasks(cache_dir, tmp_path, name, options):
  task = tasks.get_task(name, cache_dir=cache_dir, client_batch_size=2, **options)
  sampler, bits = _lefl_sampler(
    task, 2, public_examples=4, num_clusters=2, allocation='proportional'
  )
  run = _run(task, sampler, tmp_path / name, 1, bits)
  np.testing.assert_array_equal(run.metrics['cohort_size'][1:], 2)
  assert run.metrics['uplink/round_bits'][0] == bits.upload_bits > 0
  assert run.metrics['downlink/preprocessing_bits'][0] == bits.download_bits > 0
