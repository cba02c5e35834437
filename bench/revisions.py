r"""Benchmark: a benchmark cell's rounds at two commits of this repository, and whether they agree.

    .venv/bin/python -m bench.revisions --rev_base=<commit> --rev_cache_dir=<cache> \
        --rev_cell=docs/benchmark/long/natural_IDL --rev_methods=full,power_of_choice_all

A change meant to make rounds cheaper without changing what they compute is measured
here: each side is the binary of the cell run from a copy of the repository at one commit
(``git archive`` into a temporary directory, removed at the end; the Python environment is
this one). Both sides read the cell's ``experiment.flags`` from this working tree
(``--rev_rounds`` replacing its horizon), so that only the code differs between them; a flag
the base commit does not know fails its side:

* ``base``: the commit ``--rev_base``;
* ``head``: the commit ``--rev_head`` (default ``HEAD``).

For each method the sides alternate in blocks (`bench.stats.interleave`, the order
rotating), after one warm-up block. A run's time is the median of its rounds'
``round_seconds`` after its first two (which trace and compile), so the binary's start-up
is left out. The table gives each side's median and the median per-pair ratio
``head / base`` with its 95% bootstrap interval. The first timed block's runs are compared:
the clients selected and every recorded column but the wall-clock ``round_seconds`` must
agree exactly (`bench.seeds_per_call.disagreements` with tolerance 0), or the benchmark fails.
"""

from __future__ import annotations

from collections.abc import Sequence
import glob
import os
import subprocess
import tempfile

from absl import app
from absl import flags
import numpy as np

from bench import seeds_per_call
from bench import stats
from tff_sampling.runtime import results
from tff_sampling.runtime import tff_context

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, HEAD = 'base', 'head'
# Rounds left out of a run's time: the first traces and compiles the computations.
SKIPPED_ROUNDS = 2

_BASE = flags.DEFINE_string('rev_base', None, 'The commit measured against (required).')
_HEAD = flags.DEFINE_string('rev_head', 'HEAD', 'The commit measured.')
_CELL = flags.DEFINE_string(
  'rev_cell',
  os.path.join('docs', 'benchmark', 'long', 'natural_IDL'),
  'The benchmark cell (a folder with experiment.flags) whose binary and flags run.',
)
_METHODS = flags.DEFINE_list('rev_methods', ['full'], 'The methods timed, one after another.')
_ROUNDS = flags.DEFINE_integer(
  'rev_rounds', 8, 'Rounds of each run.', lower_bound=SKIPPED_ROUNDS + 1
)
_PAIRS = flags.DEFINE_integer('rev_pairs', 3, 'Timed blocks per method.', lower_bound=1)
_RATE = flags.DEFINE_float('rev_learning_rate', 0.03, 'Client learning rate.')
_CACHE_DIR = flags.DEFINE_string('rev_cache_dir', None, "TFF's dataset caches (the cell's task).")
_QUICK = flags.DEFINE_bool(
  'rev_quick', False, 'Tiny workload (smoke test only): the digits quick cell, 3 rounds, 1 pair.'
)


def export(commit: str, folder: str) -> None:
  """This repository's tree at `commit`, written into `folder` (created).

  Raises:
    app.UsageError: If `commit` names no commit of this repository.
  """
  verify = ['git', '-C', _REPO, 'rev-parse', '--verify', '--quiet', '--end-of-options']
  resolved = subprocess.run(
    [*verify, f'{commit}^{{commit}}'], capture_output=True, text=True, check=False
  )
  if resolved.returncode != 0:
    raise app.UsageError(f'No commit {commit!r} here; give a commit of {_REPO}.')
  archive = subprocess.run(
    ['git', '-C', _REPO, 'archive', '--format=tar', resolved.stdout.strip()],
    capture_output=True,
    check=True,
  )
  os.makedirs(folder)
  subprocess.run(['tar', '-x', '-C', folder], input=archive.stdout, check=True)


def round_seconds(root: str) -> float:
  """The median seconds of the rounds after the first `SKIPPED_ROUNDS` of the one run in `root`."""
  (run_dir,) = glob.glob(os.path.join(root, '*_seed0'))
  seconds = np.asarray(results.load_run(run_dir).metrics['round_seconds'], np.float64)
  return float(np.nanmedian(seconds[1 + SKIPPED_ROUNDS :]))  # Row 0 is before round 1.


def run(
  cell: str,
  methods: Sequence[str],
  rounds: int,
  pairs: int,
  rate: float,
  cache_dir: str | None,
  warmup: int = 1,
) -> dict[str, dict[str, np.ndarray]]:
  """Seconds a round of each side, per method and timed block; raises if the sides' runs of
  the first timed block differ."""
  timings = {}
  with tempfile.TemporaryDirectory(prefix='revisions_') as scratch:
    trees = {side: os.path.join(scratch, side) for side in (BASE, HEAD)}
    export(_BASE.value, trees[BASE])
    export(_HEAD.value, trees[HEAD])
    for method in methods:
      roots: dict[str, list[str]] = {BASE: [], HEAD: []}

      def measure(side: str, method: str = method, roots=roots) -> float:
        root = os.path.join(scratch, f'{method}_{side}{len(roots[side])}')
        roots[side].append(root)
        args = seeds_per_call.command(cell, method, rounds, rate, 0, 1, root, cache_dir)
        done = subprocess.run(
          args, cwd=trees[side], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
          raise RuntimeError(f'{side}: {" ".join(args)} failed: {done.stderr[-1500:]}')
        return round_seconds(root)

      timings[method] = stats.interleave(
        {side: lambda side=side: measure(side) for side in (BASE, HEAD)}, pairs, warmup=warmup
      )
      first = roots[BASE][warmup], roots[HEAD][warmup]
      differ = seeds_per_call.disagreements(*first, 1, tolerance=0.0)
      if differ:
        raise RuntimeError(f'{method}: the two commits trained differently: {"; ".join(differ)}.')
  return timings


def format_table(timings: dict[str, dict[str, np.ndarray]], label: str) -> str:
  lines = [
    label,
    f'{"method":<32}{"base s/round":>14}{"head s/round":>14}{"head / base":>13}  95% CI',
  ]
  for method, seconds in timings.items():
    ratio = stats.ratio_estimate(seconds[HEAD], seconds[BASE])
    lines.append(
      f'{method:<32}{np.median(seconds[BASE]):>14.3f}{np.median(seconds[HEAD]):>14.3f}'
      f'{ratio.median:>13.3f}  {ratio.interval} ({ratio.pairs} pairs)'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _BASE.value:
    raise app.UsageError('--rev_base is required: the commit to measure against.')
  if _QUICK.value:
    cell, methods, rounds, pairs, warmup = seeds_per_call._QUICK_CELL, ['uniform'], 3, 1, 0
  else:
    cell, methods, rounds, pairs, warmup = (
      _CELL.value,
      _METHODS.value,
      _ROUNDS.value,
      _PAIRS.value,
      1,
    )
  cell = cell if os.path.isabs(cell) else os.path.join(_REPO, cell)
  timings = run(cell, methods, rounds, pairs, _RATE.value, _CACHE_DIR.value, warmup)
  label = (
    f'{os.path.relpath(cell, _REPO)}, {rounds} rounds a run (rounds 1-{SKIPPED_ROUNDS} '
    f'not timed); base {_BASE.value}, head {_HEAD.value}; {warmup} warm-up block(s), then '
    f'{pairs} timed'
  )
  print(format_table(timings, label))


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
