r"""Benchmark: a FedAvg round on FEMNIST writers held in memory vs read from TFF's SQLite.

    .venv/bin/python -m bench.in_memory_clients --imc_cache_dir=<cache>
    .venv/bin/python -m bench.in_memory_clients --imc_cache_dir=<cache> --imc_clients=15 \\
        --imc_pairs=9

TFF's EMNIST loader gives SQL-backed clients: each client's dataset is an
SQLite query plus a parse of every example, run inside TFF's worker in every
round. ``tasks.emnist`` holds a small training split (the LEAF slices, up to
``IN_MEMORY_MAX_EXAMPLES`` examples) in memory instead, with the same clients,
elements and order. This measures one round of example-weighted FedAvg
(`tff_sampling.learning.build_fed_avg`) over the first ``--imc_clients``
writers (default: all, full participation, the benchmark grid's most
expensive methods) of the ``emnist`` task (62 classes, McMahan et al.'s 2NN,
batch 20, one local epoch), each side on its own task built from the same
database:

* ``in_memory``: the task as ``tasks.emnist`` builds it;
* ``sql``: the same task with TFF's SQL-backed training clients.

Before timing, one round of each side from the same initial weights must give
the same new global weights (exactly: the two sides train the same examples in
the same order), or the benchmark fails. Then the sides alternate in blocks
(`bench.stats.interleave`, the order rotating), after one warm-up block; the
table gives each side's median seconds a round and the median per-pair ratio
``in_memory / sql`` with its 95% bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Sequence
import sys

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import stats
from tasks import emnist
from tasks import registry
from tff_sampling.learning import fedavg
from tff_sampling.runtime import tff_context

_CACHE_DIR = flags.DEFINE_string('imc_cache_dir', None, 'Directory holding emnist_all.sqlite.')
_CLIENTS = flags.DEFINE_integer(
  'imc_clients', None, 'Clients per round (default: every writer).', lower_bound=1
)
_PAIRS = flags.DEFINE_integer('imc_pairs', 5, 'Timed blocks.', lower_bound=1)


def _task(in_memory: bool):
  limit = emnist.IN_MEMORY_MAX_EXAMPLES
  emnist.IN_MEMORY_MAX_EXAMPLES = limit if in_memory else -1
  try:
    return registry.get_task(
      'emnist',
      cache_dir=_CACHE_DIR.value,
      only_digits=False,
      model='2nn',
      client_batch_size=20,
      client_epochs=1,
    )
  finally:
    emnist.IN_MEMORY_MAX_EXAMPLES = limit


def _side(task, clients: int):
  """``(round, first_weights)``: one timed round from fixed weights, and one round's result."""
  process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(0))
  ids = task.client_ids[:clients]

  def one_round():
    data = [task.client_dataset(client, seed=i) for i, client in enumerate(ids)]
    return process.next(state, data)

  first = process.get_model_weights(one_round().state).trainable
  return one_round, [np.asarray(w) for w in first]


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not _CACHE_DIR.value:
    sys.exit('Error: --imc_cache_dir is required (the directory holding emnist_all.sqlite).')
  tasks = {'in_memory': _task(True), 'sql': _task(False)}
  clients = _CLIENTS.value or tasks['in_memory'].num_clients
  rounds, firsts = {}, {}
  for name, task in tasks.items():
    rounds[name], firsts[name] = _side(task, clients)
  for a, b in zip(firsts['in_memory'], firsts['sql']):
    if not np.array_equal(a, b):
      sys.exit(
        'Error: the two sides trained different weights '
        f'(max difference {np.max(np.abs(a - b)):.3g}).'
      )
  seconds = stats.interleave({name: stats.timed(r) for name, r in rounds.items()}, _PAIRS.value)
  ratio = stats.ratio_estimate(seconds['in_memory'], seconds['sql'])
  print(
    f'emnist (62 classes, 2NN), {clients} clients a round, {_PAIRS.value} pairs, '
    f'TF {tf.__version__}; the two sides trained identical weights.'
  )
  print('| side | median s/round |\n|---|---|')
  for name, values in seconds.items():
    print(f'| {name} | {np.median(values):.3f} |')
  print(f'\nratio in_memory / sql: {ratio.median:.3f} {ratio.interval} ({ratio.pairs} pairs)')


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
