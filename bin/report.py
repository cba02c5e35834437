"""Regenerates an experiment's results table and plots from its run directories.

    python -m bin.report \\
        --run_dirs='<runs>/emnist_*' --label_key=sampling \\
        --target_accuracy=0.5 --output_dir=<report folder> \\
        --extra_columns=selection/weight_variance,process/aggregator/improvement_factor

writes into ``--output_dir``:

* ``results.md``: a line marking it as generated, the command that regenerates
  it, a Markdown table with one row per group of runs (mean ± sample std over
  seeds of the final and best evaluation accuracy, final loss, rounds and
  uploaded bits to ``--target_accuracy``, total uploaded bits, median seconds
  per round, the ``--extra_columns`` averaged over rounds), the definitions of
  the columns, the unfinished runs, links to the plots and the runs' settings;
* ``accuracy_rounds.png`` and ``accuracy_bits.png``: evaluation accuracy
  against the round and against the cumulative uploaded bits, mean over seeds
  with a ± std band per group;

and prints the table. With ``--check`` it writes nothing and exits 1, naming the files,
unless ``results.md`` and the plots on disk are what the runs give (in every mode below
too). An experiment's own page (``docs/experiments/<name>.md``)
links to ``results.md``; the tool never writes anything else. It replaces a
``results.md`` only if that file starts with the tool's marker line, and a PNG
only if this project wrote it, so hand-written files are never lost.

Runs are grouped by ``--label_key`` (one group per value of that
hyper-parameter) or, without it, by every hyper-parameter except the seed. The
computation is `tff_sampling.analysis.report`.

An experiment with a configuration file (``bin.experiment``) has its report
regenerated from its committed raw metrics, with nothing else to give::

    python -m bin.report --experiment=docs/experiments/<name>/experiment.flags

which reads ``runs.jsonl.gz`` beside it (or ``--run_dirs``, e.g. while the runs
are going) and writes ``results.md`` and the plots into that folder, around
the verdicts of the claims the configuration fixed
(`tff_sampling.analysis.evidence_report`). Several configured experiments (e.g. one task
under every availability mode) are put side by side, from their committed raw
metrics, with::

    python -m bin.report --summary=docs/experiments/<family>_summary.md \\
        --experiments='docs/experiments/<family>_[A-Z]*/experiment.flags' --relative_to=<name>
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import shlex
import sys

from absl import app
from absl import flags

from bin import experiment_config
from bin import flag_checks
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import plotting
from tff_sampling.analysis import report
from tff_sampling.runtime import files

_RUN_DIRS = flags.DEFINE_list(
  'run_dirs',
  None,
  'Comma-separated run directories (<root_output_dir>/<experiment_name>); an entry may be a '
  'glob pattern such as results/emnist_* (quote it). Required.',
)
_EXPERIMENT = flags.DEFINE_string(
  'experiment',
  None,
  'An experiment.flags file (bin.experiment): report it from the raw metrics beside it (or '
  'from --run_dirs), with its verdicts, into its folder. The other flags do not apply.',
)
_SUMMARY = flags.DEFINE_string(
  'summary',
  None,
  'A Markdown file to write the family summary of --experiments into: their verdicts in '
  'one table, and each summary (final accuracy, mean accuracy, lowest loss), client rate and '
  'seconds per round as method x experiment. The other flags but --relative_to and --title '
  'do not apply.',
)
_EXPERIMENTS = flags.DEFINE_list(
  'experiments',
  None,
  'With --summary: the experiment.flags files, in column order; an entry may be a glob '
  'pattern (quote it; its matches in sorted order). Each needs its committed raw metrics.',
)
_RELATIVE_TO = flags.DEFINE_string(
  'relative_to',
  None,
  "With --summary: an experiment's name; every other cell also gives its change against that "
  "experiment's value for the same method, e.g. each availability mode against IDL.",
)
_OUTPUT_DIR = flags.DEFINE_string(
  'output_dir',
  None,
  'Directory for results.md, accuracy_rounds.png and accuracy_bits.png (made if missing), '
  'e.g. docs/experiments/<name>. Required.',
)
_LABEL_KEY = flags.DEFINE_string(
  'label_key',
  None,
  "Hyper-parameter whose value labels the groups, e.g. 'sampling'; unset: runs differing "
  'only in the seed form a group, labelled by the hyper-parameters that differ.',
)
_TARGET_ACCURACY = flags.DEFINE_float(
  'target_accuracy',
  None,
  'Evaluation accuracy for the rounds/bits-to-target columns, a fraction in (0, 1]; unset: '
  'no such columns.',
)
_EXTRA_COLUMNS = flags.DEFINE_list(
  'extra_columns',
  [],
  'metrics.csv columns to add to the table, each averaged over rounds then seeds, e.g. '
  'selection/weight_variance,selection/label_kl,process/aggregator/improvement_factor (the '
  'improvement factor α of optimal sampling).',
)
_PANEL_KEY = flags.DEFINE_string(
  'panel_key',
  None,
  "Hyper-parameter splitting the runs into panels, e.g. 'availability' (FedGS's modes): "
  'results.md opens with pivot tables (groups × panels: final accuracy, lowest loss) and '
  'each plot has a panel per value.',
)
_TITLE = flags.DEFINE_string('title', None, 'Heading of results.md and title of the plots.')
_MAX_ROUND = flags.DEFINE_integer(
  'max_round',
  None,
  'Count only rounds up to this one, e.g. to compare at a round that every run has reached.',
  lower_bound=0,
)
_CHECK = flags.DEFINE_bool(
  'check',
  False,
  'Write nothing: exit 1, naming the files, unless results.md and the plots on disk are what '
  'the runs give (e.g. after hand-editing a committed report).',
)
flag_checks.check_accuracy('target_accuracy')
flag_checks.check_path(
  'experiment',
  flag_checks.Path.FILE,
  hint='an experiment.flags file, e.g. docs/experiments/<name>/experiment.flags',
)
flag_checks.check_path('summary', flag_checks.Path.NEW_FILE, hint='the Markdown file to write')
flag_checks.check_path(
  'output_dir', flag_checks.Path.NEW_DIRECTORY, hint='the folder of results.md and the plots'
)

_FLAG_ORDER = (
  'run_dirs',
  'label_key',
  'panel_key',
  'target_accuracy',
  'max_round',
  'extra_columns',
  'title',
  'output_dir',
)


def regenerate_command() -> str:
  """The command line that reproduces this report, from the flags' values."""
  parts = ['python -m bin.report']
  for name in _FLAG_ORDER:
    value = flags.FLAGS[name].value
    if value is None or value == []:
      continue
    if isinstance(value, list):
      value = ','.join(value)
    elif isinstance(value, float):
      value = f'{value:g}'
    parts.append(f'--{name}={shlex.quote(str(value))}')
  return ' '.join(parts)


def check_or_write(outputs: Mapping[str, str | bytes]) -> None:
  """With ``--check``, exits 1 naming every file of `outputs` that is missing or holds other
  bytes; else writes them (each path checked first: `report.write_files`)."""
  if _CHECK.value:
    stale = files.differing(outputs)
    if stale:
      sys.exit(
        f'Error: Not what the runs give: {", ".join(stale)}; rerun the same command '
        'without --check to regenerate.'
      )
    print(f'{len(outputs)} files are what the runs give: {", ".join(outputs)}')
    return
  for path in report.write_files(outputs):
    print(f'Wrote {path}')


def experiment_main() -> None:
  """``--experiment``: the verdict report of one configured experiment."""
  config = _EXPERIMENT.value
  try:
    spec = experiment_config.load_committed(config)
    folder = os.path.dirname(os.path.abspath(config))
    if _RUN_DIRS.value:
      runs = plotting.load_runs(_RUN_DIRS.value)
    else:
      runs = experiment_config.committed_runs(config)
    command = evidence_report.regenerate_command(config)
    check_or_write(evidence_report.report_files(spec, runs, folder, command=command))
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'Error: {e}')
  except OSError as e:
    sys.exit(f'Error: Cannot write the report beside {config!r}: {e.strerror or e}.')


def summary_main() -> None:
  """``--summary``: several configured experiments side by side."""
  if not _EXPERIMENTS.value:
    raise app.UsageError('--summary needs --experiments (experiment.flags files or patterns).')
  path = _SUMMARY.value
  try:
    text = experiment_config.summary_text(
      path, _EXPERIMENTS.value, title=_TITLE.value, relative_to=_RELATIVE_TO.value
    )
    check_or_write({os.path.abspath(path): text})
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'Error: {e}')
  except OSError as e:
    sys.exit(f'Error: Cannot write --summary={_SUMMARY.value!r}: {e.strerror or e}.')


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if _EXPERIMENT.value:
    experiment_main()
    return
  if _SUMMARY.value:
    summary_main()
    return
  if not _RUN_DIRS.value:
    raise app.UsageError('--run_dirs is required.')
  if not _OUTPUT_DIR.value:
    raise app.UsageError('--output_dir is required.')
  extra_columns = list(dict.fromkeys(c.strip() for c in _EXTRA_COLUMNS.value if c.strip()))
  try:
    runs = plotting.load_runs(_RUN_DIRS.value)
    built = report.build_report(
      runs,
      _OUTPUT_DIR.value,
      command=regenerate_command(),
      label_key=_LABEL_KEY.value,
      target=_TARGET_ACCURACY.value,
      extra_columns=extra_columns,
      title=_TITLE.value,
      max_round=_MAX_ROUND.value,
      panel_key=_PANEL_KEY.value,
    )
    if not _CHECK.value:
      print(built.table)
      for run, last, planned in built.unfinished:
        print(f'Note: {run.name} is unfinished (round {last} of {planned}).')
    check_or_write(built.files)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'Error: {e}')
  except KeyError as e:  # A run lacks a column: the message names its file.
    sys.exit(f'Error: {e.args[0]}')
  except OSError as e:
    sys.exit(
      f'Error: Cannot write into --output_dir={_OUTPUT_DIR.value!r}: '
      f'{e.strerror or e}; give a writable directory.'
    )


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
