r"""Benchmark: k seeds trained by one call of a binary vs by k calls of one seed each.

    .venv/bin/python -m bench.seeds_per_call --spc_cache_dir=<cache>
    .venv/bin/python -m bench.seeds_per_call --spc_cell=docs/benchmark/skewed_LDF \
        --spc_method=md+optimal --spc_rounds=20 --spc_pairs=5

Each call of a binary pays a start-up before its first round: Python imports
TensorFlow and TFF, the task loads its clients, TFF starts its worker and traces
the computations. ``python -m bin.experiment --seeds_per_call=k`` lets one call
train k seeds of a method one after another. This measures what that saves, on
a benchmark cell's own settings (its ``experiment.flags``; ``--spc_rounds``
replaces its horizon, the rest is the cell's):

* ``one_call``: ``bin.<binary> --seed=0 --seeds=k`` in a new run directory;
* ``k_calls``: ``--seed=i --seeds=1`` for i = 0..k-1, one after another, in
  another new run directory.

The sides alternate in blocks (`bench.stats.interleave`, the order rotating),
after one warm-up block. The table gives the median seconds of each side, the
median per-pair ratio ``one_call / k_calls`` with its 95% bootstrap interval,
and the seconds saved per run (``(k_calls - one_call) / k``), with which a
grid's saving is ``saved per run × runs / --parallel``. The first block's runs
are compared: each seed's selected clients and every recorded column but the timings must
agree between the sides (relative 1e-6), or the benchmark fails: the two sides train the same
runs.

Runs go to a temporary directory, removed at the end. ``--spc_quick`` is the
smoke test's: the ``digits`` quick cell, 2 rounds (round 1 not evaluated), 2
seeds, 1 pair, no warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
import glob
import os
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

from bench import stats
from bin import experiment_config
from tff_sampling.runtime import results
from tff_sampling.runtime import tff_context

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT_CELL = os.path.join('docs', 'benchmark', 'natural_LDF')
_QUICK_CELL = os.path.join('docs', 'benchmark', 'quick', 'digits_LN')

_CELL = flags.DEFINE_string(
  'spc_cell', _DEFAULT_CELL, 'The benchmark cell (a folder with experiment.flags) to run.'
)
_METHOD = flags.DEFINE_string('spc_method', 'uniform', 'The method that trains.')
_SEEDS = flags.DEFINE_integer('spc_seeds', 5, 'k: seeds per call.', lower_bound=2)
_ROUNDS = flags.DEFINE_integer('spc_rounds', 10, 'Rounds of each run.', lower_bound=1)
_PAIRS = flags.DEFINE_integer('spc_pairs', 3, 'Timed blocks.', lower_bound=1)
_RATE = flags.DEFINE_float('spc_learning_rate', 0.1, 'Client learning rate.')
_CACHE_DIR = flags.DEFINE_string('spc_cache_dir', None, "TFF's dataset caches (the cell's task).")
_QUICK = flags.DEFINE_bool('spc_quick', False, 'Tiny workload (smoke test only).')

ONE_CALL, K_CALLS = 'one_call', 'k_calls'
TOLERANCE = 1e-6
# The one column that times a run rather than records it (the simulated devices' seconds are
# recorded, and compared).
WALL_CLOCK = 'round_seconds'


def command(
  cell: str,
  method: str,
  rounds: int,
  rate: float,
  seed: int,
  seeds: int,
  root_output_dir: str,
  cache_dir: str | None = None,
) -> list[str]:
  """The binary call of `cell`'s settings that trains seeds ``seed..seed+seeds-1``."""
  spec = experiment_config.load(os.path.join(cell, experiment_config.CONFIG_FILENAME))
  kept = [
    f
    for f in spec.binary_flags
    if not f.startswith(('--rounds=', '--checkpoint_every=', '--eval_every='))
  ]
  return [
    sys.executable,
    '-m',
    f'bin.{spec.binary}',
    *kept,
    f'--rounds={rounds}',
    f'--eval_every={rounds}',
    f'--checkpoint_every={rounds}',
    *(
      [f'--cache_dir={cache_dir}'] if cache_dir and experiment_config.takes_cache_dir(spec) else []
    ),
    f'--{spec.method_flag}={method}',
    *experiment_config.run_name_flags(spec, method),
    f'--seed={seed}',
    f'--seeds={seeds}',
    f'--client_learning_rate={rate:g}',
    f'--root_output_dir={root_output_dir}',
  ]


def _call(args: list[str]) -> None:
  done = subprocess.run(
    args, cwd=_REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
  )
  if done.returncode != 0:
    raise RuntimeError(f'{" ".join(args)} failed (exit {done.returncode}): {done.stderr[-1500:]}')


def disagreements(together: str, apart: str, seeds: int, tolerance: float = TOLERANCE) -> list[str]:
  """Where seeds 0..seeds-1 trained in one call (under `together`) differ from the same seeds
  trained alone (under `apart`): the cohorts each client was in, then every recorded column
  but the timings, within relative `tolerance`. Empty when every seed is the same run."""
  found = []
  for seed in range(seeds):
    (a,) = glob.glob(os.path.join(together, f'*_seed{seed}'))
    (b,) = glob.glob(os.path.join(apart, f'*_seed{seed}'))
    one, alone = results.load_run(a), results.load_run(b)
    counts = (one.selection_counts, alone.selection_counts)
    if (counts[0] is None) != (counts[1] is None) or not np.array_equal(*counts):
      found.append(f'seed {seed}: the clients selected')
    columns = sorted(c for c in set(one.metrics) | set(alone.metrics) if c != WALL_CLOCK)
    for column in columns:
      x, y = one.metrics.get(column), alone.metrics.get(column)
      if x is None or y is None or not np.allclose(x, y, rtol=tolerance, atol=0, equal_nan=True):
        found.append(f'seed {seed}: {column}')
  return found


def run(
  cell: str,
  method: str,
  seeds: int,
  rounds: int,
  pairs: int,
  rate: float,
  cache_dir: str | None,
  warmup: int = 1,
) -> dict[str, np.ndarray]:
  """Seconds of each side per timed block; raises if the first block's runs disagree."""
  with tempfile.TemporaryDirectory(prefix='seeds_per_call_') as scratch:
    roots: dict[str, list[str]] = {ONE_CALL: [], K_CALLS: []}

    def fresh(side: str) -> str:
      roots[side].append(os.path.join(scratch, f'{side}{len(roots[side])}'))
      return roots[side][-1]

    def one_call() -> None:
      _call(command(cell, method, rounds, rate, 0, seeds, fresh(ONE_CALL), cache_dir))

    def k_calls() -> None:
      root = fresh(K_CALLS)
      for seed in range(seeds):
        _call(command(cell, method, rounds, rate, seed, 1, root, cache_dir))

    seconds = stats.interleave(
      {ONE_CALL: stats.timed(one_call), K_CALLS: stats.timed(k_calls)}, pairs, warmup=warmup
    )
    differ = disagreements(roots[ONE_CALL][0], roots[K_CALLS][0], seeds)
    if differ:
      raise RuntimeError(f'Trained differently in one call and alone: {"; ".join(differ)}.')
    return seconds


def format_table(seconds: dict[str, np.ndarray], seeds: int, label: str) -> str:
  ratio = stats.ratio_estimate(seconds[ONE_CALL], seconds[K_CALLS])
  saved = stats.median_ci((seconds[K_CALLS] - seconds[ONE_CALL]) / seeds)
  return '\n'.join(
    [
      label,
      f'{"side":<10}{"median s":>10}',
      f'{ONE_CALL:<10}{np.median(seconds[ONE_CALL]):>10.1f}',
      f'{K_CALLS:<10}{np.median(seconds[K_CALLS]):>10.1f}',
      f'ratio one_call / k_calls: {ratio.median:.3f} {ratio.interval} ({ratio.pairs} pairs)',
      f'saved per run: {saved.median:.1f} s {saved.interval}',
    ]
  )


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _QUICK.value:
    cell, method, seeds, rounds, pairs, warmup = _QUICK_CELL, 'uniform', 2, 2, 1, 0
  else:
    cell, method, seeds, rounds, pairs, warmup = (
      _CELL.value,
      _METHOD.value,
      _SEEDS.value,
      _ROUNDS.value,
      _PAIRS.value,
      1,
    )
  cell = os.path.join(_REPO, cell) if not os.path.isabs(cell) else cell
  if not os.path.isfile(os.path.join(cell, experiment_config.CONFIG_FILENAME)):
    raise app.UsageError(
      f'--spc_cell={cell} has no {experiment_config.CONFIG_FILENAME}; give a '
      'folder of docs/benchmark/.'
    )
  seconds = run(cell, method, seeds, rounds, pairs, _RATE.value, _CACHE_DIR.value, warmup)
  label = (
    f'{os.path.basename(cell)}, {method}, {seeds} seeds of {rounds} rounds; '
    f'{warmup} warm-up block(s), then {pairs} timed'
  )
  print(format_table(seconds, seeds, label))


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
