r"""Benchmark: a FedAvg round with optimal client sampling vs plain TFF FedAvg.

Both processes run on the same 32-client cohort (≈4,800 FEMNIST-shaped
synthetic examples, McMahan CNN, batch 20, one local epoch, client SGD 0.1,
server SGD 1.0, TFF's iterator client loop) in the same process and the same
execution context (TFF's test C++ context, which runs secure sums):

* ``plain``: ``tff_sampling.learning.build_fed_avg`` (TFF's weighted mean);
* ``optimal``: ``build_fed_avg_with_optimal_sampling`` (approximate, 4
  rescaling steps, every client value through secure sums).

After one warm-up round each, `--os_timed_rounds` blocks run each process once
(``bench.stats.interleave``: the order rotates); the median per-block ratio
optimal / plain is printed with its bootstrap 95% interval and the verdict on
the target ≤ 1.10. Usage:

  .venv/bin/python -m bench.optimal_sampling_round --os_timed_rounds=15
"""

from __future__ import annotations

from collections.abc import Sequence
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow_federated as tff

from bench import fedavg_round
from bench import fedavg_workload
from bench import stats
from tff_sampling import learning
from tff_sampling.runtime import tff_context

_TIMED_ROUNDS = flags.DEFINE_integer(
  'os_timed_rounds',
  5,
  'Timed blocks (one round of each process) after a warm-up block.',
  lower_bound=1,
)
_CLIENTS = flags.DEFINE_integer('os_clients', 32, 'Cohort size.', lower_bound=1)
_EXAMPLES = flags.DEFINE_integer('os_examples', 4800, 'Examples over the cohort.', lower_bound=1)
_EXPECTED = flags.DEFINE_float('os_expected_clients', 3.0, 'm: expected uploads.')
_CSV = flags.DEFINE_string('os_csv', None, 'Append result rows to this CSV file.')
_TARGET = 1.10


def run(
  *,
  timed_rounds: int,
  clients: int,
  examples: int,
  expected_clients: float,
  plain: tff.learning.templates.LearningProcess | None = None,
) -> dict[str, np.ndarray]:
  """Round times (seconds) of each process, interleaved, after a warm-up round.

  `plain`: the ``plain`` process (`learning.build_fed_avg` of this workload's model, client
  learning rate 0.1), if the caller has it already (built here otherwise).
  """
  tff_context.use_secure_sum_simulation()
  sizes = fedavg_workload.client_sizes(clients, examples, seed=0)
  datasets = fedavg_workload.client_datasets(
    fedavg_workload.synthetic_client_arrays(sizes, seed=0), batch_size=20
  )
  model_fn = fedavg_workload.tff_model_fn(datasets[0].element_spec, seed=0)

  sgd = tff.learning.optimizers.build_sgdm
  if plain is None:
    plain = learning.build_fed_avg(model_fn, client_learning_rate=0.1)
  processes = {
    'plain': plain,
    'optimal': learning.build_fed_avg_with_optimal_sampling(
      model_fn,
      sgd(0.1),
      sgd(1.0),
      expected_clients=expected_clients,
      max_rescaling_steps=4,
      mode='approximate',
      secure=True,
    ),
  }
  states = {name: p.initialize() for name, p in processes.items()}

  def runner(name: str):
    def run():
      states[name] = processes[name].next(states[name], datasets).state

    return stats.timed(run)

  return stats.interleave({name: runner(name) for name in processes}, timed_rounds)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  times = run(
    timed_rounds=_TIMED_ROUNDS.value,
    clients=_CLIENTS.value,
    examples=_EXAMPLES.value,
    expected_clients=_EXPECTED.value,
  )
  plain, optimal = np.median(times['plain']), np.median(times['optimal'])
  ratio = stats.ratio_estimate(times['optimal'], times['plain'])
  print(
    f'FedAvg round, {_CLIENTS.value} clients, {_EXAMPLES.value} examples, McMahan CNN, '
    f'{_TIMED_ROUNDS.value} timed blocks'
  )
  print(f'{"process":<10} {"median s":>9} {"min s":>7} {"max s":>7}')
  for name in ('plain', 'optimal'):
    t = times[name]
    print(f'{name:<10} {np.median(t):>9.3f} {min(t):>7.3f} {max(t):>7.3f}')
  print(
    f'optimal / plain, median per-block ratio = {ratio.median:.3f}, 95% CI {ratio.interval} '
    f'(target <= {_TARGET}: {stats.verdict(ratio, _TARGET)})'
  )
  if _CSV.value:
    commit = fedavg_round.git_commit()
    stamp = time.strftime('%Y-%m-%dT%H:%M:%S')
    fedavg_round.append_csv(
      _CSV.value,
      [
        dict(
          benchmark='optimal_sampling_round',
          metric=m,
          value=f'{v:.6g}',
          commit=commit,
          timestamp=stamp,
        )
        for m, v in (
          ('plain_median_s', plain),
          ('optimal_median_s', optimal),
          ('optimal_over_plain', ratio.median),
          ('optimal_over_plain_low', ratio.low),
          ('optimal_over_plain_high', ratio.high),
        )
      ],
    )


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
