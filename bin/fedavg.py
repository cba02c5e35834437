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

import sys
from collections.abc import Sequence

from absl import app
from absl import logging

from bin import experiment_flags as ef
from tff_sampling import learning
from tff_sampling import program
from tff_sampling import runtime
from tff_sampling import samplers


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  runtime.quiet_library_logs()
  try:
    task = ef.task_from_flags()
    hparams = ef.experiment_hparams(task, algorithm='fedavg', sampling='uniform')
    config = ef.program_config(
        hparams, default_name=f'{ef.TASK.value}_fedavg_seed{ef.SEED.value}')
    sampler = samplers.UniformSampler(ef.CLIENTS_PER_ROUND.value, seed=ef.SEED.value)
    sampler.initialize(samplers.Population(task.client_num_examples))  # Fail fast.
    process = learning.build_fedavg(
        task.model_fn, client_learning_rate=ef.CLIENT_LEARNING_RATE.value,
        server_learning_rate=ef.SERVER_LEARNING_RATE.value)
    result = program.run_experiment(task, process, sampler, config)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  logging.info('Finished round %d: %s; uploaded %.4g bits; results in %s',
               result.final_round, dict(result.eval_metrics), result.cumulative_bits,
               config.output_dir)


if __name__ == '__main__':
  app.run(main)
