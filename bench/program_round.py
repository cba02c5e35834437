r"""Benchmark: the round loop's round as the benchmark grid runs it, against the bare TFF round.

    .venv/bin/python -m bench.run --only=program

On ``digits`` (100 clients, cohort 10), one measure a side (`measures`), each the mean
seconds a round over ``rounds`` rounds:

* ``every 20``: the loop (`tff_sampling.program.train_model`) as the benchmark grid runs
  it: FedAvg with signals (no sketch), MD sampling under LDF availability, evaluation
  every 5 rounds and at the last, a checkpoint every 20 (and at the last), metrics to
  CSV and TensorBoard, each round's clients read inside TFF's worker
  (`tff_sampling.program.client_feed`). Its seconds a round are those of rounds 2 to
  ``rounds`` (round 1 compiles the run's computations, once a run);
* ``python``: the same with the clients' datasets sent from Python (as before the feed);
* ``every 1``: the same as ``every 20`` with a checkpoint every round;
* ``bare``: the same process's ``next`` on 10 clients' inputs built once, before timing.
"""

from __future__ import annotations

from collections.abc import Callable
import os
import tempfile
import time
from unittest import mock

import numpy as np

import tasks
from tff_sampling import availability as tff_availability
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import signals
from tff_sampling.program import client_feed
from tff_sampling.runtime import results


def measures(rounds: int) -> dict[str, Callable[[], float]]:
  """The four sides (module docstring), by label."""
  task = tasks.get_task('digits')
  process = signals.build_fed_avg_with_signals(
    task.model_fn, client_learning_rate=0.1, sketch_size=None
  )
  sizes = np.asarray(task.client_num_examples)
  data = signals.selection_client_data(
    [task.client_dataset(c, 0) for c in range(10)], [float(s) for s in sizes[:10]]
  )
  state = process.initialize()

  def bare() -> float:
    start = time.perf_counter()
    for _ in range(rounds):
      process.next(state, data)
    return (time.perf_counter() - start) / rounds

  def loop(checkpoint_every: int, fed: bool = True) -> Callable[[], float]:
    def measure() -> float:
      if not fed:  # As before the client feed: every round's datasets sent from Python.
        with mock.patch.object(client_feed.ClientFeed, 'build', return_value=None):
          return loop(checkpoint_every)()
      availability = tff_availability.build_availability(
        'LDF', 0.5, client_sizes=sizes, client_labels=task.client_label_histograms, seed=0
      )
      with tempfile.TemporaryDirectory(prefix='bench_program_') as directory:
        result = program.train_model(
          task,
          process,
          samplers.MDSampler(10, seed=0),
          program.RunConfig(
            output_dir=os.path.join(directory, 'run'),
            rounds=rounds,
            eval_every=5,
            checkpoint_every=checkpoint_every,
            hparams={'bench': 1},
          ),
          availability=availability,
        )
        # Round 1 compiles the run's computations once: left out, as in a long run.
        first = results.load_run(os.path.join(directory, 'run')).column('round_seconds')[1]
      return (result.seconds - first) / (rounds - 1)

    return measure

  return {'bare': bare, 'every 20': loop(20), 'python': loop(20, fed=False), 'every 1': loop(1)}
