"""Reading, grouping and aggregating the results of runs.

The round loop (`tff_sampling.program`) writes one directory per run::

    <root_output_dir>/<experiment_name>/hparams.json   flat JSON object
    <root_output_dir>/<experiment_name>/metrics.csv    one row per round

`metrics.csv` is written by `tff.program.CSVFileReleaseManager`: the first
column is ``key`` (the round number; round 0 is the evaluation of the initial
model), the others are the '/'-joined names of the released nested structure
(``train/loss``, ``eval/accuracy``, ``uplink/cumulative_bits``, ...). Cells are
strings; a cell is empty where that round did not release the value (evaluation
metrics exist only on evaluation rounds) or where the column first appeared at
a later round (the manager then rewrites the file with the wider header).

Typical use::

    runs = [load_run(d) for d in find_run_dirs(['results/digits_*'])]
    for label, group in group_runs(runs).items():
      bits, mean, std = aggregate(group, BITS_COLUMN, 'eval/accuracy')

This module only reads files; it never writes and never reads flags.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import csv
import dataclasses
import glob
import json
import math
import os
import re
from typing import Any

import numpy as np

HPARAMS_FILENAME = 'hparams.json'
METRICS_FILENAME = 'metrics.csv'
SELECTION_COUNTS_FILENAME = 'selection_counts.csv'
# The key fieldname of the CSV release manager: the round number.
ROUND_COLUMN = 'key'
BITS_COLUMN = 'uplink/cumulative_bits'
DEFAULT_GROUP_IGNORE = ('seed', 'experiment_name', 'root_output_dir')

_BOOLEAN_CELLS = {'True': 1.0, 'False': 0.0}
_GLOB_CHARACTERS = re.compile(r'[*?[]')
_NAME_SEPARATORS = '_-./ '

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
  """One run: its hyper-parameters and its per-round metrics.

  Attributes:
    path: The run directory, as given to `load_run`.
    hparams: The contents of ``hparams.json``.
    metrics: Column name -> read-only float array aligned with `rounds`, NaN
      where the cell is empty. ``True``/``False`` cells read as 1.0/0.0. The
      ``key`` column is `rounds` itself and is not repeated here.
    rounds: The round numbers (int64, increasing), one per CSV row.
    text_columns: Columns left out of `metrics` because a cell is not a number
      (for example a released vector, written as ``'[1.0, 2.0]'``).
    selection_counts: ``int64[N]``, how often each client was selected up to
      the last checkpoint (``selection_counts.csv``), in client order; ``None``
      if the run has no such file.
  """

  path: str
  hparams: dict[str, Any]
  metrics: dict[str, np.ndarray]
  rounds: np.ndarray
  text_columns: tuple[str, ...] = ()
  selection_counts: np.ndarray | None = None

  @property
  def name(self) -> str:
    """The experiment name: ``hparams['experiment_name']`` or the directory name."""
    name = self.hparams.get('experiment_name')
    if isinstance(name, str) and name:
      return name
    return os.path.basename(os.path.normpath(self.path))

  def column(self, name: str) -> np.ndarray:
    """Returns a column as floats; ``'key'`` gives the rounds.

    Args:
      name: A column of ``metrics.csv``.

    Raises:
      KeyError: If the run has no numeric column `name`; the message names the
        run and lists its columns.
    """
    if name == ROUND_COLUMN:
      return self.rounds.astype(np.float64)
    if name in self.metrics:
      return self.metrics[name]
    if name in self.text_columns:
      raise KeyError(f'Column {name!r} of {self._metrics_path} is not numeric.')
    raise KeyError(
      f'{self._metrics_path} has no column {name!r}; its columns are: '
      f'{", ".join(sorted(self.metrics)) or "(none)"}'
    )

  def last_finite(self, name: str) -> float:
    """The last finite value of column `name`, e.g. the final evaluation.

    Raises:
      KeyError: As `column`.
      IndexError: If the column has no finite value.
    """
    values = self.column(name)
    return float(values[np.isfinite(values)][-1])

  @property
  def _metrics_path(self) -> str:
    return os.path.join(self.path, METRICS_FILENAME)


def find_run_dirs(entries: Iterable[PathLike]) -> list[str]:
  """Expands glob patterns among run directory entries.

  An entry containing ``*``, ``?`` or ``[`` is a glob pattern and becomes the
  sorted directories it matches; any other entry is kept as given (so that
  `load_run` reports a missing directory by name). Duplicates are dropped,
  keeping the first occurrence.

  Args:
    entries: Run directories and/or glob patterns.

  Returns:
    The run directories, in the order of the entries.

  Raises:
    ValueError: If a glob pattern matches no directory.
  """
  found: list[str] = []
  for entry in entries:
    entry = os.fspath(entry)
    if _GLOB_CHARACTERS.search(entry):
      matches = sorted(p for p in glob.glob(entry) if os.path.isdir(p))
      if not matches:
        raise ValueError(f'The pattern {entry!r} matches no directory.')
    else:
      matches = [entry]
    found.extend(m for m in matches if m not in found)
  return found


class NoRoundsYet(ValueError):
  """A run's ``metrics.csv`` holds no round: empty, or a header only. A run that has just
  started looks so until it releases round 0 (or the file was truncated)."""


def load_run(run_dir: PathLike) -> Run:
  """Reads one run directory written by the round loop.

  Args:
    run_dir: ``<root_output_dir>/<experiment_name>``.

  Returns:
    The `Run`, with rows sorted by round.

  Raises:
    FileNotFoundError: If `run_dir`, its ``hparams.json`` or its
      ``metrics.csv`` does not exist.
    ValueError: If a file cannot be read or is not what the program writes:
      ``hparams.json`` not a JSON object (`read_hparams`); ``metrics.csv``
      empty or without rows (`NoRoundsYet`), not UTF-8 CSV, without a ``key`` column, with a
      key that is not an integer or a repeated key; ``selection_counts.csv``
      malformed. Each message is one line naming the file.
  """
  path = os.fspath(run_dir)
  if not os.path.isdir(path):
    raise FileNotFoundError(
      f'Run directory {path!r} does not exist; give a directory the '
      'experiment program wrote (<root_output_dir>/<experiment_name>).'
    )
  hparams_path = os.path.join(path, HPARAMS_FILENAME)
  metrics_path = os.path.join(path, METRICS_FILENAME)
  for required in (hparams_path, metrics_path):
    if not os.path.isfile(required):
      raise FileNotFoundError(
        f'{required!r} does not exist; is {path!r} a run directory written by the round loop?'
      )
  hparams = read_hparams(hparams_path)
  rounds, metrics, text_columns = _read_metrics(metrics_path)
  counts_path = os.path.join(path, SELECTION_COUNTS_FILENAME)
  counts = None
  if os.path.isfile(counts_path):
    try:
      counts = np.loadtxt(
        counts_path, delimiter=',', skiprows=1, usecols=2, dtype=np.int64, ndmin=1
      )
    except (OSError, ValueError, IndexError) as e:
      raise ValueError(
        f'{counts_path!r} is not a selection-counts CSV '
        f'({_first_line(e)}); restore it or delete it.'
      ) from None
  return Run(
    path=path,
    hparams=hparams,
    metrics=metrics,
    rounds=rounds,
    text_columns=text_columns,
    selection_counts=counts,
  )


_HPARAMS_FIX = 'restore it, or leave this run out'


def read_hparams(path: PathLike, *, fix: str = _HPARAMS_FIX) -> dict[str, Any]:
  """The hyper-parameters in a run's ``hparams.json``.

  The one reader of the file for every consumer (plots, reports, resuming):
  whatever is wrong with the file, the error is one line naming it.

  Args:
    path: The ``hparams.json`` file.
    fix: What the reader can do about a bad file, ending the message (resuming
      passes e.g. ``'start over with --reset or another --experiment_name'``).

  Returns:
    The JSON object as a dict.

  Raises:
    FileNotFoundError: If `path` does not exist.
    ValueError: If it cannot be read, is not UTF-8 JSON (damaged, truncated,
      binary), or holds something other than a JSON object.
  """
  path = os.fspath(path)
  fix = f'it is not the file the round loop writes; {fix}'
  try:
    with open(path, encoding='utf-8') as f:
      hparams = json.load(f)
  except FileNotFoundError:
    raise
  except UnicodeDecodeError as e:
    raise ValueError(
      f'{path!r} is not valid JSON (not UTF-8 text: {e.reason} at byte {e.start}); {fix}.'
    ) from None
  except json.JSONDecodeError as e:
    raise ValueError(f'{path!r} is not valid JSON: {e}; {fix}.') from None
  except (OSError, RecursionError) as e:
    raise ValueError(f'{path!r} cannot be read as JSON ({_first_line(e)}); {fix}.') from None
  if not isinstance(hparams, dict):
    raise ValueError(f'{path!r} must hold a JSON object, got {type(hparams).__name__}; {fix}.')
  return hparams


_read_hparams = read_hparams  # The earlier private name.


def _first_line(error: BaseException) -> str:
  """``'<Type>: <first line of the message>'`` (at most 200 characters)."""
  lines = str(error).strip().splitlines()
  return f'{type(error).__name__}: {lines[0][:200]}' if lines else type(error).__name__


def _read_metrics(path: str) -> tuple[np.ndarray, dict[str, np.ndarray], tuple[str, ...]]:
  """Returns (rounds, numeric columns, non-numeric column names) of a CSV."""
  fix = 'is it the metrics.csv of a run of the round loop?'
  try:
    with open(path, newline='', encoding='utf-8') as f:
      reader = csv.reader(f)
      header = next(reader, None)
      rows = [row for row in reader if row]
  except UnicodeDecodeError as e:
    raise ValueError(
      f'{path!r} is not a CSV file (not UTF-8 text: {e.reason} at byte {e.start}); {fix}'
    ) from None
  except (csv.Error, OSError) as e:
    raise ValueError(f'{path!r} is not a readable CSV file ({_first_line(e)}); {fix}') from None
  if not header:
    raise NoRoundsYet(
      f'{path!r} has no {ROUND_COLUMN!r} column: it is empty (no header, no rounds); the run '
      'wrote nothing yet, or the file was truncated; rerun the training command (it resumes), or '
      'leave this run out.'
    )
  if ROUND_COLUMN not in header:
    raise ValueError(
      f'{path!r} has no {ROUND_COLUMN!r} column (the round number written by '
      f'tff.program.CSVFileReleaseManager); its header is {header}.'
    )
  if not rows:
    raise NoRoundsYet(
      f'{path!r} has a header but no rounds: the run has not released round 0 yet, or the '
      'file was truncated; rerun the training command (it resumes), or leave this run out.'
    )
  key_index = header.index(ROUND_COLUMN)

  keys = []
  for line_number, row in enumerate(rows, start=2):
    cell = row[key_index] if key_index < len(row) else ''
    try:
      keys.append(int(cell))
    except ValueError:
      raise ValueError(
        f'{path!r} line {line_number}: {ROUND_COLUMN!r} must be an integer '
        f'round number, got {cell!r}.'
      ) from None
  order = np.argsort(keys, kind='stable')
  rounds = np.asarray(keys, dtype=np.int64)[order]
  repeated = rounds[1:][rounds[1:] == rounds[:-1]]
  if repeated.size:
    raise ValueError(f'{path!r} has round {int(repeated[0])} more than once.')
  rounds.setflags(write=False)

  metrics: dict[str, np.ndarray] = {}
  text_columns = []
  for index, name in enumerate(header):
    if index == key_index or name in metrics:
      continue
    # Rows written before a column existed may also be physically short.
    cells = [rows[i][index] if index < len(rows[i]) else '' for i in order]
    values = _parse_cells(cells)
    if values is None:
      text_columns.append(name)
    else:
      values.setflags(write=False)
      metrics[name] = values
  return rounds, metrics, tuple(text_columns)


def _parse_cells(cells: Sequence[str]) -> np.ndarray | None:
  """Parses cells as floats (empty -> NaN); None if some cell is not a number."""
  values = np.full(len(cells), np.nan)
  for i, cell in enumerate(cells):
    cell = cell.strip()
    if not cell:
      continue
    if cell in _BOOLEAN_CELLS:
      values[i] = _BOOLEAN_CELLS[cell]
      continue
    try:
      values[i] = float(cell)
    except ValueError:
      return None
  return values


def group_runs(
  runs: Iterable[Run], *, ignore: Iterable[str] = DEFAULT_GROUP_IGNORE
) -> dict[str, list[Run]]:
  """Groups runs that differ only in ignored hyper-parameters (the seed).

  The label of a group lists the hyper-parameters whose values are not the
  same in every group, as ``name=value`` joined by ``', '`` (in the order the
  names first appear; a group without the name shows ``name=(unset)``); when
  one such hyper-parameter, set in every group, alone tells all groups apart,
  the label is that one (the first in order). With a
  single group the label is the experiment name shared by its runs: their
  common name, cut back to a whole ``_``/``-``/``.``-separated part, so
  ``digits_uniform_seed0`` and ``digits_uniform_seed1`` give
  ``digits_uniform``.

  Args:
    runs: The runs.
    ignore: Hyper-parameters that do not separate groups.

  Returns:
    Label -> runs of the group (in input order), groups in order of first
    appearance.
  """
  if isinstance(ignore, str):
    raise TypeError(f'`ignore` must be a collection of names, got the string {ignore!r}.')
  ignored = frozenset(ignore)
  groups: dict[str, list[Run]] = {}
  settings: dict[str, dict[str, Any]] = {}
  for run in runs:
    setting = {k: v for k, v in run.hparams.items() if k not in ignored}
    group_key = json.dumps(setting, sort_keys=True, default=str)
    groups.setdefault(group_key, []).append(run)
    settings.setdefault(group_key, setting)
  if len(groups) == 1:
    (group,) = groups.values()
    return {_common_name([run.name for run in group]): group}

  names: list[str] = []
  for setting in settings.values():
    names.extend(k for k in setting if k not in names)
  differing = [
    name
    for name in names
    if len({hparam_identity(setting, name) for setting in settings.values()}) > 1
  ]
  # One name that alone tells every group apart, and that every group sets,
  # makes a short label (e.g. `sampling=lefl` against `sampling=uniform`).
  separating = [
    name
    for name in differing
    if len({hparam_identity(setting, name) for setting in settings.values()}) == len(settings)
    and all(name in setting for setting in settings.values())
  ]
  if separating:
    differing = separating[:1]
  labelled: dict[str, list[Run]] = {}
  for group_key, group in groups.items():
    setting = settings[group_key]
    label = ', '.join(
      f'{name}={format_hparam(setting[name]) if name in setting else "(unset)"}'
      for name in differing
    )
    unique_label, copy = label, 1
    while unique_label in labelled:  # Values that print alike, e.g. 1 and '1'.
      copy += 1
      unique_label = f'{label} ({copy})'
    labelled[unique_label] = group
  return labelled


def hparam_identity(setting: Mapping[str, Any], name: str) -> str | None:
  """A comparable form of one hyper-parameter; None where it is absent."""
  if name not in setting:
    return None
  return json.dumps(setting[name], sort_keys=True, default=str)


def format_hparam(value: Any) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, (list, dict)):
    return json.dumps(value, sort_keys=True)
  return str(value)


def _common_name(names: Sequence[str]) -> str:
  prefix = os.path.commonprefix(list(names))
  if all(name == prefix for name in names):
    return prefix
  whole_parts = re.sub(f'[^{re.escape(_NAME_SEPARATORS)}]*$', '', prefix)
  return whole_parts.rstrip(_NAME_SEPARATORS) or prefix or names[0]


def seed_spread(values) -> float:
  """Sample standard deviation (``ddof = 1``) of per-seed values; 0 for a single seed."""
  values = np.asarray(values, dtype=np.float64)
  return float(values.std(ddof=1)) if values.size > 1 else 0.0


def aggregate(
  group: Sequence[Run], x_column: str, y_column: str, *, ddof: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean and standard deviation of `y_column` over the runs of a group.

  Only rows where `y_column` is present (finite) count, e.g. evaluation rounds
  for ``eval/accuracy``.

  * ``x_column='key'`` (rounds): runs are aligned on the round number, using
    the rounds at which every run has a value.
  * Any other `x_column`, e.g. ``uplink/cumulative_bits``, whose values differ
    between seeds: each run's y is linearly interpolated (in x) onto a common
    grid, the union of the runs' x values inside the range that all runs cover
    ``[max of the runs' first x, min of their last x]``; no run is
    extrapolated. The union keeps every measured point (a single run is
    returned unchanged) and adds no invented resolution. Each run's points are
    sorted by x; where several rows share an x value the last (latest round)
    is kept. Rows without an x value are dropped.

  Args:
    group: Runs to aggregate (e.g. the seeds of one `group_runs` group).
    x_column: ``'key'`` or a column that increases with the round, like
      ``uplink/cumulative_bits``.
    y_column: The metric, e.g. ``eval/accuracy``.
    ddof: Delta degrees of freedom of the standard deviation; the default 1 is
      the sample standard deviation over seeds. A single run has std 0.

  Returns:
    ``(x, mean, std)``, float arrays of equal length; empty if the runs share
    no round (or no x range).

  Raises:
    ValueError: If `group` is empty.
    KeyError: If a run lacks one of the columns.
  """
  if not group:
    raise ValueError('Cannot aggregate an empty group of runs.')
  if x_column == ROUND_COLUMN:
    x, values = _align_on_rounds(group, y_column)
  else:
    x, values = _interpolate_on_union(group, x_column, y_column)
  mean = values.mean(axis=0) if x.size else np.zeros(0)
  if len(group) > ddof and x.size:
    std = values.std(axis=0, ddof=ddof)
  else:
    std = np.zeros_like(mean)
  return x, mean, std


def mean_at_rounds(group: Sequence[Run], column: str, rounds: np.ndarray) -> np.ndarray:
  """The mean over the runs of `column` at each of `rounds` (NaN where a run has no value)."""
  values = np.full((len(group), len(rounds)), np.nan)
  for i, run in enumerate(group):
    at = np.searchsorted(run.rounds, np.asarray(rounds, np.int64))
    inside = at < run.rounds.size
    inside[inside] &= run.rounds[at[inside]] == np.asarray(rounds, np.int64)[inside]
    values[i, inside] = run.column(column)[at[inside]]
  return values.mean(axis=0)


def _align_on_rounds(group: Sequence[Run], y_column: str) -> tuple[np.ndarray, np.ndarray]:
  present = [run.rounds[np.isfinite(run.column(y_column))] for run in group]
  common = present[0]
  for rounds in present[1:]:
    common = np.intersect1d(common, rounds)
  values = np.stack([run.column(y_column)[np.searchsorted(run.rounds, common)] for run in group])
  return common.astype(np.float64), values


def _interpolate_on_union(
  group: Sequence[Run], x_column: str, y_column: str
) -> tuple[np.ndarray, np.ndarray]:
  curves = [_curve(run, x_column, y_column) for run in group]
  if any(x.size == 0 for x, _ in curves):
    return np.zeros(0), np.zeros((len(group), 0))
  low = max(x[0] for x, _ in curves)
  high = min(x[-1] for x, _ in curves)
  grid = np.unique(np.concatenate([x for x, _ in curves]))
  grid = grid[(grid >= low) & (grid <= high)]
  values = np.stack([np.interp(grid, x, y) for x, y in curves])
  return grid, values


def _curve(run: Run, x_column: str, y_column: str) -> tuple[np.ndarray, np.ndarray]:
  """The (x, y) points of a run where both are finite, strictly increasing x."""
  x, y = run.column(x_column), run.column(y_column)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  order = np.argsort(x, kind='stable')
  x, y = x[order], y[order]
  last_of_each = np.append(x[1:] != x[:-1], True)
  return x[last_of_each], y[last_of_each]


def rounds_to_target(
  run: Run, target: float, column: str = 'eval/accuracy', *, lower_is_better: bool = False
) -> int | None:
  """The first round at which `column` reaches `target`.

  Args:
    run: The run.
    target: The value to reach.
    column: The metric; its rows without a value (non-evaluation rounds) are
      skipped.
    lower_is_better: If True, "reaches" means ``<= target`` (for a loss);
      otherwise ``>= target``.

  Returns:
    The round number, or None if the run never reaches `target`.

  Raises:
    KeyError: If the run has no column `column`.
  """
  values = run.column(column)
  with np.errstate(invalid='ignore'):
    reached = values <= target if lower_is_better else values >= target
  indices = np.flatnonzero(reached & np.isfinite(values))
  return int(run.rounds[indices[0]]) if indices.size else None


def bits_to_target(
  run: Run,
  target: float,
  column: str = 'eval/accuracy',
  *,
  bits_column: str = BITS_COLUMN,
  lower_is_better: bool = False,
) -> float | None:
  """The cumulative uploaded bits at the round given by `rounds_to_target`.

  Args:
    run: The run.
    target: The value to reach.
    column: The metric.
    bits_column: The cumulative uploaded bits column.
    lower_is_better: As in `rounds_to_target`.

  Returns:
    The cumulative bits uploaded up to and including that round, or None if
    the run never reaches `target`.

  Raises:
    KeyError: If the run lacks `column` or `bits_column`.
    ValueError: If `bits_column` is empty at that round.
  """
  round_num = rounds_to_target(run, target, column, lower_is_better=lower_is_better)
  if round_num is None:
    return None
  bits = float(run.column(bits_column)[np.searchsorted(run.rounds, round_num)])
  if not math.isfinite(bits):
    raise ValueError(
      f'{os.path.join(run.path, METRICS_FILENAME)!r} has no {bits_column!r} '
      f'value at round {round_num}.'
    )
  return bits
