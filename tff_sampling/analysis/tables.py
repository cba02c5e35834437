"""Markdown tables of `run_groups.GroupSummary` rows: the results table with its notes,
pivot tables (groups x panels), the runs' settings, and pipe tables aligned for reading."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import math

from tff_sampling.analysis import evidence
from tff_sampling.analysis import run_groups
from tff_sampling.runtime import results

_MISSING = '—'
_BIT_UNITS = ((1e12, 'Tbit'), (1e9, 'Gbit'), (1e6, 'Mbit'), (1e3, 'kbit'), (1.0, 'bit'))


def pivot_table(
  panel_summaries: Mapping[str, Sequence[run_groups.GroupSummary]],
  stat: str,
  *,
  label_header: str = 'group',
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


def bit_unit(summaries: Sequence[run_groups.GroupSummary]) -> tuple[float, str]:
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
  summaries: Sequence[run_groups.GroupSummary],
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


def _stat_parts(stat: run_groups.Stat, spec: str, scale: float = 1.0) -> tuple[str, ...]:
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


def table_notes(
  summaries: Sequence[run_groups.GroupSummary], extra_columns: Sequence[str] = ()
) -> str:
  """The Markdown paragraph that defines the table's columns."""
  _, unit = bit_unit(summaries)
  target = summaries[0].target if summaries else None
  notes = [
    f'Mean ± sample standard deviation (ddof = {run_groups.DDOF}) over seeds; a value without '
    f'± comes from one seed. *final* is the last evaluation of each run '
    f'({run_groups.ACCURACY_COLUMN}, {run_groups.LOSS_COLUMN}), *best* the highest evaluation '
    'accuracy.'
  ]
  if target is not None:
    notes.append(
      f'*rounds / {unit} to {target_text(target)}*: the first evaluation round at which '
      f'{run_groups.ACCURACY_COLUMN} ≥ {target:g}, and the cumulative uploaded bits at that '
      'round, over the seeds that reach it (reached/seeds).'
    )
  notes.append(
    f'*total {unit}*: cumulative uploaded bits ({results.BITS_COLUMN}) at the last round. '
    f'*s/round*: median of {run_groups.SECONDS_COLUMN} over all rounds of all seeds.'
  )
  if extra_columns:
    notes.append(
      '*(mean/round)*: the column averaged over the rounds that have a value, per '
      'seed, then over seeds.'
    )
  return ' '.join(notes)


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
      value = run_groups._describe(all_runs[0].hparams, name)
    else:
      value = '; '.join(
        f'{label}: '
        + ', '.join(dict.fromkeys(run_groups._describe(run.hparams, name) for run in runs))
        for label, runs in groups.items()
      )
    rows.append((name, value))
  rows.append(
    (
      'seeds',
      '; '.join(
        f'{label}: ' + ', '.join(run_groups._describe(run.hparams, 'seed') for run in runs)
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


def horizon_text(run: results.Run, block: int, gain: float, lookback: int = 1) -> str:
  """Each block's mean accuracy and where the curve flattened (`evidence.flattened_at`)."""
  means = evidence.block_means(run, block)
  lines = [f'{"rounds":>12}  mean accuracy']
  for b, mean in enumerate(means):
    lines.append(f'{f"{b * block + 1}-{(b + 1) * block}":>12}  {mean:.4f}')
  at = evidence.flattened_at(run, block, gain, lookback)
  over = f'{lookback * block} rounds'
  if at is not None:
    lines.append(f'Flattened at round {at}: it gained less than {gain:g} over {over}.')
  else:
    last = means[-1] - means[-1 - lookback] if means.size > lookback else math.nan
    lines.append(
      f'Not flat by round {int(run.rounds.max())}: it gained {last:+.4f} over the last '
      f'{over} (flat: < {gain:g}).'
    )
  return '\n'.join(lines)
