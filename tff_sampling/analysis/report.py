"""Experiment reports: a Markdown table of results over seeds and the two standard plots.

A report summarizes a set of run directories (see `tff_sampling.runtime.results`)
grouped into configurations (by default every hyper-parameter except the seed,
as `results.group_runs` does; or by one hyper-parameter such as ``sampling``).
For each group, over its seeds:

* final evaluation accuracy and loss (the last evaluation of each run), and the
  best evaluation accuracy: mean ± sample standard deviation (``ddof = 1``);
* rounds and uploaded bits to a target accuracy: the first evaluation round at
  which ``eval/accuracy >= target`` and the cumulative uploaded bits at that
  round, averaged over the seeds that reach it, with how many did;
* total uploaded bits (cumulative bits at each run's last round);
* the median seconds per round (``round_seconds`` over all rounds of all seeds);
* optional extra columns: any numeric ``metrics.csv`` column, averaged over the
  rounds of each run (where it has a value), then over seeds; e.g.
  ``selection/weight_variance``, ``selection/label_kl`` or `ALPHA_COLUMN`.

With a *panel key* (e.g. ``availability``: FedGS's modes), runs are first
split by that hyper-parameter's value and grouped within each panel; results.md
then opens with two pivot tables (label rows × panel columns: final accuracy and
lowest evaluation loss, FedGS's "optimal test loss") and each plot has one
panel per value.

Runs still in progress can be compared at a common round with `truncate`
(``max_round`` of `write_report`); `incomplete_runs` lists the runs that end
before their planned ``rounds``.

`write_report` writes ``results.md`` (`MARKER` line, regenerate command,
table, notes, settings, plots) and the plots ``accuracy_rounds.png`` and
``accuracy_bits.png`` (mean line and a ± std band per group) into one
directory. It replaces only files it wrote itself: ``results.md`` only if it
starts with `MARKER`, the PNGs only if `plotting.is_own_plot`.

No flags are defined here; ``bin/report.py`` is the command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import math
import os
import textwrap
from typing import Any

from matplotlib import figure as mpl_figure
from matplotlib import ticker
from matplotlib.backends import backend_agg
import numpy as np

from tff_sampling.analysis import plotting
from tff_sampling.runtime import files
from tff_sampling.runtime import results

ACCURACY_COLUMN = 'eval/accuracy'
LOSS_COLUMN = 'eval/loss'
SECONDS_COLUMN = 'round_seconds'
# The improvement factor α of optimal client sampling (per round).
ALPHA_COLUMN = 'process/aggregator/improvement_factor'
# Delta degrees of freedom of every standard deviation over seeds.
DDOF = 1

RESULTS_FILENAME = 'results.md'
ROUNDS_PLOT_FILENAME = 'accuracy_rounds.png'
BITS_PLOT_FILENAME = 'accuracy_bits.png'
# The first line of every results.md this module writes; only such a file is replaced.
MARKER = (
  '<!-- results.md written by tff_sampling.report (python -m bin.report); '
  'rerun the command below instead of editing. -->'
)

_MISSING = '—'
_BIT_UNITS = ((1e12, 'Tbit'), (1e9, 'Gbit'), (1e6, 'Mbit'), (1e3, 'kbit'), (1.0, 'bit'))


@dataclasses.dataclass(frozen=True)
class Stat:
  """Mean and standard deviation (``ddof = DDOF``) of per-seed values.

  Attributes:
    mean: The mean; NaN if `n` is 0.
    std: The sample standard deviation; NaN if `n` <= `DDOF` (one seed).
    n: How many values (seeds) went in.
  """

  mean: float
  std: float
  n: int

  @classmethod
  def of(cls, values: Iterable[float | None]) -> Stat:
    """The Stat of the finite values among `values` (None and NaN are left out)."""
    kept = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if not kept.size:
      return cls(math.nan, math.nan, 0)
    std = float(kept.std(ddof=DDOF)) if kept.size > DDOF else math.nan
    return cls(float(kept.mean()), std, int(kept.size))


@dataclasses.dataclass(frozen=True)
class GroupSummary:
  """The results of one group of runs (the seeds of one configuration).

  Attributes:
    label: The group's label (see `group`).
    runs: The runs of the group.
    last_rounds: The last round in each run's ``metrics.csv``.
    final_accuracy: Last evaluation accuracy, over seeds.
    final_loss: Last evaluation loss, over seeds (n = 0 without `LOSS_COLUMN`).
    best_accuracy: Highest evaluation accuracy, over seeds.
    best_loss: Lowest evaluation loss, over seeds (n = 0 without `LOSS_COLUMN`).
    target: The target accuracy, or None.
    rounds_to_target: First round with accuracy >= `target`, over the seeds
      that reach it (``n`` of them); n = 0 if none does or `target` is None.
    bits_to_target: Cumulative uploaded bits at that round, same seeds.
    total_bits: Cumulative uploaded bits at the last round, over seeds.
    seconds_per_round: Median of `SECONDS_COLUMN` over all rounds of all seeds;
      NaN if no run has that column.
    extras: Extra column -> mean over rounds per seed, then Stat over the seeds
      that have the column.
  """

  label: str
  runs: tuple[results.Run, ...]
  last_rounds: tuple[int, ...]
  final_accuracy: Stat
  final_loss: Stat
  best_accuracy: Stat
  best_loss: Stat
  target: float | None
  rounds_to_target: Stat
  bits_to_target: Stat
  total_bits: Stat
  seconds_per_round: float
  extras: dict[str, Stat]

  @property
  def seeds(self) -> int:
    return len(self.runs)


def truncate(run: results.Run, max_round: int) -> results.Run:
  """`run` with only its rows up to and including round `max_round`.

  Raises:
    ValueError: If the run has no row at or before `max_round`.
  """
  keep = run.rounds <= max_round
  if not np.any(keep):
    raise ValueError(
      f'{_metrics_path(run)!r} has no round <= {max_round} (its first round is '
      f'{int(run.rounds[0])}); choose a later last round.'
    )
  if np.all(keep):
    return run
  metrics = {}
  for name, values in run.metrics.items():
    values = values[keep]
    values.setflags(write=False)
    metrics[name] = values
  rounds = run.rounds[keep]
  rounds.setflags(write=False)
  # The selection counts are those of the last checkpoint, not of round `max_round`.
  return dataclasses.replace(run, metrics=metrics, rounds=rounds, selection_counts=None)


def group(
  runs: Sequence[results.Run],
  label_key: str | None = None,
  *,
  ignore: Iterable[str] = results.DEFAULT_GROUP_IGNORE,
) -> dict[str, list[results.Run]]:
  """Groups runs into configurations, the seeds of each together.

  Args:
    runs: The runs.
    label_key: None: as `results.group_runs` (every hyper-parameter except
      `ignore` separates groups; labels name the ones that differ). A
      hyper-parameter name such as ``'sampling'``: one group per value, labelled
      with the value; the runs of a group must agree on every other
      hyper-parameter except `ignore`.
    ignore: Hyper-parameters that never separate groups (the seed).

  Returns:
    Label -> runs, groups in order of first appearance.

  Raises:
    ValueError: If `runs` is empty, a run lacks `label_key`, or runs with one
      `label_key` value differ in another hyper-parameter (the message names
      it and two such runs).
  """
  if not runs:
    raise ValueError('No runs to report.')
  if label_key is None:
    return results.group_runs(runs, ignore=ignore)
  ignored = frozenset(ignore) | {label_key}
  groups = _split_by(runs, label_key, 'to label it by; choose another label key')
  for label, members in groups.items():
    first = members[0]
    for other in members[1:]:
      for name in sorted(set(first.hparams) | set(other.hparams)):
        if name in ignored:
          continue
        if results.hparam_identity(first.hparams, name) != results.hparam_identity(
          other.hparams, name
        ):
          raise ValueError(
            f'Runs with {label_key}={label} differ in {name!r} ({first.name}: '
            f'{_describe(first.hparams, name)}, {other.name}: {_describe(other.hparams, name)}); '
            'they are not seeds of one configuration: group by every hyper-parameter (no label '
            'key), or leave one of them out.'
          )
  return groups


def _split_by(runs: Sequence[results.Run], key: str, purpose: str) -> dict[str, list[results.Run]]:
  """Runs by their formatted value of hyper-parameter `key`, in order of first appearance."""
  split: dict[str, list[results.Run]] = {}
  for run in runs:
    if key not in run.hparams:
      raise ValueError(
        f'{os.path.join(run.path, results.HPARAMS_FILENAME)!r} has no hyper-parameter '
        f'{key!r} {purpose}, or leave that run out.'
      )
    split.setdefault(results.format_hparam(run.hparams[key]), []).append(run)
  return split


def group_panels(
  runs: Sequence[results.Run], panel_key: str, label_key: str | None = None
) -> dict[str, dict[str, list[results.Run]]]:
  """Splits runs by the value of `panel_key`, then `group`s each panel by `label_key`.

  Returns:
    Panel value -> label -> runs, both in order of first appearance.

  Raises:
    ValueError: As `group`, or if a run lacks `panel_key`.
  """
  if not runs:
    raise ValueError('No runs to report.')
  panels = _split_by(runs, panel_key, 'to split the runs by; choose another panel key')
  return {
    panel: group(members, label_key, ignore=(*results.DEFAULT_GROUP_IGNORE, panel_key))
    for panel, members in panels.items()
  }


def flatten_panels(
  panels: Mapping[str, Mapping[str, Sequence[results.Run]]],
) -> dict[str, list[results.Run]]:
  """One group per (panel, label), labelled ``'<panel> · <label>'``."""
  return {
    f'{panel} · {label}': list(runs)
    for panel, groups in panels.items()
    for label, runs in groups.items()
  }


def pivot_table(
  panel_summaries: Mapping[str, Sequence[GroupSummary]], stat: str, *, label_header: str = 'group'
) -> str:
  """A pipe table of one `GroupSummary` field (e.g. ``'final_accuracy'``):
  a row per label, a column per panel, mean ± std over seeds, ``—`` where a
  panel lacks the label."""
  labels = list(dict.fromkeys(s.label for summaries in panel_summaries.values() for s in summaries))
  panels = list(panel_summaries)
  cells = []
  for panel in panels:
    by_label = {s.label: getattr(s, stat) for s in panel_summaries[panel]}
    cells.append(
      _align_parts(
        [
          _stat_parts(by_label[label], '.4f') if label in by_label else (_MISSING, '')
          for label in labels
        ]
      )
    )
  return pipe_table([label_header, *panels], [[_escape(label) for label in labels], *cells])


def summarize(
  groups: Mapping[str, Sequence[results.Run]],
  *,
  target: float | None = None,
  extra_columns: Sequence[str] = (),
) -> list[GroupSummary]:
  """Computes the `GroupSummary` of every group.

  Args:
    groups: Label -> runs, as from `group`.
    target: The target accuracy for the rounds/bits-to-target columns, or None.
    extra_columns: ``metrics.csv`` columns to average over rounds.

  Returns:
    One summary per group, in the order of `groups`.

  Raises:
    ValueError: If a group is empty; a run has no evaluation accuracy value or
      no cumulative uploaded bits (the message names the run's file); or an
      extra column is numeric in no run.
  """
  all_runs = [run for runs in groups.values() for run in runs]
  for run in all_runs:
    for column in (ACCURACY_COLUMN, results.BITS_COLUMN):
      if column not in run.metrics:
        raise ValueError(
          f'{_metrics_path(run)!r} has no numeric column {column!r}; a report needs '
          f'{ACCURACY_COLUMN!r} and {results.BITS_COLUMN!r} in every run: leave that run out.'
        )
    if not np.any(np.isfinite(run.metrics[ACCURACY_COLUMN])):
      raise ValueError(
        f'{_metrics_path(run)!r} has no {ACCURACY_COLUMN!r} value yet (no '
        'evaluation round written); leave that run out, or wait for its first '
        'evaluation.'
      )
  for column in extra_columns:
    if not any(column in run.metrics for run in all_runs):
      known = sorted({c for run in all_runs for c in run.metrics})
      raise ValueError(
        f'No run has a numeric column {column!r}; the columns are: {", ".join(known)}.'
      )
  summaries = []
  for label, runs in groups.items():
    if not runs:
      raise ValueError(f'The group {label!r} has no runs.')
    summaries.append(_summarize_group(label, runs, target, extra_columns))
  return summaries


def _summarize_group(
  label: str, runs: Sequence[results.Run], target: float | None, extra_columns: Sequence[str]
) -> GroupSummary:
  if target is None:
    to_rounds, to_bits = [], []
  else:
    to_rounds = [results.rounds_to_target(run, target, ACCURACY_COLUMN) for run in runs]
    to_bits = [results.bits_to_target(run, target, ACCURACY_COLUMN) for run in runs]
  per_run_seconds = [run.metrics[SECONDS_COLUMN] for run in runs if SECONDS_COLUMN in run.metrics]
  seconds = np.concatenate(per_run_seconds) if per_run_seconds else np.zeros(0)
  seconds = seconds[np.isfinite(seconds)]
  extras = {
    column: Stat.of(_mean_over_rounds(run.metrics[column]) for run in runs if column in run.metrics)
    for column in extra_columns
  }
  return GroupSummary(
    label=label,
    runs=tuple(runs),
    last_rounds=tuple(int(run.rounds[-1]) for run in runs),
    final_accuracy=Stat.of(_last(run, ACCURACY_COLUMN) for run in runs),
    final_loss=Stat.of(_last(run, LOSS_COLUMN) for run in runs),
    best_accuracy=Stat.of(_max(run, ACCURACY_COLUMN) for run in runs),
    best_loss=Stat.of(_min(run, LOSS_COLUMN) for run in runs),
    target=target,
    rounds_to_target=Stat.of(to_rounds),
    bits_to_target=Stat.of(to_bits),
    total_bits=Stat.of(_last(run, results.BITS_COLUMN) for run in runs),
    seconds_per_round=float(np.median(seconds)) if seconds.size else math.nan,
    extras=extras,
  )


def _finite(run: results.Run, column: str) -> np.ndarray:
  values = run.metrics.get(column)
  if values is None:
    return np.zeros(0)
  return values[np.isfinite(values)]


def _last(run: results.Run, column: str) -> float | None:
  values = _finite(run, column)
  return float(values[-1]) if values.size else None


def _max(run: results.Run, column: str) -> float | None:
  values = _finite(run, column)
  return float(values.max()) if values.size else None


def _min(run: results.Run, column: str) -> float | None:
  values = _finite(run, column)
  return float(values.min()) if values.size else None


def _mean_over_rounds(values: np.ndarray) -> float | None:
  values = values[np.isfinite(values)]
  return float(values.mean()) if values.size else None


def bit_unit(summaries: Sequence[GroupSummary]) -> tuple[float, str]:
  """The (scale, name) of the SI unit of bits for a table, e.g. (1e9, 'Gbit').

  The largest unit not exceeding the largest total uploaded bits, so that the
  table shows at most three digits before the decimal point.
  """
  largest = max((s.total_bits.mean for s in summaries if s.total_bits.n), default=0.0)
  for scale, name in _BIT_UNITS:
    if largest >= scale:
      return scale, name
  return 1.0, 'bit'


def target_text(target: float) -> str:
  """`target` as a percentage: 0.5 -> '50%', 0.755 -> '75.5%'."""
  return f'{target * 100:g}%'


def markdown_table(
  summaries: Sequence[GroupSummary],
  *,
  label_header: str = 'group',
  extra_columns: Sequence[str] = (),
) -> str:
  """The summaries as a GitHub pipe table, one row per group.

  Columns: the label, seeds, last round (a range if the seeds' runs end at
  different rounds), final accuracy, final loss, best accuracy, then with a
  target the rounds and uploaded bits to it, the total uploaded bits, the
  median seconds per round and the extra columns (mean per round). Values are
  mean ± std over seeds (no ± for one seed); to-target cells end with
  ``(reached/seeds)``; ``—`` marks a missing value. Cells are padded so that the
  columns line up in the Markdown source, with ``±`` under ``±``.
  """
  if not summaries:
    raise ValueError('No groups to tabulate.')
  scale, unit = bit_unit(summaries)
  target = summaries[0].target
  headers = [label_header, 'seeds', 'last round', 'final accuracy', 'final loss', 'best accuracy']
  if target is not None:
    headers += [f'rounds to {target_text(target)}', f'{unit} to {target_text(target)}']
  headers += [f'total {unit}', 's/round (median)']
  headers += [f'{column} (mean/round)' for column in extra_columns]

  extra_specs = {
    column: _spec_for([s.extras[column].mean for s in summaries]) for column in extra_columns
  }
  bits_spec = '.3f' if scale > 1 else '.0f'  # Whole bits, or three decimals of kbit and up.
  rows = []
  for s in summaries:
    low, high = min(s.last_rounds), max(s.last_rounds)
    row = [
      (_escape(s.label),),
      (str(s.seeds),),
      (str(low) if low == high else f'{low}–{high}',),
      _stat_parts(s.final_accuracy, '.4f'),
      _stat_parts(s.final_loss, '.4f'),
      _stat_parts(s.best_accuracy, '.4f'),
    ]
    if target is not None:
      reached = f'({s.rounds_to_target.n}/{s.seeds})'
      if s.rounds_to_target.n:
        row.append(_stat_parts(s.rounds_to_target, '.1f') + (reached,))
        row.append(_stat_parts(s.bits_to_target, bits_spec, scale) + (reached,))
      else:
        row += [('never', '', reached)] * 2
    row += [
      _stat_parts(s.total_bits, bits_spec, scale),
      (_MISSING,) if math.isnan(s.seconds_per_round) else (f'{s.seconds_per_round:.2f}',),
    ]
    row += [_stat_parts(s.extras[column], extra_specs[column]) for column in extra_columns]
    rows.append(row)

  columns = list(zip(*rows))
  return pipe_table(
    headers, [[label for (label,) in columns[0]]] + [_align_parts(column) for column in columns[1:]]
  )


def pipe_table(headers: Sequence[str], columns: Sequence[Sequence[str]]) -> str:
  """A pipe table of cell columns: the first left-aligned, the others right-aligned,
  padded so that the columns line up in the Markdown source."""
  widths = [max(len(h), *(len(c) for c in column)) for h, column in zip(headers, columns)]
  lines = [
    '| '
    + ' | '.join(
      h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))
    )
    + ' |',
    '| '
    + ' | '.join('-' * w if i == 0 else '-' * (w - 1) + ':' for i, w in enumerate(widths))
    + ' |',
  ]
  for r in range(len(columns[0])):
    lines.append(
      '| '
      + ' | '.join(
        column[r].ljust(w) if i == 0 else column[r].rjust(w)
        for i, (column, w) in enumerate(zip(columns, widths))
      )
      + ' |'
    )
  return '\n'.join(lines)


def _stat_parts(stat: Stat, spec: str, scale: float = 1.0) -> tuple[str, ...]:
  if not stat.n:
    return (_MISSING, '')
  mean = format(stat.mean / scale, spec)
  if math.isnan(stat.std):
    return (mean, '')
  return (mean, f'± {format(stat.std / scale, spec)}')


def _spec_for(values: Iterable[float]) -> str:
  """A format showing the largest finite |value| with 4 significant digits.

  Fixed-point between 1e-3 and 1e5 (every value of the column with the same
  decimals), scientific notation otherwise.
  """
  finite = [abs(v) for v in values if math.isfinite(v)]
  largest = max(finite, default=0.0)
  if not 1e-3 <= largest < 1e5:
    return '.3e' if largest else '.4g'
  return f'.{max(0, 3 - math.floor(math.log10(largest)))}f'


def _align_parts(column: Sequence[tuple[str, ...]]) -> list[str]:
  """Joins each cell's parts with spaces, parts aligned across the column.

  The first part (the mean) is right-justified, the others left-justified; a
  missing part is blank of the same width, so every cell has the same width.
  """
  count = max(len(parts) for parts in column)
  padded = [tuple(parts) + ('',) * (count - len(parts)) for parts in column]
  widths = [max(len(parts[i]) for parts in padded) for i in range(count)]
  return [
    ' '.join(
      [parts[0].rjust(widths[0])]
      + [part.ljust(width) for part, width in zip(parts[1:], widths[1:]) if width]
    )
    for parts in padded
  ]


def table_notes(summaries: Sequence[GroupSummary], extra_columns: Sequence[str] = ()) -> str:
  """The Markdown paragraph that defines the table's columns."""
  _, unit = bit_unit(summaries)
  target = summaries[0].target if summaries else None
  notes = [
    f'Mean ± sample standard deviation (ddof = {DDOF}) over seeds; a value without ± comes '
    f'from one seed. *final* is the last evaluation of each run ({ACCURACY_COLUMN}, '
    f'{LOSS_COLUMN}), *best* the highest evaluation accuracy.'
  ]
  if target is not None:
    notes.append(
      f'*rounds / {unit} to {target_text(target)}*: the first evaluation round at which '
      f'{ACCURACY_COLUMN} ≥ {target:g}, and the cumulative uploaded bits at that round, over '
      'the seeds that reach it (reached/seeds).'
    )
  notes.append(
    f'*total {unit}*: cumulative uploaded bits ({results.BITS_COLUMN}) at the last round. '
    f'*s/round*: median of {SECONDS_COLUMN} over all rounds of all seeds.'
  )
  if extra_columns:
    notes.append(
      '*(mean/round)*: the column averaged over the rounds that have a value, per '
      'seed, then over seeds.'
    )
  return ' '.join(notes)


def incomplete_runs(
  runs: Iterable[results.Run], max_round: int | None = None
) -> list[tuple[results.Run, int, int]]:
  """The runs that end before their planned last round.

  The planned last round is the run's ``rounds`` hyper-parameter, or
  `max_round` if that is smaller (a report cut at `max_round`); a run without
  an integer ``rounds`` counts as finished unless `max_round` is given.

  Returns:
    ``(run, last round, planned last round)`` per unfinished run.
  """
  unfinished = []
  for run in runs:
    planned = run.hparams.get('rounds')
    if not isinstance(planned, int) or isinstance(planned, bool):
      planned = None
    if max_round is not None:
      planned = max_round if planned is None else min(planned, max_round)
    if planned is not None and run.rounds[-1] < planned:
      unfinished.append((run, int(run.rounds[-1]), planned))
  return unfinished


def settings_table(
  groups: Mapping[str, Sequence[results.Run]], ignore: Iterable[str] = results.DEFAULT_GROUP_IGNORE
) -> str:
  """The hyper-parameters of the runs as a two-column Markdown table.

  A hyper-parameter with one value in all runs shows it; one that differs
  shows ``label: value`` per group. The ignored ones (seed, names, paths) are
  left out; the seeds of each group are listed last.
  """
  ignored = frozenset(ignore)
  all_runs = [run for runs in groups.values() for run in runs]
  names: list[str] = []
  for run in all_runs:
    names.extend(k for k in run.hparams if k not in ignored and k not in names)
  rows = []
  for name in sorted(names):
    values = {results.hparam_identity(run.hparams, name) for run in all_runs}
    if len(values) == 1:
      value = _describe(all_runs[0].hparams, name)
    else:
      value = '; '.join(
        f'{label}: ' + ', '.join(dict.fromkeys(_describe(run.hparams, name) for run in runs))
        for label, runs in groups.items()
      )
    rows.append((name, value))
  rows.append(
    (
      'seeds',
      '; '.join(
        f'{label}: ' + ', '.join(_describe(run.hparams, 'seed') for run in runs)
        for label, runs in groups.items()
      ),
    )
  )
  name_width = max(len('hyper-parameter'), *(len(n) for n, _ in rows))
  value_width = max(len('value'), *(len(v) for _, v in rows))
  lines = [
    f'| {"hyper-parameter".ljust(name_width)} | {"value".ljust(value_width)} |',
    f'| {"-" * name_width} | {"-" * value_width} |',
  ]
  lines += [f'| {n.ljust(name_width)} | {_escape(v).ljust(value_width)} |' for n, v in rows]
  return '\n'.join(lines)


def _escape(text: str) -> str:
  return text.replace('|', '\\|')


def _describe(hparams: Mapping[str, Any], name: str) -> str:
  if name not in hparams:
    return '(unset)'
  value = hparams[name]
  return 'null' if value is None else results.format_hparam(value)


def _metrics_path(run: results.Run) -> str:
  return os.path.join(run.path, results.METRICS_FILENAME)


def make_curve_figure(
  groups: Mapping[str, Sequence[results.Run]],
  x_column: str,
  *,
  y_column: str = ACCURACY_COLUMN,
  title: str | None = None,
  panels: Mapping[str, Mapping[str, Sequence[results.Run]]] | None = None,
) -> mpl_figure.Figure:
  """`y_column` against rounds (``'key'``) or uploaded bits (log axis).

  Per group, the mean over seeds (`results.aggregate`) with a band of ± one
  standard deviation (``ddof = DDOF``) when the group has several seeds; the
  legend gives the label and the number of seeds. Groups keep their colours
  across figures drawn from the same `groups`. With `panels` (as from
  `group_panels`; `groups` is then unused), one panel per value, titled with
  it, a label keeping its colour in every panel.
  """
  if panels is None:
    panels = {title or '': groups}
    title = None
  columns = min(len(panels), 4)
  rows = math.ceil(len(panels) / columns)
  fig = mpl_figure.Figure(
    figsize=(7 if columns == 1 else 3.6 * columns, 4.5 * rows), layout='constrained'
  )
  backend_agg.FigureCanvasAgg(fig)
  all_axes = np.atleast_1d(fig.subplots(rows, columns, sharey=True, squeeze=False)).ravel()
  labels = list(dict.fromkeys(label for groups_ in panels.values() for label in groups_))
  colours = {label: f'C{i % 10}' for i, label in enumerate(labels)}
  for axes, (panel, panel_groups) in zip(all_axes, panels.items()):
    _draw_curves(axes, panel_groups, x_column, y_column, colours)
    if panel:
      axes.set_title(_wrapped(panel, fig.get_figwidth() / columns))
  for axes in all_axes[len(panels) :]:
    axes.set_visible(False)
  if len({tuple(groups_) for groups_ in panels.values()}) == 1:
    for axes in all_axes[1 : len(panels)]:  # The same groups everywhere: one legend says it.
      axes.get_legend().remove()
  if title:
    fig.suptitle(_wrapped(title, fig.get_figwidth()))
  return fig


def _wrapped(title: str, inches: float) -> str:
  """`title` broken into lines that fit `inches` of figure width (~11 characters per inch)."""
  return textwrap.fill(title, width=int(11 * inches))


def _draw_curves(
  axes,
  groups: Mapping[str, Sequence[results.Run]],
  x_column: str,
  y_column: str,
  colours: Mapping[str, str],
) -> None:
  on_bits = x_column != results.ROUND_COLUMN
  shown = []
  for label, runs in groups.items():
    # Only evaluated rounds are drawn: on the bits axis, a round's mean accuracy sits at
    # that round's mean cumulative bits (no interpolation; every curve ends at its last
    # evaluation).
    x, mean, std = results.aggregate(runs, results.ROUND_COLUMN, y_column, ddof=DDOF)
    if on_bits:  # Round 0 uploads nothing; a log axis cannot show 0 bits.
      x = results.mean_at_rounds(runs, x_column, x)
      keep = np.isfinite(x) & (x > 0)
      x, mean, std = x[keep], mean[keep], std[keep]
    seeds = len(runs)
    shown.append(x)
    axes.plot(
      x, mean, color=colours[label], label=f'{label} (n={seeds} seed{"s" if seeds > 1 else ""})'
    )
    if seeds > 1:
      axes.fill_between(x, mean - std, mean + std, color=colours[label], alpha=0.2, linewidth=0)
  if on_bits:
    axes.set_xscale('log')
    all_x = np.concatenate(shown) if shown else np.zeros(0)
    if all_x.size and all_x.max() > 10 * all_x.min():
      # Decades only: labelled minor ticks would overlap. Within one decade the
      # minor labels are the only ones.
      axes.xaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel('cumulative uploaded bits')
  else:
    axes.set_xlabel('round')
  axes.set_ylabel(y_column)
  axes.grid(alpha=0.3)
  axes.legend(fontsize='small')


def plot_paths(output_dir: str | os.PathLike[str]) -> tuple[str, str]:
  """The (accuracy vs rounds, accuracy vs bits) PNG paths in `output_dir`."""
  return (
    os.path.join(output_dir, ROUNDS_PLOT_FILENAME),
    os.path.join(output_dir, BITS_PLOT_FILENAME),
  )


def plot_files(
  groups: Mapping[str, Sequence[results.Run]],
  output_dir: str | os.PathLike[str],
  *,
  title: str | None = None,
  panels: Mapping[str, Mapping[str, Sequence[results.Run]]] | None = None,
) -> dict[str, bytes]:
  """Accuracy vs rounds and accuracy vs uploaded bits, as the PNGs to write into `output_dir`
  (one panel per value of `panels`, if given: see `make_curve_figure`), by absolute path.

  Raises:
    KeyError: If a run lacks the accuracy or bits column.
  """
  return {
    os.path.abspath(path): plotting.png_bytes(
      make_curve_figure(groups, x_column, title=title, panels=panels)
    )
    for x_column, path in zip((results.ROUND_COLUMN, results.BITS_COLUMN), plot_paths(output_dir))
  }


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
  return write_files(plot_files(groups, output_dir, title=title, panels=panels))


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
  summaries: Sequence[GroupSummary],
  groups: Mapping[str, Sequence[results.Run]],
  *,
  command: str,
  label_header: str = 'group',
  extra_columns: Sequence[str] = (),
  title: str | None = None,
  max_round: int | None = None,
  panel_summaries: Mapping[str, Sequence[GroupSummary]] | None = None,
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
      ('final_accuracy', f'Final accuracy ({ACCURACY_COLUMN})'),
      ('best_loss', f'Lowest evaluation loss ({LOSS_COLUMN})'),
    ):
      parts += [
        f'{what}, mean ± std over seeds:',
        '',
        pivot_table(panel_summaries, stat, label_header=panel_label_header),
        '',
      ]
    parts += ['All columns, one row per panel and group:', '']
  parts += [
    markdown_table(summaries, label_header=label_header, extra_columns=extra_columns),
    '',
    table_notes(summaries, extra_columns),
    '',
  ]
  if max_round is not None:
    parts += [f'Only rounds up to {max_round} are counted.', '']
  unfinished = incomplete_runs((run for runs in groups.values() for run in runs), max_round)
  if unfinished:
    listed = ', '.join(f'{run.name} ({last}/{planned})' for run, last, planned in unfinished)
    parts += [
      f'**Unfinished runs** (last round/planned rounds): {listed}. Their numbers are '
      'those of the rounds written so far.',
      '',
    ]
  parts += [
    f'![{ACCURACY_COLUMN} vs round]({ROUNDS_PLOT_FILENAME})',
    '',
    f'![{ACCURACY_COLUMN} vs cumulative uploaded bits]({BITS_PLOT_FILENAME})',
    '',
    '## Settings',
    '',
    settings_table(groups),
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
  summaries: tuple[GroupSummary, ...]
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
    runs = [truncate(run, max_round) for run in runs]
  panels = panel_summaries = None
  if panel_key is None:
    groups = group(runs, label_key)
  else:
    panels = group_panels(runs, panel_key, label_key)
    groups = flatten_panels(panels)
  summaries = summarize(groups, target=target, extra_columns=extra_columns)
  if panels is not None:
    panel_summaries, rest = {}, iter(summaries)
    for panel, panel_groups in panels.items():
      panel_summaries[panel] = [
        dataclasses.replace(next(rest), label=label) for label in panel_groups
      ]
  label_header = label_key or 'group'
  if panel_key is not None:
    label_header = f'{panel_key} · {label_header}'
  table = markdown_table(summaries, label_header=label_header, extra_columns=extra_columns)
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
  plots = plot_files(groups, output_dir, title=title, panels=panels)
  results_path = os.path.join(output_dir, RESULTS_FILENAME)
  return Report(
    table=table,
    summaries=tuple(summaries),
    results_path=results_path,
    plot_paths=tuple(plots),
    unfinished=tuple(incomplete_runs(runs, max_round)),
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
