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

from collections.abc import Sequence
import os
import time

from absl import app
from absl import flags

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import flag_checks
from bin import optimal_flags
from tff_sampling import communication
from tff_sampling import comparisons
from tff_sampling import samplers
from tff_sampling.analysis import plotting
from tff_sampling.comparisons import optimal

# The demo presets the shared experiment flags (`./run main --rounds=60` works).
flags.FLAGS.set_default('root_output_dir', 'results/main')
flags.FLAGS.set_default('rounds', 30)
flags.FLAGS.set_default('clients_per_round', 32)
flags.FLAGS.set_default('client_learning_rate', 0.3)
flags.FLAGS.set_default('eval_every', 2)
flags.FLAGS.set_default('checkpoint_every', 10)
_SEEDS = cf.define_seeds(3)
_METHODS = flags.DEFINE_list(
  'methods',
  ['optimal', 'uniform', 'full'],
  f'Samplings to compare, of {", ".join(optimal.SAMPLING_MODES)}.',
)
_TARGET_ACCURACY = flags.DEFINE_float(
  'target_accuracy', 0.7, 'Accuracy for the rounds/bits-to-target columns, a fraction in (0, 1].'
)
flag_checks.check_accuracy('target_accuracy')
flag_checks.check_choices('methods', list(optimal.SAMPLING_MODES))


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  with cf.exit_on_bad_input():
    ef.refuse_devices('python -m bin.benchmark --sampling=uniform,uniform+optimal,full')
    plot_path = plotting.check_plot_path(os.path.join(cf.ROOT_OUTPUT_DIR.value, 'accuracy.png'))
    if ef.TASK.value == 'digits':
      cf.apply_defaults({'preset': 'unbalanced'})  # The demo's population (not a global default).
    task = ef.task_from_flags()
    method = optimal_flags.optimal_sampling(ef.CLIENTS_PER_ROUND.value)
    groups = comparisons.run_comparison(
      task,
      ef.comparison(_METHODS.value, _SEEDS.value),
      ef.run_settings(),
      make_process=lambda sampling, seed: method.make_process(task, sampling, seed),
      make_sampler=lambda sampling, seed: samplers.UniformSampler(
        ef.CLIENTS_PER_ROUND.value, seed=seed
      ),
      availability=ef.availability_spec(),
      uplink_fn=communication.uplink_from_measurements,
    )
  plot_path = plotting.plot_runs(
    [r.path for runs in groups.values() for r in runs],
    plot_path,
    title=(
      f'FedAvg on {ef.TASK.value} ({task.num_clients} clients), cohort '
      f'{ef.CLIENTS_PER_ROUND.value}, m = {method.expected_clients:g}'
    ),
  )
  print(
    f'\nFedAvg on {ef.TASK.value} (preset {task.options.get("preset", "-")}), cohort '
    f'{ef.CLIENTS_PER_ROUND.value}, expected uploads m = {method.expected_clients:g}, '
    f'{cf.ROUNDS.value} rounds, {_SEEDS.value} seeds (mean ± std):'
  )
  print(optimal.summary_table(groups, _TARGET_ACCURACY.value))
  print('\nImprovement factor α by rounds (mean over seeds and rounds):')
  print(optimal.improvement_table(groups))
  print(f'plot: {plot_path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
