"""Tests for tff_sampling/analysis/raw_metrics.py: runs survive the file exactly, the file
is stable."""

import gzip
import math

import fault_harness
import numpy as np
import pytest

from tff_sampling.analysis import raw_metrics
from tff_sampling.runtime import results

CSV = (
  'key,eval/accuracy,train/loss,uplink/cumulative_bits,round_seconds,flag,vector\n'
  '0,0.1,,0,,True,[1.0]\n'
  '1,,2.5,100,0.75,False,[2.0]\n'
  '2,0.30000000000000004,inf,250,0.5,True,[3.0]\n'
)


@pytest.fixture
def runs(tmp_path):
  dirs = [
    fault_harness.write_run(
      tmp_path, name, {'seed': seed, 'sampling': 'optimal', 'cache_dir': '/somewhere'}, CSV
    )
    for name, seed in (('b_seed1', 1), ('a_seed0', 0))
  ]
  return [results.load_run(d) for d in dirs]


def test_round_trip_keeps_every_number_and_drops_machine_paths(runs, tmp_path):
  path = raw_metrics.write(runs, tmp_path / 'runs.jsonl.gz')
  back = raw_metrics.read(path)
  assert [r.name for r in back] == ['a_seed0', 'b_seed1']  # Sorted by name.
  original = {r.name: r for r in runs}
  for run in back:
    source = original[run.name]
    np.testing.assert_array_equal(run.rounds, source.rounds)
    assert set(run.metrics) == set(source.metrics)  # The text column stays out, as on load.
    for column, values in source.metrics.items():
      np.testing.assert_array_equal(run.metrics[column], values)  # NaN and inf included.
    assert run.metrics['train/loss'][2] == math.inf
    assert run.metrics['eval/accuracy'][2] == 0.30000000000000004  # Shortest repr, exact.
    assert 'cache_dir' not in run.hparams and 'root_output_dir' not in run.hparams
    assert run.hparams['seed'] == source.hparams['seed']
    assert run.path.endswith(f'#{run.name}')


def test_bytes_are_deterministic_and_order_free(runs):
  first = raw_metrics.dumps(runs)
  assert first == raw_metrics.dumps(list(reversed(runs)))
  assert gzip.decompress(first).count(b'\n') == 2


def test_explicit_names_and_repeated_names(runs):
  named = raw_metrics.dumps(runs, names=['lr0.1/x', 'lr0.2/x'])
  assert b'lr0.1/x' in gzip.decompress(named)
  with pytest.raises(ValueError, match='repeated: x'):
    raw_metrics.dumps(runs, names=['x', 'x'])


def _corrupt_data(good: bytes) -> bytes:
  """A valid gzip header, then the deflate stream with a run of bytes flipped."""
  data = bytearray(good)
  for i in range(20, min(len(data) - 8, 60)):
    data[i] ^= 0xFF
  return bytes(data)


DAMAGE = {
  'foreign records': lambda good: gzip.compress(b'{"format": "other"}\n'),
  'not gzip': lambda good: b'not gzip',
  'corrupt deflate data': _corrupt_data,
  'truncated': lambda good: good[: len(good) // 2],
  'not JSON': lambda good: gzip.compress(b'{"format": \n'),
  'not UTF-8': lambda good: gzip.compress(b'\xff\xfe\n'),
  'a record without rounds': lambda good: gzip.compress(
    b'{"format": "tff_sampling.raw_metrics/1", "name": "x", "hparams": {}, "metrics": {}}\n'
  ),
}


@pytest.mark.parametrize('damage', DAMAGE, ids=list(DAMAGE))
def test_a_damaged_or_foreign_file_is_refused_in_one_line_saying_what_to_do(runs, tmp_path, damage):
  good = raw_metrics.dumps(runs)
  bad = tmp_path / 'runs.jsonl.gz'
  bad.write_bytes(DAMAGE[damage](good))
  with pytest.raises(ValueError) as error:
    raw_metrics.read(bad)
  message = str(error.value)
  assert '\n' not in message, message
  assert f'Raw metrics file {str(bad)!r} is damaged or not a raw metrics file (' in message
  assert f'git checkout -- {bad}' in message and '--stage=export' in message, message


def test_a_missing_file_is_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError):
    raw_metrics.read(tmp_path / 'missing.jsonl.gz')


def test_load_mixes_directories_and_files(runs, tmp_path):
  path = raw_metrics.write(runs[:1], tmp_path / 'one.jsonl.gz')
  loaded = raw_metrics.load([path, runs[1].path])
  assert sorted(r.name for r in loaded) == ['a_seed0', 'b_seed1']
  assert not math.isnan(loaded[0].metrics['uplink/cumulative_bits'][1])
