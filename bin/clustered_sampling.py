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
``--availability`` restricts every method to the round's active clients. MD and clustered samplers aggregate with weight ``1/m`` per draw; the
weights and the sketches travel through the signals client work
(`tff_sampling.learning.signals`). Defaults follow the paper scaled to the
offline `digits` task: the shard preset (one digit per client), m = 10, batch
50, local epochs 10. Prints a table (accuracy, loss, distinct clients and
labels per round, aggregation-weight variance) and writes the accuracy plot.
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
from tff_sampling import plotting
from tff_sampling import results
from tff_sampling import samplers
from tff_sampling.learning import signals

SAMPLINGS = ('uniform', 'md', 'clustered_size', 'clustered_similarity', 'target',
             'power_of_choice', 'fedgs')

flags.FLAGS.set_default('root_output_dir', 'results/clustered')
flags.FLAGS.set_default('rounds', 30)
flags.FLAGS.set_default('clients_per_round', 10)
flags.FLAGS.set_default('client_batch_size', 50)
flags.FLAGS.set_default('client_epochs', 10)
flags.FLAGS.set_default('client_learning_rate', 0.1)
flags.FLAGS.set_default('eval_every', 2)
flags.FLAGS.set_default('checkpoint_every', 10)
_SAMPLING = flags.DEFINE_list('sampling', ['md', 'clustered_size', 'clustered_similarity',
                                           'target'], f'Methods to run, of {SAMPLINGS}.')
_SIMILARITY = flags.DEFINE_enum('similarity', 'arccos', ['arccos', 'L2', 'L1'],
                                'clustered_similarity: distance between client updates.')
_SKETCH_SIZE = flags.DEFINE_integer('sketch_size', 1024,
                                    'Length of each client update sketch.', lower_bound=1)
_NUM_CANDIDATES = flags.DEFINE_integer('num_candidates', 20,
                                       'power_of_choice: candidates per round.', lower_bound=1)
_FEDGS_ALPHA = flags.DEFINE_float('fedgs_alpha', 1.0,
                                  'fedgs: weight α of the graph-dispersion term.')
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Runs per method (seeds seed..seed+seeds-1).',
                              lower_bound=1)
flag_checks.check_number('fedgs_alpha', low=0.0)


def make_sampler(task, method: str, seed: int) -> samplers.Sampler:
  """The server-side sampler `method` for the current flags."""
  m = ef.CLIENTS_PER_ROUND.value
  if method == 'uniform':
    return samplers.UniformSampler(m, seed=seed)
  if method == 'md':
    return samplers.MDSampler(m, seed=seed)
  if method == 'clustered_size':
    return samplers.ClusteredSampler(m, seed=seed, method='size')
  if method == 'clustered_similarity':
    return samplers.ClusteredSampler(m, seed=seed, method='similarity',
                                     similarity=_SIMILARITY.value, sketch_size=_SKETCH_SIZE.value)
  if method == 'target':
    return samplers.TargetSampler(task.client_label_histograms.argmax(axis=1), seed=seed)
  if method == 'power_of_choice':
    return samplers.PowerOfChoiceSampler(m, num_candidates=_NUM_CANDIDATES.value, seed=seed)
  if method == 'fedgs':
    # The oracle 3DG of FedGS's simulations: label-distribution features.
    histograms = task.client_label_histograms.astype(np.float64)
    features = histograms / np.maximum(histograms.sum(axis=1, keepdims=True), 1.0)
    return samplers.FedGSSampler(m, seed=seed, features=features, alpha=_FEDGS_ALPHA.value)
  raise ValueError(f'Unknown --sampling {method!r}; choose from {", ".join(SAMPLINGS)}.')


def _mean_over_runs(runs: Sequence[results.Run], column: str) -> float:
  return float(np.mean([np.nanmean(r.metrics[column][1:]) for r in runs]))


def summary_table(groups: dict[str, list[results.Run]]) -> str:
  """Final accuracy/loss and per-round selection statistics per method."""
  header = (f'{"method":<22} {"final accuracy":>16} {"final loss":>11} '
            f'{"distinct clients":>17} {"distinct labels":>16} {"weight var":>11}')
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    accuracy = np.array([r.metrics['eval/accuracy'][np.isfinite(r.metrics['eval/accuracy'])][-1]
                         for r in runs])
    loss = np.array([r.metrics['eval/loss'][np.isfinite(r.metrics['eval/loss'])][-1]
                     for r in runs])
    lines.append(
        f'{method:<22} {accuracy.mean():>9.4f} ± {accuracy.std():.3f} {loss.mean():>11.4f} '
        f'{_mean_over_runs(runs, "selection/distinct_clients"):>17.2f} '
        f'{_mean_over_runs(runs, "selection/distinct_labels"):>16.2f} '
        f'{_mean_over_runs(runs, "selection/weight_variance"):>11.2e}')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  start = ef.begin_main(argv)
  try:
    ef.check_choices('sampling', _SAMPLING.value, SAMPLINGS)
    plot_path = plotting.check_plot_path(
        os.path.join(ef.ROOT_OUTPUT_DIR.value, f'{ef.TASK.value}_accuracy.png'))
    if ef.TASK.value == 'digits' and not flags.FLAGS['preset'].present:
      flags.FLAGS.preset = 'shards'  # Fraboni's one-digit-per-client setting.
    task = ef.task_from_flags()
    processes = {}

    def process_for(method):
      # Built once per kind and reused across methods and seeds. Only
      # similarity-based sampling reads the update sketches, which cost client time.
      sketch_size = _SKETCH_SIZE.value if method == 'clustered_similarity' else None
      if sketch_size not in processes:
        processes[sketch_size] = signals.build_fedavg_with_signals(
            task.model_fn, client_learning_rate=ef.CLIENT_LEARNING_RATE.value,
            server_learning_rate=ef.SERVER_LEARNING_RATE.value, sketch_size=sketch_size)
      return processes[sketch_size]

    groups = ef.run_comparison(
        task, _SAMPLING.value, _SEEDS.value,
        make_process=lambda method, seed: process_for(method),
        make_sampler=lambda method, seed: make_sampler(task, method, seed),
        method_hparams=lambda method: dict(
            sampling=method, similarity=_SIMILARITY.value, sketch_size=_SKETCH_SIZE.value,
            num_candidates=_NUM_CANDIDATES.value, fedgs_alpha=_FEDGS_ALPHA.value))
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  plot_path = plotting.plot_runs(
      [r.path for runs in groups.values() for r in runs],
      plot_path,
      title=f'FedAvg on {ef.TASK.value}, m = {ef.CLIENTS_PER_ROUND.value}, server samplers')
  print(f'\n{ef.TASK.value} (preset {task.options.get("preset", "-")}, alpha '
        f'{task.options.get("dirichlet_alpha", "-")}), m = {ef.CLIENTS_PER_ROUND.value}, '
        f'{ef.ROUNDS.value} rounds, {_SEEDS.value} seed(s), mean ± std over seeds; '
        'selection statistics are per-round means:')
  print(summary_table(groups))
  print(f'plot: {plot_path}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling import runtime  # pylint: disable=g-import-not-at-top
  app.run(runtime.binary_main(main))
