r"""The benchmark suite: every benchmark in one run, one table of ratios, one CSV.

    .venv/bin/python -m bench.run                       # the whole suite (~6 min on 2 cores)
    .venv/bin/python -m bench.run --only=fedavg,samplers --csv=/tmp/bench.csv

Each row sets a measurement against a reference measured **in the same run**
(absolute times from separate runs on a shared machine do not compare):

| section | measurement / reference | target |
|---|---|---|
| ``fedavg`` | TFF FedAvg round (``DATASET_ITERATOR``, and TFF's default ``DATASET_REDUCE``) / the same SGD steps as a plain-TF loop (`bench.fedavg_round`) | ≤ 1.2 |
| ``processes`` | our sampling processes' round / TFF FedAvg's round, alternating: FedAvg with per-client signals (`build_fedavg_with_signals`) with and without sketches, and as all runs built it before this suite (sketch + losses); optimal-sampling FedAvg, secure sums (`bench.optimal_sampling_round`) | ≤ 1.05 |
| ``program`` | a ``digits`` round of the program loop (`tff_sampling.program.run_experiment`: selection, the TFF round, evaluation, metrics, checkpoints every 10 rounds) / the bare ``process.next``; checkpointing every round / every 10 | informational |
| ``samplers`` | server-side work / one TFF FedAvg round of the ``fedavg`` workload: exact and approximate probabilities on 10⁶ norms (`bench.probabilities`), clustered Algorithm 2 at N = 3,400 (`bench.clustered`), FedGS's per-round selection at N = 3,400 and its one-time 3DG (`bench.fedgs`), LEFL's one-time KL + k-means and per-round selection at N = 1,000 (`bench.lefl`) | per round < 0.05 |
| ``workers`` | one round split over 2 local TFF workers / one process (`bench.workers`) | informational |
| ``memory`` | peak memory increase of a 1,000-slot ``digits`` round in slices of 100 clients / in one call (`bench.memory`) | informational |

The round a sampler's time is set against is the ``fedavg`` section's TFF
round; without that section, a FedAvg round of the same workload is timed first.

``--csv`` (default ``bench_results.csv``) gets one row per table row and
measurement (``benchmark, metric, value, commit, timestamp``), appended, so
commits can be compared; the commit carries ``-dirty`` for uncommitted changes.
``--quick`` shrinks every workload (the smoke test uses it; its numbers mean
nothing).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bench import clustered as bench_clustered
from bench import fedavg_round
from bench import fedgs as bench_fedgs
from bench import lefl as bench_lefl
from bench import memory as bench_memory
from bench import optimal_sampling_round
from bench import probabilities as bench_probabilities
from bench import workers as bench_workers
import tasks
from tff_sampling import program
from tff_sampling import runtime
from tff_sampling import samplers
from tff_sampling.learning import fedavg
from tff_sampling.learning import signals

SECTIONS = ('fedavg', 'processes', 'program', 'samplers', 'workers', 'memory')

_ONLY = flags.DEFINE_list('only', list(SECTIONS), f'Sections to run, of {list(SECTIONS)}.')
_ROUNDS = flags.DEFINE_integer('suite_rounds', 5, 'Timed rounds per TFF row.', lower_bound=1)
_REPEATS = flags.DEFINE_integer('suite_repeats', 3, 'Repetitions of each sampler timing.',
                                lower_bound=1)
_CSV = flags.DEFINE_string('suite_csv', 'bench_results.csv',
                           'Append the rows to this CSV file ("" for none).')
_QUICK = flags.DEFINE_bool('quick', False, 'Tiny workloads (smoke test only).')

ROUND_TARGET = 1.2
PROCESS_TARGET = 1.05
SAMPLER_SHARE_TARGET = 0.05


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Workload sizes; `Sizes.quick` for the smoke test."""

  clients: int = 32
  examples: int = 4800
  norms: int = 1_000_000
  sampler_clients: int = 3400
  lefl_clients: int = 1000
  memory_cohort: int = 1000
  memory_slice: int = 100

  @classmethod
  def quick(cls) -> 'Sizes':
    return cls(clients=4, examples=120, norms=10_000, sampler_clients=60, lefl_clients=40,
               memory_cohort=12, memory_slice=4)


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of the table: `value` set against `reference`, both measured in this run."""

  section: str
  name: str
  value: float
  reference: float
  unit: str
  target: float | None = None  # The ratio must not exceed it; None: informational.

  @property
  def ratio(self) -> float:
    return self.value / self.reference

  @property
  def met(self) -> str:
    if self.target is None:
      return ''
    return 'yes' if self.ratio <= self.target else 'NO'


def _median_seconds(function: Callable[[], object], repeats: int) -> float:
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    function()
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


def fedavg_rows(sizes: Sizes, rounds: int) -> tuple[list[Row], float]:
  """TFF's FedAvg round against plain TF; also returns TFF's round (seconds)."""
  result = fedavg_round.run_benchmark(fedavg_round.BenchmarkConfig(
      rounds=rounds, num_clients=sizes.clients, total_examples=sizes.examples))
  plain = result.median(fedavg_round.PLAIN_TF)
  rows = []
  for loop in result.config.tff_loops:
    if not result.agreement_ok(loop.label):
      raise RuntimeError(f'{loop.label} and plain TF computed different rounds: '
                         f'{result.agreement[loop.label]}.')
    rows.append(Row('fedavg', f'TFF round ({loop.label}) / plain-TF loop',
                    result.median(loop.label), plain, 's', ROUND_TARGET))
  return rows, result.median(fedavg_round.TffLoop.ITERATOR.label)


# FedAvg with per-client signals, as the binaries build it, by row label.
SIGNAL_VARIANTS = {
    'no sketch (FedGS, LEFL, MD, clustered by size)': dict(sketch_size=None),
    'sketch 1,024 (clustered by similarity)': dict(sketch_size=1024),
    'sketch 1,024 + losses (all runs before this suite)': dict(sketch_size=1024,
                                                               client_losses=True),
}


def signals_process_seconds(sizes: Sizes, rounds: int,
                            variants: Sequence[str] = tuple(SIGNAL_VARIANTS)) -> dict[str, float]:
  """Median round (seconds) of TFF FedAvg (``'plain'``) and of each signals variant.

  The processes run in turn on the ``fedavg`` workload, the order rotating
  each round; round 0 warms up.
  """
  config = fedavg_round.BenchmarkConfig(num_clients=sizes.clients, total_examples=sizes.examples)
  client_sizes = fedavg_round.client_sizes(sizes.clients, sizes.examples, config.seed)
  datasets = fedavg_round.client_datasets(
      fedavg_round.synthetic_client_arrays(client_sizes, config.seed), config.batch_size)
  model_fn = fedavg_round.tff_model_fn(datasets[0].element_spec, config.seed)

  signal_data = signals.selection_client_data(datasets, [float(s) for s in client_sizes])
  runs = {'plain': (fedavg.build_fedavg(model_fn, client_learning_rate=0.1), datasets)}
  for label in variants:
    runs[label] = (signals.build_fedavg_with_signals(
        model_fn, client_learning_rate=0.1, **SIGNAL_VARIANTS[label]), signal_data)
  states = {name: process.initialize() for name, (process, _) in runs.items()}
  seconds = {name: [] for name in runs}
  names = list(runs)
  for round_index in range(rounds + 1):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      process, data = runs[name]
      start = time.perf_counter()
      states[name] = process.next(states[name], data).state
      if round_index:
        seconds[name].append(time.perf_counter() - start)
  return {name: statistics.median(values) for name, values in seconds.items()}


def process_rows(sizes: Sizes, rounds: int) -> list[Row]:
  medians = signals_process_seconds(sizes, rounds)
  rows = [Row('processes', f'FedAvg with signals, {label} / TFF FedAvg', medians[label],
              medians['plain'], 's', PROCESS_TARGET) for label in SIGNAL_VARIANTS]
  times = optimal_sampling_round.run(timed_rounds=rounds, clients=sizes.clients,
                                     examples=sizes.examples, expected_clients=3.0)
  rows.append(Row('processes', 'optimal-sampling FedAvg, secure sums / TFF FedAvg',
                  statistics.median(times['optimal']), statistics.median(times['plain']), 's',
                  PROCESS_TARGET))
  return rows


def program_round_seconds(rounds: int, checkpoint_every: int) -> float:
  """Seconds per round of `run_experiment` on ``digits`` (10 clients per round, eval every round)."""
  task = tasks.get_task('digits')
  process = fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1)
  with tempfile.TemporaryDirectory(prefix='bench_program_') as directory:
    result = program.run_experiment(
        task, process, samplers.UniformSampler(10, seed=0),
        program.ProgramConfig(output_dir=os.path.join(directory, 'run'), rounds=rounds,
                              checkpoint_every=checkpoint_every, hparams={'bench': 1}))
  return result.seconds / rounds


def bare_round_seconds(rounds: int) -> float:
  """Median seconds of ``process.next`` alone on 10 ``digits`` clients."""
  task = tasks.get_task('digits')
  process = fedavg.build_fedavg(task.model_fn, client_learning_rate=0.1)
  state = process.initialize()
  data = [task.client_dataset(c, 0) for c in range(10)]
  state = process.next(state, data).state  # Warm-up.
  return _median_seconds(lambda: process.next(state, data), rounds)


def program_rows(rounds: int, repeats: int) -> list[Row]:
  """The program loop's per-round work beyond the TFF round, on ``digits``."""
  seconds = {'bare': [], 1: [], 10: []}
  for _ in range(repeats):  # Alternating.
    seconds['bare'].append(bare_round_seconds(rounds))
    for every in (1, 10):
      seconds[every].append(program_round_seconds(rounds, every))
  bare, every_10, every_1 = (statistics.median(seconds[k]) for k in ('bare', 10, 1))
  return [Row('program', 'digits: loop round (eval each round, checkpoint every 10) / '
              'process.next', every_10, bare, 's'),
          Row('program', 'digits: loop round, checkpoint every round / every 10', every_1,
              every_10, 's')]


def fedavg_round_seconds(sizes: Sizes, rounds: int) -> float:
  """A TFF FedAvg round of the ``fedavg`` workload alone (when that section is skipped)."""
  return signals_process_seconds(sizes, rounds, variants=())['plain']


def sampler_rows(sizes: Sizes, repeats: int, round_seconds: float) -> list[Row]:
  """Server-side work as a share of one FedAvg round."""
  rows = []
  norms = bench_probabilities.lognormal_norms(sizes.norms, sigma=1.0, seed=0)
  for row in bench_probabilities.run_benchmark(norms, expected_clients=100.0,
                                               rescaling_steps=4, repetitions=repeats):
    if row.label in ('exact_numpy', 'approximate_numpy_4_steps'):
      rows.append(Row('samplers', f'probabilities, {sizes.norms:,} norms, {row.label} / round',
                      row.median, round_seconds, 's', SAMPLER_SHARE_TARGET))
  n = sizes.sampler_clients
  timing = bench_clustered.time_algorithm2(
      n, sketch_size=1024, num_draws=10, similarity='arccos', repetitions=repeats,
      directions=5, noise=1.0, zero_fraction=0.1, size_sigma=1.0, seed=0)
  rows.append(Row('samplers', f'clustered Algorithm 2, N={n:,} / round',
                  statistics.median(timing.total_seconds), round_seconds, 's',
                  SAMPLER_SHARE_TARGET))
  features = bench_fedgs.label_features(n, 10, 0.5, seed=0)
  graph, distances = bench_fedgs.time_graph(features, epsilon=0.1, sigma2=0.01, repeats=1)
  rows.append(Row('samplers', f'FedGS 3DG (once per run), N={n:,} / round',
                  statistics.median(graph.distance_seconds) + statistics.median(
                      graph.similarity_seconds), round_seconds, 's'))
  counts = np.random.default_rng([0, 2, n]).integers(0, 10, n)
  selection = bench_fedgs.time_selection(distances, counts, budget=10, alpha=1.0, time_limit=1.0,
                                         max_solver_clients=150, repeats=repeats)
  rows.append(Row('samplers', f'FedGS selection (heuristic), N={n:,} / round',
                  statistics.median(selection.heuristic_seconds), round_seconds, 's',
                  SAMPLER_SHARE_TARGET))
  (lefl,) = bench_lefl.run([sizes.lefl_clients], repeats=repeats, seed=0)
  rows.append(Row('samplers', f'LEFL KL + k-means (once per run), N={sizes.lefl_clients:,} / round',
                  lefl.setup_seconds, round_seconds, 's'))
  rows.append(Row('samplers', f'LEFL selection, N={sizes.lefl_clients:,} / round',
                  lefl.select_seconds, round_seconds, 's', SAMPLER_SHARE_TARGET))
  return rows


def worker_rows(sizes: Sizes, rounds: int) -> list[Row]:
  result = bench_workers.run(sizes.clients, sizes.examples, rounds, worker_counts=(2,))
  return [Row('workers', 'round over 2 local TFF workers / one process',
              result.median('workers=2'), result.median(bench_workers.ONE_PROCESS), 's'),
          Row('workers', 'CPU cores busy, 2 workers / one process',
              result.cores_busy['workers=2'], result.cores_busy[bench_workers.ONE_PROCESS],
              'cores')]


def memory_rows(sizes: Sizes) -> list[Row]:
  one_call, sliced = bench_memory.run(sizes.memory_cohort, min(700, sizes.memory_cohort),
                                      clients_per_call=(sizes.memory_slice,))
  return [Row('memory', f'peak increase, {sizes.memory_cohort:,}-slot digits round in slices '
              f'of {sizes.memory_slice} / one call', sliced.increase_mb, one_call.increase_mb,
              'MB')]


def format_table(rows: Sequence[Row]) -> str:
  name_width = max(len(r.name) for r in rows)
  lines = [f'{"section":<10} {"measurement / reference":<{name_width}} {"value":>10} '
           f'{"reference":>10} {"unit":>5} {"ratio":>8} {"target":>7} {"met":>4}']
  for r in rows:
    target = '' if r.target is None else f'<={r.target:g}'
    lines.append(f'{r.section:<10} {r.name:<{name_width}} {r.value:>10.4g} {r.reference:>10.4g} '
                 f'{r.unit:>5} {r.ratio:>8.3f} {target:>7} {r.met:>4}')
  return '\n'.join(lines)


def csv_rows(rows: Sequence[Row]) -> list[dict[str, str]]:
  commit = fedavg_round.git_commit()
  stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
  out = []
  for r in rows:
    for metric, value in (('value', r.value), ('reference', r.reference), ('ratio', r.ratio)):
      out.append(dict(benchmark=f'{r.section}/{r.name}', metric=metric, value=f'{value:.6g}',
                      commit=commit, timestamp=stamp))
  return out


def run_suite(sections: Sequence[str], sizes: Sizes, rounds: int, repeats: int) -> list[Row]:
  """Runs the sections in a fixed order (secure sums last: they change TFF's context)."""
  unknown = set(sections) - set(SECTIONS)
  if unknown or not sections:
    raise ValueError(f'Unknown or no sections {sorted(unknown)}; choose from {list(SECTIONS)}.')
  rows: list[Row] = []
  round_seconds = None
  if 'fedavg' in sections:
    fedavg_table, round_seconds = fedavg_rows(sizes, rounds)
    rows += fedavg_table
  if 'workers' in sections:
    rows += worker_rows(sizes, rounds)
  if 'memory' in sections:
    rows += memory_rows(sizes)
  if 'program' in sections:
    rows += program_rows(max(rounds, 2) * 4, repeats)
  if 'samplers' in sections:
    if round_seconds is None:
      round_seconds = fedavg_round_seconds(sizes, rounds)
    rows += sampler_rows(sizes, repeats, round_seconds)
  if 'processes' in sections:
    runtime.use_secure_sum_simulation()
    rows += process_rows(sizes, rounds)
  return rows


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  runtime.quiet_library_logs()
  sizes = Sizes.quick() if _QUICK.value else Sizes()
  start = time.monotonic()
  try:
    rows = run_suite(_ONLY.value, sizes, _ROUNDS.value, _REPEATS.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print(format_table(rows))
  logging.info('Suite finished in %.0f s.', time.monotonic() - start)
  if _CSV.value:
    fedavg_round.append_csv(_CSV.value, csv_rows(rows))
    print(f'Appended {len(rows)} rows to {_CSV.value}.')


if __name__ == '__main__':
  app.run(main)
