r"""Benchmark: a FedAvg round with optimal client sampling vs plain TFF FedAvg.

Both processes run on the same 32-client cohort (≈4,800 FEMNIST-shaped
synthetic examples, McMahan CNN, batch 20, one local epoch, client SGD 0.1,
server SGD 1.0, TFF's iterator client loop) in the same process and the same
execution context (TFF's test C++ context, which runs secure sums):

* ``plain``: ``tff_sampling.learning.build_fedavg`` (TFF's weighted mean);
* ``optimal``: ``build_fed_avg_with_optimal_sampling`` (approximate, 4
  rescaling steps, every client value through secure sums).

After one warm-up round each, `--timed_rounds` rounds alternate the two (the
order rotates) and the ratio of medians is printed; target ≤ 1.10. Usage:

  .venv/bin/python -m bench.optimal_sampling_round --timed_rounds=5
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np
import tensorflow_federated as tff

from bench import fedavg_round
from tff_sampling import learning
from tff_sampling import runtime

_TIMED_ROUNDS = flags.DEFINE_integer(
    'os_timed_rounds', 5, 'Timed rounds per process (after a warm-up round).', lower_bound=1)
_CLIENTS = flags.DEFINE_integer('os_clients', 32, 'Cohort size.', lower_bound=1)
_EXAMPLES = flags.DEFINE_integer('os_examples', 4800, 'Examples over the cohort.', lower_bound=1)
_EXPECTED = flags.DEFINE_float('os_expected_clients', 3.0, 'm: expected uploads.')
_CSV = flags.DEFINE_string('os_csv', None, 'Append result rows to this CSV file.')
_TARGET = 1.10


def run(*, timed_rounds: int, clients: int, examples: int,
        expected_clients: float) -> dict[str, list[float]]:
  """Round times (seconds) of each process; the first round is excluded."""
  runtime.use_secure_sum_simulation()
  sizes = fedavg_round.client_sizes(clients, examples, seed=0)
  datasets = fedavg_round.client_datasets(
      fedavg_round.synthetic_client_arrays(sizes, seed=0), batch_size=20)
  model_fn = fedavg_round.tff_model_fn(datasets[0].element_spec, seed=0)

  sgd = tff.learning.optimizers.build_sgdm
  processes = {
      'plain': learning.build_fedavg(model_fn, client_learning_rate=0.1),
      'optimal': learning.build_fed_avg_with_optimal_sampling(
          model_fn, sgd(0.1), sgd(1.0), expected_clients=expected_clients,
          max_rescaling_steps=4, mode='approximate', secure=True),
  }
  states = {name: p.initialize() for name, p in processes.items()}
  times: dict[str, list[float]] = {name: [] for name in processes}
  names = list(processes)
  for round_num in range(timed_rounds + 1):
    order = names[round_num % 2:] + names[:round_num % 2]
    for name in order:
      start = time.perf_counter()
      states[name] = processes[name].next(states[name], datasets).state
      if round_num > 0:
        times[name].append(time.perf_counter() - start)
  return times


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  times = run(timed_rounds=_TIMED_ROUNDS.value, clients=_CLIENTS.value,
              examples=_EXAMPLES.value, expected_clients=_EXPECTED.value)
  plain, optimal = np.median(times['plain']), np.median(times['optimal'])
  ratio = optimal / plain
  print(f'FedAvg round, {_CLIENTS.value} clients, {_EXAMPLES.value} examples, McMahan CNN, '
        f'{_TIMED_ROUNDS.value} timed rounds')
  print(f'{"process":<10} {"median s":>9} {"min s":>7} {"max s":>7}')
  for name in ('plain', 'optimal'):
    t = times[name]
    print(f'{name:<10} {np.median(t):>9.3f} {min(t):>7.3f} {max(t):>7.3f}')
  print(f'optimal / plain = {ratio:.3f} (target <= {_TARGET}: '
        f'{"met" if ratio <= _TARGET else "NOT met"})')
  if _CSV.value:
    commit = fedavg_round.git_commit()
    stamp = time.strftime('%Y-%m-%dT%H:%M:%S')
    fedavg_round.append_csv(_CSV.value, [
        dict(benchmark='optimal_sampling_round', metric=m, value=f'{v:.6g}', commit=commit,
             timestamp=stamp)
        for m, v in (('plain_median_s', plain), ('optimal_median_s', optimal),
                     ('optimal_over_plain', ratio))])


if __name__ == '__main__':
  app.run(main)
