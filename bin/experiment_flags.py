"""Flags shared by the experiment binaries, and their conversion to typed config.

Importing this module defines the flags (at module level, once per process).
Task options are flags too: each defaults to ``None`` ("the task's default"),
and setting one that the chosen task does not accept is an error naming the
task that does (see `tasks.get_task`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from absl import app
from absl import flags
from absl import logging
import tensorflow_federated as tff

from bin import flag_checks
import tasks
from tff_sampling import availability as availability_lib
from tff_sampling import communication
from tff_sampling import program
from tff_sampling import results
from tff_sampling import run_dir
from tff_sampling import runtime
from tff_sampling import samplers

# --- The experiment -----------------------------------------------------------
TASK = flags.DEFINE_enum('task', 'digits', list(tasks.task_names()), 'The task.')
ROUNDS = flags.DEFINE_integer('rounds', 20, 'Training rounds.', lower_bound=1)
CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 10, 'Cohort size: clients drawn per round.', lower_bound=1)
CLIENT_LEARNING_RATE = flags.DEFINE_float(
    'client_learning_rate', 0.1, 'Client SGD learning rate (finite, > 0).')
SERVER_LEARNING_RATE = flags.DEFINE_float(
    'server_learning_rate', 1.0, 'Server SGD learning rate (finite, > 0).')
CLIENT_EPOCHS = flags.DEFINE_integer(
    'client_epochs', 1, 'Local epochs per round.', lower_bound=1)
CLIENT_STEPS = flags.DEFINE_integer(
    'client_steps', None,
    'If set, every client takes exactly this many local batches per round (its stream '
    'cycled and cut) instead of --client_epochs passes.', lower_bound=1)
CLIENT_BATCH_SIZE = flags.DEFINE_integer(
    'client_batch_size', None, "Local batch size (default: the task's).", lower_bound=1)
EVAL_EVERY = flags.DEFINE_integer(
    'eval_every', 1, 'Evaluate every this many rounds (and at the end).', lower_bound=1)
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 1, 'Save program state every this many rounds.', lower_bound=1)
SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of the cohorts, client data order and initial model.', lower_bound=0,
    upper_bound=2**32 - 1)
ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', '/tmp/tff_sampling', 'Root directory of results.')
EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None,
    'Sub-directory of --root_output_dir for this run (default: derived from '
    'the task, method and seed). An existing run there is resumed. Binaries that '
    'compare methods use it as the prefix of <prefix>_<method>_seed<seed>.')
RESET = flags.DEFINE_bool(
    'reset', False,
    'Start over: delete this run\'s earlier output first (only a directory this project '
    'created for a run, which carries a .tff_sampling_run marker). Without it an existing run '
    'is resumed from its newest intact checkpoint.')
WORKERS = flags.DEFINE_list(
    'workers', [],
    'host:port of running TFF workers (`worker_binary --port=PORT`); each round\'s clients are '
    'split over them. Results equal a one-process run up to float summation order.')
LOCAL_WORKERS = flags.DEFINE_integer(
    'local_workers', 0,
    'Start this many TFF workers on this machine (loopback ports) and split each round\'s '
    'clients over them; 0: one process.', lower_bound=0)
CLIENTS_PER_CALL = flags.DEFINE_integer(
    'clients_per_call', None,
    'With --workers or --local_workers: cut each round into slices of at most this many '
    'clients, run in turn (bounds a worker\'s memory for large cohorts).', lower_bound=1)

# --- Client availability (FedGS §3c) ------------------------------------------
# The paper's β per mode (docs/algorithms.md §3c).
PAPER_AVAILABILITY_BETA = {'IDL': 0.0, 'LN': 0.5, 'SLN': 0.5, 'LDF': 0.7, 'MDF': 0.7,
                           'YMF': 0.9, 'YC': 0.9, 'HOMO': 0.5}
AVAILABILITY = flags.DEFINE_list(
    'availability', ['IDL'],
    'Which clients are active each round: MODE or MODE-β, e.g. LN or LN-0.5 (IDL: '
    f'everyone), of {", ".join(availability_lib.AVAILABILITY_MODES)}; every sampler '
    'selects among them. bin.fedgs takes a comma-separated list; other binaries one.')
AVAILABILITY_BETA = flags.DEFINE_float(
    'availability_beta', None,
    "β of a mode given without one, in [0, 1] (default: the paper's β for the mode).")
AVAILABILITY_PERIOD = flags.DEFINE_integer(
    'availability_period', availability_lib.DEFAULT_PERIOD, 'Period T of the YC and SLN modes.',
    lower_bound=1)

# --- Task options (None = the task's default) ---------------------------------
DATA_SEED = flags.DEFINE_integer(
    'data_seed', None, 'Seed of generated/partitioned task data (task option seed).',
    lower_bound=0, upper_bound=2**32 - 1)
_TASK_OPTION_FLAGS = {
    'cache_dir': flags.DEFINE_string(
        'cache_dir', None, 'Directory of the TFF dataset SQLite caches.'),
    'max_client_examples': flags.DEFINE_integer(
        'max_client_examples', None, 'Cap on examples per client per epoch.', lower_bound=1),
    'eval_batch_size': flags.DEFINE_integer(
        'eval_batch_size', None, 'Evaluation batch size.', lower_bound=1),
    'max_eval_examples': flags.DEFINE_integer(
        'max_eval_examples', None, 'Cap on evaluation examples.', lower_bound=1),
    'num_clients': flags.DEFINE_integer(
        'num_clients', None, 'Clients of a generated task.', lower_bound=1),
    'dirichlet_alpha': flags.DEFINE_float(
        'dirichlet_alpha', None, 'digits, cifar10: Dirichlet label-skew concentration.'),
    'size_sigma': flags.DEFINE_float(
        'size_sigma', None, 'digits: log-normal sigma of client sizes.'),
    'eval_fraction': flags.DEFINE_float(
        'eval_fraction', None, 'Fraction of generated data held out for evaluation.'),
    'preset': flags.DEFINE_string(
        'preset', None, "digits: 'default', 'unbalanced', 'shards' (one digit per client) or "
        "'two_labels' (two digits per client, equal sizes)."),
    'model': flags.DEFINE_string('model', None, 'Model variant of the task.'),
    'mlp_hidden': flags.DEFINE_list('mlp_hidden', None, 'digits: hidden layer widths.'),
    'alpha': flags.DEFINE_float('synthetic_alpha', None, 'synthetic: alpha of Synthetic(alpha, beta).'),
    'beta': flags.DEFINE_float('synthetic_beta', None, 'synthetic: beta of Synthetic(alpha, beta).'),
    'min_client_size': flags.DEFINE_integer(
        'min_client_size', None, 'synthetic: smallest client.', lower_bound=2),
    'max_client_size': flags.DEFINE_integer(
        'max_client_size', None, 'synthetic: largest client.', lower_bound=2),
    'only_digits': flags.DEFINE_bool(
        'only_digits', None, 'emnist: 10 digit classes (True) or all 62 (False).'),
    'sequence_length': flags.DEFINE_integer(
        'sequence_length', None, 'shakespeare: characters per sequence.', lower_bound=1),
    'crop_size': flags.DEFINE_integer('crop_size', None, 'cifar100: crop size.', lower_bound=1,
                                      upper_bound=32),
    'distort_images': flags.DEFINE_bool('distort_images', None, 'cifar100: random crop/flip.'),
    'data_dir': flags.DEFINE_string(
        'tfds_data_dir', None, 'cifar10: TFDS data directory holding the prepared cifar10.'),
    'size_profile': flags.DEFINE_enum(
        'size_profile', None, ['fraboni', 'balanced'], 'cifar10: client size profile.'),
    'size_group_clients': flags.DEFINE_list(
        'size_group_clients', None, 'cifar10: clients per size group (overrides the profile).'),
    'size_group_examples': flags.DEFINE_list(
        'size_group_examples', None, 'cifar10: examples per client of each size group.'),
    'unbalance_seed': flags.DEFINE_integer(
        'unbalance_seed', None, 'emnist_unbalanced_*: seed of the unbalancing.',
        lower_bound=0, upper_bound=2**32 - 1),
    'unbalance_lower': flags.DEFINE_integer(
        'unbalance_lower', None, 'emnist_unbalanced_*: smallest affected client size.',
        lower_bound=0),
    'unbalance_upper': flags.DEFINE_integer(
        'unbalance_upper', None, 'emnist_unbalanced_*: largest affected client size.',
        lower_bound=0),
    'unbalance_removal_probability': flags.DEFINE_float(
        'unbalance_removal_probability', None,
        'emnist_unbalanced_*: probability that an affected client is removed.'),
    'unbalance_keep_examples': flags.DEFINE_integer(
        'unbalance_keep_examples', None,
        'emnist_unbalanced_*: examples an affected, surviving client keeps.', lower_bound=1),
    'unbalance_calibrate': flags.DEFINE_bool(
        'unbalance_calibrate', None,
        'emnist_unbalanced_*: recalibrate the preset on the real client sizes.'),
}
# Float flags need validators: absl's bounds let NaN through. `dirichlet_alpha` is
# checked by the task (finite, > 0), whose error names it.
flag_checks.check_learning_rate('client_learning_rate')
flag_checks.check_learning_rate('server_learning_rate')
flag_checks.check_number('availability_beta', low=0.0, high=1.0)
flag_checks.check_number('size_sigma', low=0.0)
flag_checks.check_number('eval_fraction', low=0.0, high=1.0, low_open=True, high_open=True)
flag_checks.check_number('synthetic_alpha', low=0.0)
flag_checks.check_number('synthetic_beta', low=0.0)
flag_checks.check_number('unbalance_removal_probability', low=0.0, high=1.0)
flag_checks.check_int_list('mlp_hidden')
flag_checks.check_int_list('size_group_clients', example='10,20')
flag_checks.check_int_list('size_group_examples', example='100,500')


def _option_flags() -> dict[str, flags.FlagHolder]:
  """Task option -> the flag that sets it."""
  return {**_TASK_OPTION_FLAGS, 'seed': DATA_SEED, 'client_batch_size': CLIENT_BATCH_SIZE}


def task_options_from_flags() -> dict[str, Any]:
  """The task options set on the command line (unset task flags are left out).

  Raises:
    ValueError: If a flag that was set does not apply to ``--task``; the message
      names the flag, the tasks it applies to, and the flags of this task.
  """
  task = TASK.value
  valid = set(tasks.task_options(task))
  options: dict[str, Any] = {'client_epochs': CLIENT_EPOCHS.value}
  for option, holder in _option_flags().items():
    if holder.value is None:
      continue
    if option not in valid:
      owners = [t for t in tasks.task_names() if option in tasks.task_options(t)]
      own_flags = sorted(f'--{h.name}' for o, h in _option_flags().items() if o in valid)
      raise ValueError(
          f'--{holder.name} does not apply to --task={task} (it applies to: '
          f'{", ".join(owners)}); the flags of task {task!r} are {", ".join(own_flags)}.')
    value = holder.value
    if option in ('mlp_hidden', 'size_group_clients', 'size_group_examples'):
      value = flag_checks.int_list(holder.name, value)
    options[option] = value
  return options


def begin_main(argv: Sequence[str]) -> float:
  """A binary's first step: rejects extra arguments, quiets library logs.

  Returns:
    The start time (`time.monotonic`).

  Raises:
    app.UsageError: For positional arguments.
  """
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  runtime.quiet_library_logs()
  return time.monotonic()


def check_choices(flag: str, values: Sequence[str], choices: Sequence[str]) -> None:
  """Raises a ValueError naming the values of ``--flag`` that are not `choices`."""
  unknown = [v for v in values if v not in choices]
  if unknown:
    raise ValueError(f'Unknown --{flag} {unknown}; choose from {", ".join(choices)}.')


def apply_defaults(defaults: Mapping[str, Any]) -> None:
  """Sets every flag in `defaults` that the user did not give to its value there."""
  for name, value in defaults.items():
    flag = flags.FLAGS[name]
    if not flag.present:
      flag.value = value


def task_from_flags() -> tasks.Task:
  """Builds the task from ``--task`` and the task flags (see `task_options_from_flags`)."""
  return tasks.get_task(TASK.value, **task_options_from_flags())


def experiment_hparams(task: tasks.Task, availability: AvailabilitySpec | None = None,
                       **method: Any) -> dict[str, Any]:
  """The run's hyper-parameters: common flags, `availability` (default: the flags'),
  `method` and the task's options."""
  hparams: dict[str, Any] = dict(
      task=TASK.value,
      rounds=ROUNDS.value,
      clients_per_round=CLIENTS_PER_ROUND.value,
      client_learning_rate=CLIENT_LEARNING_RATE.value,
      client_steps=CLIENT_STEPS.value,
      server_learning_rate=SERVER_LEARNING_RATE.value,
      eval_every=EVAL_EVERY.value,
      checkpoint_every=CHECKPOINT_EVERY.value,
      seed=SEED.value,
      root_output_dir=ROOT_OUTPUT_DIR.value,
  )
  spec = availability or availability_spec()
  hparams.update(availability=spec.mode, availability_beta=spec.beta,
                 availability_period=spec.period)
  hparams.update(method)
  hparams.update({f'task.{k}': v for k, v in task.options.items()})
  return hparams


class AvailabilitySpec(NamedTuple):
  """One availability setting: mode, β and period."""

  mode: str
  beta: float
  period: int

  @property
  def label(self) -> str:
    """``'IDL'`` or ``'MODE-β'``, e.g. ``'LN-0.5'`` (names runs and table rows)."""
    return 'IDL' if self.mode == 'IDL' else f'{self.mode}-{self.beta:g}'


def parse_availability(spec: str) -> AvailabilitySpec:
  """Parses ``MODE`` or ``MODE-β``; β defaults to ``--availability_beta`` or the paper's.

  Raises:
    ValueError: For an unknown mode, an unparsable β, or β given twice.
  """
  mode, _, beta_text = spec.strip().partition('-')
  mode = mode.upper()
  if mode not in availability_lib.AVAILABILITY_MODES:
    raise ValueError(f'Unknown --availability mode {mode!r} in {spec!r}; choose from '
                     f'{", ".join(availability_lib.AVAILABILITY_MODES)} (optionally MODE-β).')
  if beta_text:
    try:
      beta = float(beta_text)
    except ValueError:
      raise ValueError(f'--availability {spec!r}: β {beta_text!r} is not a number; '
                       'write e.g. LN-0.5.') from None
    if AVAILABILITY_BETA.value is not None:
      raise ValueError(f'--availability {spec!r} sets β and so does --availability_beta='
                       f'{AVAILABILITY_BETA.value}; give it once.')
  elif AVAILABILITY_BETA.value is not None:
    beta = AVAILABILITY_BETA.value
  else:
    beta = PAPER_AVAILABILITY_BETA[mode]
  return AvailabilitySpec(mode, beta, AVAILABILITY_PERIOD.value)


def availability_specs() -> list[AvailabilitySpec]:
  """Every ``--availability`` setting, parsed (see `parse_availability`)."""
  if not AVAILABILITY.value:
    raise ValueError('--availability is empty; give a mode such as IDL or LN-0.5.')
  return [parse_availability(spec) for spec in AVAILABILITY.value]


def availability_spec() -> AvailabilitySpec:
  """The single ``--availability`` setting of a binary that runs one.

  Raises:
    ValueError: If several modes are given.
  """
  specs = availability_specs()
  if len(specs) != 1:
    raise ValueError(f'This binary runs one availability mode, got --availability='
                     f'{",".join(AVAILABILITY.value)}; give one, or compare modes with bin.fedgs.')
  return specs[0]


def availability_from_flags(task: tasks.Task, seed: int,
                            spec: AvailabilitySpec | None = None
                            ) -> availability_lib.Availability | None:
  """The availability model of `spec` (default: the flags') for `task`; ``None`` for IDL."""
  spec = spec or availability_spec()
  if spec.mode == 'IDL':
    return None
  return availability_lib.build_availability(
      spec.mode, spec.beta, client_sizes=task.client_num_examples,
      client_labels=task.client_label_histograms, seed=seed, period=spec.period)


def worker_options() -> dict[str, Any]:
  """`ProgramConfig`'s ``workers``, ``local_workers`` and ``clients_per_call``."""
  return dict(workers=tuple(WORKERS.value), local_workers=LOCAL_WORKERS.value,
              clients_per_call=CLIENTS_PER_CALL.value)


def run_directory(name: str) -> str:
  """``--root_output_dir/name`` for a valid run name; emptied first under ``--reset``.

  Raises:
    ValueError: For a name that is not a plain directory name, or a directory
      to reset that this project did not create.
  """
  path = run_dir.run_path(ROOT_OUTPUT_DIR.value, name)
  if RESET.value and run_dir.remove_run(path):
    logging.info('--reset: deleted the earlier run in %s.', path)
  return path


def program_config(hparams: dict[str, Any], default_name: str) -> program.ProgramConfig:
  """The `ProgramConfig` of this run; also records `experiment_name` in hparams."""
  name = EXPERIMENT_NAME.value or default_name
  hparams['experiment_name'] = name
  return program.ProgramConfig(
      output_dir=run_directory(name),
      rounds=ROUNDS.value,
      seed=SEED.value,
      client_steps=CLIENT_STEPS.value,
      eval_every=EVAL_EVERY.value,
      checkpoint_every=CHECKPOINT_EVERY.value,
      hparams=hparams,
      **worker_options())


def run_with_uniform_cohorts(
    method: Mapping[str, Any],
    default_name: str,
    make_process: Callable[[tasks.Task], tff.learning.templates.LearningProcess],
    *,
    uplink_fn: program.UplinkFn = communication.full_cohort_uplink,
) -> program.ExperimentResult:
  """Runs the flags' experiment with uniformly drawn cohorts and logs the outcome.

  Builds the task, checks the cohort size against the population before any
  TFF work, and exits with a one-line error naming the problem for bad input
  (flags, missing data, a non-finite model).

  Args:
    method: The method's hyper-parameters (recorded in ``hparams.json``).
    default_name: The run directory name when ``--experiment_name`` is unset.
    make_process: Builds the learning process for the task.
    uplink_fn: Counts each round's uploads (see `program.run_experiment`).
  """
  try:
    task = task_from_flags()
    config = program_config(experiment_hparams(task, **method), default_name)
    sampler = samplers.UniformSampler(CLIENTS_PER_ROUND.value, seed=SEED.value)
    sampler.initialize(samplers.Population(task.client_num_examples))  # Fail fast.
    result = program.run_experiment(task, make_process(task), sampler, config,
                                    uplink_fn=uplink_fn,
                                    availability=availability_from_flags(task, SEED.value))
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')
  logging.info('Finished round %d: %s; uploaded %.4g bits; results in %s',
               result.final_round, dict(result.eval_metrics), result.cumulative_bits,
               config.output_dir)
  return result


def comparison_run_name(method: str, seed: int,
                        availability: AvailabilitySpec | None = None) -> str:
  """``<name>[_<MODE-β>]_<method>_seed<seed>``: a `run_comparison` run's directory
  name, with ``<name>`` = ``--experiment_name`` if given, else the task."""
  name = EXPERIMENT_NAME.value or TASK.value
  prefix = name if availability is None else f'{name}_{availability.label}'
  return f'{prefix}_{method}_seed{seed}'


def load_comparison(methods: Sequence[str], num_seeds: int,
                    availability: AvailabilitySpec | None = None
                    ) -> dict[str, list[results.Run]]:
  """The runs `run_comparison` would write, read from ``--root_output_dir``.

  Raises:
    FileNotFoundError: If one of them is missing.
  """
  return {method: [results.load_run(run_dir.run_path(
      ROOT_OUTPUT_DIR.value, comparison_run_name(method, seed, availability)))
                   for seed in range(SEED.value, SEED.value + num_seeds)]
          for method in methods}


def run_comparison(
    task: tasks.Task,
    methods: Sequence[str],
    num_seeds: int,
    *,
    make_process: Callable[[str, int], tff.learning.templates.LearningProcess],
    make_sampler: Callable[[str, int], samplers.Sampler],
    method_hparams: Callable[[str], Mapping[str, Any]],
    uplink_fn: program.UplinkFn = communication.full_cohort_uplink,
    availability: AvailabilitySpec | None = None,
    preprocessing_bits: Callable[[str, int], communication.PreprocessingBits | None]
    | None = None,
) -> dict[str, list[results.Run]]:
  """Runs every method for seeds ``--seed … --seed + num_seeds − 1``; returns the runs.

  Each run goes to ``<root_output_dir>/<task>_<method>_seed<seed>`` (with
  ``_<MODE-β>`` after the task when `availability` is given) and resumes there
  like any run (``--reset`` starts it over). `availability` defaults to the flag's
  single mode. `preprocessing_bits(method, seed)`, if given, is called after
  ``make_sampler(method, seed)`` (which may do the pre-processing) and its
  result passed to `program.run_experiment`. Raises like
  `program.run_experiment`.
  """
  groups: dict[str, list[results.Run]] = {}
  for method in methods:
    for seed in range(SEED.value, SEED.value + num_seeds):
      name = comparison_run_name(method, seed, availability)
      output_dir = run_directory(name)
      hparams = experiment_hparams(task, availability, **method_hparams(method))
      hparams.update(seed=seed, experiment_name=name)
      config = program.ProgramConfig(
          output_dir=output_dir, rounds=ROUNDS.value, seed=seed, hparams=hparams,
          client_steps=CLIENT_STEPS.value, eval_every=EVAL_EVERY.value,
          checkpoint_every=CHECKPOINT_EVERY.value, **worker_options())
      sampler = make_sampler(method, seed)
      program.run_experiment(
          task, make_process(method, seed), sampler, config, uplink_fn=uplink_fn,
          availability=availability_from_flags(task, seed, availability),
          preprocessing_bits=preprocessing_bits and preprocessing_bits(method, seed))
      groups.setdefault(method, []).append(results.load_run(output_dir))
  return groups


def _check_experiment_name(name: str | None) -> bool:
  if name is not None:
    try:
      run_dir.check_run_name(name)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from None
  return True


flags.register_validator('experiment_name', _check_experiment_name)
