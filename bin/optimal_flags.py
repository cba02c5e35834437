"""Flags of the optimal client sampling binaries (``bin.optimal_sampling``, ``bin.demo``)."""

from __future__ import annotations

from absl import flags

from bin import common_flags as cf
from bin import flag_checks
from tff_sampling.comparisons import optimal

ALGORITHM = flags.DEFINE_enum(
  'algorithm',
  'fedavg',
  list(optimal.ALGORITHMS),
  'FedAvg (local SGD) or DSGD (one gradient per client).',
)
EXPECTED_CLIENTS = flags.DEFINE_float(
  'expected_clients',
  3.0,
  "m: expected uploads per round (bin.optimal_sampling: default the task's paper value).",
)
MAX_RESCALING_STEPS = flags.DEFINE_integer(
  'max_rescaling_steps', 4, 'j_max of the secure protocol.', lower_bound=0
)
flag_checks.check_number(
  'expected_clients', low=0.0, low_open=True, hint='expected uploads per round, such as 3'
)


def full_participation_note(cohort: int) -> str | None:
  """The note a run gets when ``m >= cohort``: every client uploads (p = 1), or None."""
  m = EXPECTED_CLIENTS.value
  if m < cohort:
    return None
  return (
    f'Note: --expected_clients={m:g} is at least the cohort of {cohort}: every cohort '
    'client uploads (p = 1) whatever the sampling, i.e. full participation.'
  )


def optimal_sampling(cohort: int | None = None) -> optimal.OptimalSampling:
  """The `optimal.OptimalSampling` of the flags; prints `full_participation_note` once
  if `cohort` is given and ``m >= cohort``."""
  note = None if cohort is None else full_participation_note(cohort)
  if note:
    print(note, flush=True)
  return optimal.OptimalSampling(
    algorithm=ALGORITHM.value,
    expected_clients=EXPECTED_CLIENTS.value,
    max_rescaling_steps=MAX_RESCALING_STEPS.value,
    client_learning_rate=cf.CLIENT_LEARNING_RATE.value,
    server_learning_rate=cf.SERVER_LEARNING_RATE.value,
  )
