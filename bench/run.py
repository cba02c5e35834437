r"""The benchmark suite: every benchmark in one run, one table of ratios, one CSV.

    .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --only=fedavg,samplers --suite_pairs=30 --suite_csv=/tmp/b.csv

Each row sets a measurement against a reference measured **in the same run**
(absolute times from separate runs on a shared machine do not compare):

| section | measurement / reference | target |
|---|---|---|
| ``fedavg`` | TFF FedAvg round (``DATASET_ITERATOR``, and TFF's default ``DATASET_REDUCE``) / the same SGD steps as a plain-TF loop (`bench.fedavg_round`) | ≤ 1.2 |
| ``natural`` | with ``--suite_leaf_dir``: a small model's (2NN, FFNN, logistic regression) FedAvg round over a LEAF FEMNIST folder's writers, clients read in TFF's worker as the program reads them, and fed from Python as before / the same SGD steps as a plain-TF loop (`bench.natural_round`) | ≤ 1.3 (worker) |
| ``processes`` | power-of-choice's loss probe (`build_loss_probe`: each client's mean loss under the global model, forward passes only) / TFF FedAvg's round on the same clients (≤ 0.4); our sampling processes' round / TFF FedAvg's round: FedAvg with per-client signals (`build_fed_avg_with_signals`) with and without sketches, and as all runs built it before this suite (sketch + losses); optimal-sampling FedAvg, secure sums (`bench.optimal_sampling_round`) | ≤ 1.05 |
| ``program`` | a ``digits`` round of the program loop as the benchmark grid runs it (`tff_sampling.program.train_model`: FedAvg with signals, MD sampling under LDF availability, the TFF round, evaluation every 5 rounds, metrics, a checkpoint every 20) / the bare ``process.next`` on the same cohort size; checkpointing every round / every 20 (informational) | ≤ 1.1 |
| ``samplers`` | server-side work / one TFF FedAvg round of the ``fedavg`` workload: exact and approximate probabilities on 10⁶ norms (`bench.probabilities`), clustered Algorithm 2 at N = 3,400 (`bench.clustered`), FedGS's per-round selection at N = 3,400 and its one-time 3DG (`bench.fedgs`), LEFL's one-time KL + k-means and per-round selection at N = 1,000 (`bench.lefl`) | per round < 0.05 |
| ``workers`` | one round split over 2 local TFF workers / one process (`bench.workers`) | informational |
| ``memory`` | peak memory increase of a 1,000-slot ``digits`` round in slices of 100 clients / in one call (`bench.memory`) | informational |

Method (`bench.stats`): after a warm-up block, each row's two sides run
interleaved in blocks, each side once per block, the order rotating from block
to block (``A B``, ``B A``, ...; rows that share a reference run in one block,
e.g. every sampler with one FedAvg round). Each block gives one per-pair ratio;
the table shows their median and a 95% percentile-bootstrap interval (10,000
resamples over the pairs, seed 0). A target is **met** when the interval lies
entirely within it, **missed** when entirely outside, and **unresolved** when it
straddles it (more pairs or a quieter machine may decide it). ``--suite_pairs``
(default 20) blocks time the rounds and the cheap sampler work;
``--suite_expensive_pairs`` (default 5) the program loop, the memory rows and
FedGS's 3DG. The run time grows linearly with both.

The table's header records the machine (CPU model, logical cores, load average
at the start); ``--suite_csv`` (default ``bench_results.csv``) gets one row per
table row and metric (value, reference: the medians of each side; ratio,
ratio_low, ratio_high, pairs), with the commit (``-dirty`` for uncommitted
changes), the time and the machine, appended, so commits can be compared.
``--quick`` shrinks every workload (the smoke test uses it; its numbers mean
nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import datetime
import functools
import os
import platform
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bench import clustered as bench_clustered
from bench import fedavg_round
from bench import fedavg_workload
from bench import fedgs as bench_fedgs
from bench import lefl as bench_lefl
from bench import memory as bench_memory
from bench import natural_round
from bench import optimal_sampling_round
from bench import probabilities as bench_probabilities
from bench import program_round
from bench import stats
from bench import workers as bench_workers
from tff_sampling import probabilities
from tff_sampling.learning import signals
from tff_sampling.runtime import tff_context
from tff_sampling.samplers import base
from tff_sampling.samplers import clustered_similarity
from tff_sampling.samplers import fedgs_problem
from tff_sampling.samplers import fedgs_solvers
from tff_sampling.samplers import lefl

SECTIONS = ('fedavg', 'natural', 'processes', 'program', 'samplers', 'workers', 'memory')

_ONLY = flags.DEFINE_list('only', list(SECTIONS), f'Sections to run, of {list(SECTIONS)}.')
_PAIRS = flags.DEFINE_integer(
  'suite_pairs', 20, 'Timed blocks (pairs) of the round and sampler rows.', lower_bound=2
)
_EXPENSIVE_PAIRS = flags.DEFINE_integer(
  'suite_expensive_pairs',
  5,
  'Blocks (pairs) of the program, memory and FedGS 3DG rows.',
  lower_bound=2,
)
_CSV = flags.DEFINE_string(
  'suite_csv', 'bench_results.csv', 'Append the rows to this CSV file ("" for none).'
)
_QUICK = flags.DEFINE_bool('quick', False, 'Tiny workloads (smoke test only).')
_LEAF_DIR = flags.DEFINE_string(
  'suite_leaf_dir',
  None,
  'A LEAF FEMNIST folder: the natural section times small models on its writers '
  '(without it the section is left out, and says so).',
)

ROUND_TARGET = 1.2
PROCESS_TARGET = 1.05
LOOP_TARGET = 1.1  # The loop's round as the benchmark grid runs it / the bare round.
SMALL_MODEL_TARGET = 1.3  # A small model's round on real writers / plain TF.
PROBE_TARGET = 0.4  # The loss probe's forward passes / the training round, same clients.
SAMPLER_SHARE_TARGET = 0.05
_ROUND = 'FedAvg round'


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
  program_rounds: int = 20
  natural_models: tuple[str, ...] = natural_round.SMALL_MODELS

  @classmethod
  def quick(cls) -> Sizes:
    return cls(
      clients=4,
      examples=120,
      norms=10_000,
      sampler_clients=60,
      lefl_clients=40,
      memory_cohort=12,
      memory_slice=4,
      program_rounds=2,
      natural_models=('logreg',),
    )


@dataclasses.dataclass(frozen=True)
class Row:
  """One line of the table: ``values[i]`` set against ``references[i]``, measured in block i."""

  section: str
  name: str
  values: Sequence[float]
  references: Sequence[float]
  unit: str
  target: float | None = None  # The ratio must not exceed it; None: informational.

  @property
  def value(self) -> float:
    return float(np.median(self.values))

  @property
  def reference(self) -> float:
    return float(np.median(self.references))

  @functools.cached_property
  def ratio(self) -> stats.Estimate:
    return stats.ratio_estimate(self.values, self.references)

  @property
  def verdict(self) -> str:
    return '' if self.target is None else stats.verdict(self.ratio, self.target)


@dataclasses.dataclass(frozen=True)
class Machine:
  """Where the suite ran: CPU model, logical cores and the load average at the start."""

  cpu: str
  logical_cores: int
  load_average: tuple[float, float, float]

  @classmethod
  def describe(cls) -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
      with open('/proc/cpuinfo') as f:
        cpu = next(
          (line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), cpu
        )
    except OSError:
      pass
    return cls(cpu, os.cpu_count() or 0, tuple(os.getloadavg()))

  @property
  def load(self) -> str:
    return ' '.join(f'{x:.2f}' for x in self.load_average)

  def csv_fields(self) -> dict[str, str]:
    return dict(cpu=self.cpu, logical_cores=str(self.logical_cores), load_average=self.load)


def _workload(sizes: Sizes) -> fedavg_workload.Workload:
  """The ``fedavg`` section's workload at `sizes`, shared by every section that runs it."""
  config = fedavg_round.BenchmarkConfig(num_clients=sizes.clients, total_examples=sizes.examples)
  return fedavg_workload.Workload(sizes.clients, sizes.examples, config.seed, config.batch_size)


def _round(process, data) -> Callable[[], float]:
  """A measure: seconds of one ``process.next``, the state carried from call to call."""
  state = process.initialize()

  def run() -> None:
    nonlocal state
    state = process.next(state, data).state

  return stats.timed(run)


def fedavg_rows(sizes: Sizes, pairs: int, workload: fedavg_workload.Workload) -> list[Row]:
  """TFF's FedAvg round against plain TF."""
  result = fedavg_round.run_benchmark(
    fedavg_round.BenchmarkConfig(
      rounds=pairs, num_clients=sizes.clients, total_examples=sizes.examples
    ),
    built={fedavg_round.TffLoop.ITERATOR: workload.process},
  )
  rows = []
  for loop in result.config.tff_loops:
    if not result.agreement_ok(loop.label):
      raise RuntimeError(
        f'{loop.label} and plain TF computed different rounds: {result.agreement[loop.label]}.'
      )
    rows.append(
      Row(
        'fedavg',
        f'TFF round ({loop.label}) / plain-TF loop',
        result.seconds[loop.label],
        result.seconds[fedavg_round.PLAIN_TF],
        's',
        ROUND_TARGET,
      )
    )
  return rows


# FedAvg with per-client signals, as the binaries build it, by row label.
SIGNAL_VARIANTS = {
  'no sketch (FedGS, LEFL, MD, clustered by size)': dict(sketch_size=None),
  'sketch 1,024 (clustered by similarity)': dict(sketch_size=1024),
  'sketch 1,024 + losses (all runs before this suite)': dict(sketch_size=1024, client_losses=True),
}


def process_rows(sizes: Sizes, pairs: int, workload: fedavg_workload.Workload) -> list[Row]:
  """Our processes' rounds against TFF FedAvg's, on the ``fedavg`` workload."""
  client_sizes, datasets, model_fn = workload.client_sizes, workload.datasets, workload.model_fn
  signal_data = signals.selection_client_data(datasets, [float(s) for s in client_sizes])
  plain = workload.process
  measures = {'plain': _round(plain, datasets)}
  for label, kwargs in SIGNAL_VARIANTS.items():
    measures[label] = _round(
      signals.build_fed_avg_with_signals(model_fn, client_learning_rate=0.1, **kwargs), signal_data
    )
  probe = signals.build_loss_probe(
    model_fn, plain.get_model_weights.type_signature.result, datasets[0].element_spec
  )
  weights = plain.get_model_weights(plain.initialize())
  measures['probe'] = stats.timed(lambda: probe(weights, signal_data))
  seconds = stats.interleave(measures, pairs)
  rows = [
    Row(
      'processes',
      "power-of-choice's loss probe of the cohort / TFF FedAvg round of the cohort",
      seconds['probe'],
      seconds['plain'],
      's',
      PROBE_TARGET,
    )
  ]
  rows += [
    Row(
      'processes',
      f'FedAvg with signals, {label} / TFF FedAvg',
      seconds[label],
      seconds['plain'],
      's',
      PROCESS_TARGET,
    )
    for label in SIGNAL_VARIANTS
  ]
  times = optimal_sampling_round.run(
    timed_rounds=pairs,
    clients=sizes.clients,
    examples=sizes.examples,
    expected_clients=3.0,
    plain=plain,
  )
  rows.append(
    Row(
      'processes',
      'optimal-sampling FedAvg, secure sums / TFF FedAvg',
      times['optimal'],
      times['plain'],
      's',
      PROCESS_TARGET,
    )
  )
  return rows


def program_rows(rounds: int, pairs: int) -> list[Row]:
  """The loop's round as the benchmark grid runs it against the bare TFF round
  (`bench.program_round`)."""
  seconds = stats.interleave(program_round.measures(rounds), pairs)
  return [
    Row(
      'program',
      'digits: grid round (signals, MD, LDF, eval every 5, checkpoint every 20) / process.next',
      seconds['every 20'],
      seconds['bare'],
      's',
      LOOP_TARGET,
    ),
    Row(
      'program',
      'digits: grid round, clients sent from Python (as before the feed) / process.next',
      seconds['python'],
      seconds['bare'],
      's',
    ),
    Row(
      'program',
      'digits: grid round, checkpoint every round / every 20',
      seconds['every 1'],
      seconds['every 20'],
      's',
    ),
  ]


def _fedgs_graph_row(
  num_clients: int, fedavg_round_seconds: Callable[[], float], expensive_pairs: int
) -> tuple[Row, np.ndarray]:
  """FedGS's one-time 3DG against one round, and the 3DG (the selection row's input)."""
  features = bench_fedgs.label_features(num_clients, 10, 0.5, seed=0)
  graph = {}

  def build_graph() -> None:
    graph['distances'] = fedgs_problem.graph_distances(
      fedgs_problem.similarity_from_features(features), epsilon=0.1, sigma2=0.01
    )

  seconds = stats.interleave(
    {_ROUND: fedavg_round_seconds, '3DG': stats.timed(build_graph)}, expensive_pairs, warmup=0
  )
  name = f'FedGS 3DG (once per run), N={num_clients:,} / round'
  return Row('samplers', name, seconds['3DG'], seconds[_ROUND], 's'), graph['distances']


def _sampler_work(sizes: Sizes, distances: np.ndarray) -> dict[str, tuple[Callable, float | None]]:
  """The per-round (and LEFL's one-time) server work: row name -> (the work, its target)."""
  n = sizes.sampler_clients
  norms = bench_probabilities.lognormal_norms(sizes.norms, sigma=1.0, seed=0)
  cluster_sizes = bench_clustered.client_sizes(n, 1.0, 0)
  updates, _ = bench_clustered.mixture_updates(n, 1024, 5, 1.0, 0.1, 0)
  counts = np.random.default_rng([0, 2, n]).integers(0, 10, n)
  available = np.ones(n, bool)
  m = sizes.lefl_clients
  soft_labels = bench_lefl.soft_labels(m, public_examples=200, labels=10, concentration=0.5, seed=0)
  lefl_sampler = lefl.LeflSampler(min(10, m), seed=0, kl=lefl.kl_matrix(soft_labels))
  lefl_state = lefl_sampler.initialize(base.Population(bench_lefl.client_sizes(m, 0)))
  lefl_available = np.ones(m, bool)
  return {
    f'probabilities, {sizes.norms:,} norms, exact_numpy': (
      lambda: probabilities.optimal_probabilities(norms, 100.0),
      SAMPLER_SHARE_TARGET,
    ),
    f'probabilities, {sizes.norms:,} norms, approximate_numpy_4_steps': (
      lambda: probabilities.approximate_optimal_probabilities_with_info(norms, 100.0, 4),
      SAMPLER_SHARE_TARGET,
    ),
    f'clustered Algorithm 2, N={n:,}': (
      lambda: clustered_similarity.similarity_based_units(
        cluster_sizes, updates, 10, similarity='arccos'
      ),
      SAMPLER_SHARE_TARGET,
    ),
    f'FedGS selection (heuristic), N={n:,}': (
      lambda: fedgs_solvers.select_clients_with_report(
        distances,
        counts,
        available,
        10,
        alpha=1.0,
        time_limit_s=1.0,
        seed=0,
        method='heuristic',
        max_solver_clients=150,
      ),
      SAMPLER_SHARE_TARGET,
    ),
    f'LEFL KL + k-means (once per run), N={m:,}': (
      lambda: lefl.cluster_clients(lefl.kl_matrix(soft_labels), seed=0),
      None,
    ),
    f'LEFL selection, N={m:,}': (
      lambda: lefl_sampler.select(lefl_state, 1, lefl_available),
      SAMPLER_SHARE_TARGET,
    ),
  }


def sampler_rows(
  sizes: Sizes, pairs: int, expensive_pairs: int, workload: fedavg_workload.Workload
) -> list[Row]:
  """Server-side work against one FedAvg round, interleaved with it."""
  fedavg_round_seconds = _round(workload.process, workload.datasets)
  fedavg_round_seconds()  # Warm-up: the 3DG's blocks have none (it needs no warming).
  graph_row, distances = _fedgs_graph_row(
    sizes.sampler_clients, fedavg_round_seconds, expensive_pairs
  )
  work = _sampler_work(sizes, distances)
  seconds = stats.interleave(
    {_ROUND: fedavg_round_seconds, **{name: stats.timed(w) for name, (w, _) in work.items()}}, pairs
  )
  return [
    Row('samplers', f'{name} / round', seconds[name], seconds[_ROUND], 's', target)
    for name, (_, target) in work.items()
  ] + [graph_row]


def worker_rows(sizes: Sizes, pairs: int, workload: fedavg_workload.Workload) -> list[Row]:
  result = bench_workers.run(
    sizes.clients, sizes.examples, pairs, worker_counts=(2,), process=workload.process
  )
  one = bench_workers.ONE_PROCESS
  return [
    Row(
      'workers',
      'round over 2 local TFF workers / one process',
      result.seconds['workers=2'],
      result.seconds[one],
      's',
    ),
    Row(
      'workers',
      'CPU cores busy, 2 workers / one process',
      result.cores_busy('workers=2'),
      result.cores_busy(one),
      'cores',
    ),
  ]


def memory_rows(sizes: Sizes, pairs: int) -> list[Row]:
  calls = bench_memory.measures(
    sizes.memory_cohort, min(700, sizes.memory_cohort), clients_per_call=(sizes.memory_slice,)
  )
  # Each call starts a fresh worker and warms it up itself.
  increase = stats.interleave(
    {label: (lambda c: lambda: c().increase_mb)(call) for label, call in calls.items()},
    pairs,
    warmup=0,
  )
  return [
    Row(
      'memory',
      f'peak increase, {sizes.memory_cohort:,}-slot digits round in slices '
      f'of {sizes.memory_slice} / one call',
      increase[f'slices_of_{sizes.memory_slice}'],
      increase['one_call'],
      'MB',
    )
  ]


def format_table(rows: Sequence[Row], machine: Machine) -> str:
  name_width = max(len(r.name) for r in rows)
  lines = [
    f'machine: {machine.cpu}, {machine.logical_cores} logical cores, load average '
    f'{machine.load} (1, 5, 15 min) at the start',
    f'value, reference: medians; ratio: median of per-pair ratios, {stats.CONFIDENCE:.0%} '
    f'CI by percentile bootstrap over the pairs ({stats.RESAMPLES:,} resamples)',
    f'{"section":<10} {"measurement / reference":<{name_width}} {"value":>10} '
    f'{"reference":>10} {"unit":>5} {"ratio":>9} {"95% CI":>22} {"pairs":>5} '
    f'{"target":>7} verdict',
  ]
  for r in rows:
    target = '' if r.target is None else f'<={r.target:g}'
    lines.append(
      f'{r.section:<10} {r.name:<{name_width}} {r.value:>10.4g} {r.reference:>10.4g} '
      f'{r.unit:>5} {r.ratio.median:>9.4g} {r.ratio.interval:>22} '
      f'{r.ratio.pairs:>5} {target:>7} {r.verdict}'.rstrip()
    )
  return '\n'.join(lines)


def csv_rows(rows: Sequence[Row], machine: Machine) -> list[dict[str, str]]:
  commit = fedavg_round.git_commit()
  stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')
  out = []
  for r in rows:
    for metric, value in (
      ('value', r.value),
      ('reference', r.reference),
      ('ratio', r.ratio.median),
      ('ratio_low', r.ratio.low),
      ('ratio_high', r.ratio.high),
      ('pairs', r.ratio.pairs),
    ):
      out.append(
        dict(
          benchmark=f'{r.section}/{r.name}',
          metric=metric,
          value=f'{value:.6g}',
          commit=commit,
          timestamp=stamp,
          **machine.csv_fields(),
        )
      )
  return out


def natural_rows(leaf_dir: str, models: Sequence[str], pairs: int) -> list[Row]:
  """Small models' FedAvg rounds on a LEAF folder's writers (`bench.natural_round`): the
  program's round, clients read in TFF's worker, and the round fed from Python, each
  against the same SGD steps in plain TF."""
  seconds = natural_round.run(leaf_dir, models, pairs)
  rows = []
  for model, sides in seconds.items():
    for side, how, target in (
      ('fed', 'clients read in the worker', SMALL_MODEL_TARGET),
      ('python', 'datasets from Python', None),
    ):
      rows.append(
        Row(
          'natural',
          f'FEMNIST writers, {model}: TFF round, {how} / plain-TF loop',
          sides[side],
          sides['plain_tf'],
          's',
          target,
        )
      )
  return rows


def run_suite(
  sections: Sequence[str],
  sizes: Sizes,
  pairs: int,
  expensive_pairs: int,
  leaf_dir: str | None = None,
) -> list[Row]:
  """Runs the sections in a fixed order (secure sums last: they change TFF's context);
  ``natural`` only with `leaf_dir`."""
  unknown = set(sections) - set(SECTIONS)
  if unknown or not sections:
    raise ValueError(f'Unknown or no sections {sorted(unknown)}; choose from {list(SECTIONS)}.')
  rows: list[Row] = []
  workload = _workload(sizes)  # Its process is built by the first section to run it.
  if 'fedavg' in sections:
    rows += fedavg_rows(sizes, pairs, workload)
  if 'natural' in sections:
    if leaf_dir:
      rows += natural_rows(leaf_dir, sizes.natural_models, pairs)
    else:
      logging.info('The natural section needs --suite_leaf_dir (a LEAF FEMNIST folder): left out.')
  if 'workers' in sections:
    rows += worker_rows(sizes, pairs, workload)
  if 'memory' in sections:
    rows += memory_rows(sizes, expensive_pairs)
  if 'program' in sections:
    rows += program_rows(sizes.program_rounds, expensive_pairs)
  if 'samplers' in sections:
    rows += sampler_rows(sizes, pairs, expensive_pairs, workload)
  if 'processes' in sections:
    tff_context.use_secure_sum_simulation()
    rows += process_rows(sizes, pairs, workload)
  return rows


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  tff_context.quiet_library_logs()
  tff_context.plain_log_lines()
  machine = Machine.describe()
  sizes = Sizes.quick() if _QUICK.value else Sizes()
  start = time.monotonic()
  try:
    if _CSV.value:
      fedavg_round.append_csv(_CSV.value, [])  # Checks the file's columns before the run.
    rows = run_suite(_ONLY.value, sizes, _PAIRS.value, _EXPENSIVE_PAIRS.value, _LEAF_DIR.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print(format_table(rows, machine))
  logging.info('Suite finished in %.0f s.', time.monotonic() - start)
  if _CSV.value:
    fedavg_round.append_csv(_CSV.value, csv_rows(rows, machine))
    print(f'Appended {len(rows)} rows to {_CSV.value}.')


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
