"""Clustered sampling experiments (Fraboni et al., ICML 2021) and other server samplers.

    python -m bin.clustered_sampling --sampling=md,clustered_size,clustered_similarity,target \\
        --seeds=3 --root_output_dir=results/clustered

For each ``--sampling`` method and seed, FedAvg runs with cohorts chosen on the
server: ``uniform`` (without replacement, FedAvg weights), ``md`` (m i.i.d.
draws ∝ n_i), ``clustered_size`` (Algorithm 1), ``clustered_similarity``
(Algorithm 2 on count sketches of the clients' last updates, ``--similarity``),
``target`` (one client per majority label: an oracle reference), or
``power_of_choice`` (the highest-loss clients among ``--num_candidates`` drawn
∝ n_k) or ``fedgs`` (FedGS on the oracle label-distribution graph, ``--fedgs_alpha``).
``--availability`` restricts every method to the round's active clients. MD and
clustered samplers aggregate with weight ``1/m`` per draw; the weights and the
sketches travel through the signals client work
(`tff_sampling.learning.signals`). Defaults follow the paper scaled to the
offline `digits` task: the shard preset (one digit per client), m = 10, batch
50, local epochs 10. Prints a table (accuracy, loss, distinct clients and
labels per round, aggregation-weight variance) and writes the accuracy plot.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import os
import time

from absl import app
from absl import flags

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import flag_checks
from tff_sampling import comparisons
from tff_sampling.analysis import plotting
from tff_sampling.comparisons import clustered

flags.FLAGS.set_default('root_output_dir', 'results/clustered')
flags.FLAGS.set_default('rounds', 30)
flags.FLAGS.set_default('clients_per_round', 10)
flags.FLAGS.set_default('client_batch_size', 50)
flags.FLAGS.set_default('client_epochs', 10)
flags.FLAGS.set_default('client_learning_rate', 0.1)
flags.FLAGS.set_default('eval_every', 2)
flags.FLAGS.set_default('checkpoint_every', 10)
_SAMPLING = flags.DEFINE_list(
  'sampling',
  ['md', 'clustered_size', 'clustered_similarity', 'target'],
  f'Methods to run, of {clustered.SAMPLINGS}.',
)
_SIMILARITY = flags.DEFINE_enum(
  'similarity',
  'arccos',
  ['arccos', 'L2', 'L1'],
  'clustered_similarity: distance between client updates.',
)
_SKETCH_SIZE = flags.DEFINE_integer(
  'sketch_size', 1024, 'Length of each client update sketch.', lower_bound=1
)
_NUM_CANDIDATES = flags.DEFINE_integer(
  'num_candidates', 20, 'power_of_choice: candidates per round.', lower_bound=1
)
_FEDGS_ALPHA = flags.DEFINE_float(
  'fedgs_alpha', 1.0, 'fedgs: weight α of the graph-dispersion term.'
)
_SEEDS = cf.define_seeds()
flag_checks.check_number('fedgs_alpha', low=0.0)
flag_checks.check_choices('sampling', clustered.SAMPLINGS)


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  with cf.exit_on_bad_input():
    plot_path = plotting.check_plot_path(
      os.path.join(cf.ROOT_OUTPUT_DIR.value, f'{ef.TASK.value}_accuracy.png')
    )
    if ef.TASK.value == 'digits':
      cf.apply_defaults({'preset': 'shards'})  # Fraboni's one-digit-per-client setting.
    task = ef.task_from_flags()
    methods = clustered.ClusteredMethods(
      ef.CLIENTS_PER_ROUND.value,
      cf.CLIENT_LEARNING_RATE.value,
      cf.SERVER_LEARNING_RATE.value,
      similarity=_SIMILARITY.value,
      sketch_size=_SKETCH_SIZE.value,
      num_candidates=_NUM_CANDIDATES.value,
      fedgs_alpha=_FEDGS_ALPHA.value,
    )
    groups = comparisons.run_comparison(
      task,
      ef.comparison(_SAMPLING.value, _SEEDS.value),
      ef.run_settings(),
      make_process=methods.process_factory(task),
      make_sampler=functools.partial(methods.make_sampler, task),
      availability=ef.availability_spec(),
    )
  plot_path = plotting.plot_runs(
    [r.path for runs in groups.values() for r in runs],
    plot_path,
    title=f'FedAvg on {ef.TASK.value}, m = {ef.CLIENTS_PER_ROUND.value}, server samplers',
  )
  print(
    f'\n{ef.TASK.value} (preset {task.options.get("preset", "-")}, alpha '
    f'{task.options.get("dirichlet_alpha", "-")}), m = {ef.CLIENTS_PER_ROUND.value}, '
    f'{cf.ROUNDS.value} rounds, {_SEEDS.value} seed(s), mean ± std over seeds; '
    'selection statistics are per-round means:'
  )
  print(clustered.summary_table(groups))
  print(f'plot: {plot_path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
