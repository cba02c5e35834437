"""The benchmark's picture: every method against the baseline in every ranked cell.

One panel per comparison (final accuracy at a fixed number of rounds; accuracy at the
baseline's uplink budget; accuracy at the baseline's client work, the examples its clients
train on; once a cell is timed by a system model, accuracy at the baseline's simulated time,
a panel of the timed cells only), methods down, cells across; a square's colour is the paired mean
difference against the baseline over the seeds (blue ahead, red behind), and a dot marks the
differences whose interval still excludes 0 once the cell's comparisons against the
baseline (every method at every measure) are one family (Holm), the same verdicts as the
page's *Holm* column.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import os

from matplotlib import figure as mpl_figure
from matplotlib.backends import backend_agg
import numpy as np

from tff_sampling.analysis import benchmark_report
from tff_sampling.analysis import evidence
from tff_sampling.analysis import plotting

FILENAME = 'heatmap.png'
PANELS = (
  ('final', 'at a fixed number of rounds'),
  ('budget', "at the baseline's uploaded bits"),
  ('work', "at the baseline's client work"),
)
TIME_PANEL = (benchmark_report.TIME, "at the baseline's simulated time")  # Once a cell is timed.


@dataclasses.dataclass(frozen=True)
class Grid:
  """The numbers the picture draws.

  Attributes:
    panels: The `PANELS` drawn, and `TIME_PANEL` if any cell is timed.
    methods: Row labels (methods, the best mean rank first; the baseline left out).
    cells: Column labels (the cells' folder names).
    difference: ``{panel: float[methods, cells]}``, the paired mean difference against the
      baseline (NaN where a cell lacks the method).
    decided: ``{panel: bool[methods, cells]}``, the Holm-adjusted interval excludes 0.
  """

  panels: tuple[tuple[str, str], ...]
  methods: tuple[str, ...]
  cells: tuple[str, ...]
  difference: dict[str, np.ndarray]
  decided: dict[str, np.ndarray]


def grid(cells: Sequence[benchmark_report.Cell]) -> Grid | None:
  """The `Grid` of the ranked cells (``None`` while none is ranked)."""
  ready = _ready(cells)
  if not ready:
    return None
  values: dict[tuple[str, str, str], tuple[float, bool]] = {}
  ranks: dict[str, list[int]] = {}
  panels: tuple[tuple[str, str], ...] = PANELS
  for cell in ready:
    name = os.path.basename(cell.folder)
    ranked, budget = benchmark_report.rows(cell)
    kinds = benchmark_report.measures(budget)
    if benchmark_report.TIME in kinds:
      panels = (*PANELS, TIME_PANEL)
    differences = [
      (row.method, kind, row.difference(kind))
      for row in ranked
      if row.method != cell.spec.baseline
      for kind in kinds
    ]
    verdicts = evidence.holm_verdicts(
      [d for *_, d in differences],
      [evidence.Direction.HIGHER] * len(differences),
      [0.0] * len(differences),
    )
    for (method, panel, paired), verdict in zip(differences, verdicts):
      decisive = verdict in (evidence.Verdict.REPRODUCED, evidence.Verdict.CONTRADICTED)
      values[method, name, panel] = (paired.mean, decisive)
    for rank, row in enumerate(ranked, 1):
      if row.method != cell.spec.baseline:
        ranks.setdefault(row.method, []).append(rank)
  methods = tuple(sorted(ranks, key=lambda m: (float(np.mean(ranks[m])), m)))
  names = tuple(os.path.basename(c.folder) for c in ready)
  shape = (len(methods), len(names))
  difference = {p: np.full(shape, np.nan) for p, _ in panels}
  decided = {p: np.zeros(shape, bool) for p, _ in panels}
  for (method, name, panel), (mean, decisive) in values.items():
    i, j = methods.index(method), names.index(name)
    difference[panel][i, j], decided[panel][i, j] = mean, decisive
  return Grid(panels, methods, names, difference, decided)


def figure(data: Grid, baseline: str) -> mpl_figure.Figure:
  """The panels side by side, on one colour scale symmetric about 0.

  A panel shows only the cells that have a number in it (the time panel only the timed
  cells), each panel as wide as its cells.
  """
  finite = np.concatenate([d[np.isfinite(d)] for d in data.difference.values()])
  limit = float(np.max(np.abs(finite))) if finite.size else 1.0
  shown = {p: shown_cells(data, p) for p, _ in data.panels}
  rows, cols = len(data.methods), sum(len(c) for c in shown.values())
  fig = mpl_figure.Figure(figsize=(3.0 + 0.6 * cols, 1.8 + 0.3 * rows), layout='constrained')
  backend_agg.FigureCanvasAgg(fig)
  axes = fig.subplots(
    1, len(data.panels), sharey=True, width_ratios=[len(shown[p]) for p, _ in data.panels]
  )
  images = []
  for ax, (panel, title) in zip(axes, data.panels):
    columns = shown[panel]
    values = np.ma.masked_invalid(data.difference[panel][:, columns])
    images.append(ax.imshow(values, cmap='RdBu', vmin=-limit, vmax=limit, aspect='auto'))
    ax.set_facecolor('0.85')  # A method the cell does not have.
    marked = np.argwhere(data.decided[panel][:, columns])
    ax.scatter(marked[:, 1], marked[:, 0], s=16, c='black', edgecolors='white', linewidths=0.8)
    labels = [data.cells[j] for j in columns]
    ax.set_xticks(range(len(columns)), labels, rotation=40, ha='right', fontsize=8)
    ax.set_title(f'vs {baseline}\n{title}', fontsize=9)
  axes[0].set_yticks(range(rows), data.methods, fontsize=8)
  colorbar = fig.colorbar(images[0], ax=list(axes), shrink=0.8)
  colorbar.set_label(f'accuracy difference against {baseline} (mean over seeds)', fontsize=8)
  fig.suptitle(
    f'Each method against {baseline}: blue ahead, red behind; • the Holm-adjusted 95% '
    'interval excludes 0',
    fontsize=9,
  )
  return fig


def shown_cells(data: Grid, panel: str) -> list[int]:
  """The columns of `data.cells` that have a number in `panel`: a cell the measure does not
  apply to, such as an untimed cell at fixed simulated time, is left out (all of them, grey,
  if no cell has a number)."""
  columns = [j for j in range(len(data.cells)) if np.isfinite(data.difference[panel][:, j]).any()]
  return columns or list(range(len(data.cells)))


def _ready(cells: Sequence[benchmark_report.Cell]) -> list[benchmark_report.Cell]:
  return [c for c in cells if not (c.pending or c.spec.tuning_only)]


def heatmap_path(cells: Sequence[benchmark_report.Cell]) -> str | None:
  """Where the picture goes: beside the cells' folders (``None`` while no cell is ranked)."""
  if not _ready(cells):
    return None
  folder = os.path.commonpath([os.path.abspath(c.folder) for c in cells])
  if len(cells) == 1:
    folder = os.path.dirname(folder)
  return os.path.join(folder, FILENAME)


def heatmap_files(cells: Sequence[benchmark_report.Cell]) -> dict[str, bytes]:
  """``{heatmap_path: png}`` (nothing while no cell is ranked)."""
  path, data = heatmap_path(cells), grid(cells)
  if path is None or data is None:
    return {}
  baseline = _ready(cells)[0].spec.baseline
  return {path: plotting.png_bytes(figure(data, baseline))}
