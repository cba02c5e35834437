r"""Benchmark: peak memory of one FedAvg round with a 1,000-client cohort on ``digits``.

    .venv/bin/python -m bench.memory
    .venv/bin/python -m bench.memory --mem_cohort=2000 --mem_clients_per_call=100,250

``digits`` has at most 719 clients (every client needs two examples), so the
cohort's 1,000 slots are drawn with replacement (as MD sampling does) from a
700-client ``digits`` population; each slot is a separate client dataset in the
round. The process is `tff_sampling.learning.build_fed_avg` (the MLP).

Rows (each runs two rounds of the same cohort; the time is the second's):

* ``one_call``: a fresh local worker (`tff_sampling.runtime.workers.WorkerPool`), the
  whole cohort in one call.
* ``slices_of_<c>``: a fresh local worker with ``clients_per_call=c``: the
  round runs as ``ceil(cohort / c)`` calls of at most ``c`` clients, merged.

Each row starts its own worker, so no row inherits memory that an earlier
computation left allocated.

Memory is the resident set size of this process plus all its child processes
(the TFF C++ workers hold the round's datasets), sampled every 5 ms during the
two rounds; the table gives the peak, its increase over the level just
before them (memory the allocators keep after the first round counts too), and
that increase per client slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import threading
import time

from absl import app
from absl import flags
import numpy as np
import psutil

import tasks
from tff_sampling.learning import fedavg
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers as workers_lib

_COHORT = flags.DEFINE_integer('mem_cohort', 1000, 'Client slots in the round.', lower_bound=1)
_POPULATION = flags.DEFINE_integer(
  'mem_population', 700, 'digits clients (at most 719).', lower_bound=1
)
_CLIENTS_PER_CALL = flags.DEFINE_list(
  'mem_clients_per_call', ['100'], 'Slice sizes to measure with one local worker.'
)

_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class MemoryRow:
  label: str
  cohort: int
  seconds: float
  before_mb: float
  peak_mb: float

  @property
  def increase_mb(self) -> float:
    return self.peak_mb - self.before_mb

  @property
  def kb_per_client(self) -> float:
    return self.increase_mb * 1024 / self.cohort


def resident_bytes() -> int:
  """RSS of this process and all its descendants."""
  total = 0
  for process in [psutil.Process()] + psutil.Process().children(recursive=True):
    try:
      total += process.memory_info().rss
    except psutil.Error:
      continue
  return total


class PeakSampler:
  """Samples `resident_bytes` in a thread while active; `peak` is the largest seen."""

  def __init__(self, interval_s: float = 0.005):
    self.peak = 0
    self._interval_s = interval_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self) -> None:
    while not self._stop.is_set():
      self.peak = max(self.peak, resident_bytes())
      time.sleep(self._interval_s)

  def __enter__(self) -> PeakSampler:
    self.peak = resident_bytes()
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, resident_bytes())


def _measure(label: str, run_round, cohort: int) -> MemoryRow:
  before = resident_bytes()
  with PeakSampler() as sampler:
    run_round()  # Warm-up: compilation and the first transfer of every dataset.
    start = time.perf_counter()
    run_round()
    seconds = time.perf_counter() - start
  return MemoryRow(label, cohort, seconds, before / _MB, sampler.peak / _MB)


def measures(
  cohort: int = 1000, population: int = 700, clients_per_call: Sequence[int] = (100,), seed: int = 0
) -> dict[str, Callable[[], MemoryRow]]:
  """Row label -> a call that measures one round of `cohort` slots on a fresh worker."""
  task = tasks.get_task('digits', num_clients=population)
  slots = np.random.default_rng([seed, 0]).choice(population, size=cohort, replace=True)
  data = [task.client_dataset(int(c), seed) for c in slots]
  process = fedavg.build_fed_avg(task.model_fn, client_learning_rate=0.1)
  state = process.set_model_weights(process.initialize(), task.initial_model_weights(seed))

  def measure(label: str, size: int | None) -> Callable[[], MemoryRow]:
    def call() -> MemoryRow:
      with workers_lib.WorkerPool.start_local(1, clients_per_call=size) as pool:
        return _measure(label, lambda: pool.run(process.next, state, data), cohort)

    return call

  calls = {}
  for size in (None, *clients_per_call):
    label = 'one_call' if size is None else f'slices_of_{size}'
    calls[label] = measure(label, size)
  return calls


def run(
  cohort: int = 1000, population: int = 700, clients_per_call: Sequence[int] = (100,), seed: int = 0
) -> list[MemoryRow]:
  """Measures one round of `cohort` slots, in one call and in each slice size."""
  return [call() for call in measures(cohort, population, clients_per_call, seed).values()]


def format_table(rows: Sequence[MemoryRow]) -> str:
  lines = [
    f'One FedAvg round, {rows[0].cohort} client slots of digits (RSS of this process + '
    'TFF workers)',
    f'{"row":<16}{"seconds":>9}{"before MB":>11}{"peak MB":>10}{"increase MB":>13}'
    f'{"KB/client":>11}',
  ]
  for row in rows:
    lines.append(
      f'{row.label:<16}{row.seconds:>9.2f}{row.before_mb:>11.0f}{row.peak_mb:>10.0f}'
      f'{row.increase_mb:>13.0f}{row.kb_per_client:>11.1f}'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  sizes = [int(s) for s in _CLIENTS_PER_CALL.value]
  if min(sizes, default=1) < 1:
    raise app.UsageError(f'--mem_clients_per_call must be positive, got {sizes}.')
  print(format_table(run(_COHORT.value, _POPULATION.value, sizes)))


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
