"""Tests for tff_sampling/program/client_feed.py: clients' data read inside TFF's worker.

The feed must change nothing observable: the same streams as `Task.client_dataset`,
and the same metrics, round for round, as a run that sends datasets from Python.
"""

import os
import types

import fault_harness
import numpy as np
import pytest
import tensorflow as tf

from tff_sampling import program
from tff_sampling import randomness
from tff_sampling import samplers
from tff_sampling.learning import fedavg
from tff_sampling.learning import signals
from tff_sampling.program import client_feed
from tff_sampling.program import trainer as trainer_lib


def _elements(dataset):
  return [tf.nest.map_structure(np.asarray, e) for e in dataset]


def _assert_same_stream(a, b):
  a, b = _elements(a), _elements(b)
  assert len(a) == len(b) > 0
  for x, y in zip(a, b):
    tf.nest.map_structure(np.testing.assert_array_equal, x, y)


def _files_feed(task, steps, folder):
  return client_feed.ClientFeed(task, steps, client_feed.ClientFiles(task, str(folder)).dataset)


@pytest.mark.parametrize('source', ['embedded', 'files'])
@pytest.mark.parametrize('steps', [None, 7])
def test_the_feed_gives_the_tasks_streams(small_digits_task, tmp_path, steps, source):
  if source == 'embedded':
    feed = client_feed.ClientFeed.build(small_digits_task, steps, str(tmp_path))
    assert not list(tmp_path.iterdir())  # The small population needs no files.
  else:
    feed = _files_feed(small_digits_task, steps, tmp_path)
  assert feed is not None
  for client in (0, 7, 19):
    seed = randomness.client_shuffle_seed(3, 2, client)
    # A new dataset each time: iterating one again would reshuffle it.
    expected = [small_digits_task.client_dataset(client, seed, steps=steps) for _ in range(2)]
    _assert_same_stream(feed.stream(small_digits_task.client_ids[client], seed), expected[0])
    weighted = feed.client_input(small_digits_task.client_ids[client], seed, 4, 2.5)
    _assert_same_stream(weighted['data'], expected[1])
    assert _elements(weighted['meta']) == [{'slot': 4, 'weight': 2.5}]


@pytest.mark.parametrize('epochs', [1, 2])
def test_streams_of_steps_beyond_the_epochs_are_the_ones_of_tf_datas_defaults(tmp_path, epochs):
  # About 9 batches an epoch, cycled to 25 steps. tf.data's default rewrites fuse a seeded
  # shuffle directly followed by repeat (the epochs) into an op whose order differs once the
  # stream is iterated again: the stream from Python and the fed one both keep the order the
  # defaults give (the runs trained before the rewrites were turned off).
  import tasks  # pylint: disable=g-import-not-at-top

  task = tasks.get_task('digits', num_clients=20, client_batch_size=10, client_epochs=epochs)
  feed = client_feed.ClientFeed.build(task, 25, str(tmp_path))
  for client in (0, 7):
    seed = randomness.client_shuffle_seed(3, 2, client)
    raw = task.train_data.create_tf_dataset_for_client(task.client_ids[client])
    defaults = task.preprocess_client(raw, seed).repeat().take(25)
    _assert_same_stream(task.client_dataset(client, seed, steps=25), defaults)
    _assert_same_stream(
      feed.stream(task.client_ids[client], seed),
      task.preprocess_client(raw, seed).repeat().take(25),
    )


def test_a_large_in_memory_population_is_read_from_files(small_digits_task, tmp_path, monkeypatch):
  monkeypatch.setattr(client_feed, 'MAX_EMBEDDED_BYTES', 1000)
  folder = tmp_path / 'files'
  feed = client_feed.ClientFeed.build(small_digits_task, None, str(folder))
  embedded = client_feed.ClientFeed(small_digits_task, None).size
  assert feed is not None and feed.size < embedded / 10  # The data is not in the trace.
  sizes = small_digits_task.client_num_examples
  assert sorted(os.listdir(folder)) == sorted(f'{i}_{k}.bin' for i in range(20) for k in (0, 1))
  for i in (0, 19):  # float32 8x8 images, int32 labels
    assert os.path.getsize(folder / f'{i}_0.bin') == sizes[i] * 64 * 4
    assert os.path.getsize(folder / f'{i}_1.bin') == sizes[i] * 4


def test_no_files_beyond_the_size_a_run_may_write(small_digits_task, tmp_path, monkeypatch):
  monkeypatch.setattr(client_feed, 'MAX_EMBEDDED_BYTES', 1000)
  examples = int(np.sum(small_digits_task.client_num_examples))
  monkeypatch.setattr(client_feed, 'MAX_FILE_BYTES', examples * (64 + 1) * 4 - 1)
  assert client_feed.ClientFeed.build(small_digits_task, None, str(tmp_path / 'files')) is None
  assert not (tmp_path / 'files').exists()
  monkeypatch.setattr(client_feed, 'MAX_FILE_BYTES', examples * (64 + 1) * 4)
  assert client_feed.ClientFeed.build(small_digits_task, None, str(tmp_path / 'files'))


@pytest.mark.parametrize(
  'spec', [tf.TensorSpec([], tf.string), tf.TensorSpec([None, 4], tf.float32)], ids=str
)
def test_files_refuse_strings_and_varying_shapes(tmp_path, spec):
  task = types.SimpleNamespace(train_data=types.SimpleNamespace(element_type_structure={'x': spec}))
  with pytest.raises(ValueError, match='cannot be written as raw values'):
    client_feed.ClientFiles(task, str(tmp_path))
  assert not list(tmp_path.iterdir())


def _run(task, process, sampler, path, **kwargs):
  config = program.RunConfig(
    output_dir=str(path), rounds=8, seed=0, hparams={'seed': 0}, eval_every=4, **kwargs
  )
  return program.train_model(task, process, sampler, config)


_RUNS = {
  # A plain TFF process under uniform sampling, with a client learning-rate decay.
  'fedavg_uniform': (
    lambda task: fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1),
    lambda: samplers.UniformSampler(4, seed=0),
    {'client_learning_rate_decay': 0.95},
  ),
  # The signals' client input (slot, weight), the loss probe, fixed local steps.
  'signals_power_of_choice': (
    lambda task: signals.build_fed_avg_with_signals(
      task.model_fn, client_learning_rate=0.1, sketch_size=None
    ),
    lambda: samplers.PowerOfChoiceSampler(3, num_candidates=8, seed=0),
    {'client_steps': 3},
  ),
}


@pytest.mark.parametrize('name', sorted(_RUNS))
@pytest.mark.slow
def test_a_fed_run_has_the_same_metrics_as_one_sent_from_python(
  small_digits_task, tmp_path, monkeypatch, name
):
  # One run sent from Python; the same run fed with the data embedded and fed from files
  # (MAX_EMBEDDED_BYTES 0) each equal it.
  build_process, build_sampler, options = _RUNS[name]
  process = build_process(small_digits_task)
  with monkeypatch.context() as patch:
    patch.setattr(client_feed.ClientFeed, 'build', lambda *args: None)
    sent = _run(small_digits_task, process, build_sampler(), tmp_path / 'sent', **options)
  sent_rows = fault_harness.metrics_rows(tmp_path / 'sent')
  assert len(sent_rows) == 9

  build = client_feed.ClientFeed.build
  for files in (False, True):
    built = []

    def recording_build(*args, files=files, built=built):
      built.append(build(*args))
      if files:  # The files exist while the run lasts.
        assert os.listdir(os.path.join(args[2]))
      return built[-1]

    fed_dir = tmp_path / ('fed_files' if files else 'fed_embedded')
    with monkeypatch.context() as patch:
      if files:
        patch.setattr(client_feed, 'MAX_EMBEDDED_BYTES', 0)
      patch.setattr(client_feed.ClientFeed, 'build', recording_build)
      fed = _run(small_digits_task, process, build_sampler(), fed_dir, **options)
    assert len(built) == 1 and built[0] is not None, files  # The run was fed.
    assert trainer_lib.FEED_FOLDER not in os.listdir(fed_dir), files  # Removed at the end.
    assert fault_harness.metrics_rows(fed_dir) == sent_rows, files
    for a, b in zip(fed.model_weights.trainable, sent.model_weights.trainable):
      np.testing.assert_array_equal(a, b, err_msg=f'files={files}')


def test_runs_of_one_process_on_one_task_share_the_feed_and_its_composition(
  small_digits_task, tmp_path
):
  folder = str(tmp_path)
  feed = client_feed.ClientFeed.build(small_digits_task, None, folder)
  assert feed is client_feed.ClientFeed.build(small_digits_task, None, folder)
  assert feed is not client_feed.ClientFeed.build(small_digits_task, 3, folder)
  process = fedavg.build_fed_avg(small_digits_task.model_fn, client_learning_rate=0.1)
  assert feed.compose(process.next) is feed.compose(process.next)
