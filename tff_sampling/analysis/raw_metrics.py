"""Raw per-run metrics in one compressed file, so a report regenerates without the runs.

An experiment's run directories hold checkpoints and TensorBoard logs (megabytes
per run); what a report reads is each run's ``hparams.json`` and
``metrics.csv``. `write` stores exactly that for a set of runs in one gzip'd
JSON-lines file (one run per line, sorted by run name), and `read` gives back
`results.Run` objects equal to those `results.load_run` reads, so every table
and plot of `tff_sampling.analysis.report` and `tff_sampling.analysis.evidence` comes out the
same from the file as from the directories.

The file is byte-for-byte deterministic (no timestamp in the gzip header, keys
sorted, floats in Python's shortest round-trip form, NaN as ``null``, infinities
as ``"inf"``), so a
commit changes only when the metrics do. Hyper-parameters that only say where
the run was on one machine (`MACHINE_HPARAMS`: output and cache paths) are
left out.
"""

from __future__ import annotations

from collections.abc import Sequence
import gzip
import io
import json
import math
import os
import zlib

import numpy as np

from tff_sampling.runtime import files
from tff_sampling.runtime import results

# Where a run was written or read its data from: not part of what it measured.
MACHINE_HPARAMS = frozenset(
  {
    'root_output_dir',
    'cache_dir',
    'task.cache_dir',
    'data_dir',
    'task.data_dir',
    'tfds_data_dir',
    'task.tfds_data_dir',
  }
)
FILENAME = 'runs.jsonl.gz'
_FORMAT = 'tff_sampling.raw_metrics/1'


def _cell(value: float) -> float | str | None:
  if math.isnan(value):
    return None
  if math.isinf(value):
    return 'inf' if value > 0 else '-inf'  # JSON has no infinity; a diverged loss keeps it.
  return float(value)


def _record(run: results.Run, name: str) -> dict:
  hparams = {k: v for k, v in run.hparams.items() if k not in MACHINE_HPARAMS}
  record = {
    'format': _FORMAT,
    'name': name,
    'hparams': hparams,
    'rounds': [int(r) for r in run.rounds],
    'metrics': {name: [_cell(v) for v in values] for name, values in run.metrics.items()},
  }
  if run.selection_counts is not None:
    record['selection_counts'] = [int(c) for c in run.selection_counts]
  return record


def dumps(runs: Sequence[results.Run], names: Sequence[str] | None = None) -> bytes:
  """The file's bytes for `runs` (sorted by name).

  Args:
    runs: The runs.
    names: Each run's name in the file (default: `results.Run.name`), e.g. its
      path relative to a runs directory when experiment names repeat there.

  Raises:
    ValueError: If two runs share a name.
  """
  names = [run.name for run in runs] if names is None else list(names)
  if len(names) != len(runs):
    raise ValueError(f'{len(names)} names for {len(runs)} runs.')
  records = sorted((_record(run, n) for run, n in zip(runs, names)), key=lambda r: r['name'])
  names = [r['name'] for r in records]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise ValueError(f'Runs must have distinct names; repeated: {", ".join(repeated)}.')
  text = ''.join(
    json.dumps(r, sort_keys=True, ensure_ascii=False, allow_nan=False) + '\n' for r in records
  )
  buffer = io.BytesIO()
  with gzip.GzipFile(filename='', mode='wb', fileobj=buffer, mtime=0, compresslevel=9) as f:
    f.write(text.encode('utf-8'))
  return buffer.getvalue()


def write(
  runs: Sequence[results.Run], path: str | os.PathLike[str], names: Sequence[str] | None = None
) -> str:
  """Writes `runs` (named as in `dumps`) to `path`, replacing it atomically.

  Returns:
    The absolute path.
  """
  data = dumps(runs, names)
  path = os.path.abspath(os.fspath(path))
  files.write_atomically(path, data)
  return path


def read(path: str | os.PathLike[str]) -> list[results.Run]:
  """The runs stored in `path`, in file order; each `Run.path` is ``<path>#<name>``.

  Raises:
    FileNotFoundError: If `path` does not exist.
    ValueError: If it is not a file `write` wrote (the message names it).
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'Raw metrics file {path!r} does not exist.')
  runs = []
  try:
    with gzip.open(path, 'rt', encoding='utf-8') as f:
      for line_number, line in enumerate(f, 1):
        record = json.loads(line)
        if not isinstance(record, dict) or record.get('format') != _FORMAT:
          raise ValueError(f'line {line_number} is not a {_FORMAT} record')
        runs.append(_run(path, record))
  except (OSError, EOFError, zlib.error, KeyError, TypeError, ValueError) as e:
    # ValueError includes JSON and UTF-8 decoding errors; OSError a file that is not gzip.
    if isinstance(e, KeyError):
      reason = f'a record has no {e.args[0]!r}'
    else:
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(
      f'Raw metrics file {path!r} is damaged or not a raw metrics file ({reason}): restore '
      f'the committed one (git checkout -- {path}), or regenerate it from the runs directory '
      '(python -m bin.experiment --config=<its experiment.flags> --runs_dir=<runs> '
      '--stage=export).'
    ) from None
  return runs


def _run(path: str, record: dict) -> results.Run:
  rounds = np.asarray(record['rounds'], dtype=np.int64)
  metrics = {}
  for name, cells in record['metrics'].items():
    column = np.array([math.nan if c is None else float(c) for c in cells], dtype=np.float64)
    if column.shape != rounds.shape:
      raise ValueError(f'column {name!r} of {record["name"]} has {column.size} cells')
    column.setflags(write=False)
    metrics[name] = column
  counts = record.get('selection_counts')
  return results.Run(
    path=f'{path}#{record["name"]}',
    hparams=dict(record['hparams']),
    metrics=metrics,
    rounds=rounds,
    selection_counts=None if counts is None else np.asarray(counts, dtype=np.int64),
  )


def load(entries: Sequence[str]) -> list[results.Run]:
  """Runs from a mix of run directories (glob patterns allowed) and raw metrics files."""
  runs: list[results.Run] = []
  directories = []
  for entry in entries:
    if entry.endswith('.jsonl.gz'):
      runs.extend(read(entry))
    else:
      directories.append(entry)
  if directories:
    runs.extend(results.load_run(d) for d in results.find_run_dirs(directories))
  return runs
