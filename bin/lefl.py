"""LEFL experiments (Abebe, Munoz, Jannesari): low-entropy stratified sampling.

    python -m bin.lefl --task=digits --sampling=lefl,uniform --seeds=3 \\
        --pretrain_epochs=10 --public_examples=200 --public_data=noise

``lefl`` first runs a pre-processing round: every client trains the initial
model for ``--pretrain_epochs`` passes over its data and uploads its soft labels
on ``--public_examples`` public unlabeled inputs (``--public_data``: ``noise``,
the offline default, or TFDS's ``fashion_mnist`` / ``cifar10``). The server
clusters the clients by the KL divergence of their soft labels (k-means,
``--num_clusters``, default ⌈log2 N⌉) and samples every round from each
cluster (``--allocation``: ``per_cluster`` takes ``max(1, round(rate·|c|))``
per cluster with ``--sample_rate``; ``proportional`` splits exactly
``--clients_per_round``). ``uniform`` samples without replacement. Both
aggregate with ``n_k / Σ n_j`` and see the same availability.

Prints per method: the relative entropy of the sampled clients' label
distribution to the global one (mean per round), final accuracy, rounds to
``--target_accuracy``, and the pre-processing communication against one
round's uploads; plots accuracy and relative entropy per round.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import os
import time

from absl import app
from absl import flags
import numpy as np

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import flag_checks
from tasks import public
from tff_sampling import communication
from tff_sampling import comparisons
from tff_sampling.analysis import plotting
from tff_sampling.comparisons import lefl
from tff_sampling.learning import signals
from tff_sampling.task import Task

# The paper's settings (CIFAR 100 clients at 10% per round, EMNIST 1,000 at 1%,
# E_p = 10), with fewer rounds; `digits` is the offline stand-in (Dirichlet 0.5).
PAPER_DEFAULTS = {
  'digits': dict(rounds=60, eval_every=2, clients_per_round=10, client_learning_rate=0.1),
  'synthetic': dict(rounds=60, eval_every=2, clients_per_round=6, client_learning_rate=0.05),
  'emnist': dict(rounds=500, eval_every=10, clients_per_round=34, client_learning_rate=0.1),
  'cifar10': dict(rounds=500, eval_every=10, clients_per_round=10, client_learning_rate=0.03),
  'cifar100': dict(rounds=500, eval_every=10, clients_per_round=50, client_learning_rate=0.03),
}

flags.FLAGS.set_default('root_output_dir', 'results/lefl')
flags.FLAGS.set_default('checkpoint_every', 20)
_SAMPLING = flags.DEFINE_list(
  'sampling', list(lefl.SAMPLINGS), f'Methods to run, of {lefl.SAMPLINGS}.'
)
_PRETRAIN_EPOCHS = flags.DEFINE_integer(
  'pretrain_epochs',
  10,
  'lefl: E_p, passes over each client stream before its soft labels.',
  lower_bound=1,
)
_PUBLIC_EXAMPLES = flags.DEFINE_integer(
  'public_examples', 200, 'lefl: size of the public unlabeled set.', lower_bound=1
)
_PUBLIC_DATA = flags.DEFINE_enum(
  'public_data',
  'noise',
  list(public.SOURCES),
  'lefl: the public set: Gaussian noise (offline), real writers outside the population '
  '(leaf_femnist: --public_data_dir is their LEAF FEMNIST folder) or a TFDS dataset '
  '(--public_data_dir).',
)
_PUBLIC_DATA_DIR = flags.DEFINE_string(
  'public_data_dir',
  None,
  'lefl: TFDS data directory holding the prepared public dataset, '
  'or the LEAF FEMNIST folder of --public_data=leaf_femnist.',
)
_NUM_CLUSTERS = flags.DEFINE_integer(
  'num_clusters', None, 'lefl: k-means clusters (default ⌈log2 N⌉).', lower_bound=1
)
_SAMPLE_RATE = flags.DEFINE_float(
  'sample_rate',
  None,
  'lefl per_cluster: fraction of each cluster per round (default clients_per_round / N).',
)
_ALLOCATION = flags.DEFINE_enum(
  'allocation',
  'per_cluster',
  ['per_cluster', 'proportional'],
  'lefl: max(1, round(rate·|c|)) per cluster (the paper), or exactly '
  '--clients_per_round split ∝ cluster sizes.',
)
_TARGET_ACCURACY = flags.DEFINE_float(
  'target_accuracy',
  None,
  'Accuracy for "rounds to target", a fraction in (0, 1] '
  '(default: 90% of the best final accuracy among the methods).',
)
_SEEDS = cf.define_seeds()
flag_checks.check_number('sample_rate', low=0.0, high=1.0, low_open=True)
flag_checks.check_accuracy('target_accuracy')
flag_checks.check_choices('sampling', lefl.SAMPLINGS)


def lefl_methods() -> lefl.LeflMethods:
  """The samplers' settings from the flags."""

  def public_inputs(task: Task, seed: int) -> np.ndarray:
    return public.public_inputs(
      task,
      _PUBLIC_DATA.value,
      num_examples=_PUBLIC_EXAMPLES.value,
      seed=seed,
      data_dir=_PUBLIC_DATA_DIR.value,
    )

  return lefl.LeflMethods(
    ef.CLIENTS_PER_ROUND.value,
    cf.CLIENT_LEARNING_RATE.value,
    public_inputs,
    client_steps=ef.CLIENT_STEPS.value,
    pretrain_epochs=_PRETRAIN_EPOCHS.value,
    num_clusters=_NUM_CLUSTERS.value,
    sample_rate=_SAMPLE_RATE.value,
    allocation=_ALLOCATION.value,
  )


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  ef.apply_task_defaults(PAPER_DEFAULTS)
  with cf.exit_on_bad_input():
    plot_paths = {
      metric: plotting.check_plot_path(
        os.path.join(cf.ROOT_OUTPUT_DIR.value, f'{ef.TASK.value}_{metric.replace("/", "_")}.png')
      )
      for metric in ('accuracy', 'selection/label_kl')
    }
    if _SAMPLE_RATE.value is not None and not 0 < _SAMPLE_RATE.value <= 1:
      raise ValueError(f'--sample_rate must be in (0, 1], got {_SAMPLE_RATE.value}.')
    task = ef.task_from_flags()
    costs: dict[tuple[str, int], communication.PreprocessingBits] = {}
    process = signals.build_fed_avg_with_signals(
      task.model_fn,
      client_learning_rate=cf.CLIENT_LEARNING_RATE.value,
      server_learning_rate=cf.SERVER_LEARNING_RATE.value,
      sketch_size=None,
    )  # LEFL reads no sketches: none computed.
    groups = comparisons.run_comparison(
      task,
      ef.comparison(_SAMPLING.value, _SEEDS.value),
      ef.run_settings(),
      make_process=lambda method, seed: process,
      make_sampler=functools.partial(lefl_methods().make_sampler, task, costs=costs),
      availability=ef.availability_spec(),
      preprocessing_bits=lambda method, seed: costs.get((method, seed)),
    )
  target = _TARGET_ACCURACY.value
  if target is None:
    target = lefl.default_target(groups)
  run_dirs = [r.path for runs in groups.values() for r in runs]
  plots = [
    plotting.plot_runs(
      run_dirs, plot_paths[metric], metric=metric, title=f'{ef.TASK.value}: {title}'
    )
    for metric, title in (
      ('accuracy', 'accuracy'),
      ('selection/label_kl', 'KL(sampled labels ‖ global)'),
    )
  ]
  print(
    f'\n{ef.TASK.value}, {task.num_clients} clients, m = {ef.CLIENTS_PER_ROUND.value}, '
    f'{cf.ROUNDS.value} rounds, {_SEEDS.value} seed(s), mean ± std over seeds; '
    '"= rounds": the pre-processing upload in rounds of uploads:'
  )
  print(lefl.summary_table(groups, target))
  print('plots: ' + ', '.join(plots))
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
