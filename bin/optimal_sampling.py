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
import tensorflow_federated as tff

from bin import experiment_flags as ef
from bin import flag_checks
from tff_sampling import aggregators
from tff_sampling import learning

SAMPLING_MODES = {'optimal': 'approximate', 'optimal_exact': 'exact',
                  'uniform': 'uniform', 'full': 'full'}

# The paper's settings (docs/algorithms.md §1e); `digits`/`synthetic` are
# the offline stand-ins. Keys: rounds, eval_every, clients_per_round,
# expected_clients, client_batch_size, client_learning_rate.
PAPER_DEFAULTS = {
    'emnist': dict(rounds=151, eval_every=5, clients_per_round=32, expected_clients=3.0,
                   client_batch_size=20, client_learning_rate=0.1),
    'shakespeare': dict(rounds=151, eval_every=5, clients_per_round=32, expected_clients=2.0,
                        client_batch_size=8, client_learning_rate=0.1),
    'cifar100': dict(rounds=1001, eval_every=10, clients_per_round=32, expected_clients=3.0,
                     client_batch_size=20, client_learning_rate=0.001),
    'digits': dict(rounds=40, eval_every=2, clients_per_round=32, expected_clients=3.0,
                   client_batch_size=20, client_learning_rate=0.3),
    'synthetic': dict(rounds=40, eval_every=2, clients_per_round=16, expected_clients=2.0,
                      client_batch_size=20, client_learning_rate=0.05),
}
for _name in ('emnist_unbalanced_1', 'emnist_unbalanced_2', 'emnist_unbalanced_3'):
  PAPER_DEFAULTS[_name] = PAPER_DEFAULTS['emnist']

_SAMPLING = flags.DEFINE_enum('sampling', 'optimal', list(SAMPLING_MODES),
                              'Who uploads (see the module docstring).')
_ALGORITHM = flags.DEFINE_enum('algorithm', 'fedavg', ['fedavg', 'dsgd'],
                               'FedAvg (local SGD) or DSGD (one gradient per client).')
EXPECTED_CLIENTS = flags.DEFINE_float(
    'expected_clients', None, "m: expected uploads per round (default: the task's paper value).")
_MAX_RESCALING_STEPS = flags.DEFINE_integer(
    'max_rescaling_steps', 4, 'j_max of the secure protocol.', lower_bound=0)
flag_checks.check_number('expected_clients', low=0.0, low_open=True,
                         hint='expected uploads per round, such as 3')


def make_process(task, sampling: str, seed: int) -> tff.learning.templates.LearningProcess:
  """The learning process of `sampling` for the current flags."""
  mode = SAMPLING_MODES[sampling]
  common = dict(expected_clients=EXPECTED_CLIENTS.value,
                max_rescaling_steps=_MAX_RESCALING_STEPS.value, mode=mode,
                secure=(mode != 'exact'), seed=seed)
  server_optimizer = tff.learning.optimizers.build_sgdm(ef.SERVER_LEARNING_RATE.value)
  if _ALGORITHM.value == 'dsgd':
    return learning.build_dsgd_with_optimal_sampling(task.model_fn, server_optimizer, **common)
  return learning.build_fed_avg_with_optimal_sampling(
      task.model_fn, tff.learning.optimizers.build_sgdm(ef.CLIENT_LEARNING_RATE.value),
      server_optimizer, **common)


def method_hparams() -> dict:
  return dict(algorithm=_ALGORITHM.value, sampling=_SAMPLING.value,
              expected_clients=EXPECTED_CLIENTS.value,
              max_rescaling_steps=_MAX_RESCALING_STEPS.value)


def main(argv: Sequence[str]) -> None:
  ef.begin_main(argv)
  ef.apply_defaults(PAPER_DEFAULTS.get(ef.TASK.value, {}))
  if EXPECTED_CLIENTS.value is None:
    EXPECTED_CLIENTS.value = PAPER_DEFAULTS.get(ef.TASK.value, {}).get('expected_clients', 3.0)
  ef.run_with_uniform_cohorts(
      method_hparams(),
      default_name=f'{ef.TASK.value}_{_ALGORITHM.value}_{_SAMPLING.value}_seed{ef.SEED.value}',
      make_process=lambda task: make_process(task, _SAMPLING.value, ef.SEED.value),
      uplink_fn=aggregators.uplink_from_measurements)


if __name__ == '__main__':
  from tff_sampling import runtime  # pylint: disable=g-import-not-at-top
  app.run(runtime.binary_main(main))
