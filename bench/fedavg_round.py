r"""Benchmark: one FedAvg round through TFF vs the same SGD steps in plain TF.

What it measures: the wall-clock time of one round of example-weighted FedAvg
(McMahan et al., AISTATS 2017) run through TensorFlow Federated's
``tff.learning.algorithms.build_weighted_fed_avg`` (``process.next`` in TFF's
local C++ runtime), against the *same* SGD steps written as a plain TensorFlow
loop in the same process. The ratio TFF / plain TF is the overhead TFF adds
(serialising client datasets, the C++ executor, per-client
``tf.function`` calls, returning the state to Python); the project's target is
at most 1.3x.

The workload: `--clients` clients (default 32) holding `--examples` (default
4,800) synthetic FEMNIST-shaped examples in total (28x28x1 float32 images in
[0, 1], 10 labels), client sizes drawn from a seeded lognormal, or with `--fedavg_leaf_dir`
the first `--clients` writers of a LEAF FEMNIST directory with their own examples (62
labels); `--fedavg_model`: the McMahan CNN (default), the 2NN, an FFNN or logistic regression
(``bench.fedavg_workload.MODELS``); batch 20, one local epoch, client SGD at 0.1,
server SGD at 1.0.

TFF is timed with both client loop implementations of
``build_weighted_fed_avg(loop_implementation=...)``, ``DATASET_REDUCE`` (its
default) and ``DATASET_ITERATOR``, since the choice changes the time markedly.

Checking that both sides do the same work: from the same initial weights, one
round of each is run on a *short* cohort (every client's first
`--agreement_steps` batches, default 4) and the new global weights must agree
to `--agreement_tolerance` (1e-3) relative to the size of the update. A full
round cannot be checked that tightly: early training of this CNN at learning
rate 0.1 is chaotic over the ~20 steps of the largest client, so float32
rounding differences grow to percent level. The full warm-up round's difference
is printed too, next to its noise floor: plain TF against itself started from
weights perturbed by one part in 10^6.

Timing: after the warm-up round, `--timed_rounds` blocks are timed, each running
every implementation once (``bench.stats.interleave``: the order rotates every
block so that none always runs first on a noisy machine). The table shows each
implementation's median and the median of the per-block ratios TFF / plain TF
with its bootstrap 95% interval, and whether the target is met, missed or
unresolved (the interval straddles it).

Usage (from the repository root):

  .venv/bin/python -m bench.fedavg_round --timed_rounds=5
  .venv/bin/python -m bench.fedavg_round --timed_rounds=9 --csv=/tmp/bench.csv
  .venv/bin/python -m bench.fedavg_round --tff_loops=iterator
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import csv
import dataclasses
import datetime
import enum
import math
import os
import pathlib
import statistics
import subprocess

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow_federated as tff

from bench import fedavg_workload
from bench import stats
from tff_sampling.runtime import tff_context

BENCHMARK_NAME = 'fedavg_round'
PLAIN_TF = 'plain_tf'


class TffLoop(enum.Enum):
  """The `tff.learning.LoopImplementation` of TFF's client training loop."""

  REDUCE = 'reduce'
  ITERATOR = 'iterator'

  @property
  def loop_implementation(self) -> tff.learning.LoopImplementation:
    if self is TffLoop.REDUCE:
      return tff.learning.LoopImplementation.DATASET_REDUCE
    return tff.learning.LoopImplementation.DATASET_ITERATOR

  @property
  def label(self) -> str:
    return f'tff_dataset_{self.value}'


_ROUNDS = flags.DEFINE_integer(
  'timed_rounds',
  5,
  'Timed blocks (one round of each implementation) after the warm-up.',
  lower_bound=1,
)
_CLIENTS = flags.DEFINE_integer('clients', 32, 'Clients per round.', lower_bound=1)
_EXAMPLES = flags.DEFINE_integer(
  'examples', 4800, 'Examples over all clients (one local epoch each).', lower_bound=1
)
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 20, 'Client batch size.', lower_bound=1)
_CLIENT_LEARNING_RATE = flags.DEFINE_float('client_lr', 0.1, 'Client SGD learning rate.')
_SERVER_LEARNING_RATE = flags.DEFINE_float('server_lr', 1.0, 'Server SGD learning rate.')
_SEED = flags.DEFINE_integer(
  'workload_seed', 0, 'Seed of the synthetic data and of the initial weights.', lower_bound=0
)
_TFF_LOOPS = flags.DEFINE_list(
  'tff_loops',
  [TffLoop.REDUCE.value, TffLoop.ITERATOR.value],
  'Comma-separated TFF client loop implementation(s) to time: `reduce` '
  '(DATASET_REDUCE, the default of build_weighted_fed_avg) and/or `iterator` '
  '(DATASET_ITERATOR).',
)
flags.register_validator(
  'tff_loops',
  lambda values: bool(values) and all(v in {loop.value for loop in TffLoop} for v in values),
  message=f'--tff_loops takes a non-empty list of {[loop.value for loop in TffLoop]}.',
)
_MODEL = flags.DEFINE_enum(
  'fedavg_model',
  'cnn',
  list(fedavg_workload.MODELS),
  'The model: the McMahan CNN or 2NN, an FFNN (784-128) or logistic regression.',
)
_LEAF_DIR = flags.DEFINE_string(
  'fedavg_leaf_dir',
  '',
  'A LEAF FEMNIST directory (train/, test/ JSON): its first --clients writers, in id order, '
  'with their own examples (--examples is then unused), instead of synthetic data.',
)
_TARGET_RATIO = flags.DEFINE_float(
  'target_ratio', 1.3, 'Target for the median per-round ratio TFF / plain TF.'
)
_TOLERANCE = flags.DEFINE_float(
  'agreement_tolerance',
  1e-3,
  'Largest allowed max|w_tff - w_plain| after the short check round from the same '
  'start, relative to max|update| of that round.',
)
_AGREEMENT_STEPS = flags.DEFINE_integer(
  'agreement_steps',
  4,
  'Batches per client in the agreement check round (longer rounds are chaotic at '
  'learning rate 0.1, see the module docstring).',
  lower_bound=1,
)
_CSV = flags.DEFINE_string(
  'csv',
  None,
  'If set, append (benchmark, metric, value, commit, timestamp) rows to '
  'this CSV file (header written when the file is new).',
)


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
  """The benchmark's workload and measurement settings."""

  rounds: int = 5
  num_clients: int = 32
  total_examples: int = 4800
  batch_size: int = 20
  client_learning_rate: float = 0.1
  server_learning_rate: float = 1.0
  seed: int = 0
  tff_loops: tuple[TffLoop, ...] = (TffLoop.REDUCE, TffLoop.ITERATOR)
  model: str = 'cnn'
  leaf_dir: str = ''  # Real FEMNIST writers from this LEAF directory instead of synthetic data.
  target_ratio: float = 1.3
  agreement_tolerance: float = 1e-3
  agreement_steps: int = 4

  def __post_init__(self):
    for name in ('rounds', 'num_clients', 'batch_size', 'agreement_steps'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be at least 1, got {getattr(self, name)!r}.')
    if self.total_examples < self.num_clients:
      raise ValueError(
        f'total_examples ({self.total_examples}) must be at least num_clients '
        f'({self.num_clients}): every client needs one example.'
      )
    if self.model not in fedavg_workload.MODELS:
      raise ValueError(f'model must be one of {list(fedavg_workload.MODELS)}, got {self.model!r}.')
    if not self.tff_loops or len(set(self.tff_loops)) != len(self.tff_loops):
      raise ValueError(f'tff_loops must be non-empty and distinct, got {self.tff_loops!r}.')
    for name in (
      'client_learning_rate',
      'server_learning_rate',
      'target_ratio',
      'agreement_tolerance',
    ):
      if not getattr(self, name) > 0:
        raise ValueError(f'{name} must be positive, got {getattr(self, name)!r}.')

  @property
  def tag(self) -> str:
    """Benchmark name with the workload, so CSV rows of different sizes never mix."""
    data = 'leaf_femnist' if self.leaf_dir else f'examples={self.total_examples}'
    model = '' if self.model == 'cnn' else f',model={self.model}'
    return f'{BENCHMARK_NAME}/clients={self.num_clients},{data},batch={self.batch_size}{model}'

  @property
  def num_classes(self) -> int:
    return fedavg_workload.FEMNIST_CLASSES if self.leaf_dir else fedavg_workload.NUM_CLASSES

  def client_arrays(self) -> list:
    """The clients' examples: the LEAF directory's first writers, or synthetic."""
    if self.leaf_dir:
      return fedavg_workload.leaf_client_arrays(self.leaf_dir, self.num_clients)
    sizes = fedavg_workload.client_sizes(self.num_clients, self.total_examples, self.seed)
    return fedavg_workload.synthetic_client_arrays(sizes, self.seed)


@dataclasses.dataclass(frozen=True)
class Agreement:
  """How closely two implementations' new global weights agree after one round.

  Attributes:
    max_abs_difference: ``max |w_a - w_b|`` over every weight entry.
    max_abs_update: ``max |w_b - w_start|``, the scale of the round's update.
    relative_difference: ``max_abs_difference / max_abs_update``. Relative to the
      update, not to the weights: the update is small next to the weights, so a
      weight-relative tolerance would pass even if one side did no training.
  """

  max_abs_difference: float
  max_abs_update: float
  relative_difference: float


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
  """Timings and agreement figures of one benchmark run.

  Attributes:
    config: The configuration run.
    seconds: Label -> seconds of each timed round, in run order.
    agreement: TFF label -> TFF vs plain TF after the short check round (the
      pass/fail check).
    full_round_agreement: TFF label -> TFF vs plain TF after the full warm-up
      round (informational; see `full_round_noise_floor`).
    full_round_noise_floor: Plain TF vs plain TF started from weights
      perturbed by one part in 10^6: how far rounding-level differences alone
      carry after a full round.
    client_sizes: Examples per client.
  """

  config: BenchmarkConfig
  seconds: Mapping[str, tuple[float, ...]]
  agreement: Mapping[str, Agreement]
  full_round_agreement: Mapping[str, Agreement]
  full_round_noise_floor: Agreement
  client_sizes: tuple[int, ...]

  def median(self, label: str) -> float:
    return statistics.median(self.seconds[label])

  def ratio(self, label: str) -> stats.Estimate:
    """Median and bootstrap interval of the per-block ratios `label` / plain TF."""
    return stats.ratio_estimate(self.seconds[label], self.seconds[PLAIN_TF])

  def agreement_ok(self, label: str) -> bool:
    return self.agreement[label].relative_difference <= self.config.agreement_tolerance


# --------------------------------------------------------------------------
# Workload.


# --------------------------------------------------------------------------
# The two implementations.


def build_tff_process(
  element_spec, config: BenchmarkConfig, loop: TffLoop
) -> tff.learning.templates.LearningProcess:
  """TFF's weighted FedAvg over the model (example weighting, SGD both sides)."""
  logging.info('Building TFF process (%s)', loop.label)
  return tff.learning.algorithms.build_weighted_fed_avg(
    fedavg_workload.tff_model_fn(element_spec, config.seed, config.model, config.num_classes),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(config.client_learning_rate),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(config.server_learning_rate),
    loop_implementation=loop.loop_implementation,
  )


# --------------------------------------------------------------------------
# Measurement.


def compare_weights(
  start: Sequence[np.ndarray], candidate: Sequence[np.ndarray], reference: Sequence[np.ndarray]
) -> Agreement:
  """Compares `candidate` with `reference`, two results of one round from `start`.

  A non-finite entry in either result makes the difference infinite, so a
  diverged run never passes a tolerance.
  """
  if not (len(start) == len(candidate) == len(reference)):
    raise ValueError(
      f'Weight lists differ in length: {len(start)}, {len(candidate)}, {len(reference)}.'
    )
  differences, updates = [0.0], [0.0]
  for s, c, r in zip(start, candidate, reference):
    s, c, r = (np.asarray(x, np.float64) for x in (s, c, r))
    if not s.shape == c.shape == r.shape:
      raise ValueError(f'Weight shapes differ: {s.shape}, {c.shape}, {r.shape}.')
    if c.size:
      differences.append(float(np.max(np.abs(c - r))))
      updates.append(float(np.max(np.abs(r - s))))
  max_difference, max_update = max(differences), max(updates)
  if not all(np.isfinite(differences + updates)):
    return Agreement(math.inf, max_update, math.inf)
  relative = max_difference / max_update if max_update > 0 else math.inf
  return Agreement(max_difference, max_update, relative)


def _tff_weights(process, state) -> list[np.ndarray]:
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def run_benchmark(
  config: BenchmarkConfig,
  built: Mapping[TffLoop, tff.learning.templates.LearningProcess] | None = None,
) -> BenchmarkResult:
  """Warms up and checks every implementation, then times `config.rounds` rounds each;
  `built` holds processes already built as `build_tff_process` builds them, by loop."""
  arrays = config.client_arrays()
  sizes = np.array([len(a['y']) for a in arrays], np.int64)
  datasets = fedavg_workload.client_datasets(arrays, config.batch_size)
  check_datasets = [d.take(config.agreement_steps) for d in datasets]
  logging.info(
    '%d clients, %d examples, sizes %d..%d, %d SGD steps per round',
    len(sizes),
    sizes.sum(),
    sizes.min(),
    sizes.max(),
    int(np.sum(-(-sizes // config.batch_size))),
  )

  # All TFF processes first: TFF builds its models inside a `tf.Graph`, which
  # invalidates Keras models created earlier in eager mode.
  built = built or {}
  processes = {
    loop.label: built.get(loop) or build_tff_process(datasets[0].element_spec, config, loop)
    for loop in config.tff_loops
  }
  plain = fedavg_workload.PlainFedAvg(
    fedavg_workload.MODELS[config.model](config.num_classes, config.seed),
    client_learning_rate=config.client_learning_rate,
    server_learning_rate=config.server_learning_rate,
  )

  def plain_round(start: Sequence[np.ndarray], cohort) -> list[np.ndarray]:
    plain.set_global_weights(start)
    plain.run_round(cohort)
    return plain.global_weights()

  states, agreement, full_round_agreement = {}, {}, {}
  start = None
  for label, process in processes.items():
    initial_state = process.initialize()
    start = _tff_weights(process, initial_state)
    # The check: a short round of each side from the same start.
    tff_check = _tff_weights(process, process.next(initial_state, check_datasets).state)
    agreement[label] = compare_weights(start, tff_check, plain_round(start, check_datasets))
    # The warm-up: a full round of each side from the same start.
    states[label] = process.next(initial_state, datasets).state
    full_round_agreement[label] = compare_weights(
      start, _tff_weights(process, states[label]), plain_round(start, datasets)
    )
    logging.info(
      '%s vs plain TF: check round %s; full round %s',
      label,
      agreement[label],
      full_round_agreement[label],
    )
  reference = plain_round(start, datasets)
  perturbed = plain_round([w * np.float32(1 + 1e-6) for w in start], datasets)
  noise_floor = compare_weights(start, perturbed, reference)
  logging.info('Plain TF vs itself from a start perturbed by 1e-6: %s', noise_floor)

  def tff_runner(label):
    def run():
      states[label] = processes[label].next(states[label], datasets).state

    return run

  runners = {label: stats.timed(tff_runner(label)) for label in processes}
  runners[PLAIN_TF] = stats.timed(lambda: plain.run_round(datasets))
  # The check and warm-up rounds above ran every side already.
  seconds = stats.interleave(runners, config.rounds, warmup=0)
  return BenchmarkResult(
    config=config,
    seconds={label: tuple(values) for label, values in seconds.items()},
    agreement=agreement,
    full_round_agreement=full_round_agreement,
    full_round_noise_floor=noise_floor,
    client_sizes=tuple(int(s) for s in sizes),
  )


# --------------------------------------------------------------------------
# Reporting.


def _describe(agreement: Agreement) -> str:
  return (
    f'max |diff| {agreement.max_abs_difference:.3g}, max |update| '
    f'{agreement.max_abs_update:.3g}, relative {agreement.relative_difference:.3g}'
  )


def format_table(result: BenchmarkResult) -> str:
  """The timing table, the target verdicts and the agreement figures."""
  config = result.config
  sizes = np.asarray(result.client_sizes)
  lines = [
    f'FedAvg round: {len(sizes)} clients, {sizes.sum()} examples '
    f'(sizes {sizes.min()}..{sizes.max()}{", LEAF FEMNIST" if config.leaf_dir else ""}), '
    f'model {config.model}, batch {config.batch_size}, '
    f'{config.rounds} timed blocks; TFF/plain: median per-block ratio and bootstrap 95% CI',
    f'{"implementation":<24}{"median s":>10}{"min s":>10}{"max s":>10}{"TFF/plain":>11}'
    f'{"95% CI":>22}{"target":>8}  verdict',
  ]
  for label, values in result.seconds.items():
    if label == PLAIN_TF:
      verdict = ''
    else:
      ratio = result.ratio(label)
      verdict = (
        f'{ratio.median:>11.3f}{ratio.interval:>22}'
        f'{"<=" + format(config.target_ratio, "g"):>8}  '
        f'{stats.verdict(ratio, config.target_ratio)}'
      )
    lines.append(
      f'{label:<24}{result.median(label):>10.3f}{min(values):>10.3f}{max(values):>10.3f}{verdict}'
    )
  lines.append('')
  lines.append('Agreement of the new global weights, TFF vs plain TF, from the same start:')
  for label, agreement in result.agreement.items():
    ok = 'OK' if result.agreement_ok(label) else 'FAILED'
    lines.append(
      f'  {label}, check round ({config.agreement_steps} batches per client): '
      f'{_describe(agreement)} <= {config.agreement_tolerance:g}: {ok}'
    )
  for label, agreement in result.full_round_agreement.items():
    lines.append(f'  {label}, full round (informational): {_describe(agreement)}')
  lines.append(
    f'  noise floor, full round, plain TF vs itself from start x (1 + 1e-6): '
    f'{_describe(result.full_round_noise_floor)}'
  )
  return '\n'.join(lines)


def csv_rows(result: BenchmarkResult) -> list[dict[str, str]]:
  """Rows ``benchmark, metric, value, commit, timestamp`` for comparing commits."""
  commit = git_commit()
  timestamp = datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')
  metrics = {f'median_seconds/{label}': result.median(label) for label in result.seconds}
  for label, agreement in result.agreement.items():
    ratio = result.ratio(label)
    metrics[f'ratio/{label}_over_{PLAIN_TF}'] = ratio.median
    metrics[f'ratio_low/{label}_over_{PLAIN_TF}'] = ratio.low
    metrics[f'ratio_high/{label}_over_{PLAIN_TF}'] = ratio.high
    metrics[f'agreement_relative/{label}'] = agreement.relative_difference
    metrics[f'full_round_agreement_relative/{label}'] = result.full_round_agreement[
      label
    ].relative_difference
  metrics['full_round_noise_floor_relative'] = result.full_round_noise_floor.relative_difference
  return [
    dict(
      benchmark=result.config.tag,
      metric=metric,
      value=f'{value:.6g}',
      commit=commit,
      timestamp=timestamp,
    )
    for metric, value in metrics.items()
  ]


CSV_FIELDS = (
  'benchmark',
  'metric',
  'value',
  'commit',
  'timestamp',
  'cpu',
  'logical_cores',
  'load_average',
)


def append_csv(path: str, rows: Sequence[Mapping[str, str]]) -> None:
  """Appends `rows` (missing fields empty) to `path`, writing the header if it is new.

  Raises:
    ValueError: `path` has other columns (e.g. from an older version).
  """
  is_new = not os.path.exists(path) or os.path.getsize(path) == 0
  if not is_new:
    with open(path, newline='') as f:
      header = next(csv.reader(f), [])
    if tuple(header) != CSV_FIELDS:
      raise ValueError(
        f'{path} has the columns {header}, not {list(CSV_FIELDS)}: '
        'move it aside or write to another file.'
      )
  with open(path, 'a', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, restval='')
    if is_new:
      writer.writeheader()
    writer.writerows(rows)


def git_commit() -> str:
  """The repository's HEAD commit (``-dirty`` if the tree has changes), or ``''``."""
  root = pathlib.Path(__file__).resolve().parent.parent
  try:
    head = subprocess.run(
      ['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()
    status = subprocess.run(
      ['git', 'status', '--porcelain'],
      cwd=root,
      capture_output=True,
      text=True,
      timeout=10,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ''
  return f'{head}-dirty' if status else head


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  loops = []
  for value in _TFF_LOOPS.value:
    if TffLoop(value) not in loops:
      loops.append(TffLoop(value))
  try:
    config = BenchmarkConfig(
      rounds=_ROUNDS.value,
      num_clients=_CLIENTS.value,
      total_examples=_EXAMPLES.value,
      batch_size=_BATCH_SIZE.value,
      client_learning_rate=_CLIENT_LEARNING_RATE.value,
      server_learning_rate=_SERVER_LEARNING_RATE.value,
      seed=_SEED.value,
      tff_loops=tuple(loops),
      model=_MODEL.value,
      leaf_dir=_LEAF_DIR.value,
      target_ratio=_TARGET_RATIO.value,
      agreement_tolerance=_TOLERANCE.value,
      agreement_steps=_AGREEMENT_STEPS.value,
    )
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  result = run_benchmark(config)
  print(format_table(result))
  if _CSV.value:
    rows = csv_rows(result)
    append_csv(_CSV.value, rows)
    logging.info('Appended %d rows to %s', len(rows), _CSV.value)
  failed = [label for label in result.agreement if not result.agreement_ok(label)]
  if failed:
    raise SystemExit(
      f'Agreement check failed for {failed}: the implementations do not '
      'compute the same update, so their timings are not comparable.'
    )


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
