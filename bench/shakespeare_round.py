r"""Benchmark: a Shakespeare GRU round at true client sizes, as the program runs it.

    .venv/bin/python -m bench.shakespeare_round --shakespeare_play_text=<tinyshakespeare.txt>

The play becomes TFF's Shakespeare database in a temporary folder (`tasks.tff_sqlite`,
as ``bin.convert_leaf --play_text`` writes it), and the ``shakespeare`` task reads it:
one client per role, every sequence of a role a round (no cap), batches of 8
five-character sequences, the two-layer GRU. A cohort of ``--shakespeare_cohort`` roles
(uniform without replacement, seed 0) trains one round of example-weighted FedAvg
(client SGD 0.1, server SGD 1.0, the program's loop), timed two ways:

* ``fed``: the round loop's way (`tff_sampling.program.client_feed`): the call gets each
  role's id and shuffle seed, and TFF's worker reads the role's snippets from the
  database and tokenises, shuffles and batches them;
* ``plain_tf``: the same SGD steps as a plain-TF loop (`bench.fedavg_workload.PlainFedAvg`)
  over the same batches, held in memory.

Before timing, one round of each must train the same weights within
`AGREEMENT_TOLERANCE` of the round's update. The sides then alternate in blocks
(`bench.stats.interleave`) after a warm-up block; the output gives each side's median
seconds a round, the SGD steps a round, and the median per-pair ratio ``fed / plain_tf``
with its 95% bootstrap interval.
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
from tff_sampling.learning import fedavg
from tff_sampling.program import client_feed
from tff_sampling.runtime import tff_context
from tff_sampling.task import Task

_PLAY_TEXT = flags.DEFINE_string(
  'shakespeare_play_text', None, 'A play in speaker-block form (tinyshakespeare.txt).'
)
_COHORT = flags.DEFINE_integer('shakespeare_cohort', 32, 'Roles a round.', lower_bound=1)
_PAIRS = flags.DEFINE_integer('shakespeare_pairs', 5, 'Timed blocks (pairs).', lower_bound=2)
_BATCH_SIZE = 8
_CLIENT_LR, _SERVER_LR = 0.1, 1.0
# TFF against plain TF after a whole round, relative to the update (`fedavg_round.compare_weights`):
# a wrong batch or a missing step gives an order of 1.
AGREEMENT_TOLERANCE = 0.02


def shakespeare_task(play_text: str, folder: str) -> Task:
  """The ``shakespeare`` task at true sizes over `play_text`, its database written to `folder`."""
  tff_sqlite.write_shakespeare_database(play_text, folder)
  return tasks.get_task('shakespeare', cache_dir=folder, client_batch_size=_BATCH_SIZE)


def _in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """The batches of one pass over `dataset`, as an in-memory dataset of the same batches."""
  sequences = dataset.unbatch().batch(1_000_000).get_single_element()
  return tf.data.Dataset.from_tensor_slices(sequences).batch(_BATCH_SIZE)


def measures(task: Task, cohort: int, folder: str) -> tuple[dict[str, Callable[[], float]], int]:
  """The two sides' round measures (module docstring), after checking that they train the
  same weights, and the SGD steps of the round."""
  clients = np.sort(np.random.default_rng(0).choice(task.num_clients, cohort, replace=False))
  seeds = [randomness.client_shuffle_seed(0, 1, int(c)) for c in clients]
  feed = client_feed.ClientFeed.build(task, None, folder)
  if feed is None:
    raise RuntimeError('The round loop would send these clients from Python: nothing to time.')
  references = feed.references(clients, seeds)
  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_CLIENT_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(_SERVER_LR),
    loop_implementation=fedavg.CLIENT_LOOP,
  )
  fed_next = feed.compose(process.next)
  held = [_in_memory(task.client_dataset(int(c), s)) for c, s in zip(clients, seeds)]
  steps = sum(int(held_one.reduce(0, lambda n, _: n + 1)) for held_one in held)
  plain = fedavg_workload.PlainFedAvg(
    task.keras_model_fn(0), client_learning_rate=_CLIENT_LR, server_learning_rate=_SERVER_LR
  )
  state = process.initialize()
  start = process.get_model_weights(state).trainable
  plain.set_global_weights(start)
  states = {'fed': fed_next(state, references).state}
  plain.run_round(held)
  trained = process.get_model_weights(states['fed']).trainable
  agreement = fedavg_round.compare_weights(start, trained, plain.global_weights())
  if agreement.relative_difference > AGREEMENT_TOLERANCE:
    raise SystemExit(f'TFF and the plain-TF loop trained other weights: {agreement}.')

  def fed_round():
    states['fed'] = fed_next(states['fed'], references).state

  return {
    'fed': stats.timed(fed_round),
    'plain_tf': stats.timed(lambda: plain.run_round(held)),
  }, steps


def run(play_text: str, cohort: int, pairs: int) -> tuple[dict[str, list[float]], int]:
  """Seconds a round by side (`measures`), `pairs` timed blocks, and the round's SGD steps."""
  with tempfile.TemporaryDirectory(prefix='shakespeare_round_') as folder:
    task = shakespeare_task(play_text, folder)
    if cohort > task.num_clients:
      raise ValueError(f"cohort={cohort} exceeds the play's {task.num_clients} roles.")
    sides, steps = measures(task, cohort, os.path.join(folder, 'records'))
    return stats.interleave(sides, pairs, warmup=1), steps


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _PLAY_TEXT.value:
    raise app.UsageError('--shakespeare_play_text is required: a play text (docs/data.md).')
  seconds, steps = run(_PLAY_TEXT.value, _COHORT.value, _PAIRS.value)
  print(
    f'Shakespeare GRU FedAvg rounds, cohort {_COHORT.value} at true sizes ({steps} SGD steps '
    f'of {_BATCH_SIZE} sequences), {_PAIRS.value} pairs:'
  )
  print(', '.join(f'{side} {np.median(values):.2f} s' for side, values in seconds.items()))
  ratio = stats.ratio_estimate(seconds['fed'], seconds['plain_tf'])
  print(f'fed / plain_tf: {ratio.median:.3g} {ratio.interval}')


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
