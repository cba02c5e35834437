"""Every sampler on one task and availability mode, alone and with optimal uploads.

    python -m bin.benchmark --task=digits --availability=IDL \\
        --sampling=uniform,md,uniform+optimal,md+optimal --clients_per_round=5 \\
        --training_cohort=15 --seeds=2

A method is a sampler (``uniform``, ``md``, ``clustered_size``,
``clustered_similarity``, ``power_of_choice``, ``power_of_choice_all``, ``fedgs``,
``lefl``, ``oort``, ``tifl`` (with ``--devices`` only), ``full``), alone (it picks
``--clients_per_round`` = m clients, all upload) or followed by ``+optimal`` (it picks
``--training_cohort`` = K > m clients, they train, and optimal client sampling's secure
protocol lets about m of them upload); see `tff_sampling.comparisons.benchmark`. Every method sees
the same availability (``--availability``, one mode) and, within a seed, the
same initial model and client data order. Prints each method's final accuracy
and uploaded bits (mean ± std over seeds).

The grid of tasks × availability modes is a set of experiment configurations
run by ``python -m bin.experiment`` and rendered by ``python -m bin.benchmark_report``
(``docs/benchmark.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
import time

from absl import app
from absl import flags
import numpy as np

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import flag_checks
from tasks import public
from tff_sampling import comparisons
from tff_sampling.comparisons import benchmark
from tff_sampling.runtime import results
from tff_sampling.task import Task

flags.FLAGS.set_default('root_output_dir', 'results/benchmark')
flags.FLAGS.set_default('checkpoint_every', 20)
_SAMPLING = flags.DEFINE_list(
  'sampling',
  list(benchmark.all_methods()),
  'Methods: samplers, each optionally followed by +optimal (optimal uploads).',
)
_TRAINING_COHORT = flags.DEFINE_integer(
  'training_cohort',
  None,
  '+optimal: K, the clients that train before about m of them upload (default 3 m).',
  lower_bound=2,
)
_MAX_RESCALING_STEPS = flags.DEFINE_integer(
  'max_rescaling_steps', 4, '+optimal: rescaling steps of the secure protocol.', lower_bound=0
)
_FEDGS_ALPHA = flags.DEFINE_float('fedgs_alpha', 1.0, 'fedgs: weight α of graph dispersion.')
_FEDGS_SOLVER = flags.DEFINE_enum(
  'fedgs_solver',
  'heuristic',
  ['heuristic', 'auto', 'solver'],
  'fedgs: how each selection is optimised: the greedy + swap heuristic (deterministic), or '
  'SCIP after it (auto, solver; as bin.fedgs --solver), whose result depends on the machine '
  'when it stops at --fedgs_solver_time_limit.',
)
_FEDGS_SOLVER_TIME_LIMIT = flags.DEFINE_float(
  'fedgs_solver_time_limit', 1.0, "fedgs: the selection solver's limit in seconds."
)
_PUBLIC_DATA = flags.DEFINE_enum(
  'public_data', 'noise', list(public.SOURCES), 'lefl: the public unlabeled set (as bin.lefl).'
)
_PUBLIC_EXAMPLES = flags.DEFINE_integer(
  'public_examples', 200, 'lefl: size of the public set.', lower_bound=1
)
_PUBLIC_DATA_DIR = flags.DEFINE_string(
  'public_data_dir', None, 'lefl: directory of the public set (as bin.lefl).'
)
_SEEDS = cf.define_seeds()
flag_checks.check_number('fedgs_alpha', low=0.0)
flag_checks.check_list('sampling', benchmark.parse_method)
flag_checks.check_number('fedgs_solver_time_limit', low=0.0, low_open=True, hint='seconds')


def benchmark_methods() -> benchmark.BenchmarkMethods:
  """The methods' settings from the flags."""

  def public_inputs(task: Task, seed: int) -> np.ndarray:
    return public.public_inputs(
      task,
      _PUBLIC_DATA.value,
      num_examples=_PUBLIC_EXAMPLES.value,
      seed=seed,
      data_dir=_PUBLIC_DATA_DIR.value,
    )

  m = ef.CLIENTS_PER_ROUND.value
  return benchmark.BenchmarkMethods(
    m,
    _TRAINING_COHORT.value or 3 * m,
    cf.CLIENT_LEARNING_RATE.value,
    server_learning_rate=cf.SERVER_LEARNING_RATE.value,
    client_steps=ef.CLIENT_STEPS.value,
    max_rescaling_steps=_MAX_RESCALING_STEPS.value,
    fedgs_alpha=_FEDGS_ALPHA.value,
    fedgs_solver=_FEDGS_SOLVER.value,
    fedgs_solver_time_limit=_FEDGS_SOLVER_TIME_LIMIT.value,
    public_inputs=public_inputs,
    devices=ef.device_spec(),
    rounds=cf.ROUNDS.value,
  )


def summary(groups: dict[str, list[results.Run]]) -> str:
  """Final accuracy and uploaded bits per method, mean ± std over seeds."""
  header = f'{"method":<28}{"final accuracy":>20}{"uploaded Gbit":>16}{"uploads/round":>15}'
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    accuracy = np.array([r.last_finite('eval/accuracy') for r in runs])
    gbit = np.array([r.last_finite(results.BITS_COLUMN) for r in runs]) / 1e9
    uploads = np.mean([np.nanmean(r.metrics['uplink/model_uploads'][1:]) for r in runs])
    lines.append(
      f'{method:<28}{accuracy.mean():>11.4f} ± {results.seed_spread(accuracy):.3f}'
      f'{gbit.mean():>16.4g}{uploads:>15.2f}'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  start = cf.begin_main(argv)
  with cf.exit_on_bad_input():
    methods = benchmark_methods()
    task = ef.task_from_flags()
    make_sampler, costs = methods.sampler_factory(task)
    availability = ef.availability_spec()
    groups = comparisons.run_comparison(
      task,
      ef.comparison(_SAMPLING.value, _SEEDS.value, availability),
      ef.run_settings(),
      make_process=methods.process_factory(task),
      make_sampler=make_sampler,
      method_hparams=methods.method_hparams,
      availability=availability,
      uplink_fn=benchmark.uplink,
      preprocessing_bits=lambda method, seed: costs.get((method, seed)),
    )
  print(
    f'\n{ef.TASK.value} ({task.num_clients} clients), {availability.label}, '
    f'm = {methods.clients_per_round}, K = {methods.training_cohort}, '
    f'{cf.ROUNDS.value} rounds, {_SEEDS.value} seed(s):'
  )
  print(summary(groups))
  print(f'wall time: {time.monotonic() - start:.1f} s')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  tff_context.use_secure_sum_simulation()
  app.run(tff_context.binary_main(main))
