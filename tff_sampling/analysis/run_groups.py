"""Runs grouped over seeds and summarised: `group` (by a hyper-parameter, or by every
hyper-parameter but the seed), `group_panels`, and `summarize` (final and best accuracy,
lowest loss, rounds and bits to a target, seconds per round) into `GroupSummary` rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import math
import os
from typing import Any

import numpy as np

from tff_sampling.runtime import results

ACCURACY_COLUMN = 'eval/accuracy'


LOSS_COLUMN = 'eval/loss'


SECONDS_COLUMN = 'round_seconds'


# The improvement factor α of optimal client sampling (per round).
ALPHA_COLUMN = 'process/aggregator/improvement_factor'


# Delta degrees of freedom of every standard deviation over seeds.
DDOF = 1


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


def _describe(hparams: Mapping[str, Any], name: str) -> str:
  if name not in hparams:
    return '(unset)'
  value = hparams[name]
  return 'null' if value is None else results.format_hparam(value)


def _metrics_path(run: results.Run) -> str:
  return os.path.join(run.path, results.METRICS_FILENAME)
