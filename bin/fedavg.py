"""FedAvg with uniformly sampled cohorts, on any task.

    python -m bin.fedavg --task=digits --rounds=20 --clients_per_round=10 \\
        --root_output_dir=/tmp/results --experiment_name=digits_fedavg

Runs `tff.learning.algorithms.build_weighted_fed_avg` (example-weighted, client
and server SGD) through the shared program loop (`tff_sampling.program`):
metrics in ``<root_output_dir>/<experiment_name>/metrics.csv`` and TensorBoard,
hyper-parameters in ``hparams.json``, checkpoints every ``--checkpoint_every``
rounds; rerunning the same command resumes.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import app

from bin import common_flags as cf
from bin import experiment_flags as ef
from tff_sampling import comparisons
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import samplers


def main(argv: Sequence[str]) -> None:
  cf.begin_main(argv)
  seed, cohort = cf.SEED.value, ef.CLIENTS_PER_ROUND.value
  with cf.exit_on_bad_input():
    task = ef.task_from_flags()
    process = learning.build_fed_avg(
      task.model_fn,
      client_learning_rate=cf.CLIENT_LEARNING_RATE.value,
      server_learning_rate=cf.SERVER_LEARNING_RATE.value,
    )
    sampler = samplers.UniformSampler(cohort, seed=seed)
    sampler.initialize(samplers.Population(task.client_num_examples))  # Cohort > N fails here.
    availability, settings = ef.availability_spec(), ef.run_settings()
    name = cf.EXPERIMENT_NAME.value or f'{ef.TASK.value}_fedavg_seed{seed}'
    method = dict(algorithm='fedavg', sampling='uniform')
    hparams = comparisons.run_hparams(
      settings, name, seed, availability.hparams(), method, comparisons.task_hparams(task)
    )
    result = program.train_model(
      task,
      process,
      sampler,
      settings.run_config(name, seed, hparams),
      availability=availability.build(task, seed),
      devices=settings.devices.build(task, seed, settings.client_steps),
    )
  print(f'{name}: round {result.final_round}, {dict(result.eval_metrics)}', flush=True)


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
