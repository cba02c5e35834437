"""How many rounds a benchmark cell needs: where full participation's curve flattens.

    python -m bin.horizon --cell=docs/benchmark/natural_LDF --max_rounds=500 \\
        --runs_dir=<runs> --cache_dir=<cache>

trains one method (full participation by default) of the cell's configuration on its tuning
seed (never a reported seed), at the rate the cell runs it at, for ``--max_rounds`` rounds
into ``--runs_dir`` (resumable, like every binary), then prints the mean accuracy of each
block of ``--block`` rounds and the round at which the curve flattened
(`tff_sampling.analysis.evidence.flattened_at`: the last block's mean exceeds the mean of
the block ``--lookback`` blocks earlier by less than ``--gain``), or that it had not by
``--max_rounds``. It writes nothing
outside ``--runs_dir``.
"""

from __future__ import annotations

from collections.abc import Sequence
import glob
import os
import subprocess
import sys

from absl import app
from absl import flags

from bin import experiment_config
from tff_sampling.analysis import tables
from tff_sampling.runtime import processes
from tff_sampling.runtime import results

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CELL = flags.DEFINE_string('cell', None, 'A benchmark cell: its folder (with experiment.flags).')
_METHOD = flags.DEFINE_string('method', 'full', 'The method whose curve decides the horizon.')
_MAX_ROUNDS = flags.DEFINE_integer('max_rounds', 500, 'Rounds to train.', lower_bound=2)
_BLOCK = flags.DEFINE_integer('block', 50, 'Rounds per block of the criterion.', lower_bound=1)
_GAIN = flags.DEFINE_float('gain', 0.01, 'Less accuracy gained than this is flat.')
_LOOKBACK = flags.DEFINE_integer(
  'lookback', 2, 'Blocks over which the gain is measured.', lower_bound=1
)
_RUNS_DIR = flags.DEFINE_string('runs_dir', None, 'Where the run goes (required).')
_CACHE_DIR = flags.DEFINE_string('cache_dir', None, "TFF's dataset caches (passed to the run).")
flags.mark_flags_as_required(['cell', 'runs_dir'])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = os.path.join(_CELL.value, experiment_config.CONFIG_FILENAME)
  try:
    args = experiment_config.horizon_command(
      config, _METHOD.value, _MAX_ROUNDS.value, _RUNS_DIR.value, _CACHE_DIR.value
    )
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f'Error: {e}')
  print(' '.join(args[2:]), flush=True)
  # Linux stops the run (SIGTERM, which it passes to its TFF workers) should this process die.
  returncode = processes.start(args, cwd=_REPO, stdin=subprocess.DEVNULL).wait()
  if returncode != 0:
    sys.exit(f'Error: the run failed (exit {returncode}); see its output above.')
  (path,) = glob.glob(os.path.join(_RUNS_DIR.value, f'*_{_METHOD.value}_seed*'))
  print(tables.horizon_text(results.load_run(path), _BLOCK.value, _GAIN.value, _LOOKBACK.value))


if __name__ == '__main__':
  app.run(main)
