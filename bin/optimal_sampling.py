"""The optimal client sampling experiments (Chen, Horváth, Richtárik, TMLR 2022).

    python -m bin.optimal_sampling --task=emnist --cache_dir=~/.tff \\
        --sampling=optimal --algorithm=fedavg --seed=0

Each round a cohort of ``--clients_per_round`` clients is drawn uniformly; all
of them train; each uploads with probability ``p_i``:
``--sampling=optimal`` (the secure two-phase protocol, ``--max_rescaling_steps``
steps), ``optimal_exact`` (Algorithm 1; reveals norms), ``uniform``
(``p = m/n``) or ``full`` (``p = 1``), with ``m = --expected_clients``.
Unset flags take the paper's defaults for the task (`PAPER_DEFAULTS`).
Results feed ``bin/plot.py``; uploaded bits include the protocol's scalars.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app
from absl import flags

from bin import common_flags as cf
from bin import experiment_flags as ef
from bin import optimal_flags
from tff_sampling import communication
from tff_sampling import comparisons
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.comparisons import optimal

# The paper's settings (docs/algorithms.md §1e); `digits`/`synthetic` are
# the offline stand-ins. Keys: rounds, eval_every, clients_per_round,
# expected_clients, client_batch_size, client_learning_rate.
PAPER_DEFAULTS = {
  'emnist': dict(
    rounds=151,
    eval_every=5,
    clients_per_round=32,
    expected_clients=3.0,
    client_batch_size=20,
    client_learning_rate=0.1,
  ),
  'shakespeare': dict(
    rounds=151,
    eval_every=5,
    clients_per_round=32,
    expected_clients=2.0,
    client_batch_size=8,
    client_learning_rate=0.1,
  ),
  'cifar100': dict(
    rounds=1001,
    eval_every=10,
    clients_per_round=32,
    expected_clients=3.0,
    client_batch_size=20,
    client_learning_rate=0.001,
  ),
  'digits': dict(
    rounds=40,
    eval_every=2,
    clients_per_round=32,
    expected_clients=3.0,
    client_batch_size=20,
    client_learning_rate=0.3,
  ),
  'synthetic': dict(
    rounds=40,
    eval_every=2,
    clients_per_round=16,
    expected_clients=2.0,
    client_batch_size=20,
    client_learning_rate=0.05,
  ),
}
for _name in ('emnist_unbalanced_1', 'emnist_unbalanced_2', 'emnist_unbalanced_3'):
  PAPER_DEFAULTS[_name] = PAPER_DEFAULTS['emnist']

_SAMPLING = flags.DEFINE_enum(
  'sampling', 'optimal', list(optimal.SAMPLING_MODES), 'Who uploads (see the module docstring).'
)


def main(argv: Sequence[str]) -> None:
  cf.begin_main(argv)
  ef.apply_task_defaults(PAPER_DEFAULTS)
  seed, sampling, cohort = cf.SEED.value, _SAMPLING.value, ef.CLIENTS_PER_ROUND.value
  with cf.exit_on_bad_input():
    ef.refuse_devices('python -m bin.benchmark --sampling=uniform+optimal')
    task = ef.task_from_flags()
    method = optimal_flags.optimal_sampling(cohort)
    # Every cohort client trains; the aggregator lets each upload with probability p_i.
    aggregator = method.aggregator(sampling, seed)
    process = method.process(task, aggregator)
    sampler = samplers.UniformSampler(cohort, seed=seed)
    sampler.initialize(samplers.Population(task.client_num_examples))  # Cohort > N fails here.
    availability, settings = ef.availability_spec(), ef.run_settings()
    name = cf.EXPERIMENT_NAME.value or f'{ef.TASK.value}_{method.algorithm}_{sampling}_seed{seed}'
    hparams = comparisons.run_hparams(
      settings, name, seed, availability.hparams(), comparisons.task_hparams(task)
    )
    result = program.train_model(
      task,
      process,
      sampler,
      settings.run_config(name, seed, hparams),
      uplink_fn=communication.uplink_from_measurements,
      availability=availability.build(task, seed),
    )
  print(f'{name}: round {result.final_round}, {dict(result.eval_metrics)}', flush=True)


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
