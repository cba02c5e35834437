"""Plots of experiment results: a metric against rounds and against uploaded bits.

Library code used by `bin/plot.py` and by binaries that plot their own results
(no flags are defined here, so any binary may import it). Matplotlib loads with the first
figure, not with this module: a binary that only checks its plot path starts without it.
"""

from __future__ import annotations

from collections.abc import Sequence
import io
import os
from typing import TYPE_CHECKING

from absl import logging
import numpy as np
import PIL.Image

from tff_sampling.runtime import files
from tff_sampling.runtime import results

if TYPE_CHECKING:
  from matplotlib import figure as mpl_figure

METRIC_COLUMNS = {'accuracy': 'eval/accuracy', 'loss': 'eval/loss'}


def metric_column(metric: str) -> str:
  """The metrics.csv column of a `--metric` value.

  Args:
    metric: 'accuracy', 'loss', or a column name containing '/'.

  Raises:
    ValueError: If `metric` is neither a known name nor a column name.
  """
  if metric in METRIC_COLUMNS:
    return METRIC_COLUMNS[metric]
  if '/' in metric:
    return metric
  raise ValueError(
    f'Unknown metric {metric!r}; use one of {", ".join(METRIC_COLUMNS)} or a '
    "metrics.csv column such as 'train/loss'."
  )


def make_figure(
  runs: Sequence[results.Run], *, metric: str = 'accuracy', title: str | None = None
) -> mpl_figure.Figure:
  """Draws the two panels for `runs`, one line per hyper-parameter group.

  Args:
    runs: Loaded runs; seeds of one configuration are averaged.
    metric: As for `metric_column`.
    title: Figure title, or None for none.

  Returns:
    A figure attached to the non-interactive Agg canvas (no pyplot state).

  Raises:
    ValueError: If `runs` is empty or `metric` unknown.
    KeyError: If a run lacks the metric or the cumulative bits column.
  """
  if not runs:
    raise ValueError('No runs to plot.')
  y_column = metric_column(metric)
  from matplotlib import figure as mpl_figure  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.backends import backend_agg  # pylint: disable=g-import-not-at-top

  fig = mpl_figure.Figure(figsize=(12, 4.5), layout='constrained')
  backend_agg.FigureCanvasAgg(fig)
  rounds_axes, bits_axes = fig.subplots(1, 2)
  for label, group in results.group_runs(runs).items():
    if len(group) > 1:
      label = f'{label} (n={len(group)} seeds)'
    rounds, mean, std = results.aggregate(group, results.ROUND_COLUMN, y_column)
    (line,) = rounds_axes.plot(rounds, mean, label=label)
    # Evaluated rounds only: a round's mean at that round's mean cumulative bits.
    bits = results.mean_at_rounds(group, results.BITS_COLUMN, rounds)
    bits_mean, bits_std = mean, std
    # Round 0 uploads nothing; a log axis cannot show 0 bits.
    positive = np.isfinite(bits) & (bits > 0)
    bits_axes.plot(bits[positive], bits_mean[positive], color=line.get_color(), label=label)
    if len(group) > 1:
      rounds_axes.fill_between(
        rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0
      )
      bits_axes.fill_between(
        bits[positive],
        (bits_mean - bits_std)[positive],
        (bits_mean + bits_std)[positive],
        color=line.get_color(),
        alpha=0.2,
        linewidth=0,
      )
    if not np.any(positive):
      logging.warning('%s: the seeds share no range of uploaded bits > 0.', label)
  rounds_axes.set_xlabel('round')
  bits_axes.set_xlabel('cumulative uploaded bits')
  bits_axes.set_xscale('log')
  bits_axes.xaxis.set_minor_formatter(ticker.NullFormatter())  # Decades only: no overlap.
  for axes in (rounds_axes, bits_axes):
    axes.set_ylabel(y_column)
    axes.grid(alpha=0.3)
  rounds_axes.legend(fontsize='small')
  if title:
    fig.suptitle(title)
  return fig


def load_runs(
  run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[results.Run]:
  """Loads the runs of run directories or glob patterns (one, or a sequence).

  Raises:
    ValueError: If no run directory is given, a pattern matches nothing, or a
      run's files cannot be read (see `results.load_run`).
    FileNotFoundError: If a run directory or one of its files is missing.
  """
  if isinstance(run_dirs, (str, os.PathLike)):
    run_dirs = [run_dirs]
  directories = results.find_run_dirs(run_dirs)
  if not directories:
    raise ValueError('No run directories given.')
  return [results.load_run(directory) for directory in directories]


# The PNG text chunk that marks a plot as written by this project: only such a
# file is ever overwritten.
PLOT_MARKER = {'Software': 'tff_sampling'}


def is_own_plot(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is a PNG this project wrote (it carries `PLOT_MARKER`)."""
  try:
    with PIL.Image.open(path) as image:
      return image.format == 'PNG' and all(image.info.get(k) == v for k, v in PLOT_MARKER.items())
  except (OSError, ValueError, PIL.UnidentifiedImageError):
    return False


def check_plot_path(output_path: str | os.PathLike[str]) -> str:
  """The absolute `output_path` if a plot may be written there; else ValueError.

  A plot may replace only a plot this project wrote (`is_own_plot`), never a
  user's file or directory. Binaries call this before their runs start.
  """
  path = os.path.abspath(os.fspath(output_path))
  if os.path.isdir(path):
    raise ValueError(
      f'Cannot write the plot to {path!r}: it is a directory; give a file name ending in .png.'
    )
  if os.path.lexists(path) and not is_own_plot(path):
    raise ValueError(
      f'Refusing to overwrite {path!r}: it is not a plot written by '
      'tff_sampling. Move it away, or choose another output path.'
    )
  return path


def save_figure(fig: mpl_figure.Figure, output_path: str | os.PathLike[str], dpi: int = 120) -> str:
  """Writes `fig` as a PNG (missing parent directories are made); returns its absolute path.

  An existing file is replaced only if this project wrote it (`is_own_plot`);
  the PNG is written to a temporary file first and renamed into place.

  Raises:
    ValueError: If `output_path` is a directory, or exists and is not a plot of
      this project.
    OSError: If the file cannot be written (e.g. `output_path` is a directory).
  """
  path = check_plot_path(output_path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  files.write_atomically(path, png_bytes(fig, dpi))
  return path


def png_bytes(fig: mpl_figure.Figure, dpi: int = 120) -> bytes:
  """`fig` as the PNG that `save_figure` writes (marked with `PLOT_MARKER`)."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=dpi, metadata=PLOT_MARKER)
  return buffer.getvalue()


def plot_runs(
  run_dirs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
  output_path: str | os.PathLike[str],
  *,
  metric: str = 'accuracy',
  title: str | None = None,
) -> str:
  """Loads runs, plots them with `make_figure` and writes a PNG.

  Args:
    run_dirs: Run directories or glob patterns (one, or a sequence).
    output_path: Where to write the PNG; missing parent directories are made.
    metric: 'accuracy', 'loss', or a metrics.csv column.
    title: Figure title, or None for none.

  Returns:
    The absolute path of the written PNG.

  Raises:
    ValueError: If no run directory is given, a pattern matches nothing,
      `metric` is unknown, or a run's files cannot be read.
    FileNotFoundError: If a run directory or one of its files is missing.
    KeyError: If a run lacks the metric or the cumulative bits column.
    OSError: If the PNG cannot be written.
  """
  metric_column(metric)  # Fail before reading any file.
  runs = load_runs(run_dirs)
  return save_figure(make_figure(runs, metric=metric, title=title), output_path)
