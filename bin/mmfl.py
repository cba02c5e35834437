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
``random`` and ``round_robin`` are the baselines (`tff_sampling.learning.multi_model`);
``random_train_all`` and ``round_robin_train_all`` make the same draws after every client
trained every model, as ``optimal`` does: its compute, their selection.

Suites (`tasks.multi_model`): ``digits_noniid`` (offline: ``S`` digits tasks
with Dirichlet α from 0.05 to 10), ``femnist_noniid`` (the same on the real
FEMNIST digits, LEFL's FFNN, ``--cache_dir``), ``digits_synthetic`` (offline: digits +
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

from collections.abc import Sequence
import os
import time

from absl import app
from absl import flags
from absl import logging

from bin import common_flags as cf
from bin import flag_checks
from tasks import multi_model as suites
from tff_sampling import comparisons
from tff_sampling.analysis import plotting
from tff_sampling.comparisons import mmfl
from tff_sampling.learning import multi_model
from tff_sampling.learning import multi_model_types
from tff_sampling.program import multi_model as multi_model_program
from tff_sampling.runtime import results

DEFAULT_SAMPLINGS = ('optimal', 'optimal_loss', 'optimal_secure', 'random', 'round_robin')

flags.FLAGS.set_default('rounds', 60)
flags.FLAGS.set_default('data_seed', 0)
flags.FLAGS.set_default('client_epochs', 5)
flags.FLAGS.set_default('client_batch_size', 10)
flags.FLAGS.set_default('eval_every', 5)
flags.FLAGS.set_default('checkpoint_every', 10)
flags.FLAGS.set_default('root_output_dir', 'results/mmfl')
_SUITE = flags.DEFINE_enum('suite', 'digits_noniid', list(suites.SUITES), 'The task suite.')
_SAMPLING = flags.DEFINE_list(
  'sampling',
  list(DEFAULT_SAMPLINGS),
  f'Methods to run, of {", ".join(multi_model_types.SAMPLINGS)}.',
)
_NUM_MODELS = flags.DEFINE_integer(
  'num_models', None, "S, the number of models (default: the suite's).", lower_bound=1
)
_CLIENTS = flags.DEFINE_integer(
  'clients', 120, 'N, the clients shared by the models.', lower_bound=1
)
_EXPECTED_CLIENTS = flags.DEFINE_float(
  'expected_clients',
  12.0,
  'm, the expected number of clients that train per round, in (0, --clients].',
)
_MAX_RESCALING_STEPS = flags.DEFINE_integer(
  'max_rescaling_steps',
  2,
  'Secure samplings: Algorithm 2 rescaling steps (also the largest '
  'j of the reported secure/exact variance ratios).',
  lower_bound=0,
)
_REPORT_ONLY = flags.DEFINE_bool(
  'report_only', False, 'Print the report from existing runs; train nothing.'
)
_SEEDS = cf.define_seeds()
flag_checks.check_choices('sampling', multi_model_types.SAMPLINGS)
flag_checks.check_number(
  'expected_clients', low=0.0, low_open=True, hint='expected trainers per round, at most --clients'
)


def check_flags() -> None:
  """Raises ValueError naming the bad flag value and the fix."""
  m = _EXPECTED_CLIENTS.value
  if not 0 < m <= _CLIENTS.value:
    raise ValueError(
      f'--expected_clients must be in (0, --clients={_CLIENTS.value}], got {m}: '
      'it is the expected number of the N clients that train each round.'
    )


def run_one(
  tasks, settings: comparisons.ComparisonSettings, name: str, method: str, seed: int
) -> results.Run:
  """Trains one (method, seed) run (resuming its checkpoints); returns it."""
  config = settings.run_config(
    name,
    seed,
    comparisons.run_hparams(
      settings,
      name,
      seed,
      dict(tasks=[t.name for t in tasks], num_models=len(tasks), sampling=method),
    ),
  )
  process = multi_model.build_multi_model_process(
    [task.model_fn for task in tasks],
    sampling=method,
    expected_clients=_EXPECTED_CLIENTS.value,
    client_learning_rates=cf.CLIENT_LEARNING_RATE.value,
    server_learning_rate=cf.SERVER_LEARNING_RATE.value,
    max_rescaling_steps=_MAX_RESCALING_STEPS.value,
    seed=seed,
  )
  result = multi_model_program.train_multi_model(tasks, process, config)
  logging.info(
    '%s seed %d: mean accuracy %.4f after %d rounds (%.1f s).',
    method,
    seed,
    result.eval_metrics['mean_accuracy'],
    result.final_round,
    result.seconds,
  )
  return results.load_run(config.output_dir)


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  with cf.exit_on_bad_input():
    check_flags()
    comparison = cf.comparison(_SAMPLING.value, _SEEDS.value, _SUITE.value)
    plot_path = plotting.check_plot_path(
      os.path.join(cf.ROOT_OUTPUT_DIR.value, f'{comparison.prefix}_mean_accuracy.png')
    )
    tasks = suites.create_suite(
      _SUITE.value,
      num_models=_NUM_MODELS.value,
      num_clients=_CLIENTS.value,
      seed=cf.DATA_SEED.value,
      client_epochs=cf.CLIENT_EPOCHS.value,
      client_batch_size=cf.CLIENT_BATCH_SIZE.value,
      cache_dir=cf.CACHE_DIR.value,
    )
    if _REPORT_ONLY.value:
      groups = comparisons.load_comparison(comparison, cf.ROOT_OUTPUT_DIR.value)
    else:
      settings = cf.run_settings()
      groups = {}
      for method, seed in comparison.runs():
        run = run_one(tasks, settings, comparison.run_name(method, seed), method, seed)
        groups.setdefault(method, []).append(run)
  plot = plotting.plot_runs(
    [run.path for runs in groups.values() for run in runs],
    plot_path,
    metric='eval/mean_accuracy',
    title=f'{comparison.prefix}: average accuracy over {len(tasks)} models',
  )
  labels = [f'{t.name} ({t.options["model"]})' if 'model' in t.options else t.name for t in tasks]
  print(
    f'\n{_SUITE.value}: {len(tasks)} models ({", ".join(labels)}), '
    f'N = {_CLIENTS.value}, m = {_EXPECTED_CLIENTS.value:g}, E = {cf.CLIENT_EPOCHS.value}, '
    f'{cf.ROUNDS.value} rounds, {_SEEDS.value} seed(s); accuracy averaged over the models, '
    'mean ± std over seeds; "secure/exact var": the secure version\'s sampling variance '
    f"over the exact one's with j = 0…{_MAX_RESCALING_STEPS.value} rescaling steps, on "
    "this run's signals (mean over rounds):"
  )
  print(mmfl.summary_table(groups, cf.ROUNDS.value, cf.EVAL_EVERY.value, len(tasks)))
  print(f'plot: {plot}')
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
