"""A report of runs: ``results.md`` (the `run_groups` summaries over seeds as `tables`, with
notes, settings and the regenerate command) and the two `curves` plots. `build_report` makes
it as path -> content; `write_report` writes it, replacing only a ``results.md`` that starts
with `MARKER` and PNGs that `plotting.is_own_plot`. ``bin/report.py`` is the command line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import os
from typing import Any

from tff_sampling.analysis import curves
from tff_sampling.analysis import plotting
from tff_sampling.analysis import run_groups
from tff_sampling.analysis import tables
from tff_sampling.runtime import files
from tff_sampling.runtime import results

RESULTS_FILENAME = 'results.md'
# The first line of every results.md this module writes; only such a file is replaced.
MARKER = (
  '<!-- results.md written by tff_sampling.report (python -m bin.report); '
  'rerun the command below instead of editing. -->'
)


def write_files(outputs: Mapping[str, str | bytes]) -> tuple[str, ...]:
  """Writes each file of `outputs` (path -> content, in order), making missing directories;
  returns the paths. Every path is checked before any is written: a PNG may replace only a
  plot of this project's, any other file only a results.md of this tool's.

  Raises:
    ValueError: If a path holds something else (a user's file, a directory).
  """
  for path in outputs:
    if path.endswith('.png'):
      plotting.check_plot_path(path)
    else:
      check_results_path(path)
  for path, data in outputs.items():
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    files.write_atomically(path, data)
  return tuple(outputs)


def write_plots(
  groups: Mapping[str, Sequence[results.Run]],
  output_dir: str | os.PathLike[str],
  *,
  title: str | None = None,
  panels: Mapping[str, Mapping[str, Sequence[results.Run]]] | None = None,
) -> tuple[str, ...]:
  """Writes `plot_files` (both paths checked before either is written); returns their paths.

  Raises:
    ValueError: If a path exists and is not a plot this project wrote.
    KeyError: If a run lacks the accuracy or bits column.
  """
  return write_files(curves.plot_files(groups, output_dir, title=title, panels=panels))


def check_results_path(path: str | os.PathLike[str]) -> str:
  """The absolute `path` if results.md may be written there; else ValueError.

  It may be written if absent, or if it is a file whose first line is `MARKER`.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path):
    raise ValueError(f'Cannot write {path!r}: it is a directory.')
  if os.path.lexists(path) and not is_own_results(path):
    raise ValueError(
      f'Refusing to overwrite {path!r}: it was not written by this report tool '
      '(its first line is not the report marker). Move it away, or choose '
      'another output directory.'
    )
  return path


def is_own_results(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is a results.md written by `write_report` (first line `MARKER`)."""
  try:
    with open(path, encoding='utf-8') as f:
      return f.readline().rstrip('\r\n') == MARKER
  except (OSError, UnicodeDecodeError):
    return False


def results_markdown(
  summaries: Sequence[run_groups.GroupSummary],
  groups: Mapping[str, Sequence[results.Run]],
  *,
  command: str,
  label_header: str = 'group',
  extra_columns: Sequence[str] = (),
  title: str | None = None,
  max_round: int | None = None,
  panel_summaries: Mapping[str, Sequence[run_groups.GroupSummary]] | None = None,
  panel_label_header: str = 'group',
) -> str:
  """The text of results.md: marker, command, table, notes, unfinished runs, plots, settings.

  `max_round` (if the runs were cut with `truncate`) is stated under the table.
  `panel_summaries` (panel value -> its groups' summaries) adds the pivot
  tables of final accuracy and lowest loss before the full table.
  """
  parts = [MARKER, '']
  if title:
    parts += [f'# {title}', '']
  parts += ['Regenerate this file and its plots with:', '', '```sh', command, '```', '']
  if panel_summaries:
    for stat, what in (
      ('final_accuracy', f'Final accuracy ({run_groups.ACCURACY_COLUMN})'),
      ('best_loss', f'Lowest evaluation loss ({run_groups.LOSS_COLUMN})'),
    ):
      parts += [
        f'{what}, mean ± std over seeds:',
        '',
        tables.pivot_table(panel_summaries, stat, label_header=panel_label_header),
        '',
      ]
    parts += ['All columns, one row per panel and group:', '']
  parts += [
    tables.markdown_table(summaries, label_header=label_header, extra_columns=extra_columns),
    '',
    tables.table_notes(summaries, extra_columns),
    '',
  ]
  if max_round is not None:
    parts += [f'Only rounds up to {max_round} are counted.', '']
  unfinished = run_groups.incomplete_runs(
    (run for runs in groups.values() for run in runs), max_round
  )
  if unfinished:
    listed = ', '.join(f'{run.name} ({last}/{planned})' for run, last, planned in unfinished)
    parts += [
      f'**Unfinished runs** (last round/planned rounds): {listed}. Their numbers are '
      'those of the rounds written so far.',
      '',
    ]
  parts += [
    f'![{run_groups.ACCURACY_COLUMN} vs round]({curves.ROUNDS_PLOT_FILENAME})',
    '',
    f'![{run_groups.ACCURACY_COLUMN} vs cumulative uploaded bits]({curves.BITS_PLOT_FILENAME})',
    '',
    '## Settings',
    '',
    tables.settings_table(groups),
    '',
  ]
  return '\n'.join(parts)


@dataclasses.dataclass(frozen=True)
class Report:
  """A report of runs: what `build_report` computed and `write_report` writes.

  Attributes:
    table: The Markdown table (as in results.md).
    summaries: The per-group summaries.
    results_path: Absolute path of results.md.
    plot_paths: Absolute paths of the rounds and bits plots.
    unfinished: As `incomplete_runs`.
    files: Every file of the report, path -> content: the plots, then results.md.
  """

  table: str
  summaries: tuple[run_groups.GroupSummary, ...]
  results_path: str
  plot_paths: tuple[str, ...]
  unfinished: tuple[tuple[results.Run, int, int], ...]
  files: Mapping[str, str | bytes]


def build_report(
  runs: Sequence[results.Run],
  output_dir: str | os.PathLike[str],
  *,
  command: str,
  label_key: str | None = None,
  target: float | None = None,
  extra_columns: Sequence[str] = (),
  title: str | None = None,
  max_round: int | None = None,
  panel_key: str | None = None,
) -> Report:
  """The report of `runs` for `output_dir`: results.md and the two plots, written nowhere.

  Args:
    runs: Loaded runs.
    output_dir: The report directory.
    command: The command that regenerates the report, quoted in results.md.
    label_key: As for `group`.
    target: The target accuracy, or None for no to-target columns.
    extra_columns: As for `summarize`.
    title: A heading for results.md and the plots' title, or None.
    max_round: If set, only rounds up to it count (`truncate`), e.g. to
      compare runs of which some are still running at a common round.
    panel_key: If set, a hyper-parameter splitting the runs into panels
      (`group_panels`): pivot tables in results.md, a panel per value in the
      plots.

  Raises:
    ValueError: For bad runs (see `group`, `summarize`), or an output directory that is a file.
  """
  output_dir = os.path.abspath(os.fspath(output_dir))
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f'The output directory {output_dir!r} is a file; give a directory.')
  if max_round is not None:
    runs = [run_groups.truncate(run, max_round) for run in runs]
  panels = panel_summaries = None
  if panel_key is None:
    groups = run_groups.group(runs, label_key)
  else:
    panels = run_groups.group_panels(runs, panel_key, label_key)
    groups = run_groups.flatten_panels(panels)
  summaries = run_groups.summarize(groups, target=target, extra_columns=extra_columns)
  if panels is not None:
    panel_summaries, rest = {}, iter(summaries)
    for panel, panel_groups in panels.items():
      panel_summaries[panel] = [
        dataclasses.replace(next(rest), label=label) for label in panel_groups
      ]
  label_header = label_key or 'group'
  if panel_key is not None:
    label_header = f'{panel_key} · {label_header}'
  table = tables.markdown_table(summaries, label_header=label_header, extra_columns=extra_columns)
  text = results_markdown(
    summaries,
    groups,
    command=command,
    label_header=label_header,
    extra_columns=extra_columns,
    title=title,
    max_round=max_round,
    panel_summaries=panel_summaries,
    panel_label_header=label_key or 'group',
  )
  plots = curves.plot_files(groups, output_dir, title=title, panels=panels)
  results_path = os.path.join(output_dir, RESULTS_FILENAME)
  return Report(
    table=table,
    summaries=tuple(summaries),
    results_path=results_path,
    plot_paths=tuple(plots),
    unfinished=tuple(run_groups.incomplete_runs(runs, max_round)),
    files={**plots, results_path: text},
  )


def write_report(
  runs: Sequence[results.Run], output_dir: str | os.PathLike[str], *, command: str, **options: Any
) -> Report:
  """Writes the `build_report` of `runs` (same arguments) into `output_dir`, made if missing.

  Everything is computed and every output path checked before anything is written.

  Raises:
    ValueError: As `build_report`, or for an output path that holds something this module
      did not write.
  """
  built = build_report(runs, output_dir, command=command, **options)
  write_files(built.files)
  return built
