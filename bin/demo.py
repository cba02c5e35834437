"""The main job: FedAvg on the embedded `digits` task, several seeds, one plot.

    ./run main                      # = python -m bin.demo

Trains FedAvg with uniform cohorts on scikit-learn's handwritten digits split
into 100 non-IID clients (no download), once per seed, prints a summary table
(final accuracy, rounds and uploaded bits to a target accuracy) and writes the
accuracy-vs-rounds / accuracy-vs-uploaded-bits plot. Every run directory is
started afresh unless ``--noreset``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np

from bin import experiment_flags as ef
from tff_sampling import plotting
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import results
from tff_sampling import runtime
from tff_sampling import samplers

# The demo is a preset of the shared experiment flags (so `./run main --rounds=50`
# works) plus a few of its own.
flags.FLAGS.set_default('root_output_dir', 'results/main')
flags.FLAGS.set_default('rounds', 30)
flags.FLAGS.set_default('client_learning_rate', 0.3)
flags.FLAGS.set_default('checkpoint_every', 10)
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Runs (seeds 0..seeds-1).', lower_bound=1)
_TARGET_ACCURACY = flags.DEFINE_float(
    'target_accuracy', 0.7, 'Accuracy for the rounds/bits-to-target columns.')
_RESET = flags.DEFINE_bool('reset', True, 'Delete earlier demo runs before starting.')


def _summary_table(runs: Sequence[results.Run], target: float) -> str:
  final = np.array([r.metrics['eval/accuracy'][-1] for r in runs])
  to_target = [results.rounds_to_target(r, target) for r in runs]
  bits = [results.bits_to_target(r, target) for r in runs]
  reached = [b for b in bits if b is not None]
  rows = [
      ('runs (seeds)', f'{len(runs)}'),
      ('final eval accuracy', f'{final.mean():.4f} ± {final.std(ddof=1) if len(runs) > 1 else 0:.4f}'),
      (f'rounds to {target:.0%}', ', '.join('—' if t is None else str(t) for t in to_target)),
      (f'uploaded bits to {target:.0%}',
       f'{np.median(reached):.3g} (median of {len(reached)})' if reached else 'not reached'),
      ('total uploaded bits / run', f'{runs[0].metrics["uplink/cumulative_bits"][-1]:.3g}'),
  ]
  width = max(len(k) for k, _ in rows)
  return '\n'.join(f'  {k:<{width}}  {v}' for k, v in rows)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  runtime.quiet_library_logs()
  start = time.monotonic()
  try:
    task = ef.task_from_flags()
    process = learning.build_fedavg(
        task.model_fn, client_learning_rate=ef.CLIENT_LEARNING_RATE.value,
        server_learning_rate=ef.SERVER_LEARNING_RATE.value)
    run_dirs = []
    for seed in range(ef.SEED.value, ef.SEED.value + _SEEDS.value):
      name = f'{ef.TASK.value}_fedavg_seed{seed}'
      output_dir = os.path.join(ef.ROOT_OUTPUT_DIR.value, name)
      if _RESET.value:
        shutil.rmtree(output_dir, ignore_errors=True)
      hparams = ef.experiment_hparams(task, algorithm='fedavg', sampling='uniform')
      hparams.update(seed=seed, experiment_name=name)
      config = program.ProgramConfig(
          output_dir=output_dir, rounds=ef.ROUNDS.value, seed=seed, hparams=hparams,
          eval_every=ef.EVAL_EVERY.value, checkpoint_every=ef.CHECKPOINT_EVERY.value)
      sampler = samplers.UniformSampler(ef.CLIENTS_PER_ROUND.value, seed=seed)
      program.run_experiment(task, process, sampler, config)
      run_dirs.append(output_dir)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  plot_path = plotting.plot_runs(
      run_dirs, os.path.join(ef.ROOT_OUTPUT_DIR.value, 'accuracy.png'),
      title=f'FedAvg on {ef.TASK.value} ({task.num_clients} clients)')
  runs = [results.load_run(d) for d in run_dirs]
  print(f'\nFedAvg, uniform cohorts of {ef.CLIENTS_PER_ROUND.value}, task {ef.TASK.value}, '
        f'{ef.ROUNDS.value} rounds:')
  print(_summary_table(runs, _TARGET_ACCURACY.value))
  print(f'  plot: {plot_path}')
  print(f'  wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  app.run(main)
