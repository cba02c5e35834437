"""Accuracy against rounds and against uploaded bits, mean over seeds with a +/- std band
per group (one panel per value of a panel key), rendered as the PNGs a report writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import math
import os
import textwrap

from matplotlib import figure as mpl_figure
from matplotlib import ticker
from matplotlib.backends import backend_agg
import numpy as np

from tff_sampling.analysis import plotting
from tff_sampling.analysis import run_groups
from tff_sampling.runtime import results

ROUNDS_PLOT_FILENAME = 'accuracy_rounds.png'


BITS_PLOT_FILENAME = 'accuracy_bits.png'
SECONDS_PLOT_FILENAME = 'accuracy_seconds.png'
# Simulated seconds since round 1, under a system model (`tff_sampling.devices`).
SECONDS_COLUMN = 'system/cumulative_seconds'


def make_curve_figure(
  groups: Mapping[str, Sequence[results.Run]],
  x_column: str,
  *,
  y_column: str = run_groups.ACCURACY_COLUMN,
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
  on_bits = x_column == results.BITS_COLUMN
  on_seconds = x_column == SECONDS_COLUMN
  shown = []
  for label, runs in groups.items():
    # Only evaluated rounds are drawn: on the bits axis, a round's mean accuracy sits at
    # that round's mean cumulative bits (no interpolation; every curve ends at its last
    # evaluation).
    x, mean, std = results.aggregate(runs, results.ROUND_COLUMN, y_column, ddof=run_groups.DDOF)
    if on_seconds:  # Round 0 takes no time: it starts the axis at 0.
      x = np.nan_to_num(results.mean_at_rounds(runs, x_column, x), nan=0.0)
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
  elif on_seconds:
    axes.set_xlabel('simulated seconds')
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

  With simulated time in every run (`timed`), accuracy vs simulated seconds too.

  Raises:
    KeyError: If a run lacks the accuracy or bits column.
  """
  columns = [results.ROUND_COLUMN, results.BITS_COLUMN]
  paths = list(plot_paths(output_dir))
  if timed(groups):
    columns.append(SECONDS_COLUMN)
    paths.append(os.path.join(output_dir, SECONDS_PLOT_FILENAME))
  return {
    os.path.abspath(path): plotting.png_bytes(
      make_curve_figure(groups, x_column, title=title, panels=panels)
    )
    for x_column, path in zip(columns, paths)
  }


def timed(groups: Mapping[str, Sequence[results.Run]]) -> bool:
  """Whether every run has simulated time (`SECONDS_COLUMN`)."""
  runs = [run for group in groups.values() for run in group]
  return bool(runs) and all(SECONDS_COLUMN in run.metrics for run in runs)


def seconds_plot_markdown(groups: Mapping[str, Sequence[results.Run]]) -> list[str]:
  """The report's lines showing the accuracy vs simulated seconds plot, if there is one."""
  if not timed(groups):
    return []
  return [f'![accuracy vs simulated seconds]({SECONDS_PLOT_FILENAME})', '']
