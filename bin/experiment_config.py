"""An experiment's configuration file: an absl flagfile read into an `ExperimentSpec`.

One file per experiment, ``docs/experiments/<name>/experiment.flags``, holds
every setting before anything runs: the experiment's own flags below (methods,
learning-rate grid, tuning seed, reported seeds, ``final_k``, targets, baseline,
claims) and, after them, the training binary's flags, passed to it unchanged::

    --binary=demo
    --methods=optimal,uniform,full
    --baseline=uniform
    --learning_rates=0.2,0.1,0.05,0.025,0.0125    # or optimal:0.1,uniform:0.05,full:0.1
    --tuning_seed=100
    --seeds=5
    --final_k=3
    --targets=0.4,0.6
    --claims=optimal>uniform:final,optimal<full:bits_to_0.6
    # the binary's flags
    --task=emnist_unbalanced_1
    --rounds=150

`load` reads it with absl's own flagfile reader into a private flag registry
(the binary's flags are the ones this registry does not know), so the file
never touches the global flags of the program reading it.
"""

from __future__ import annotations

from collections.abc import Sequence
import glob
import os
import shlex
import sys

from absl import flags

from tff_sampling.analysis import benchmark_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import family_report
from tff_sampling.analysis import raw_metrics
from tff_sampling.runtime import results

CONFIG_FILENAME = 'experiment.flags'
# Training binary -> its flag selecting the methods.
BINARIES = {
  'benchmark': 'sampling',
  'demo': 'methods',
  'clustered_sampling': 'sampling',
  'fedgs': 'sampling',
  'lefl': 'sampling',
  'mmfl': 'sampling',
}
# Flags the driver sets per run; the file must leave them out.
DRIVER_FLAGS = (
  'seed',
  'seeds',
  'client_learning_rate',
  'root_output_dir',
  'reset',
  'cache_dir',
  'experiment_name',
)


def _registry() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_enum('binary', None, list(BINARIES), 'Training binary bin.<binary>.', flag_values=fv)
  flags.DEFINE_string('title', None, "The report's heading.", flag_values=fv)
  flags.DEFINE_list('methods', None, 'Methods compared.', flag_values=fv)
  flags.DEFINE_string('baseline', None, 'The method the others are compared with.', flag_values=fv)
  flags.DEFINE_list(
    'learning_rates',
    None,
    'Client learning-rate grid (one value: no tuning), or one fixed rate per method as '
    '<method>:<rate>,... (no tuning; e.g. the rates another experiment tuned).',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'learning_rates_from',
    None,
    "Instead of --learning_rates: every method's rate as chosen by the tuning of this sibling "
    'experiment (docs/experiments/<name>), e.g. the same task under full availability; '
    "<name>:<method> gives every method that one method's rate.",
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'extend_grid',
    0,
    "Rates a method's tuning may add past the grid's edge when its best rate is there, one at "
    'a time at the ratio of the last two (e.g. 0.0033 past 0.03, 0.01).',
    flag_values=fv,
  )
  flags.DEFINE_integer('tuning_seed', 100, 'Seed of the tuning runs.', flag_values=fv)
  flags.DEFINE_integer('seeds', 5, 'Reported seeds 0..seeds-1.', flag_values=fv)
  flags.DEFINE_integer(
    'extended_seeds',
    0,
    'A sequential extension, fixed before its runs: seeds seeds..extended_seeds-1 are trained '
    'too, and the report gives every verdict at --seeds and again at --extended_seeds '
    '(0: none).',
    flag_values=fv,
  )
  flags.DEFINE_integer(
    'final_k', 3, 'Final accuracy: mean of the last k evaluations.', flag_values=fv
  )
  flags.DEFINE_enum(
    'tune_on',
    'final',
    list(evidence_spec.TUNE_ON),
    "What chooses a method's rate on the tuning seed: the highest final accuracy, or the lowest "
    'evaluation loss (best_loss; for claims on the loss).',
    flag_values=fv,
  )
  flags.DEFINE_list('targets', [], 'Accuracy targets.', flag_values=fv)
  flags.DEFINE_list(
    'claims', [], 'Claims <method><op><baseline>:<metric>[@margin].', flag_values=fv
  )
  flags.DEFINE_string(
    'method_flag',
    None,
    "The binary's flag the driver sets to each method (default: the binary's method flag, "
    'e.g. --sampling; --method_flag=alpha compares values of --alpha).',
    flag_values=fv,
  )
  flags.DEFINE_string(
    'label_key',
    None,
    "Hyper-parameter naming a run's method (default: --method_flag if given, else sampling).",
    flag_values=fv,
  )
  flags.DEFINE_list(
    'extra_columns',
    [],
    'metrics.csv columns the report summarises (mean per round).',
    flag_values=fv,
  )
  return fv


def _floats(name: str, values) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    raise ValueError(f'--{name}={",".join(values)}: give comma-separated numbers.') from None


def _rates(values) -> tuple[tuple[float, ...], tuple[tuple[str, float], ...]]:
  """``--learning_rates``: ``(grid, ())`` or, for ``m:r,...``, ``(distinct rates, fixed)``."""
  if not any(':' in v for v in values):
    return _floats('learning_rates', values), ()
  fixed = []
  for value in values:
    method, colon, rate = value.partition(':')
    if not colon:
      raise ValueError(
        f'--learning_rates={",".join(values)}: give every method a rate (<method>:<rate>) or '
        'none (a grid).'
      )
    fixed.append((method.strip(), _floats('learning_rates', [rate])[0]))
  return tuple(sorted({r for _, r in fixed}, reverse=True)), tuple(fixed)


def load(path: str) -> evidence_spec.ExperimentSpec:
  """Reads the configuration file `path`.

  Raises:
    FileNotFoundError: If it does not exist.
    ValueError: With one line naming the file and the bad value.
  """
  if os.path.isdir(path):
    raise FileNotFoundError(
      f'Experiment configuration {path!r} is a directory; give the {CONFIG_FILENAME} in it.'
    )
  if not os.path.isfile(path):
    raise FileNotFoundError(f'Experiment configuration {path!r} does not exist.')
  fv = _registry()
  try:
    args = fv.read_flags_from_files(['config', f'--flagfile={path}'])
    binary_flags = tuple(fv(args, known_only=True)[1:])
    for name in ('binary', 'methods', 'baseline'):
      if not fv[name].present and fv[name].value is None:
        raise ValueError(f'--{name} is required')
    if (fv.learning_rates is None) == (fv.learning_rates_from is None):
      raise ValueError('give either --learning_rates or --learning_rates_from')
    method_flag = fv.method_flag or BINARIES[fv.binary]
    for arg in binary_flags:
      if not arg.startswith('--'):
        raise ValueError(f'{arg!r} is not a --flag=value line')
      name = arg[2:].split('=', 1)[0]
      bare = name[2:] if name.startswith('no') else name  # absl's --nofoo for booleans.
      if {name, bare} & {*DRIVER_FLAGS, method_flag}:
        raise ValueError(f'--{name} is set per run by bin.experiment; leave it out')
    name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    learning_rates, fixed_rates = _rates(fv.learning_rates) if fv.learning_rates else ((), ())
    return evidence_spec.ExperimentSpec(
      name=name,
      title=fv.title or name,
      binary=fv.binary,
      binary_flags=binary_flags,
      methods=tuple(fv.methods),
      baseline=fv.baseline,
      learning_rates=learning_rates,
      tuning_seed=fv.tuning_seed,
      seeds=fv.seeds,
      extended_seeds=fv.extended_seeds,
      final_k=fv.final_k,
      tune_on=fv.tune_on,
      targets=_floats('targets', fv.targets),
      claims=tuple(evidence_spec.parse_claim(c) for c in fv.claims),
      label_key=fv.label_key or fv.method_flag or 'sampling',
      method_flag=method_flag,
      extra_columns=tuple(fv.extra_columns),
      fixed_rates=fixed_rates,
      extend_grid=fv.extend_grid,
      rates_from=fv.learning_rates_from or '',
    )
  except (flags.Error, ValueError) as e:
    raise ValueError(f'{path}: {str(e).splitlines()[0]}') from None


def sibling(config: str, name: str) -> str:
  """The configuration file of experiment `name`, beside `config`'s folder."""
  return os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(config))), name, CONFIG_FILENAME
  )


def borrow_rates(
  spec: evidence_spec.ExperimentSpec, config: str, sibling_runs
) -> evidence_spec.ExperimentSpec:
  """`spec` with the rates its sibling's tuning chose (``--learning_rates_from``), if it has one.

  Args:
    spec: As `load` read it from `config`.
    config: Its configuration file.
    sibling_runs: ``spec -> runs``: the sibling experiment's runs (its runs
      directory, or its committed raw metrics).

  Raises:
    FileNotFoundError, ValueError: If the sibling, its runs or its tuning are missing.
  """
  if not spec.rates_from:
    return spec
  name = spec.rates_from.partition(':')[0]
  source = load(sibling(config, name))
  if source.rates_from:
    raise ValueError(f'{config}: {name} borrows its rates too; name the one that tunes.')
  return evidence_spec.with_borrowed_rates(spec, evidence_spec.tune(source, sibling_runs(source)))


def committed_runs(config: str) -> list[results.Run]:
  """The raw metrics committed beside `config` (``runs.jsonl.gz``).

  Raises:
    FileNotFoundError: If there are none (the experiment has not run).
  """
  return raw_metrics.read(
    os.path.join(os.path.dirname(os.path.abspath(config)), raw_metrics.FILENAME)
  )


def load_committed(config: str) -> evidence_spec.ExperimentSpec:
  """`load`, with borrowed rates resolved from the sibling's committed raw metrics."""
  return borrow_rates(
    load(config), config, lambda source: committed_runs(sibling(config, source.name))
  )


def committed_cell(config: str) -> benchmark_report.Cell:
  """A benchmark cell from its committed raw metrics (none before it has run): its spec, with
  borrowed rates resolved once the sibling has tuned, its runs and how far it is."""
  spec, folder = load(config), os.path.dirname(os.path.abspath(config))
  try:
    runs = committed_runs(config)
  except FileNotFoundError:
    runs = []
  if spec.rates_from:
    try:
      spec = load_committed(config)
    except (FileNotFoundError, ValueError):  # The sibling has not run, or not finished tuning.
      return benchmark_report.Cell(
        spec, runs, folder, benchmark_report.progress(spec, runs, rates_from_pending=True)
      )
  return benchmark_report.Cell(spec, runs, folder, benchmark_report.progress(spec, runs))


def _cell_name(config: str) -> str:
  return os.path.basename(os.path.dirname(config))


def grid_configs(grid: str, names: Sequence[str] = ()) -> list[str]:
  """The grid's configuration files in training order: task by task, the cell that tunes,
  then those that borrow its rates (so each task's ranking is complete before the next task
  starts). `names`, if given, picks cells and their order.

  Raises:
    ValueError: If the grid has no cell, or a name is not one of its cells.
  """
  configs = sorted(glob.glob(os.path.join(grid, '*', CONFIG_FILENAME)))
  if not configs:
    raise ValueError(f'No cell configuration (*/{CONFIG_FILENAME}) in {grid}.')
  if names:
    by_name = {_cell_name(c): c for c in configs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
      raise ValueError(
        f'No cell {", ".join(unknown)} in {grid}; its cells are {", ".join(sorted(by_name))}.'
      )
    return [by_name[n] for n in names]

  def order(config: str) -> tuple[str, bool, str]:
    source = load(config).rates_from.partition(':')[0]
    return (source or _cell_name(config), bool(source), _cell_name(config))

  return sorted(configs, key=order)


def expand_configs(entries: Sequence[str]) -> list[str]:
  """``--experiments``: paths, and glob patterns replaced by their sorted matches.

  Raises:
    FileNotFoundError: If an entry matches nothing.
  """
  configs = []
  for entry in entries:
    matches = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
    if not matches:
      raise FileNotFoundError(f'--experiments entry {entry!r} matches no file.')
    configs += matches
  return configs


def _shown(path: str) -> str:
  """`path` as the page's command shows it: relative to the working directory (the
  repository's root) when inside it, so the page does not depend on the checkout."""
  relative = os.path.relpath(path)
  return path if relative.startswith(os.pardir) else relative


def summary_text(
  summary: str, entries: Sequence[str], *, title: str | None, relative_to: str | None
) -> str:
  """The family summary of the experiments `entries` name, to be written at `summary`.

  Every experiment needs its committed raw metrics (a part-run family is summarised
  without the experiments still running).

  Raises:
    FileNotFoundError: If an entry matches nothing or an experiment has no raw metrics.
    ValueError: As `family_report.family_markdown`.
  """
  members = []
  for config in expand_configs(entries):
    results_md = os.path.join(os.path.dirname(os.path.abspath(config)), 'results.md')
    members.append(
      family_report.Member(
        load_committed(config),
        committed_runs(config),
        os.path.relpath(results_md, os.path.dirname(os.path.abspath(summary))),
      )
    )
  command = [
    'python -m bin.report',
    f'--summary={shlex.quote(_shown(summary))}',
    f'--experiments={shlex.quote(",".join(_shown(e) for e in entries))}',
  ]
  if relative_to:
    command.append(f'--relative_to={shlex.quote(relative_to)}')
  if title:
    command.append(f'--title={shlex.quote(title)}')
  return family_report.family_markdown(
    members,
    title=title or 'Experiments side by side',
    command=' '.join(command),
    relative_to=relative_to,
  )


def _same_value(flag_value: str, recorded) -> bool:
  """Whether a flag's text and a recorded hyper-parameter say the same."""
  if isinstance(recorded, bool):
    return flag_value.lower() in (('true', '1') if recorded else ('false', '0'))
  if isinstance(recorded, (int, float)):
    try:
      return float(flag_value) == float(recorded)
    except ValueError:
      return False
  if isinstance(recorded, (list, tuple)):
    return [v.strip() for v in flag_value.split(',')] == [str(v) for v in recorded]
  return flag_value == str(recorded)


def check_settings(spec: evidence_spec.ExperimentSpec, run: results.Run) -> None:
  """Raises ValueError if `run` was trained with other values of the configuration's flags.

  A configuration edited after its runs started would otherwise count the old runs as
  done, and the report would show settings they were not trained with.
  """
  for arg in spec.binary_flags:
    name, _, value = arg[2:].partition('=')
    if name == 'availability' and 'availability_beta' in run.hparams:
      # Recorded as mode and β apart; the flag gives the mode, optionally with β (``LN-0.5``).
      mode, _, beta = value.partition('-')
      same = mode.upper() == str(run.hparams['availability']) and (
        not beta or _same_value(beta, run.hparams['availability_beta'])
      )
      if not same:
        raise ValueError(
          f'{run.path} was trained with availability {run.hparams["availability"]} (β '
          f'{run.hparams["availability_beta"]:g}), but the configuration says '
          f'--availability={value}: use another --runs_dir for the new configuration, or '
          'restore it.'
        )
      continue
    if name in run.hparams and not _same_value(value, run.hparams[name]):
      raise ValueError(
        f'{run.path} was trained with {name}={run.hparams[name]!r}, but the configuration says '
        f'--{name}={value}: use another --runs_dir for the new configuration, or restore it.'
      )


def run_name_flags(spec: evidence_spec.ExperimentSpec, method: str) -> list[str]:
  """The ``--experiment_name`` that keeps each method's runs in a directory of their own.

  A binary names a run after its own method flag (``<task>_<sampling>_seed<s>``), so the
  default needs nothing. A method set through another flag (FedGS's ``--alpha``) is not in
  that name: every value would write to, resume from and lock the same directory.
  """
  if spec.method_flag == BINARIES[spec.binary]:
    return []
  return [f'--experiment_name={spec.method_flag}{method}']


def takes_cache_dir(spec: evidence_spec.ExperimentSpec) -> bool:
  """Whether the configuration's task reads TFF's dataset cache (the binaries refuse
  ``--cache_dir`` for a task that does not, e.g. the offline ``synthetic``)."""
  task = next((a.split('=', 1)[1] for a in spec.binary_flags if a.startswith('--task=')), None)
  if task is None:
    return True  # E.g. bin.mmfl's suites, which take it whatever they hold.
  import tasks  # pylint: disable=g-import-not-at-top  (TensorFlow: only when it matters)

  return 'cache_dir' in tasks.task_options(task)


def horizon_command(
  config: str, method: str, rounds: int, root: str, cache_dir: str | None = None
) -> list[str]:
  """The binary call that trains `method` of the benchmark cell at `config`, at the rate the
  cell runs it at, on its tuning seed, for `rounds` rounds into `root` (``bin.horizon``).

  Raises:
    FileNotFoundError, ValueError: If the cell, its rates or its method are missing.
  """
  cell = committed_cell(config)
  if cell.spec.rates_from and not cell.spec.fixed_rates:
    raise ValueError(f'{config}: its sibling has not finished tuning ({cell.pending}).')
  if method not in cell.spec.methods:
    raise ValueError(f'{method!r} is not a method of {config}: {", ".join(cell.spec.methods)}.')
  rate = evidence_spec.tune(cell.spec, cell.runs).chosen[method]
  kept = [f for f in cell.spec.binary_flags if not f.startswith('--rounds=')]
  takes_cache = bool(cache_dir) and takes_cache_dir(cell.spec)
  return [
    sys.executable,
    '-m',
    f'bin.{cell.spec.binary}',
    *kept,
    f'--rounds={rounds}',
    *([f'--cache_dir={cache_dir}'] if takes_cache else []),
    f'--{cell.spec.method_flag}={method}',
    *run_name_flags(cell.spec, method),
    f'--seed={cell.spec.tuning_seed}',  # Never a reported seed.
    '--seeds=1',
    f'--client_learning_rate={rate:g}',
    f'--root_output_dir={root}',
  ]
