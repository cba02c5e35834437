r"""Benchmark: one FedAvg round in one TFF process vs split over several TFF workers.

    .venv/bin/python -m bench.workers --wk_timed_rounds=5
    .venv/bin/python -m bench.workers --wk_worker_counts=1,2,4 --wk_clients=64

The workload of `bench.fedavg_round` (FEMNIST-shaped synthetic clients, McMahan
CNN, batch 20, TFF FedAvg with the ``DATASET_ITERATOR`` loop). Rows:

* ``one_process``: TFF's default context (one local ``worker_binary``).
* ``workers=k``: `tff_sampling.runtime.workers.WorkerPool.start_local(k)`: the round
  compiled to TFF's mergeable form, the cohort cut into ``k`` slices run by ``k``
  local workers in parallel, partial aggregates merged.

They alternate round by round in one process (``bench.stats.interleave``: the
order rotates); speed-ups are medians of per-round ratios. Before
timing, each pool's round from the common start is compared with the
one-process round: the largest weight difference relative to the update's
largest entry must be below 1e-4 (float summation order only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import psutil
import tensorflow_federated as tff

from bench import fedavg_round
from bench import fedavg_workload
from bench import stats
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers as workers_lib

_TIMED_ROUNDS = flags.DEFINE_integer('wk_timed_rounds', 5, 'Timed rounds per row.', lower_bound=1)
_CLIENTS = flags.DEFINE_integer('wk_clients', 32, 'Clients per round.', lower_bound=1)
_EXAMPLES = flags.DEFINE_integer('wk_examples', 4800, 'Examples over all clients.', lower_bound=1)
_WORKER_COUNTS = flags.DEFINE_list('wk_worker_counts', ['1', '2'], 'Pool sizes to time.')

ONE_PROCESS = 'one_process'
TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class WorkersResult:
  """Seconds and CPU seconds per round of each row, and each pool's agreement with one process."""

  num_clients: int
  total_examples: int
  seconds: dict[str, np.ndarray]
  cpu_seconds: dict[str, np.ndarray]  # This process and its workers.
  agreement: dict[str, float]

  def median(self, label: str) -> float:
    return float(np.median(self.seconds[label]))

  def speedup(self, label: str) -> float:
    """Median per-round ratio one process / this row (> 1: faster)."""
    return stats.ratio_estimate(self.seconds[ONE_PROCESS], self.seconds[label]).median

  def cores_busy(self, label: str) -> np.ndarray:
    """CPU seconds per wall second, per round."""
    return self.cpu_seconds[label] / self.seconds[label]


def run(
  num_clients: int = 32,
  total_examples: int = 4800,
  timed_rounds: int = 5,
  worker_counts: Sequence[int] = (1, 2),
  process: tff.learning.templates.LearningProcess | None = None,
) -> WorkersResult:
  """Builds the workload, checks each pool against one process, then times them alternately.

  `process`: the workload's process as `fedavg_round.build_tff_process` builds it with
  ``DATASET_ITERATOR``, if the caller has it already (built here otherwise).
  """
  config = fedavg_round.BenchmarkConfig(num_clients=num_clients, total_examples=total_examples)
  sizes = fedavg_workload.client_sizes(num_clients, total_examples, config.seed)
  datasets = fedavg_workload.client_datasets(
    fedavg_workload.synthetic_client_arrays(sizes, config.seed), config.batch_size
  )
  if process is None:
    process = fedavg_round.build_tff_process(
      datasets[0].element_spec, config, fedavg_round.TffLoop.ITERATOR
    )
  initial = process.initialize()
  start = fedavg_round._tff_weights(process, initial)  # pylint: disable=protected-access
  reference = fedavg_round._tff_weights(process, process.next(initial, datasets).state)  # pylint: disable=protected-access
  pools = {f'workers={k}': workers_lib.WorkerPool.start_local(k) for k in worker_counts}
  try:
    agreement = {}
    for label, pool in pools.items():
      split = fedavg_round._tff_weights(process, pool.run(process.next, initial, datasets).state)  # pylint: disable=protected-access
      agreement[label] = fedavg_round.compare_weights(start, split, reference).relative_difference
      logging.info('%s vs one process: relative difference %.2e', label, agreement[label])
      if not agreement[label] < TOLERANCE:
        raise RuntimeError(
          f'{label} computed a different round: relative difference '
          f'{agreement[label]:.3g} >= {TOLERANCE}.'
        )
    runners = {ONE_PROCESS: lambda: process.next(initial, datasets)}
    for label, pool in pools.items():
      runners[label] = (lambda p: lambda: p.run(process.next, initial, datasets))(pool)
    # Every runner ran in the agreement check above: no warm-up block.
    measured = stats.interleave(
      {label: _wall_and_cpu(run) for label, run in runners.items()}, timed_rounds, warmup=0
    )
  finally:
    for pool in pools.values():
      pool.close()
  return WorkersResult(
    num_clients,
    total_examples,
    {label: m[:, 0] for label, m in measured.items()},
    {label: m[:, 1] for label, m in measured.items()},
    agreement,
  )


def _wall_and_cpu(function: Callable[[], object]) -> Callable[[], tuple[float, float]]:
  """A measure for `stats.interleave`: wall and CPU seconds (`cpu_seconds`) of one call."""

  def measure() -> tuple[float, float]:
    cpu_begin, begin = cpu_seconds(), time.perf_counter()
    function()
    wall = time.perf_counter() - begin
    return wall, cpu_seconds() - cpu_begin

  return measure


def cpu_seconds() -> float:
  """User + system CPU seconds of this process and its live children (the TFF workers)."""
  total = 0.0
  for process in [psutil.Process()] + psutil.Process().children(recursive=True):
    try:
      times = process.cpu_times()
    except psutil.Error:
      continue
    total += times.user + times.system
  return total


def format_table(result: WorkersResult) -> str:
  lines = [
    f'{result.num_clients} clients, {result.total_examples} examples, McMahan CNN; '
    'medians over the timed rounds',
    f'{"row":<14}{"median s":>10}{"speed-up":>10}{"cores busy":>11}{"agreement":>11}',
  ]
  for label in result.seconds:
    agreement = result.agreement.get(label)
    lines.append(
      f'{label:<14}{result.median(label):>10.3f}{result.speedup(label):>10.2f}'
      f'{np.median(result.cores_busy(label)):>11.2f}'
      f'{"" if agreement is None else f"{agreement:.1e}":>11}'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  counts = [int(c) for c in _WORKER_COUNTS.value]
  if not counts or min(counts) < 1:
    raise app.UsageError(f'--wk_worker_counts must be positive integers, got {counts}.')
  result = run(_CLIENTS.value, _EXAMPLES.value, _TIMED_ROUNDS.value, counts)
  print(format_table(result))


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
