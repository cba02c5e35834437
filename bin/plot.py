"""Plots runs of the experiment program: a metric against rounds and bits.

    python -m bin.plot \\
        --run_dirs='results/digits_uniform_seed*,results/digits_optimal_seed*' \\
        --output=/tmp/digits.png --metric=accuracy

The figure has two panels side by side: the evaluation metric against the
round, and against the cumulative uploaded bits (log scale). Runs whose
hyper-parameters differ only in the seed form one line: the mean over seeds
with a band of ± one (sample) standard deviation, labelled with the
hyper-parameters that differ between lines and "n=3 seeds". See
`tff_sampling.runtime.results.aggregate` for how seeds whose uploads differ are
aligned on the bits axis.

The plotting itself is `tff_sampling.analysis.plotting` (no flags), which other
binaries call directly.
"""

from __future__ import annotations

from collections.abc import Sequence
import sys

from absl import app
from absl import flags

from tff_sampling.analysis import plotting

_RUN_DIRS = flags.DEFINE_list(
  'run_dirs',
  None,
  'Comma-separated run directories (<root_output_dir>/<experiment_name>); an '
  'entry may be a glob pattern such as results/digits_*. Required.',
)
_OUTPUT = flags.DEFINE_string('output', None, 'Path of the PNG to write. Required.')
_METRIC = flags.DEFINE_string(
  'metric',
  'accuracy',
  "'accuracy' (eval/accuracy), 'loss' (eval/loss), or any numeric column of "
  'metrics.csv such as train/loss.',
)
_TITLE = flags.DEFINE_string('title', None, 'Figure title; none if unset.')


def _check_metric(metric: str) -> bool:
  if metric in plotting.METRIC_COLUMNS or '/' in metric:
    return True
  raise flags.ValidationError(
    f'--metric must be {", ".join(plotting.METRIC_COLUMNS)} or a metrics.csv column such as '
    f'train/loss, got {metric!r}.'
  )


flags.register_validator('metric', _check_metric)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not _RUN_DIRS.value:
    raise app.UsageError('--run_dirs is required.')
  if not _OUTPUT.value:
    raise app.UsageError('--output is required.')
  try:
    runs = plotting.load_runs(_RUN_DIRS.value)
    figure = plotting.make_figure(runs, metric=_METRIC.value, title=_TITLE.value)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'Error: {e}')
  except KeyError as e:  # A run lacks the column: its message names the file.
    sys.exit(
      f'Error: {e.args[0]}; plot a column every run has (--metric), or leave that '
      'run out of --run_dirs.'
    )
  try:
    path = plotting.save_figure(figure, _OUTPUT.value)
  except (OSError, ValueError) as e:  # ValueError: a directory, or a file not ours.
    sys.exit(
      f'Error: Cannot write --output={_OUTPUT.value!r}: '
      f'{getattr(e, "strerror", None) or e}; give the path of a PNG file in a writable '
      'directory.'
    )
  print(f'Wrote {path}')


if __name__ == '__main__':
  from tff_sampling.runtime import tff_context  # pylint: disable=g-import-not-at-top

  app.run(tff_context.binary_main(main))
