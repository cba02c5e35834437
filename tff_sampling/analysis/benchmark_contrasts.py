"""The comparisons a cell's ranking against uniform leaves out: the leader against the next
`RIVALS` methods, and every method against full participation, each at a fixed number of
rounds, at the baseline's uploaded bits and at the baseline's client work, and at its
simulated time in a timed cell (`benchmark_report.measures`). Each table is one family: its
verdicts are Holm-adjusted over its rows and measures."""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

from tff_sampling.analysis import benchmark_report
from tff_sampling.analysis import evidence
from tff_sampling.analysis import tables

RIVALS = 3  # The methods after the leader it is compared with.
FULL = 'full'
_WORDS = {
  evidence.Verdict.REPRODUCED: 'ahead',
  evidence.Verdict.CONTRADICTED: 'behind',
  evidence.Verdict.NO_DIFFERENCE: evidence.Verdict.NO_DIFFERENCE,
  evidence.Verdict.TOO_FEW: evidence.Verdict.TOO_FEW,
}


@dataclasses.dataclass(frozen=True)
class Contrast:
  """``first − second`` at each of the cell's `benchmark_report.measures`, paired over seeds,
  with the verdicts raw and Holm-adjusted over the contrast's table."""

  first: str
  second: str
  differences: tuple[evidence.PairedDifference, ...]
  raw: tuple[str, ...]
  holm: tuple[str, ...]


def _contrasts(
  pairs: Sequence[tuple[benchmark_report.Row, benchmark_report.Row]], kinds: Sequence[str]
) -> list[Contrast]:
  """One `Contrast` per ``(first, second)`` pair at the `kinds` of measures; Holm over all
  pairs and measures."""
  differences = [
    tuple(evidence.paired_difference(a.by_seed(m), b.by_seed(m)) for m in kinds) for a, b in pairs
  ]
  flat = [d for row in differences for d in row]
  higher = evidence.Direction.HIGHER
  adjusted = evidence.holm_verdicts(flat, [higher] * len(flat), [0.0] * len(flat))
  width = len(kinds)
  out = []
  for i, ((a, b), row) in enumerate(zip(pairs, differences)):
    out.append(
      Contrast(
        first=a.label,
        second=b.label,
        differences=row,
        raw=tuple(_WORDS[evidence.verdict(d, higher)] for d in row),
        holm=tuple(_WORDS[v] for v in adjusted[i * width : (i + 1) * width]),
      )
    )
  return out


def leader(
  ranked: Sequence[benchmark_report.Row], kinds: Sequence[str] = benchmark_report.MEASURES
) -> list[Contrast]:
  """The best final accuracy against each of the next `RIVALS`."""
  return _contrasts([(ranked[0], rival) for rival in ranked[1 : 1 + RIVALS]], kinds)


def against_full(
  ranked: Sequence[benchmark_report.Row], kinds: Sequence[str] = benchmark_report.MEASURES
) -> list[Contrast]:
  """Every method against full participation (empty if the cell does not run it)."""
  full = [row for row in ranked if row.method == FULL]
  if not full:
    return []
  return _contrasts([(row, full[0]) for row in ranked if row.method != FULL], kinds)


def _cell(difference: evidence.PairedDifference, raw: str, holm: str) -> str:
  if difference.n < 2:
    return raw
  word = raw if raw == holm else f'{raw}; Holm: {holm}'
  return f'{difference.mean:+.4f} [{difference.low:+.4f}, {difference.high:+.4f}] {word}'


def table(contrasts: Sequence[Contrast], budget: benchmark_report.Budgets, final_k: int) -> str:
  """`contrasts` as a pipe table: one row each, one column per measure."""
  kinds = benchmark_report.measures(budget)
  columns = [[f'{c.first} − {c.second}' for c in contrasts]]
  for i in range(len(kinds)):
    columns.append([_cell(c.differences[i], c.raw[i], c.holm[i]) for c in contrasts])
  headers = [
    'difference',
    f'final accuracy (last {final_k} evals) [95% CI]',
    f'at {budget.bits / 1e9:.4g} Gbit [95% CI]',
    f'at {budget.examples / 1e6:.3g}M examples trained [95% CI]',
    f'at {budget.seconds:.4g} simulated s [95% CI]',
  ][: 1 + len(kinds)]
  return tables.pipe_table(headers, columns)


def section(cell: benchmark_report.Cell) -> list[str]:
  """The page's lines for one ranked cell: the leader's table, then full participation's."""
  ranked, budget = benchmark_report.rows(cell)
  k, kinds = cell.spec.final_k, benchmark_report.measures(budget)
  parts = []
  if len(ranked) > 1:
    parts += [
      f'The leader against the next {min(RIVALS, len(ranked) - 1)} (one Holm family):',
      '',
      table(leader(ranked, kinds), budget, k),
      '',
    ]
  full = against_full(ranked, kinds)
  if full:
    parts += [
      'Every method against full participation (one Holm family):',
      '',
      table(full, budget, k),
      '',
    ]
  return parts
