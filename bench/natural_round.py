r"""Benchmark: small models' FedAvg rounds on real FEMNIST writers, as the program runs them.

    .venv/bin/python -m bench.natural_round --natural_leaf_dir=<LEAF FEMNIST folder>
    .venv/bin/python -m bench.natural_round --natural_leaf_dir=<folder> --natural_models=2nn

The LEAF folder's writers become TFF's EMNIST database in a temporary folder
(`tasks.tff_sqlite`, as ``bin.convert_leaf`` writes it) and the ``emnist`` task
(62 labels, batches of 20) reads it. For each model of ``--natural_models`` (the
small models of `bench.fedavg_workload.MODELS`), one round of example-weighted
FedAvg over every writer (client SGD 0.1, server SGD 1.0, ``DATASET_ITERATOR``) is
timed three ways:

* ``fed``: the round loop's way (`tff_sampling.program.client_feed`): the call gets
  each client's id and shuffle seed, and TFF's worker reads the client's examples
  (the task holds these writers in memory: from the record files the feed writes
  once) and shuffles and batches them;
* ``python``: the way before it: each client's ``tf.data.Dataset`` built in Python
  (`Task.client_dataset`) for every call;
* ``plain_tf``: the same SGD steps as a plain-TF loop (`bench.fedavg_workload.PlainFedAvg`)
  over the same batches, held in memory.

Every side trains the same batches in the same order (each client's shuffle seed is
fixed for the benchmark). Before timing, a first round must give ``fed`` and ``python``
identical weights, and plain TF the same within `AGREEMENT_TOLERANCE` of the round's
update. The sides then alternate in blocks (`bench.stats.interleave`)
after a warm-up block; the table gives each side's median seconds a round and the
median per-pair ratios ``fed / plain_tf`` and ``python / plain_tf`` with their 95%
bootstrap intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import os
import tempfile

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from bench import fedavg_round
from bench import fedavg_workload
from bench import stats
import tasks
from tasks import tff_sqlite
from tff_sampling import randomness
from tff_sampling.program import client_feed
from tff_sampling.runtime import tff_context
from tff_sampling.task import Task

SMALL_MODELS = ('2nn', 'ffnn', 'logreg')
_LEAF_DIR = flags.DEFINE_string('natural_leaf_dir', None, 'A LEAF FEMNIST folder (train/, test/).')
_MODELS = flags.DEFINE_list('natural_models', list(SMALL_MODELS), f'Models: {SMALL_MODELS}.')
_PAIRS = flags.DEFINE_integer('natural_pairs', 9, 'Timed blocks (pairs).', lower_bound=2)
_BATCH_SIZE = 20
_CLIENT_LR, _SERVER_LR = 0.1, 1.0
# TFF against plain TF after a whole round, relative to the update (`fedavg_round.compare_weights`):
# rounding differences grow over a round's SGD steps (up to 0.5% seen); a wrong batch or a
# missing step gives an order of 1.
AGREEMENT_TOLERANCE = 0.02


def femnist_task(leaf_dir: str, folder: str) -> Task:
  """The ``emnist`` task (62 labels, batches of 20) over a LEAF folder's writers, whose
  database is written to `folder`."""
  tff_sqlite.write_emnist_database(leaf_dir, folder, overwrite=False)
  return tasks.get_task(
    'emnist', cache_dir=folder, only_digits=False, client_batch_size=_BATCH_SIZE
  )


def _fed_avg(task: Task, model: str) -> tff.learning.templates.LearningProcess:
  return tff.learning.algorithms.build_weighted_fed_avg(
    fedavg_workload.tff_model_fn(task.element_spec, 0, model, task.num_classes),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_CLIENT_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(_SERVER_LR),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )


def _in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """The batches of one pass over `dataset`, as an in-memory dataset of the same batches."""
  examples = dataset.unbatch().batch(1_000_000).get_single_element()
  return tf.data.Dataset.from_tensor_slices(examples).batch(_BATCH_SIZE)


def model_measures(
  task: Task, model: str, feed: client_feed.ClientFeed
) -> dict[str, Callable[[], float]]:
  """The three sides' round measures for `model` (module docstring), after checking that
  they train the same weights."""
  clients = np.arange(task.num_clients)
  seeds = [randomness.client_shuffle_seed(0, 1, int(c)) for c in clients]
  references = feed.references(clients, seeds)
  process = _fed_avg(task, model)
  fed_next = feed.compose(process.next)

  def datasets() -> list[tf.data.Dataset]:
    return [task.client_dataset(int(c), s) for c, s in zip(clients, seeds)]

  held = [_in_memory(d) for d in datasets()]
  plain = fedavg_workload.PlainFedAvg(
    fedavg_workload.MODELS[model](task.num_classes, 0),
    client_learning_rate=_CLIENT_LR,
    server_learning_rate=_SERVER_LR,
  )
  states = {'fed': fed_next(process.initialize(), references).state}
  states['python'] = process.next(process.initialize(), datasets()).state
  start = plain.global_weights()
  plain.run_round(held)
  trained = {side: process.get_model_weights(state).trainable for side, state in states.items()}
  if not all(np.array_equal(a, b) for a, b in zip(trained['fed'], trained['python'])):
    raise SystemExit(f'{model}: the fed and python rounds trained different weights.')
  agreement = fedavg_round.compare_weights(start, trained['fed'], plain.global_weights())
  if agreement.relative_difference > AGREEMENT_TOLERANCE:
    raise SystemExit(f'{model}: TFF and the plain-TF loop trained other weights: {agreement}.')

  def fed_round():
    states['fed'] = fed_next(states['fed'], references).state

  def python_round():
    states['python'] = process.next(states['python'], datasets()).state

  return {
    'fed': stats.timed(fed_round),
    'python': stats.timed(python_round),
    'plain_tf': stats.timed(lambda: plain.run_round(held)),
  }


def run(leaf_dir: str, models: Sequence[str], pairs: int) -> dict[str, dict[str, list[float]]]:
  """Each model's seconds a round by side (`model_measures`), `pairs` timed blocks each."""
  unknown = sorted(set(models) - set(SMALL_MODELS))
  if unknown:
    raise ValueError(f'Unknown models {unknown}; choose among {", ".join(SMALL_MODELS)}.')
  with tempfile.TemporaryDirectory(prefix='natural_round_') as folder:
    task = femnist_task(leaf_dir, folder)
    feed = client_feed.ClientFeed.build(task, None, os.path.join(folder, 'records'))
    if feed is None:
      raise RuntimeError('The round loop would send these clients from Python: nothing to time.')
    return {
      model: stats.interleave(model_measures(task, model, feed), pairs, warmup=1)
      for model in models
    }


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _LEAF_DIR.value:
    raise app.UsageError('--natural_leaf_dir is required: a LEAF FEMNIST folder (docs/data.md).')
  seconds = run(_LEAF_DIR.value, _MODELS.value, _PAIRS.value)
  print(f'FedAvg rounds on the writers of {_LEAF_DIR.value}, {_PAIRS.value} pairs:')
  for model, sides in seconds.items():
    medians = ', '.join(f'{side} {np.median(values):.3f} s' for side, values in sides.items())
    print(f'{model}: {medians}')
    for side in ('fed', 'python'):
      ratio = stats.ratio_estimate(sides[side], sides['plain_tf'])
      print(f'  {side} / plain_tf: {ratio.median:.3g} {ratio.interval}')


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
