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
from tff_sampling import learning


def main(argv: Sequence[str]) -> None:
  cf.begin_main(argv)
  ef.run_uniform_cohorts(
    f'{ef.TASK.value}_fedavg_seed{cf.SEED.value}',
    make_process=lambda task: learning.build_fed_avg(
      task.model_fn,
      client_learning_rate=cf.CLIENT_LEARNING_RATE.value,
      server_learning_rate=cf.SERVER_LEARNING_RATE.value,
    ),
    method_hparams=dict(algorithm='fedavg', sampling='uniform'),
  )


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
