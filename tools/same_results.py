"""Checks that a change keeps every binary's results: same metrics.csv cells on fixed seeds.

    # Runs of the code at a base commit and of the working tree, then the comparison:
    git worktree add /tmp/base <base-commit>
    python -m tools.same_results run --code_dir=/tmp/base --out=/tmp/same/base
    python -m tools.same_results run --code_dir=. --out=/tmp/same/head
    python -m tools.same_results compare /tmp/same/base /tmp/same/head

``run`` trains every binary briefly on the offline tasks (`INVOCATIONS`), each
with the code in ``--code_dir`` (the binaries are run as ``python -m bin.<name>``
from that directory, so its packages are the ones imported). ``compare`` pairs
the ``metrics.csv`` files of two such outputs and compares them cell by cell
as written (exact text), leaving out the columns that measure time
(`TIMING_COLUMNS`). It prints one line per run and exits 1 on any difference
or missing run.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

# Short runs of every binary on the offline tasks (digits, synthetic), fixed seeds.
INVOCATIONS = {
  'fedavg': ['--task=digits', '--rounds=3'],
  'optimal_sampling': ['--task=digits', '--rounds=3', '--sampling=optimal'],
  'demo': ['--rounds=3', '--seeds=1', '--methods=optimal,optimal_exact,uniform,full'],
  'clustered_sampling': [
    '--rounds=3',
    '--seeds=1',
    '--sampling=md,clustered_size,clustered_similarity',
  ],
  'fedgs': [
    '--rounds=3',
    '--availability=IDL,LN',
    '--sampling=fedgs,uniform,md,power_of_choice,fedprox',
  ],
  'lefl': ['--task=digits', '--rounds=3', '--sampling=lefl,uniform', '--pretrain_epochs=1'],
  # The benchmark's own paths: Oort, TiFL, samplers followed by optimal uploads, devices.
  'benchmark': [
    '--task=synthetic',
    '--num_clients=30',
    '--rounds=3',
    '--seeds=1',
    '--devices=lognormal',
    '--deadline_seconds=2.3',
    '--clients_per_round=3',
    '--training_cohort=6',
    '--fedgs_solver=heuristic',
    '--sampling=uniform,md,oort,tifl,power_of_choice_all,clustered_similarity,fedgs+optimal,'
    'oort+optimal,full',
  ],
  'mmfl': [
    '--suite=digits_noniid',
    '--num_models=2',
    '--clients=20',
    '--expected_clients=4',
    '--rounds=2',
    '--seeds=1',
    '--sampling=optimal,optimal_loss,optimal_secure,random,round_robin',
  ],
}
TIMING_COLUMNS = ('round_seconds',)


def run(code_dir: str, out: str) -> int:
  code_dir, out = os.path.abspath(code_dir), os.path.abspath(out)
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  for binary, flags in INVOCATIONS.items():
    root = os.path.join(out, binary)
    command = [sys.executable, '-m', f'bin.{binary}', *flags, f'--root_output_dir={root}']
    print(f'{binary}: {" ".join(command[2:])}', flush=True)
    done = subprocess.run(
      command, cwd=code_dir, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode:
      print(done.stderr[-3000:], file=sys.stderr)
      print(f'{binary} failed with exit code {done.returncode}', file=sys.stderr)
      return 1
  return 0


def _metrics_files(root: str) -> dict[str, str]:
  found = {}
  for directory, _, files in os.walk(root):
    if 'metrics.csv' in files:
      found[os.path.relpath(directory, root)] = os.path.join(directory, 'metrics.csv')
  return found


def _read(path: str) -> tuple[list[str], list[list[str]]]:
  with open(path, newline='', encoding='utf-8') as f:
    rows = list(csv.reader(f))
  return rows[0], rows[1:]


def compare_files(base: str, head: str) -> str | None:
  """None if the two metrics.csv agree outside `TIMING_COLUMNS`; else the first difference."""
  base_header, base_rows = _read(base)
  head_header, head_rows = _read(head)
  if sorted(base_header) != sorted(head_header):
    return (
      f'columns differ: only in base {sorted(set(base_header) - set(head_header))}, '
      f'only in head {sorted(set(head_header) - set(base_header))}'
    )
  if len(base_rows) != len(head_rows):
    return f'{len(base_rows)} rows vs {len(head_rows)}'
  for number, (base_row, head_row) in enumerate(zip(base_rows, head_rows)):
    base_cells, head_cells = dict(zip(base_header, base_row)), dict(zip(head_header, head_row))
    for column in base_header:
      if column not in TIMING_COLUMNS and base_cells[column] != head_cells[column]:
        return f'row {number} column {column!r}: {base_cells[column]!r} vs {head_cells[column]!r}'
  return None


def compare(base: str, head: str) -> int:
  base_files, head_files = _metrics_files(base), _metrics_files(head)
  failures = 0
  for name in sorted(set(base_files) | set(head_files)):
    if name not in base_files or name not in head_files:
      print(f'{name}: only in {"head" if name in head_files else "base"}')
      failures += 1
      continue
    difference = compare_files(base_files[name], head_files[name])
    rows = len(_read(base_files[name])[1])
    print(f'{name}: {"same" if difference is None else "DIFFERENT: " + difference} ({rows} rows)')
    failures += difference is not None
  print(f'{len(base_files)} runs compared, {failures} differ or are missing.')
  return 1 if failures or not base_files else 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest='command', required=True)
  run_parser = commands.add_parser('run', help='Train every binary briefly.')
  run_parser.add_argument('--code_dir', required=True, help='Checkout whose code runs.')
  run_parser.add_argument('--out', required=True, help='Output root (created).')
  compare_parser = commands.add_parser('compare', help='Compare two outputs of run.')
  compare_parser.add_argument('base')
  compare_parser.add_argument('head')
  args = parser.parse_args(argv)
  if args.command == 'run':
    return run(args.code_dir, args.out)
  return compare(args.base, args.head)


if __name__ == '__main__':
  sys.exit(main())
