"""Flags of the single-model experiment binaries, and their conversion to typed settings.

Importing this module defines the flags (at module level, once per process)
on top of `bin.common_flags`, which ``bin.mmfl`` shares. Task options are flags
too: each defaults to ``None`` ("the task's default"), and setting one that the
chosen task does not accept is an error naming the task that does (see
`tasks.get_task`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from bin import common_flags as cf
from bin import flag_checks
import tasks
from tff_sampling import availability as availability_lib
from tff_sampling import comparisons
from tff_sampling.task import Task

# --- The experiment -----------------------------------------------------------
TASK = flags.DEFINE_enum('task', 'digits', list(tasks.task_names()), 'The task.')
CLIENTS_PER_ROUND = flags.DEFINE_integer(
  'clients_per_round', 10, 'Cohort size: clients drawn per round.', lower_bound=1
)
CLIENT_LEARNING_RATE_DECAY = flags.DEFINE_float(
  'client_learning_rate_decay',
  None,
  'γ in (0, 1]: round t trains with --client_learning_rate · γ^(t−1) (FedGS: 0.998); unset: '
  'a constant rate.',
)
CLIENT_STEPS = flags.DEFINE_integer(
  'client_steps',
  None,
  'If set, every client takes exactly this many local batches per round (its stream '
  'cycled and cut) instead of --client_epochs passes.',
  lower_bound=1,
)
WORKERS = flags.DEFINE_list(
  'workers',
  [],
  "host:port of running TFF workers (`worker_binary --port=PORT`); each round's clients are "
  'split over them. Results equal a one-process run up to float summation order.',
)
LOCAL_WORKERS = flags.DEFINE_integer(
  'local_workers',
  0,
  "Start this many TFF workers on this machine (loopback ports) and split each round's "
  'clients over them; 0: one process.',
  lower_bound=0,
)
CLIENTS_PER_CALL = flags.DEFINE_integer(
  'clients_per_call',
  None,
  'With --workers or --local_workers: cut each round into slices of at most this many '
  "clients, run in turn (bounds a worker's memory for large cohorts).",
  lower_bound=1,
)

# --- Client availability (FedGS §3c) ------------------------------------------
AVAILABILITY = flags.DEFINE_list(
  'availability',
  ['IDL'],
  'Which clients are active each round: MODE or MODE-β, e.g. LN or LN-0.5 (IDL: '
  f'everyone), of {", ".join(availability_lib.AVAILABILITY_MODES)}; every sampler '
  'selects among them. bin.fedgs takes a comma-separated list; other binaries one.',
)
DEVICES = flags.DEFINE_string(
  'devices',
  'none',
  "Clients' devices: none (rounds take no simulated time), lognormal (log-normal compute speed "
  'and bandwidths, drawn per seed; docs/devices.md), or a CSV file of per-client '
  'seconds_per_example, download_bits_per_second, upload_bits_per_second.',
)
DEVICE_TARGET = flags.DEFINE_integer(
  'device_target',
  None,
  'With --devices: updates the server waits for each round, the first to arrive (default: '
  'every selected client). Over-commit by selecting more, e.g. --clients_per_round=13 '
  '--device_target=10.',
  lower_bound=1,
)
DEADLINE_SECONDS = flags.DEFINE_float(
  'deadline_seconds',
  None,
  'With --devices: the longest a round waits, in simulated seconds (> 0); later clients are '
  'dropped.',
)
DROPOUT = flags.DEFINE_float(
  'dropout',
  0.0,
  'With --devices: probability that a selected client drops out mid-round, in [0, 1).',
)
AVAILABILITY_BETA = flags.DEFINE_float(
  'availability_beta',
  None,
  "β of a mode given without one, in [0, 1] (default: the paper's β for the mode).",
)
AVAILABILITY_PERIOD = flags.DEFINE_integer(
  'availability_period',
  availability_lib.DEFAULT_PERIOD,
  'Period T of the YC and SLN modes.',
  lower_bound=1,
)

# --- Task options (None = the task's default) ---------------------------------
_TASK_OPTION_FLAGS = {
  'max_client_examples': flags.DEFINE_integer(
    'max_client_examples', None, 'Cap on examples per client per epoch.', lower_bound=1
  ),
  'eval_batch_size': flags.DEFINE_integer(
    'eval_batch_size', None, 'Evaluation batch size.', lower_bound=1
  ),
  'max_eval_examples': flags.DEFINE_integer(
    'max_eval_examples', None, 'Cap on evaluation examples.', lower_bound=1
  ),
  'num_clients': flags.DEFINE_integer(
    'num_clients', None, 'Clients of a generated task.', lower_bound=1
  ),
  'dirichlet_alpha': flags.DEFINE_float(
    'dirichlet_alpha', None, 'digits, cifar10, emnist_skewed: Dirichlet label-skew concentration.'
  ),
  'size_sigma': flags.DEFINE_float(
    'size_sigma', None, 'digits, emnist_skewed: log-normal sigma of client sizes.'
  ),
  'eval_fraction': flags.DEFINE_float(
    'eval_fraction', None, 'Fraction of generated data held out for evaluation.'
  ),
  'preset': flags.DEFINE_string(
    'preset',
    None,
    "digits: 'default', 'unbalanced', 'shards' (one digit per client) or "
    "'two_labels' (two digits per client, equal sizes).",
  ),
  'partition': flags.DEFINE_string(
    'partition',
    None,
    "emnist_skewed: 'dirichlet' (label proportions ~ Dirichlet("
    "--dirichlet_alpha)), 'shards' (one label per client) or 'two_labels'.",
  ),
  'model': flags.DEFINE_string('model', None, 'Model variant of the task.'),
  'mlp_hidden': flags.DEFINE_list('mlp_hidden', None, 'digits: hidden layer widths.'),
  'alpha': flags.DEFINE_float(
    'synthetic_alpha', None, 'synthetic: alpha of Synthetic(alpha, beta).'
  ),
  'beta': flags.DEFINE_float('synthetic_beta', None, 'synthetic: beta of Synthetic(alpha, beta).'),
  'min_client_size': flags.DEFINE_integer(
    'min_client_size', None, 'synthetic: smallest client.', lower_bound=2
  ),
  'max_client_size': flags.DEFINE_integer(
    'max_client_size', None, 'synthetic: largest client.', lower_bound=2
  ),
  'only_digits': flags.DEFINE_bool(
    'only_digits', None, 'emnist: 10 digit classes (True) or all 62 (False).'
  ),
  'sequence_length': flags.DEFINE_integer(
    'sequence_length', None, 'shakespeare: characters per sequence.', lower_bound=1
  ),
  'crop_size': flags.DEFINE_integer(
    'crop_size', None, 'cifar100: crop size.', lower_bound=1, upper_bound=32
  ),
  'distort_images': flags.DEFINE_bool('distort_images', None, 'cifar100: random crop/flip.'),
  'data_dir': flags.DEFINE_string(
    'tfds_data_dir', None, 'cifar10: TFDS data directory holding the prepared cifar10.'
  ),
  'size_profile': flags.DEFINE_enum(
    'size_profile', None, ['fraboni', 'balanced'], 'cifar10: client size profile.'
  ),
  'size_group_clients': flags.DEFINE_list(
    'size_group_clients',
    None,
    'cifar10, emnist_skewed: clients per size group (cifar10: overrides the profile).',
  ),
  'size_group_examples': flags.DEFINE_list(
    'size_group_examples', None, 'cifar10, emnist_skewed: examples per client of each size group.'
  ),
  'unbalance_seed': flags.DEFINE_integer(
    'unbalance_seed',
    None,
    'emnist_unbalanced_*: seed of the unbalancing.',
    lower_bound=0,
    upper_bound=2**32 - 1,
  ),
  'unbalance_lower': flags.DEFINE_integer(
    'unbalance_lower', None, 'emnist_unbalanced_*: smallest affected client size.', lower_bound=0
  ),
  'unbalance_upper': flags.DEFINE_integer(
    'unbalance_upper', None, 'emnist_unbalanced_*: largest affected client size.', lower_bound=0
  ),
  'unbalance_removal_probability': flags.DEFINE_float(
    'unbalance_removal_probability',
    None,
    'emnist_unbalanced_*: probability that an affected client is removed.',
  ),
  'unbalance_keep_examples': flags.DEFINE_integer(
    'unbalance_keep_examples',
    None,
    'emnist_unbalanced_*: examples an affected, surviving client keeps.',
    lower_bound=1,
  ),
  'unbalance_calibrate': flags.DEFINE_bool(
    'unbalance_calibrate',
    None,
    'emnist_unbalanced_*: recalibrate the preset on the real client sizes.',
  ),
}
# Float flags need validators: absl's bounds let NaN through. `dirichlet_alpha` is
# checked by the task (finite, > 0), whose error names it.
flag_checks.check_number('availability_beta', low=0.0, high=1.0)
flag_checks.check_number('size_sigma', low=0.0)
flag_checks.check_number('eval_fraction', low=0.0, high=1.0, low_open=True, high_open=True)
flag_checks.check_number('synthetic_alpha', low=0.0)
flag_checks.check_number('synthetic_beta', low=0.0)
flag_checks.check_number('unbalance_removal_probability', low=0.0, high=1.0)
flag_checks.check_number('deadline_seconds', low=0.0, low_open=True, hint='simulated seconds')
flag_checks.check_number('dropout', low=0.0, high=1.0, high_open=True, hint='a probability')
flag_checks.check_number(
  'client_learning_rate_decay',
  low=0.0,
  high=1.0,
  low_open=True,
  hint='the factor a round, e.g. 0.998',
)
flag_checks.check_int_list('mlp_hidden')
flag_checks.check_int_list('size_group_clients', example='10,20')
flag_checks.check_int_list('size_group_examples', example='100,500')
_INT_LIST_OPTIONS = ('mlp_hidden', 'size_group_clients', 'size_group_examples')


def _option_flags() -> dict[str, flags.FlagHolder]:
  """Task option -> the flag that sets it."""
  return {
    'cache_dir': cf.CACHE_DIR,
    **_TASK_OPTION_FLAGS,
    'seed': cf.DATA_SEED,
    'client_batch_size': cf.CLIENT_BATCH_SIZE,
  }


def task_options_from_flags() -> dict[str, Any]:
  """The task options set on the command line (unset task flags are left out).

  Raises:
    ValueError: If a flag that was set does not apply to ``--task``; the message
      names the flag, the tasks it applies to, and the flags of this task.
  """
  task = TASK.value
  valid = set(tasks.task_options(task))
  options: dict[str, Any] = {'client_epochs': cf.CLIENT_EPOCHS.value}
  for option, holder in _option_flags().items():
    if holder.value is None:
      continue
    if option not in valid:
      owners = [t for t in tasks.task_names() if option in tasks.task_options(t)]
      own_flags = sorted(f'--{h.name}' for o, h in _option_flags().items() if o in valid)
      raise ValueError(
        f'--{holder.name} does not apply to --task={task} (it applies to: '
        f'{", ".join(owners)}); the flags of task {task!r} are {", ".join(own_flags)}.'
      )
    value = holder.value
    if option in _INT_LIST_OPTIONS:
      value = flag_checks.int_list(holder.name, value)
    options[option] = value
  return options


def check_flags() -> None:
  """The checks of the task and availability flags that need no data (`bin.binary_flags`).

  Raises:
    ValueError: As `task_options_from_flags` and `availability_specs`.
  """
  task_options_from_flags()
  availability_specs()


def task_from_flags() -> Task:
  """Builds the task from ``--task`` and the task flags (see `task_options_from_flags`)."""
  return tasks.get_task(TASK.value, **task_options_from_flags())


def apply_task_defaults(defaults: Mapping[str, Mapping[str, Any]]) -> None:
  """Makes ``defaults[--task]`` (flag -> value) the flags' defaults, if there are any."""
  cf.apply_defaults(defaults.get(TASK.value, {}))


def parse_availability(spec: str) -> comparisons.AvailabilitySpec:
  """Parses ``MODE`` or ``MODE-β``; β defaults to ``--availability_beta`` or the paper's."""
  return comparisons.parse_availability(
    spec, beta=AVAILABILITY_BETA.value, period=AVAILABILITY_PERIOD.value
  )


def availability_specs() -> list[comparisons.AvailabilitySpec]:
  """Every ``--availability`` setting, parsed (see `parse_availability`)."""
  if not AVAILABILITY.value:
    raise ValueError('--availability is empty; give a mode such as IDL or LN-0.5.')
  return [parse_availability(spec) for spec in AVAILABILITY.value]


def availability_spec() -> comparisons.AvailabilitySpec:
  """The single ``--availability`` setting of a binary that runs one.

  Raises:
    ValueError: If several modes are given.
  """
  specs = availability_specs()
  if len(specs) != 1:
    raise ValueError(
      f'This binary runs one availability mode, got --availability='
      f'{",".join(AVAILABILITY.value)}; give one, or compare modes with bin.fedgs.'
    )
  return specs[0]


def refuse_devices(instead: str) -> None:
  """Raises ValueError if a device flag (``--devices`` and its settings) is set: the binary's
  plain TFF processes with optimal uploads say only how many clients uploaded, so a simulated
  round cannot time the uploads. `instead` names the command to run instead. (A check in
  `main`, not a flag validator: the flags are shared with binaries that take devices.)"""
  given = [
    f'--{holder.name}={holder.value}'
    for holder in (DEVICES, DEVICE_TARGET, DEADLINE_SECONDS, DROPOUT)
    if holder.value != holder.default
  ]
  if given:
    raise ValueError(
      f'{", ".join(given)}: this binary cannot simulate devices, as its processes report only '
      f"how many clients uploaded, so a round's uploads cannot be timed; run {instead} "
      'instead (docs/devices.md).'
    )


def device_spec() -> comparisons.DeviceSpec:
  """The clients' devices of the flags (``--devices`` and its settings)."""
  return comparisons.DeviceSpec(
    DEVICES.value, DEVICE_TARGET.value, DEADLINE_SECONDS.value, DROPOUT.value
  )


def run_settings() -> comparisons.ComparisonSettings:
  """The `ComparisonSettings` of the flags."""
  return cf.run_settings(
    devices=device_spec(),
    client_steps=CLIENT_STEPS.value,
    workers=tuple(WORKERS.value),
    local_workers=LOCAL_WORKERS.value,
    clients_per_call=CLIENTS_PER_CALL.value,
    client_learning_rate_decay=CLIENT_LEARNING_RATE_DECAY.value,
  )


def comparison(
  methods: Sequence[str], num_seeds: int, availability: comparisons.AvailabilitySpec | None = None
) -> comparisons.Comparison:
  """The sweep of `methods`: runs ``<name>[_<MODE-β>]_<method>_seed<seed>``, with
  ``<name>`` = ``--experiment_name`` if given, else the task."""
  return cf.comparison(methods, num_seeds, TASK.value, availability and availability.label)
