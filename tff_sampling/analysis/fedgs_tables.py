"""FedGS's tables and plot over availability modes: the lowest test loss per method and
mode, and the final sampling counts per client (`bin.fedgs` prints and draws them)."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib import figure as mpl_figure
from matplotlib.backends import backend_agg
import numpy as np

from tff_sampling.analysis import evidence
from tff_sampling.analysis import plotting
from tff_sampling.runtime import results


def best_loss(run: results.Run) -> float:
  """The lowest evaluated test loss of a run (the paper's "optimal testing loss")."""
  return evidence.lowest(run)


def loss_table(table: Mapping[str, Mapping[str, list[results.Run]]]) -> str:
  """Best test loss (mean ± std over seeds) per method (rows) × mode (columns),
  with the relative change against the method's IDL run where there is one."""
  modes = list(table)
  methods = list(dict.fromkeys(m for groups in table.values() for m in groups))
  width = 24
  header = f'{"method":<16}' + ''.join(f'{mode:>{width}}' for mode in modes)
  lines = [header, '-' * len(header)]
  for method in methods:
    cells = []
    ideal = table.get('IDL', {}).get(method)
    ideal_mean = np.mean([best_loss(r) for r in ideal]) if ideal else None
    for mode in modes:
      runs = table[mode].get(method, [])
      losses = np.array([best_loss(r) for r in runs])
      cell = f'{losses.mean():.4f} ± {results.seed_spread(losses):.4f}'
      if ideal_mean is not None and mode != 'IDL':
        cell += f' {100 * (losses.mean() / ideal_mean - 1):+.1f}%'
      cells.append(f'{cell:>{width}}')
    lines.append(f'{method:<16}' + ''.join(cells))
  return '\n'.join(lines)


def plot_sampling_counts(groups: Mapping[str, list[results.Run]], title: str, path: str) -> str:
  """Sorted final sampling counts per client, one line per method (its first seed's run)."""
  fig = mpl_figure.Figure(figsize=(6.4, 4.0))
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.subplots()
  for i, (method, runs) in enumerate(groups.items()):
    counts = runs[0].selection_counts
    if counts is None:
      continue
    # Dashes keep methods with the same sampler (uniform, fedprox) both visible.
    ax.plot(
      np.sort(counts)[::-1],
      marker='.',
      linestyle=('-', '--', ':', '-.')[i % 4],
      label=f'{method} (std {counts.std():.1f})',
    )
  ax.set_xlabel('client (sorted by count)')
  ax.set_ylabel('times sampled')
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  return plotting.save_figure(fig, path, dpi=100)


def count_table(groups: Mapping[str, list[results.Run]]) -> str:
  """Spread of the final sampling counts per method (mean over seeds)."""
  lines = [f'{"method":<16}{"count std":>10}{"min":>6}{"max":>6}{"never sampled":>15}']
  for method, runs in groups.items():
    counts = [r.selection_counts for r in runs if r.selection_counts is not None]
    if not counts:
      continue
    lines.append(
      f'{method:<16}{np.mean([c.std() for c in counts]):>10.2f}'
      f'{np.mean([c.min() for c in counts]):>6.1f}'
      f'{np.mean([c.max() for c in counts]):>6.1f}'
      f'{np.mean([np.sum(c == 0) for c in counts]):>15.1f}'
    )
  return '\n'.join(lines)
