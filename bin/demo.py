"""The main job: optimal vs uniform vs full participation on unbalanced `digits`.

    ./run main                      # = python -m bin.demo

On scikit-learn's handwritten digits split into 100 unbalanced, non-IID
clients (``preset='unbalanced'``: the largest 10% of clients hold ≈80% of the
examples; no download), FedAvg draws a cohort of 32 clients per round; every
cohort client trains, and then uploads with probability ``p_i``: optimal
(the secure two-phase protocol, 4 rescaling steps), uniform ``m/n``, or
``1`` (full participation), with ``m = 3`` expected uploads. The same seeds run
for every method. Prints a table (final accuracy; rounds and uploaded bits to
a target accuracy; mean improvement factor) and writes the accuracy-vs-rounds
and accuracy-vs-uploaded-bits plot. Like every binary, it resumes earlier runs
of the same configuration (a finished run is only re-read); ``--reset`` starts
them over.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np

from bin import experiment_flags as ef
from bin import flag_checks
from bin import optimal_sampling as os_bin
from tff_sampling import aggregators
from tff_sampling import plotting
from tff_sampling import results
from tff_sampling import samplers

# The demo presets the shared experiment flags (`./run main --rounds=60` works).
flags.FLAGS.set_default('root_output_dir', 'results/main')
flags.FLAGS.set_default('rounds', 30)
flags.FLAGS.set_default('clients_per_round', 32)
flags.FLAGS.set_default('client_learning_rate', 0.3)
flags.FLAGS.set_default('eval_every', 2)
flags.FLAGS.set_default('checkpoint_every', 10)
flags.FLAGS.set_default('expected_clients', 3.0)
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Runs per method (seeds seed..seed+seeds-1).',
                              lower_bound=1)
_METHODS = flags.DEFINE_list('methods', ['optimal', 'uniform', 'full'],
                             'Samplings to compare (see bin/optimal_sampling.py).')
_TARGET_ACCURACY = flags.DEFINE_float(
    'target_accuracy', 0.7,
    'Accuracy for the rounds/bits-to-target columns, a fraction in (0, 1].')
flag_checks.check_accuracy('target_accuracy')


def summary_table(groups: dict[str, list[results.Run]], target: float) -> str:
  """One row per method: accuracy, rounds and bits to `target`, mean α."""
  header = (f'{"method":<14} {"final accuracy":>16} {f"rounds to {target:.0%}":>14} '
            f'{f"Mbit to {target:.0%}":>14} {"total Mbit":>11} {"mean α":>7}')
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    final = np.array([r.metrics['eval/accuracy'][np.isfinite(r.metrics['eval/accuracy'])][-1]
                      for r in runs])
    rounds = [results.rounds_to_target(r, target) for r in runs]
    bits = [results.bits_to_target(r, target) for r in runs]
    reached = [b for b in bits if b is not None]
    alpha_column = 'process/aggregator/improvement_factor'
    alpha = np.nanmean([np.nanmean(r.metrics[alpha_column]) for r in runs
                        if alpha_column in r.metrics])
    rounds_text = (f'{np.median([r for r in rounds if r is not None]):.0f}'
                   f' ({len([r for r in rounds if r is not None])}/{len(runs)})'
                   if any(r is not None for r in rounds) else 'never')
    bits_text = f'{np.median(reached) / 1e6:.2f}' if reached else 'never'
    total = np.median([r.metrics['uplink/cumulative_bits'][-1] for r in runs]) / 1e6
    lines.append(f'{method:<14} {final.mean():>9.4f} ± {final.std():.3f} {rounds_text:>14} '
                 f'{bits_text:>14} {total:>11.2f} {alpha:>7.3f}')
  return '\n'.join(lines)


def improvement_table(groups: dict[str, list[results.Run]], blocks: int = 3) -> str:
  """Mean improvement factor α (over seeds) per block of rounds, and rescaling steps used."""
  alpha_column = 'process/aggregator/improvement_factor'
  steps_column = 'process/aggregator/rescaling_steps'
  rounds = max(int(r.rounds[-1]) for runs in groups.values() for r in runs)
  edges = np.linspace(0, rounds, blocks + 1).astype(int)
  names = [f'rounds {lo + 1}-{hi}' for lo, hi in zip(edges[:-1], edges[1:])]
  lines = [f'{"method":<14} ' + ' '.join(f'{n:>14}' for n in names) +
           f' {"steps used (mean/max)":>22}']
  for method, runs in groups.items():
    if alpha_column not in runs[0].metrics:
      continue
    cells = []
    for lo, hi in zip(edges[:-1], edges[1:]):
      values = [r.metrics[alpha_column][(r.rounds > lo) & (r.rounds <= hi)] for r in runs]
      cells.append(f'{np.nanmean(np.concatenate(values)):>14.3f}')
    steps = np.concatenate([r.metrics[steps_column][1:] for r in runs])
    lines.append(f'{method:<14} ' + ' '.join(cells) +
                 f' {f"{np.nanmean(steps):.2f}/{np.nanmax(steps):.0f}":>22}')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  start = ef.begin_main(argv)
  try:
    ef.check_choices('methods', _METHODS.value, list(os_bin.SAMPLING_MODES))
    plot_path = plotting.check_plot_path(os.path.join(ef.ROOT_OUTPUT_DIR.value, 'accuracy.png'))
    if ef.TASK.value == 'digits' and not flags.FLAGS['preset'].present:
      flags.FLAGS.preset = 'unbalanced'  # The demo's population (not a global default).
    task = ef.task_from_flags()
    groups = ef.run_comparison(
        task, _METHODS.value, _SEEDS.value,
        make_process=lambda method, seed: os_bin.make_process(task, method, seed),
        make_sampler=lambda method, seed: samplers.UniformSampler(
            ef.CLIENTS_PER_ROUND.value, seed=seed),
        method_hparams=lambda method: {**os_bin.method_hparams(), 'sampling': method},
        uplink_fn=aggregators.uplink_from_measurements)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  plot_path = plotting.plot_runs(
      [r.path for runs in groups.values() for r in runs],
      plot_path,
      title=(f'FedAvg on {ef.TASK.value} ({task.num_clients} clients), cohort '
             f'{ef.CLIENTS_PER_ROUND.value}, m = {os_bin.EXPECTED_CLIENTS.value:g}'))
  print(f'\nFedAvg on {ef.TASK.value} (preset {task.options.get("preset", "-")}), cohort '
        f'{ef.CLIENTS_PER_ROUND.value}, expected uploads m = {os_bin.EXPECTED_CLIENTS.value:g}, '
        f'{ef.ROUNDS.value} rounds, {_SEEDS.value} seeds (mean ± std):')
  print(summary_table(groups, _TARGET_ACCURACY.value))
  print('\nImprovement factor α by rounds (mean over seeds and rounds):')
  print(improvement_table(groups))
  print(f'plot: {plot_path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling import runtime  # pylint: disable=g-import-not-at-top
  app.run(runtime.binary_main(main))
