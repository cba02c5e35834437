"""Flags of every experiment binary, and the hyper-parameters a run records from flags.

Importing this module defines the flags shared by ``bin.mmfl`` and the
single-model binaries (`bin.experiment_flags` adds theirs); a binary changes a
default with ``flags.FLAGS.set_default``. `recorded_hparams` records every flag
that our binaries define except `IRRELEVANT_FLAGS`, so a flag added to a binary
is recorded, and checked on resume, without further code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
import contextlib
import os
import sys
import time
from typing import Any

from absl import app
from absl import flags

import bin
from bin import flag_checks
from tff_sampling import comparisons
from tff_sampling.runtime import run_dir
from tff_sampling.runtime import tff_context

ROUNDS = flags.DEFINE_integer('rounds', 20, 'Training rounds.', lower_bound=1)
SEED = flags.DEFINE_integer(
  'seed',
  0,
  'Seed of the cohorts, client data order and initial model (of a comparison: the first seed).',
  lower_bound=0,
  upper_bound=2**32 - 1,
)
DATA_SEED = flags.DEFINE_integer(
  'data_seed',
  None,
  "Seed of generated/partitioned task data (default: the task's).",
  lower_bound=0,
  upper_bound=2**32 - 1,
)
CLIENT_LEARNING_RATE = flags.DEFINE_float(
  'client_learning_rate', 0.1, 'Client SGD learning rate (finite, > 0).'
)
SERVER_LEARNING_RATE = flags.DEFINE_float(
  'server_learning_rate', 1.0, 'Server SGD learning rate (finite, > 0).'
)
CLIENT_EPOCHS = flags.DEFINE_integer('client_epochs', 1, 'Local epochs per round.', lower_bound=1)
CLIENT_BATCH_SIZE = flags.DEFINE_integer(
  'client_batch_size', None, "Local batch size (default: the task's).", lower_bound=1
)
CACHE_DIR = flags.DEFINE_string('cache_dir', None, 'Directory of the TFF dataset SQLite caches.')
EVAL_EVERY = flags.DEFINE_integer(
  'eval_every', 1, 'Evaluate every this many rounds (and at the end).', lower_bound=1
)
CHECKPOINT_EVERY = flags.DEFINE_integer(
  'checkpoint_every', 1, 'Save program state every this many rounds.', lower_bound=1
)
ROOT_OUTPUT_DIR = flags.DEFINE_string(
  'root_output_dir', '/tmp/tff_sampling', 'Root directory of results.'
)
EXPERIMENT_NAME = flags.DEFINE_string(
  'experiment_name',
  None,
  'Sub-directory of --root_output_dir for this run (default: derived from '
  'the task, method and seed). An existing run there is resumed. Binaries that '
  'compare methods use it as the prefix of <prefix>_<method>_seed<seed>.',
)
RESET = flags.DEFINE_bool(
  'reset',
  False,
  "Start over: delete this run's earlier output first (only a directory this project "
  'created for a run, which carries a .tff_sampling_run marker). Without it an existing run '
  'is resumed from its newest intact checkpoint.',
)
flag_checks.check_learning_rate('client_learning_rate')
flag_checks.check_learning_rate('server_learning_rate')

# Flags that do not change a run's results, so a run does not record them (it
# records its own directory: `comparisons.run_hparams`), and a resume may change them.
IRRELEVANT_FLAGS = frozenset(
  {
    'root_output_dir',
    'experiment_name',  # Where the run is.
    'reset',
    'report_only',  # Whether to (re)run, not what.
    'workers',
    'local_workers',
    'clients_per_call',  # Equal results up to summation order.
    'seeds',
    'methods',  # Which runs a sweep has; each records its seed and method.
    'target_accuracy',  # Printed tables only.
    'verbose',  # What is logged.
  }
)
_BIN_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_ours(module_name: str) -> bool:
  """Whether flags of `module_name` are ours (``python -m bin.x`` registers x's by path)."""
  if module_name.endswith('.py'):
    return os.path.dirname(os.path.abspath(module_name)) == _BIN_DIR
  return module_name.split('.')[0] == 'bin'


def recorded_flags() -> list[flags.Flag]:
  """The flags our binaries defined in the current registry, bar `IRRELEVANT_FLAGS`, by name."""
  found = {
    flag.name: flag
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
    if _is_ours(module)
    for flag in module_flags
    if flag.name in flags.FLAGS and flags.FLAGS[flag.name] is flag
  }
  return [found[name] for name in sorted(found) if name not in IRRELEVANT_FLAGS]


def recorded_hparams() -> dict[str, Any]:
  """``{flag: value}`` of every flag that changes a run's results."""
  return {flag.name: flag.value for flag in recorded_flags()}


def run_settings(**single_model: Any) -> comparisons.ComparisonSettings:
  """The `ComparisonSettings` of these flags; `single_model`: `bin.experiment_flags`' fields."""
  return comparisons.ComparisonSettings(
    root_output_dir=ROOT_OUTPUT_DIR.value,
    rounds=ROUNDS.value,
    eval_every=EVAL_EVERY.value,
    checkpoint_every=CHECKPOINT_EVERY.value,
    reset=RESET.value,
    hparams=recorded_hparams(),
    defaults={flag.name: flag.default for flag in recorded_flags()},
    **single_model,
  )


def comparison(
  methods: Sequence[str], num_seeds: int, default_name: str, label: str | None = None
) -> comparisons.Comparison:
  """The sweep of `methods` from ``--seed``: runs ``<name>[_<label>]_<method>_seed<seed>``,
  with ``<name>`` = ``--experiment_name`` if given, else `default_name`."""
  name = EXPERIMENT_NAME.value or default_name
  return comparisons.Comparison(
    name if label is None else f'{name}_{label}', tuple(methods), SEED.value, num_seeds
  )


def define_seeds(default: int = 1) -> flags.FlagHolder[int]:
  """Defines ``--seeds`` of a binary that compares methods over seeds."""
  return flags.DEFINE_integer(
    'seeds', default, 'Runs per method (seeds seed..seed+seeds-1).', lower_bound=1
  )


def begin_main(argv: Sequence[str]) -> float:
  """A binary's first step: rejects extra arguments, quiets logs (unless ``--verbose``).

  Returns:
    The start time (`time.monotonic`).

  Raises:
    app.UsageError: For positional arguments.
  """
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not bin.VERBOSE.value:
    tff_context.quiet_library_logs()
    tff_context.plain_log_lines()
  return time.monotonic()


@contextlib.contextmanager
def exit_on_bad_input() -> Iterator[None]:
  """Ends the process with one line, ``Error: …``, for bad input (flags, data, divergence)."""
  try:
    yield
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    sys.exit(f'Error: {e}')


def apply_defaults(defaults: Mapping[str, Any]) -> None:
  """Makes each value in `defaults` its flag's default (which a given flag overrides)."""
  for name, value in defaults.items():
    flags.FLAGS.set_default(name, value)


def _check_experiment_name(name: str | None) -> bool:
  if name is not None:
    try:
      run_dir.check_run_name(name)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from None
  return True


flags.register_validator('experiment_name', _check_experiment_name)
