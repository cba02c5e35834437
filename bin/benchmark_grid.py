"""Runs the benchmark grid and renders its page: which sampler wins where.

    nohup python -m bin.benchmark_grid --runs_dir=<runs> --cache_dir=<cache> --parallel=2 \\
        --seeds_per_call=5 &
    python -m bin.benchmark_grid --stage=report          # docs/benchmark.md, no training
    python -m bin.benchmark_grid --stage=check           # is docs/benchmark.md up to date?
    python -m bin.benchmark_grid --quick --runs_dir=/tmp/quick   # minutes; writes only there

The grid is a folder of cells, ``docs/benchmark/<cell>/experiment.flags``: each
one task (regime) under one availability mode, every method of ``bin.benchmark``
on the same seeds (`tff_sampling.comparisons.benchmark`). ``--stage=train``
runs every cell with ``python -m bin.experiment``, task by task (the cell that
tunes, then those that borrow its rates; ``--cells`` picks cells and their
order), resumable (a finished run is never trained again), exporting each
cell's raw metrics beside its configuration.
``--stage=report`` renders ``docs/benchmark.md`` from those raw metrics alone
(`tff_sampling.analysis.benchmark_report`), with ``docs/benchmark/summary.md`` (the
hand-written "which sampler should I use") at its top and each complete cell's hand-written
``findings.md`` (in its folder) above its ranking, at any stage of the grid (unfinished
cells say how far they are). ``all`` does both. ``--stage=check``
exits non-zero, naming the files, unless the committed page and plots are what the raw
metrics give.

``--quick`` runs the small grid of ``docs/benchmark/quick`` (one regime, a few
rounds, 2 seeds) on copies of its configurations inside ``--runs_dir``, and
writes its page there too: nothing outside ``--runs_dir`` changes.
"""

from __future__ import annotations

from collections.abc import Sequence
import glob
import os
import shutil
import signal
import subprocess
import sys

from absl import app
from absl import flags

from bin import experiment_config
from bin import flag_checks
from tff_sampling.analysis import benchmark_page
from tff_sampling.analysis import benchmark_report
from tff_sampling.runtime import files
from tff_sampling.runtime import processes

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(_REPO, 'docs', 'benchmark')
QUICK_GRID = os.path.join(GRID, 'quick')
PAGE = os.path.join(_REPO, 'docs', 'benchmark.md')
SUMMARY = 'summary.md'

_RUNS_DIR = flags.DEFINE_string(
  'runs_dir', None, 'Directory of the runs, one sub-folder per cell (required to train).'
)
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, "TFF's dataset caches (passed to the runs).")
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Binary calls running at once.', lower_bound=1)
_SEEDS_PER_CALL = flags.DEFINE_integer(
  'seeds_per_call',
  1,
  "Seeds of a method that one binary call trains (bin.experiment's flag).",
  lower_bound=1,
)
_STAGE = flags.DEFINE_enum(
  'stage',
  'all',
  ['all', 'train', 'report', 'check'],
  'What to do: train, report (write the page), both, or check (exit 1 unless the page is what '
  'report would write).',
)
_QUICK = flags.DEFINE_bool('quick', False, 'The small grid, inside --runs_dir only.')
flag_checks.check_path(
  'runs_dir', flag_checks.Path.NEW_DIRECTORY, hint='where the runs go, one folder per cell'
)
flag_checks.check_path('cache_dir', flag_checks.Path.DIRECTORY, hint="TFF's dataset caches")
_CELLS = flags.DEFINE_list(
  'cells',
  [],
  'Cells to train, in this order (default: all, task by task); the page shows every cell.',
)


def _run_driver(args: Sequence[str]) -> tuple[int, int | None]:
  """Runs ``bin.experiment`` with `args` to its end: its exit status, and the signal that
  stopped it early (SIGTERM or SIGINT sent to this process, passed on as SIGTERM: the driver
  stops its binaries, whose runs resume on a rerun) or None."""
  # Its own session: a terminal's Ctrl-C reaches the driver once, through `forward`; and
  # SIGTERM from Linux should this process die unannounced (SIGKILL).
  driver = processes.start(
    [sys.executable, '-m', 'bin.experiment', *args],
    cwd=_REPO,
    stdin=subprocess.DEVNULL,
    start_new_session=True,
  )
  stopped_by: list[int] = []

  def forward(signum, frame):  # pylint: disable=unused-argument
    if not stopped_by:
      stopped_by.append(signum)
      driver.send_signal(signal.SIGTERM)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    returncode = driver.wait()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  return returncode, (stopped_by or [None])[0]  # Read once no signal can add to it.


def train(configs: Sequence[str], runs_dir: str) -> None:
  """Runs every cell with the experiment driver; raises if one fails. SIGTERM or SIGINT
  stops the driver and then this process, with exit status 128 + the signal's number."""
  for config in configs:
    name = os.path.basename(os.path.dirname(config))
    print(f'=== {name}', flush=True)
    returncode, stopped_by = _run_driver(
      [
        f'--config={config}',
        f'--runs_dir={os.path.join(runs_dir, name)}',
        f'--parallel={_PARALLEL.value}',
        f'--seeds_per_call={_SEEDS_PER_CALL.value}',
        *([f'--cache_dir={_CACHE_DIR.value}'] if _CACHE_DIR.value else []),
      ]
    )
    if stopped_by is not None:
      print(
        f'Stopped by {signal.Signals(stopped_by).name}; rerun the same command to resume.',
        flush=True,
      )
      sys.exit(128 + stopped_by)
    if returncode != 0:
      raise RuntimeError(f'Cell {name} failed (exit {returncode}); rerun to resume.')


def load_cells(configs: Sequence[str]) -> list[benchmark_report.Cell]:
  """Every cell, from the raw metrics committed beside each configuration."""
  return [experiment_config.committed_cell(config) for config in sorted(configs)]


def check(cells: Sequence[benchmark_report.Cell], page: str, *, command: str, preface: str) -> None:
  """Raises unless `page` and the cells' plots are what the report stage would write from
  the raw metrics, naming the files that are not.

  A grid without any raw metrics needs no page yet.
  """
  if not os.path.exists(page) and not any(cell.runs for cell in cells):
    return
  stale = files.differing(benchmark_page.page_files(cells, page, command=command, preface=preface))
  if stale:
    raise RuntimeError(
      f'Not what the raw metrics give: {", ".join(stale)}; rewrite with --stage=report.'
    )


def _quick_grid(runs_dir: str) -> str:
  """A copy of the quick grid's configurations inside `runs_dir` (its raw metrics go there)."""
  copies = os.path.join(runs_dir, 'configs')
  for config in glob.glob(os.path.join(QUICK_GRID, '*', experiment_config.CONFIG_FILENAME)):
    target = os.path.join(copies, os.path.basename(os.path.dirname(config)))
    os.makedirs(target, exist_ok=True)
    shutil.copyfile(config, os.path.join(target, experiment_config.CONFIG_FILENAME))
  return copies


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  try:
    if _QUICK.value:
      if not _RUNS_DIR.value:
        raise ValueError('--quick writes only inside --runs_dir: give one.')
      runs_dir = os.path.abspath(_RUNS_DIR.value)
      grid = _quick_grid(runs_dir)
      page, summary = os.path.join(runs_dir, 'benchmark.md'), None
      command = f'python -m bin.benchmark_grid --quick --runs_dir={_RUNS_DIR.value} --stage=report'
    else:
      grid = GRID
      page, summary = PAGE, os.path.join(GRID, SUMMARY)
      command = 'python -m bin.benchmark_grid --stage=report'
    if _STAGE.value in ('all', 'train'):
      if not _RUNS_DIR.value:
        raise ValueError('--runs_dir is required to train.')
      train(experiment_config.grid_configs(grid, _CELLS.value), os.path.abspath(_RUNS_DIR.value))
    configs = experiment_config.grid_configs(grid)
    preface = ''
    if summary and os.path.isfile(summary):
      with open(summary, encoding='utf-8') as f:
        preface = f.read()
    if _STAGE.value == 'check':
      check(load_cells(configs), page, command=command, preface=preface)
      print(f'{page} is what its raw metrics give.')
    if _STAGE.value in ('all', 'report'):
      for path in benchmark_page.write(load_cells(configs), page, command=command, preface=preface):
        print(f'Wrote {path}')
  except (ValueError, FileNotFoundError, RuntimeError) as e:
    sys.exit(f'Error: {e}')


if __name__ == '__main__':
  app.run(main)
