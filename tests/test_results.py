"""Tests for tff_sampling/runtime/results.py on hand-written and TFF-written runs."""

import asyncio
import collections
import json
import math
import os
import re

import fault_harness
import numpy as np
import pytest

from tff_sampling.runtime import results

# The format of tff.program.CSVFileReleaseManager, with every cell quoted;
# eval/* only on evaluation rounds (0, 2, 4); `process/clip` first released at
# round 2, so rounds 0-1 have it empty (round 1's row is physically short, as a
# file appended to by hand would be), and a vector-valued column.
METRICS_CSV = """\
"key","eval/accuracy","eval/loss","round_seconds","train/accuracy","train/loss","uplink/cumulative_bits","uplink/round_bits","vector","process/clip"
"0","0.1","2.5","","","","0","0","[1.0, 2.0]",""
"1","","","0.25","0.2","2.0","640","640","[1.0, 2.0]"
"2","0.5","1.5","0.5","0.4","1.5","1280","640","[1.0, 2.0]","3.0"
"3","","","0.75","0.45","1.25","1920","640","[1.0, 2.0]","True"
"4","0.7","1.0","1.0","0.5","1.0","2560","640","[1.0, 2.0]","False"
"""

NAN = math.nan


write_run = fault_harness.write_run


def curve_csv(bits, accuracy):
  """A CSV with eval/accuracy (None = not evaluated) and cumulative bits."""
  lines = ['"key","eval/accuracy","uplink/cumulative_bits"']
  for key, (b, a) in enumerate(zip(bits, accuracy)):
    lines.append(f'"{key}","{"" if a is None else a}","{b}"')
  return '\n'.join(lines) + '\n'


def load_curve(tmp_path, name, bits, accuracy, **hparams):
  hparams.setdefault('seed', 0)
  return results.load_run(write_run(tmp_path, name, hparams, curve_csv(bits, accuracy)))


@pytest.fixture
def run(tmp_path):
  return results.load_run(
    write_run(tmp_path, 'digits_uniform_seed0', {'task': 'digits', 'seed': 0}, METRICS_CSV)
  )


def test_load_run_parses_quoted_cells_and_empty_cells_as_nan(run, tmp_path):
  assert run.path == os.path.join(str(tmp_path), 'digits_uniform_seed0')
  assert run.name == 'digits_uniform_seed0'
  assert run.hparams['task'] == 'digits' and run.hparams['seed'] == 0
  np.testing.assert_array_equal(run.rounds, [0, 1, 2, 3, 4])
  assert run.rounds.dtype == np.int64
  np.testing.assert_array_equal(run.metrics['eval/accuracy'], [0.1, NAN, 0.5, NAN, 0.7])
  np.testing.assert_array_equal(run.metrics['train/loss'], [NAN, 2.0, 1.5, 1.25, 1.0])
  np.testing.assert_array_equal(run.metrics['uplink/cumulative_bits'], [0, 640, 1280, 1920, 2560])
  # Column added mid-file: empty, then a short row, then values and booleans.
  np.testing.assert_array_equal(run.metrics['process/clip'], [NAN, NAN, 3.0, 1.0, 0.0])
  assert 'key' not in run.metrics
  assert run.text_columns == ('vector',)
  assert set(run.metrics) == {
    'eval/accuracy',
    'eval/loss',
    'round_seconds',
    'train/accuracy',
    'train/loss',
    'uplink/cumulative_bits',
    'uplink/round_bits',
    'process/clip',
  }
  np.testing.assert_array_equal(run.column('key'), [0.0, 1.0, 2.0, 3.0, 4.0])
  with pytest.raises(ValueError, match='read-only'):
    run.metrics['eval/loss'][0] = 0.0


def test_column_errors_name_the_file(run):
  with pytest.raises(
    KeyError,
    match=r"metrics.csv has no column 'eval/nope'; its columns are: "
    r'eval/accuracy, eval/loss',
  ):
    run.column('eval/nope')
  with pytest.raises(KeyError, match="Column 'vector' of .*metrics.csv is not numeric"):
    run.column('vector')


def test_rows_are_sorted_by_round(tmp_path):
  csv_text = '"key","eval/accuracy"\n"2","0.3"\n"0","0.1"\n"1",""\n'
  run = results.load_run(write_run(tmp_path, 'r', {'seed': 0}, csv_text))
  np.testing.assert_array_equal(run.rounds, [0, 1, 2])
  np.testing.assert_array_equal(run.metrics['eval/accuracy'], [0.1, NAN, 0.3])


def test_name_falls_back_to_directory(tmp_path):
  run_dir = tmp_path / 'plain'
  run_dir.mkdir()
  (run_dir / 'hparams.json').write_text('{"seed": 1}')
  (run_dir / 'metrics.csv').write_text('key\n0\n')
  run = results.load_run(run_dir)
  assert run.name == 'plain'
  assert run.metrics == {}
  np.testing.assert_array_equal(run.rounds, [0])


def test_missing_directory_and_files(tmp_path):
  missing = tmp_path / 'nope'
  with pytest.raises(
    FileNotFoundError, match=re.escape(f"Run directory '{missing}' does not exist")
  ):
    results.load_run(missing)
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  hparams_path = run_dir / 'hparams.json'
  with pytest.raises(
    FileNotFoundError,
    match=re.escape(f"'{hparams_path}' does not exist; is '{run_dir}' a run directory"),
  ):
    results.load_run(run_dir)
  (run_dir / 'hparams.json').write_text('{"seed": 0}')
  with pytest.raises(
    FileNotFoundError, match=re.escape(f"'{run_dir / 'metrics.csv'}' does not exist")
  ):
    results.load_run(str(run_dir))


@pytest.mark.parametrize(
  'hparams, csv_text, pattern',
  [
    (
      '{"seed": 0}',
      '"round","eval/accuracy"\n"0","0.1"\n',
      r"metrics.csv' has no 'key' column .*header is \['round', 'eval/accuracy'\]",
    ),
    ('{"seed": 0}', '', r"metrics.csv' has no 'key' column"),
    (
      '{"seed": 0}',
      '"key","x"\n"0","1"\n"one","2"\n',
      r"metrics.csv' line 3: 'key' must be an integer round number, got 'one'",
    ),
    ('{"seed": 0}', '"key","x"\n"0","1"\n"0","2"\n', r"metrics.csv' has round 0 more than once"),
    ('[1, 2]', 'key\n', r"hparams.json' must hold a JSON object, got list"),
    ('{"seed": ', 'key\n', r"hparams.json' is not valid JSON"),
  ],
)
def test_malformed_files(tmp_path, hparams, csv_text, pattern):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  (run_dir / 'hparams.json').write_text(hparams)
  (run_dir / 'metrics.csv').write_text(csv_text)
  with pytest.raises(ValueError, match=pattern):
    results.load_run(run_dir)


def test_group_runs_ignores_seed_and_labels_by_differing_hparams(tmp_path):
  runs = []
  for sampling in ('uniform', 'optimal'):
    for seed in range(3):
      runs.append(
        load_curve(
          tmp_path,
          f'{sampling}_seed{seed}',
          [0],
          [0.1],
          seed=seed,
          task='digits',
          sampling=sampling,
          rounds=20,
        )
      )
  groups = results.group_runs(runs)
  assert list(groups) == ['sampling=uniform', 'sampling=optimal']
  assert [r.name for r in groups['sampling=uniform']] == [
    'uniform_seed0',
    'uniform_seed1',
    'uniform_seed2',
  ]
  assert [r.hparams['seed'] for r in groups['sampling=optimal']] == [0, 1, 2]
  # Without ignoring the seed every run is its own group.
  assert len(results.group_runs(runs, ignore=('experiment_name', 'root_output_dir'))) == 6


def test_group_labels_list_every_differing_hparam(tmp_path):
  settings = [
    dict(algorithm='fedavg', sampling='uniform', lr=0.1),
    dict(algorithm='fedavg', sampling='optimal', lr=0.1),
    dict(algorithm='fedprox', sampling='optimal', lr=0.1, mu=0.01),
  ]
  runs = [
    load_curve(tmp_path, f'run{i}', [0], [0.1], task='digits', **s) for i, s in enumerate(settings)
  ]
  assert list(results.group_runs(runs)) == [
    'algorithm=fedavg, sampling=uniform, mu=(unset)',
    'algorithm=fedavg, sampling=optimal, mu=(unset)',
    'algorithm=fedprox, sampling=optimal, mu=0.01',
  ]


def test_one_separating_hparam_set_everywhere_is_the_whole_label(tmp_path):
  settings = [
    dict(sampling='lefl', allocation='per_cluster', public_examples=200),
    dict(sampling='uniform'),
  ]
  runs = [
    load_curve(tmp_path, f'run{i}', [0], [0.1], task='digits', **s) for i, s in enumerate(settings)
  ]
  # `allocation` also separates the groups, but the uniform run does not set it.
  assert list(results.group_runs(runs)) == ['sampling=lefl', 'sampling=uniform']


def test_single_group_is_labelled_by_experiment_name(tmp_path):
  runs = [
    load_curve(tmp_path, f'digits_uniform_seed{seed}', [0], [0.1], seed=seed) for seed in range(3)
  ]
  groups = results.group_runs(runs)
  assert list(groups) == ['digits_uniform']
  assert len(groups['digits_uniform']) == 3
  assert list(results.group_runs(runs[:1])) == ['digits_uniform_seed0']
  assert results.group_runs([]) == {}
  with pytest.raises(TypeError, match="got the string 'seed'"):
    results.group_runs(runs, ignore='seed')


def test_aggregate_on_rounds_uses_rounds_present_in_all_runs(tmp_path):
  # Evaluated at rounds 0, 2, 4; the third seed stopped after round 3.
  runs = [
    load_curve(tmp_path, 'a', [0, 1, 2, 3, 4], [0.1, None, 0.5, None, 0.7], seed=0),
    load_curve(tmp_path, 'b', [0, 1, 2, 3, 4], [0.2, None, 0.6, None, 0.8], seed=1),
    load_curve(tmp_path, 'c', [0, 1, 2, 3], [0.6, None, 0.7, None], seed=2),
  ]
  x, mean, std = results.aggregate(runs, 'key', 'eval/accuracy')
  np.testing.assert_array_equal(x, [0.0, 2.0])
  # Round 0: (0.1, 0.2, 0.6): mean 0.3, deviations (-0.2, -0.1, 0.3),
  # sample variance (0.04 + 0.01 + 0.09) / 2 = 0.07.
  # Round 2: (0.5, 0.6, 0.7): mean 0.6, sample variance (0.01 + 0 + 0.01) / 2.
  np.testing.assert_allclose(mean, [0.3, 0.6])
  np.testing.assert_allclose(std, [math.sqrt(0.07), 0.1])
  _, _, population_std = results.aggregate(runs, 'key', 'eval/accuracy', ddof=0)
  np.testing.assert_allclose(population_std, [math.sqrt(0.14 / 3), math.sqrt(0.02 / 3)])
  # A single run is returned as is, with zero spread.
  x, mean, std = results.aggregate(runs[:1], 'key', 'eval/accuracy')
  np.testing.assert_array_equal(x, [0.0, 2.0, 4.0])
  np.testing.assert_allclose(mean, [0.1, 0.5, 0.7])
  np.testing.assert_array_equal(std, [0.0, 0.0, 0.0])


def test_aggregate_on_bits_interpolates_onto_union_grid(tmp_path):
  # Run a: evaluated at 0, 100, 200 bits (round 1, 50 bits, not evaluated).
  # Run b: evaluated at 0, 150, 300 bits.
  a = load_curve(tmp_path, 'a', [0, 50, 100, 200], [0.0, None, 0.4, 0.8], seed=0)
  b = load_curve(tmp_path, 'b', [0, 150, 300], [0.0, 0.6, 0.9], seed=1)
  x, mean, std = results.aggregate([a, b], 'uplink/cumulative_bits', 'eval/accuracy')
  # Common range [0, 200]; grid = union of evaluated x in it = 0, 100, 150, 200.
  np.testing.assert_array_equal(x, [0.0, 100.0, 150.0, 200.0])
  # a on the grid: 0, 0.4, 0.6 (halfway 0.4 -> 0.8), 0.8.
  # b on the grid: 0, 0.4 (100/150 of 0.6), 0.6, 0.7 (0.6 + 50/150 * 0.3).
  np.testing.assert_allclose(mean, [0.0, 0.4, 0.6, 0.75])
  np.testing.assert_allclose(std, [0.0, 0.0, 0.0, 0.1 / math.sqrt(2)], atol=1e-12)


def test_aggregate_on_bits_keeps_last_of_repeated_x_and_handles_no_overlap(tmp_path):
  # Round 1 uploaded nothing: two evaluations at 0 bits; the later one counts.
  a = load_curve(tmp_path, 'a', [0, 0, 100], [0.1, 0.3, 0.5], seed=0)
  x, mean, _ = results.aggregate([a], 'uplink/cumulative_bits', 'eval/accuracy')
  np.testing.assert_array_equal(x, [0.0, 100.0])
  np.testing.assert_allclose(mean, [0.3, 0.5])
  b = load_curve(tmp_path, 'b', [200, 300], [0.1, 0.2], seed=1)
  x, mean, std = results.aggregate([a, b], 'uplink/cumulative_bits', 'eval/accuracy')
  assert x.size == mean.size == std.size == 0


def test_aggregate_errors(run):
  with pytest.raises(ValueError, match='empty group'):
    results.aggregate([], 'key', 'eval/accuracy')
  with pytest.raises(KeyError, match="no column 'eval/top5'"):
    results.aggregate([run], 'key', 'eval/top5')
  with pytest.raises(KeyError, match="no column 'uplink/bits'"):
    results.aggregate([run], 'uplink/bits', 'eval/accuracy')


def test_rounds_and_bits_to_target(run):
  # eval/accuracy: 0.1 @ round 0 (0 bits), 0.5 @ 2 (1280 bits), 0.7 @ 4 (2560).
  assert results.rounds_to_target(run, 0.05) == 0
  assert results.rounds_to_target(run, 0.3) == 2
  assert results.rounds_to_target(run, 0.5) == 2  # Reaching means >=.
  assert results.rounds_to_target(run, 0.6) == 4
  assert results.rounds_to_target(run, 0.71) is None
  assert results.bits_to_target(run, 0.3) == 1280.0
  assert results.bits_to_target(run, 0.6) == 2560.0
  assert results.bits_to_target(run, 0.71) is None
  # Train accuracy reaches 0.45 at round 3, which has no evaluation.
  assert results.rounds_to_target(run, 0.45, 'train/accuracy') == 3
  assert results.bits_to_target(run, 0.45, 'train/accuracy') == 1920.0
  # A loss reaches a target from above.
  assert results.rounds_to_target(run, 1.5, 'eval/loss', lower_is_better=True) == 2
  assert results.bits_to_target(run, 0.9, 'eval/loss', lower_is_better=True) is None
  with pytest.raises(KeyError, match="no column 'uplink/bits'"):
    results.bits_to_target(run, 0.3, bits_column='uplink/bits')


def test_bits_to_target_requires_bits_at_that_round(tmp_path):
  csv_text = '"key","eval/accuracy","uplink/cumulative_bits"\n"0","0.1","0"\n"1","0.9",""\n'
  run = results.load_run(write_run(tmp_path, 'r', {'seed': 0}, csv_text))
  with pytest.raises(ValueError, match="has no 'uplink/cumulative_bits' value at round 1"):
    results.bits_to_target(run, 0.5)


def test_find_run_dirs_expands_globs(tmp_path):
  for name in ('b_seed0', 'a_seed1', 'a_seed0'):
    (tmp_path / name).mkdir()
  (tmp_path / 'a_notes.txt').write_text('not a run')
  plain = str(tmp_path / 'b_seed0')
  assert results.find_run_dirs([str(tmp_path / 'a_*'), plain, str(tmp_path / 'a_seed0')]) == [
    str(tmp_path / 'a_seed0'),
    str(tmp_path / 'a_seed1'),
    plain,
  ]
  # A plain entry is kept even if missing, for load_run to report.
  assert results.find_run_dirs([tmp_path / 'missing']) == [str(tmp_path / 'missing')]
  with pytest.raises(ValueError, match=r"The pattern '.*c_\*' matches no directory"):
    results.find_run_dirs([str(tmp_path / 'c_*')])


def test_reads_what_tff_csv_release_manager_writes(tmp_path):
  import tensorflow_federated as tff  # Slow to import; only this test needs it.

  od = collections.OrderedDict
  run_dir = tmp_path / 'digits_optimal_seed3'
  run_dir.mkdir()
  (run_dir / 'hparams.json').write_text(json.dumps({'sampling': 'optimal', 'seed': 3}))
  manager = tff.program.CSVFileReleaseManager(str(run_dir / 'metrics.csv'))
  cumulative_bits = 0
  for key in range(4):
    round_bits = 0 if key == 0 else 1000 * key
    cumulative_bits += round_bits
    value = od(
      uplink=od(round_bits=np.int64(round_bits), cumulative_bits=np.int64(cumulative_bits))
    )
    if key > 0:  # The program releases training metrics from round 1 on.
      value['round_seconds'] = 0.5 * key
      value['train'] = od(loss=np.float32(2.0 / key), accuracy=np.float32(0.25 * key))
      value['process'] = od(
        aggregator=od(mean_value=od(clipped=np.int32(key)), weights=np.array([1.0, float(key)]))
      )
    if key % 2 == 0:  # Evaluation rounds.
      value['eval'] = od(loss=np.float32(1.0 / (key + 1)), accuracy=np.float32(0.1 + 0.2 * key))
    asyncio.run(manager.release(value, key))

  header = (run_dir / 'metrics.csv').read_text().splitlines()[0]
  assert header.startswith('key,')
  assert 'process/aggregator/mean_value/clipped' in header.split(',')

  run = results.load_run(run_dir)
  np.testing.assert_array_equal(run.rounds, [0, 1, 2, 3])
  np.testing.assert_allclose(run.metrics['eval/accuracy'], [0.1, NAN, 0.5, NAN])
  np.testing.assert_allclose(run.metrics['eval/loss'], [1.0, NAN, 1 / 3, NAN], rtol=1e-6)
  np.testing.assert_allclose(run.metrics['train/loss'], [NAN, 2.0, 1.0, 2 / 3], rtol=1e-6)
  np.testing.assert_array_equal(run.metrics['train/accuracy'], [NAN, 0.25, 0.5, 0.75])
  np.testing.assert_array_equal(run.metrics['round_seconds'], [NAN, 0.5, 1.0, 1.5])
  np.testing.assert_array_equal(run.metrics['uplink/round_bits'], [0, 1000, 2000, 3000])
  np.testing.assert_array_equal(run.metrics['uplink/cumulative_bits'], [0, 1000, 3000, 6000])
  np.testing.assert_array_equal(
    run.metrics['process/aggregator/mean_value/clipped'], [NAN, 1, 2, 3]
  )
  assert run.text_columns == ('process/aggregator/weights',)
  assert results.rounds_to_target(run, 0.4) == 2
  assert results.bits_to_target(run, 0.4) == 3000.0


def test_seed_spread_is_the_sample_standard_deviation():
  # [1, 3]: mean 2, squared deviations 1 + 1 over n - 1 = 1 -> sqrt(2).
  assert results.seed_spread([1.0, 3.0]) == pytest.approx(2**0.5)
  assert results.seed_spread([0.7]) == 0.0  # One seed: no spread to report.
