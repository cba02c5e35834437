"""How a benchmark cell's answer moved between two commits of its raw metrics.

    # The synthetic cells at 200 rounds (before 4b56d0f) against today's:
    python -m tools.ranking_shift --before=4b56d0f^ synthetic_LDF synthetic_YC

For each named cell of ``docs/benchmark`` it loads the cell as committed at ``--before``
(its flags, raw metrics and the tuning cell it borrows rates from, read out of git into a
temporary folder) and as it is in the working tree (or at ``--after``), ranks both as the
page does (`benchmark_report.rows`) and prints, per method: the rate, the rank, the final
accuracy and the verdict against the baseline at fixed rounds and at fixed bits, before →
after. A verdict is ``+`` ahead, ``−`` behind, ``=`` no difference detected (the 95%
interval), with ``*`` where it holds after Holm's adjustment over the cell's comparisons
with the baseline (the page's *Holm* column and the heatmap's dots). Under each table:
Kendall's tau between the two rankings over the methods both have, and how many verdicts
changed. It prints and writes nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import dataclasses
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from scipy import stats

from bin import experiment_config
from tff_sampling.analysis import benchmark_heatmap
from tff_sampling.analysis import benchmark_report

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE_DIR = os.path.join('docs', 'benchmark')
MEASURES = ('final', 'budget')  # Fixed rounds, fixed uploaded bits.


@dataclasses.dataclass(frozen=True)
class Standing:
  """A method in one version of a cell."""

  rate: str
  rank: int
  accuracy: float  # Mean final accuracy over the reported seeds.
  verdicts: tuple[str, ...]  # Against the baseline, one per `MEASURES` ('' for the baseline).


def standings(cell: benchmark_report.Cell) -> dict[str, Standing]:
  """``{method: Standing}`` of a complete cell, in the page's ranking order."""
  name = os.path.basename(cell.folder)
  if cell.pending:
    raise ValueError(f'Cell {name!r} is not complete ({cell.pending}); compare it once it is.')
  grid = benchmark_heatmap.grid([cell])
  if grid is None:
    raise ValueError(f'Cell {name!r} only tunes (--seeds=0) and ranks nothing; name one that does.')
  ranked, _ = benchmark_report.rows(cell)
  out = {}
  for rank, row in enumerate(ranked, 1):
    verdicts = ()
    if row.method != cell.spec.baseline:
      i = grid.methods.index(row.method)
      verdicts = tuple(
        _mark(row.difference(m)) + ('*' if grid.decided[m][i, 0] else '') for m in MEASURES
      )
    match = re.search(r'\(lr ([^)]+)\)', row.label)
    out[row.method] = Standing(
      match.group(1) if match else '', rank, float(np.mean(row.final)), verdicts
    )
  return out


def _mark(difference) -> str:
  if difference.low > 0:
    return '+'
  if difference.high < 0:
    return '−'
  return '='


def shift_table(before: dict[str, Standing], after: dict[str, Standing]) -> str:
  """The markdown table of every method both versions have, in the later ranking's order,
  then Kendall's tau and the count of changed verdicts."""
  common = sorted((m for m in after if m in before), key=lambda m: after[m].rank)
  lines = [
    '| method | rate | rank | accuracy | per round vs baseline | per bit vs baseline |',
    '|---|---|---|---|---|---|',
  ]
  changed = 0
  for method in common:
    b, a = before[method], after[method]
    pairs = [
      f'{x or "·"} → {y or "·"}' for x, y in zip(b.verdicts or ('',) * 2, a.verdicts or ('',) * 2)
    ]
    changed += sum(x != y for x, y in zip(b.verdicts, a.verdicts))
    lines.append(
      f'| {method} | {b.rate} → {a.rate} | {b.rank} → {a.rank} '
      f'| {b.accuracy:.3f} → {a.accuracy:.3f} | {pairs[0]} | {pairs[1]} |'
    )
  tau = stats.kendalltau([before[m].rank for m in common], [after[m].rank for m in common])
  compared = sum(1 for m in common if before[m].verdicts and after[m].verdicts) * len(MEASURES)
  lines.append('')
  lines.append(
    f"Kendall's tau between the rankings: {tau.correlation:.2f} over {len(common)} methods; "
    f'{changed} of {compared} verdicts against the baseline changed.'
  )
  left = sorted(set(before) ^ set(after))
  if left:
    lines.append(f'In one version only (left out): {", ".join(left)}.')
  return '\n'.join(lines)


def cells_at(
  revision: str | None, names: Sequence[str], folder: str
) -> dict[str, benchmark_report.Cell]:
  """The named cells as committed at `revision` (extracted under `folder`), or as they are
  in the working tree (`revision` None)."""
  root = REPOSITORY
  if revision is not None:
    archive = subprocess.run(
      ['git', 'archive', revision, PAGE_DIR], cwd=REPOSITORY, capture_output=True, check=False
    )
    if archive.returncode:
      raise ValueError(
        f'git cannot read {PAGE_DIR} at {revision!r}: {archive.stderr.decode().strip()}'
      )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
      tar.extractall(folder, filter='data')
    root = folder
  cells = {}
  for name in names:
    relative = os.path.join(PAGE_DIR, name, experiment_config.CONFIG_FILENAME)
    config = os.path.join(root, relative)
    if not os.path.exists(config):
      where = f'at {revision}' if revision else 'in the working tree'
      raise ValueError(
        f'No cell {name!r} {where} ({relative} is missing); name a folder of {PAGE_DIR}.'
      )
    cells[name] = experiment_config.committed_cell(config)
  return cells


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--before', required=True, help='the earlier commit (any git revision)')
  parser.add_argument('--after', help='the later commit (default: the working tree)')
  parser.add_argument('cells', nargs='+', help=f'folder names in {PAGE_DIR}, e.g. synthetic_LDF')
  args = parser.parse_args(argv)
  try:
    with tempfile.TemporaryDirectory() as before_dir, tempfile.TemporaryDirectory() as after_dir:
      before = cells_at(args.before, args.cells, before_dir)
      after = cells_at(args.after, args.cells, after_dir)
      for name in args.cells:
        print(f'## {name}: {args.before} → {args.after or "working tree"}\n')
        print(shift_table(standings(before[name]), standings(after[name])))
        print()
  except ValueError as error:
    print(f'Error: {error}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
