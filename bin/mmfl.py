"""Multi-model FL (MMFL): several models share the clients, each trains at most one.

    python -m bin.mmfl --suite=digits_noniid --num_models=5 --clients=120 \\
        --expected_clients=12 --rounds=60 --seeds=3 \\
        --sampling=optimal,optimal_loss,optimal_secure,random,round_robin

Every round all ``--clients`` clients compute their signal for every model
(``optimal*``: update norms after local training, or ``*_loss``: the current
models' losses, a forward pass); each then trains at most one model with
probability ``p_{s|i}`` so that ``--expected_clients`` train on average, and
uploads only that update, weighted ``d_{i,s} / p_{s|i}``. ``optimal_secure``
gets ``p`` with secure sums only (``--max_rescaling_steps`` rescaling steps);
``random`` and ``round_robin`` are the baselines (`tff_sampling.learning.multi_model`).

Suites (`tasks.multi_model`): ``digits_noniid`` (offline: ``S`` digits tasks
with Dirichlet α from 0.05 to 10), ``digits_synthetic`` (offline: digits +
Synthetic(0.5, 0.5)), ``leaf`` (FEMNIST, Shakespeare, CIFAR-100 from TFF's
cache, ``--cache_dir``), ``femnist_models`` (FEMNIST's CNN and 2NN on the same
writers, ``--cache_dir``).

Prints, per method, the average accuracy over the models at four points of the
run (mean ± std over seeds), each model's final accuracy, uploads per round,
uploaded bits, the variance relative to random assignment (``α``) and, for
``optimal``/``optimal_loss``, the variance the secure version would have had
relative to the exact one, on that run's real signals. Writes a plot of the
average accuracy against rounds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bin import flag_checks
from tasks import multi_model as suites
from tff_sampling import multi_model_program
from tff_sampling import plotting
from tff_sampling import program
from tff_sampling import results
from tff_sampling import run_dir
from tff_sampling.learning import multi_model

DEFAULT_SAMPLINGS = ('optimal', 'optimal_loss', 'optimal_secure', 'random', 'round_robin')

_SUITE = flags.DEFINE_enum('suite', 'digits_noniid', list(suites.SUITES), 'The task suite.')
_SAMPLING = flags.DEFINE_list('sampling', list(DEFAULT_SAMPLINGS),
                              f'Methods to run, of {", ".join(multi_model.SAMPLINGS)}.')
_NUM_MODELS = flags.DEFINE_integer('num_models', None,
                                   'S, the number of models (default: the suite\'s).',
                                   lower_bound=1)
_CLIENTS = flags.DEFINE_integer('clients', 120, 'N, the clients shared by the models.',
                                lower_bound=1)
_EXPECTED_CLIENTS = flags.DEFINE_float(
    'expected_clients', 12.0,
    'm, the expected number of clients that train per round, in (0, --clients].')
_ROUNDS = flags.DEFINE_integer('rounds', 60, 'Training rounds.', lower_bound=1)
_SEEDS = flags.DEFINE_integer('seeds', 1, 'Runs per method (seeds seed..seed+seeds-1).',
                              lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'First seed (sampling, shuffles, initial models).',
                             lower_bound=0, upper_bound=2**32 - 1)
_DATA_SEED = flags.DEFINE_integer('data_seed', 0, 'Seed of the suite\'s data partitions.',
                                  lower_bound=0, upper_bound=2**32 - 1)
_CLIENT_LEARNING_RATE = flags.DEFINE_float('client_learning_rate', 0.1,
                                           'Local SGD step size (finite, > 0).')
_SERVER_LEARNING_RATE = flags.DEFINE_float('server_learning_rate', 1.0,
                                           'η of w_s ← w_s − η Σ (d/p) U (finite, > 0).')
_CLIENT_EPOCHS = flags.DEFINE_integer('client_epochs', 5, 'E, local epochs.', lower_bound=1)
_CLIENT_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 10, 'Local batch size.',
                                          lower_bound=1)
_MAX_RESCALING_STEPS = flags.DEFINE_integer(
    'max_rescaling_steps', 2, 'Secure samplings: Algorithm 2 rescaling steps (also the largest '
    'j of the reported secure/exact variance ratios).', lower_bound=0)
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 5, 'Evaluate every this many rounds.',
                                   lower_bound=1)
_CHECKPOINT_EVERY = flags.DEFINE_integer('checkpoint_every', 10, 'Checkpoint every this many '
                                         'rounds.', lower_bound=1)
_ROOT_OUTPUT_DIR = flags.DEFINE_string('root_output_dir', 'results/mmfl', 'Results root.')
_EXPERIMENT_NAME = flags.DEFINE_string('experiment_name', None,
                                       'Prefix of the run directories (default: the suite).')
_CACHE_DIR = flags.DEFINE_string('cache_dir', None,
                                 'leaf, femnist_models: TFF dataset cache directory.')
_REPORT_ONLY = flags.DEFINE_bool('report_only', False,
                                 'Print the report from existing runs; train nothing.')
flag_checks.check_learning_rate('client_learning_rate')
flag_checks.check_learning_rate('server_learning_rate')
flag_checks.check_number('expected_clients', low=0.0, low_open=True,
                         hint='expected trainers per round, at most --clients')
_RESET = flags.DEFINE_bool(
    'reset', False, 'Start each run over: delete its earlier output first (only a directory '
    'this project created for a run). Without it an existing run is resumed.')


def run_name(method: str, seed: int) -> str:
  prefix = _EXPERIMENT_NAME.value or _SUITE.value
  return f'{prefix}_{method}_seed{seed}'


def run_directory(method: str, seed: int) -> str:
  """The (method, seed) run's directory under --root_output_dir (ValueError for a bad name)."""
  return run_dir.run_path(_ROOT_OUTPUT_DIR.value, run_name(method, seed))


def check_flags() -> None:
  """Raises ValueError naming the bad flag value and the fix."""
  unknown = [s for s in _SAMPLING.value if s not in multi_model.SAMPLINGS]
  if unknown or not _SAMPLING.value:
    raise ValueError(f'--sampling has unknown method(s) {unknown}; choose from '
                     f'{", ".join(multi_model.SAMPLINGS)}.')
  if _CLIENTS.value <= 0:
    raise ValueError(f'--clients must be positive, got {_CLIENTS.value}.')
  m = _EXPECTED_CLIENTS.value
  if not 0 < m <= _CLIENTS.value:
    raise ValueError(f'--expected_clients must be in (0, --clients={_CLIENTS.value}], got {m}: '
                     'it is the expected number of the N clients that train each round.')


def run_one(tasks, method: str, seed: int) -> str:
  """Trains one (method, seed) run (resuming its checkpoints); returns its directory."""
  process = multi_model.build_multi_model_process(
      [task.model_fn for task in tasks], sampling=method,
      expected_clients=_EXPECTED_CLIENTS.value,
      client_learning_rates=_CLIENT_LEARNING_RATE.value,
      server_learning_rate=_SERVER_LEARNING_RATE.value,
      max_rescaling_steps=_MAX_RESCALING_STEPS.value, seed=seed)
  hparams = dict(
      suite=_SUITE.value, tasks=[t.name for t in tasks], num_models=len(tasks),
      clients=_CLIENTS.value, expected_clients=_EXPECTED_CLIENTS.value, sampling=method,
      seed=seed, data_seed=_DATA_SEED.value, client_learning_rate=_CLIENT_LEARNING_RATE.value,
      server_learning_rate=_SERVER_LEARNING_RATE.value, client_epochs=_CLIENT_EPOCHS.value,
      client_batch_size=_CLIENT_BATCH_SIZE.value,
      max_rescaling_steps=_MAX_RESCALING_STEPS.value, rounds=_ROUNDS.value,
      eval_every=_EVAL_EVERY.value, checkpoint_every=_CHECKPOINT_EVERY.value,
      experiment_name=run_name(method, seed))
  directory = run_directory(method, seed)
  if _RESET.value:
    run_dir.remove_run(directory)
  result = multi_model_program.run_multi_model_experiment(tasks, process, program.ProgramConfig(
      output_dir=directory, rounds=_ROUNDS.value, seed=seed, eval_every=_EVAL_EVERY.value,
      checkpoint_every=_CHECKPOINT_EVERY.value, hparams=hparams))
  logging.info('%s seed %d: mean accuracy %.4f after %d rounds (%.1f s).', method, seed,
               result.eval_metrics['mean_accuracy'], result.final_round, result.seconds)
  return directory


def _column_mean(run: results.Run, column: str) -> float:
  values = run.metrics.get(column)
  if values is None:
    return float('nan')
  values = values[1:]
  return float(np.nanmean(values)) if np.any(np.isfinite(values)) else float('nan')


def _accuracy_at(run: results.Run, round_num: int) -> float:
  index = np.flatnonzero(run.rounds == round_num)
  return float(run.metrics['eval/mean_accuracy'][index[0]]) if index.size else float('nan')


def summary_table(groups: dict[str, list[results.Run]], rounds: int, eval_every: int,
                  num_models: int) -> str:
  """Average accuracy at four points, per-model final accuracy, uplink and variance."""
  points = sorted({max(eval_every, int(round(rounds * f / eval_every)) * eval_every)
                   for f in (0.25, 0.5, 0.75)} | {rounds})
  header = f'{"method":<22}' + ''.join(f'{f"acc@{r}":>16}' for r in points) + (
      f'{"final per model":>{8 * num_models + 2}}{"uploads/rd":>12}{"Mbit/rd":>9}'
      f'{"α vs random":>13}{"secure/exact var":>30}{"s/round":>9}')
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    cells = []
    for r in points:
      values = np.array([_accuracy_at(run, r) for run in runs])
      cells.append(f'{np.mean(values):>9.4f} ± {np.std(values):.3f}')
    final = [np.mean([run.metrics[f'eval/model_{s}/accuracy'][-1] for run in runs])
             for s in range(num_models)]
    uploads = np.mean([_column_mean(run, 'uplink/model_uploads') for run in runs])
    bits = np.mean([_column_mean(run, 'uplink/round_bits') for run in runs]) / 1e6
    alpha = np.mean([_column_mean(run, 'process/improvement_factor') for run in runs])
    ratio_columns = sorted(c for c in runs[0].metrics if c.startswith(
        'process/secure_variance_ratio/steps_'))
    ratio = (' / '.join(f'{np.mean([_column_mean(run, c) for run in runs]):.4f}'
                        for c in ratio_columns) if ratio_columns else '—')
    seconds = np.mean([np.nanmedian(run.metrics['round_seconds'][1:]) for run in runs])
    lines.append(f'{method:<22}' + ''.join(f'{c:>16}' for c in cells)
                 + f'{" ".join(f"{a:.3f}" for a in final):>{8 * num_models + 2}}'
                 + f'{uploads:>12.2f}{bits:>9.3f}'
                 + (f'{alpha:>13.3f}' if np.isfinite(alpha) else f'{"—":>13}')
                 + f'  {ratio:>28}{seconds:>9.2f}')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  start = time.monotonic()
  try:
    check_flags()
    plot_path = plotting.check_plot_path(os.path.join(
        _ROOT_OUTPUT_DIR.value, f'{_EXPERIMENT_NAME.value or _SUITE.value}_mean_accuracy.png'))
    tasks = suites.create_suite(
        _SUITE.value, num_models=_NUM_MODELS.value, num_clients=_CLIENTS.value,
        seed=_DATA_SEED.value, client_epochs=_CLIENT_EPOCHS.value,
        client_batch_size=_CLIENT_BATCH_SIZE.value, cache_dir=_CACHE_DIR.value)
    run_dirs = []
    for method in _SAMPLING.value:
      for seed in range(_SEED.value, _SEED.value + _SEEDS.value):
        if _REPORT_ONLY.value:
          run_dirs.append(run_directory(method, seed))
        else:
          run_dirs.append(run_one(tasks, method, seed))
    runs = [results.load_run(d) for d in run_dirs]
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  groups: dict[str, list[results.Run]] = {}
  for run in runs:
    groups.setdefault(run.hparams['sampling'], []).append(run)
  prefix = _EXPERIMENT_NAME.value or _SUITE.value
  plot = plotting.plot_runs(
      run_dirs, plot_path,
      metric='eval/mean_accuracy',
      title=f'{prefix}: average accuracy over {len(tasks)} models')
  labels = [f'{t.name} ({t.options["model"]})' if 'model' in t.options else t.name
            for t in tasks]
  print(f'\n{_SUITE.value}: {len(tasks)} models ({", ".join(labels)}), '
        f'N = {_CLIENTS.value}, m = {_EXPECTED_CLIENTS.value:g}, E = {_CLIENT_EPOCHS.value}, '
        f'{_ROUNDS.value} rounds, {_SEEDS.value} seed(s); accuracy averaged over the models, '
        'mean ± std over seeds; "secure/exact var": the secure version\'s sampling variance '
        f'over the exact one\'s with j = 0…{_MAX_RESCALING_STEPS.value} rescaling steps, on '
        'this run\'s signals (mean over rounds):')
  print(summary_table(groups, _ROUNDS.value, _EVAL_EVERY.value, len(tasks)))
  print(f'plot: {plot}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling import runtime  # pylint: disable=g-import-not-at-top
  app.run(runtime.binary_main(main))
