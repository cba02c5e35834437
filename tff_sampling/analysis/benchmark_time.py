"""Time to the target in a cell a system model timed: each method's simulated seconds to the
cell's first target against the baseline's, paired over seeds, with a run that never reaches
it counted at its end (a lower bound, `evidence.to_target`). The comparisons are one Holm
family; a verdict that censoring could have caused is *undecided* (`evidence.censored_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses

import numpy as np

from tff_sampling.analysis import benchmark_report
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import tables

SOONER, LATER = 'sooner', 'later'
_WORDS: dict[str, str] = {
  evidence.Verdict.REPRODUCED: SOONER,  # The claim tested: fewer seconds than the baseline.
  evidence.Verdict.CONTRADICTED: LATER,
  evidence.Verdict.NO_DIFFERENCE: evidence.Verdict.NO_DIFFERENCE,
  evidence.Verdict.UNDECIDED: evidence.Verdict.UNDECIDED,
  evidence.Verdict.TOO_FEW: evidence.Verdict.TOO_FEW,
}


@dataclasses.dataclass(frozen=True)
class TimeToTarget:
  """One method's simulated seconds to the target and, but for the baseline, its paired
  difference from the baseline's with the verdicts raw and Holm-adjusted."""

  label: str
  seconds: Mapping[int, float]  # Seed -> seconds to the target, or to the run's end.
  censored: frozenset[int]  # The seeds whose run never reached the target.
  difference: evidence.PairedDifference | None = None
  raw: str = ''
  holm: str = ''


def _censoring(
  method: TimeToTarget, baseline: TimeToTarget, difference: evidence.PairedDifference
) -> tuple[bool, bool]:
  """Whether the method's and the baseline's values on the paired seeds include a bound."""
  paired = set(difference.seeds)
  return bool(method.censored & paired), bool(baseline.censored & paired)


def compare(methods: Sequence[TimeToTarget], baseline: TimeToTarget) -> list[TimeToTarget]:
  """`methods` (the baseline among them or not) each against `baseline`, with Holm's adjustment
  over the comparisons; the baseline comes back as it is."""
  others = [m for m in methods if m.label != baseline.label]
  differences = [evidence.paired_difference(m.seconds, baseline.seconds) for m in others]
  censoring = [_censoring(m, baseline, d) for m, d in zip(others, differences)]
  lower = evidence.Direction.LOWER
  adjusted = evidence.holm_verdicts(
    differences, [lower] * len(others), [0.0] * len(others), censoring
  )
  compared = {
    m.label: dataclasses.replace(
      m,
      difference=d,
      raw=_WORDS[
        evidence.censored_verdict(
          evidence.verdict(d, lower), lower, method_censored=c[0], baseline_censored=c[1]
        )
      ],
      holm=_WORDS[holm],
    )
    for m, d, c, holm in zip(others, differences, censoring, adjusted)
  }
  return [compared.get(m.label, m) for m in methods]


def cell_times(cell: benchmark_report.Cell) -> list[TimeToTarget]:
  """The cell's methods in its ranking's order, each against the baseline; empty unless the
  cell was timed and has a target."""
  ranked, budget = benchmark_report.rows(cell)
  spec = cell.spec
  if benchmark_report.TIME not in benchmark_report.measures(budget) or not spec.targets:
    return []
  chosen = evidence_report.reported_runs(spec, cell.runs, evidence_spec.tune(spec, cell.runs))
  metric = f'{evidence_spec.SECONDS_TO}{spec.targets[0]}'
  by_label = {}
  for method in chosen.values():
    seconds, censored = evidence_report.censored_values(spec, method.runs, metric)
    by_label[method.label] = TimeToTarget(method.label, seconds, frozenset(censored))
  methods = [by_label[row.label] for row in ranked]
  return compare(methods, by_label[chosen[spec.baseline].label])


def _mean(method: TimeToTarget) -> str:
  text = f'{np.mean(list(method.seconds.values())):.4g}'
  if not method.censored:
    return text
  return f'≥ {text} ({len(method.seconds) - len(method.censored)}/{len(method.seconds)} reach)'


def _versus(method: TimeToTarget) -> str:
  d = method.difference
  if d is None:
    return '(baseline)'
  word = method.raw if method.raw == method.holm else f'{method.raw}; Holm: {method.holm}'
  if d.n < 2:
    return word
  return f'{d.mean:+.4g} [{d.low:+.4g}, {d.high:+.4g}] {word}'


def section(cell: benchmark_report.Cell) -> list[str]:
  """The page's lines for a timed cell's time to target (none for another cell)."""
  times = cell_times(cell)
  if not times:
    return []
  to = tables.target_text(cell.spec.targets[0])
  table = tables.pipe_table(
    ['method (lr)', f'mean simulated s to {to}', f'vs {cell.spec.baseline} [95% CI]'],
    [[m.label for m in times], [_mean(m) for m in times], [_versus(m) for m in times]],
  )
  return [
    f'Simulated seconds to {to} against {cell.spec.baseline}, a run that never reaches it '
    'counted at its end (one Holm family):',
    '',
    table,
    '',
  ]
