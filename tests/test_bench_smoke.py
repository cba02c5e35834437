"""Smoke tests of bench/fedavg_round.py and bench/fedgs.py: main on tiny configurations.

Runs `main` in-process (flags -> config -> both TFF loops and plain TF -> table
-> CSV) with 4 clients and one timed round, and checks the CSV it appends: the
timings are finite and positive and the TFF/plain-TF agreement is within the
tolerance. Plus fast checks of the pieces the numbers rest on.
"""

import csv
from dataclasses import replace as dataclasses_replace
import json
import math
import re

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tff_sqlite_fixtures

from bench import fedavg_round
from bench import fedavg_workload
from bench import fedgs as bench_fedgs
from bench import in_memory_clients
from bench import natural_round
from bench import revisions
from bench import seeds_per_call
from bench import shakespeare_round
from tasks import models

_TOLERANCE = 1e-3


@pytest.fixture(scope='module')
def parsed_flags():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def _leaf_femnist(root, counts):
  """A LEAF FEMNIST folder whose writer ``w<i>`` holds ``counts[i]`` training examples."""
  rng = np.random.default_rng(0)
  for split, sizes in (('train', counts), ('test', [1] * len(counts))):
    users = [f'w{i}' for i in range(len(sizes))]
    data = {
      'users': users,
      'num_samples': list(sizes),
      'user_data': {
        u: {'x': rng.uniform(size=(n, 784)).tolist(), 'y': rng.integers(0, 62, n).tolist()}
        for u, n in zip(users, sizes)
      },
    }
    (root / split).mkdir(parents=True)
    (root / split / f'{split}.json').write_text(json.dumps(data))
  return str(root)


def test_real_writers_and_a_small_model(tmp_path):
  leaf_dir = _leaf_femnist(tmp_path / 'leaf', [7, 3, 5])
  config = fedavg_round.BenchmarkConfig(
    rounds=1, num_clients=2, model='2nn', leaf_dir=leaf_dir, agreement_steps=1
  )
  assert config.tag == 'fedavg_round/clients=2,leaf_femnist,batch=20,model=2nn'
  assert config.num_classes == 62
  result = fedavg_round.run_benchmark(config)
  np.testing.assert_array_equal(result.client_sizes, [7, 3])  # The first two writers, by id.
  assert all(result.agreement_ok(label) for label in result.agreement)
  assert 'model 2nn' in fedavg_round.format_table(result)
  with pytest.raises(ValueError, match='holds 3 writers, fewer than --clients=4'):
    dataclasses_replace(config, num_clients=4).client_arrays()
  with pytest.raises(ValueError, match="model must be one of .*got 'vgg'"):
    fedavg_round.BenchmarkConfig(model='vgg')


def test_natural_round_refuses_an_unknown_model(tmp_path):
  # The rounds themselves, with their checks that the fed and python sides train identical
  # weights and plain TF the same within the tolerance, run in the quick suite's natural
  # section (test_suite_quick_run_prints_every_section_and_writes_the_csv: logistic
  # regression on these three writers).
  leaf_dir = _leaf_femnist(tmp_path / 'leaf', [7, 3, 25])
  with pytest.raises(ValueError, match=r"Unknown models \['cnn'\]; choose among 2nn"):
    natural_round.run(leaf_dir, ['cnn'], pairs=2)


@pytest.mark.slow
def test_a_shakespeare_round_read_in_the_worker_trains_what_plain_tf_trains(tmp_path):
  play = tmp_path / 'play.txt'
  speeches = [
    f'ROLE {r}:\n' + 'To be, or not to be, that is the question. ' * (r + 1) for r in range(3)
  ]
  play.write_text('\n\n'.join(speeches * 2) + '\n')
  # Raises SystemExit unless TFF and plain TF train the same weights within the tolerance.
  seconds, steps = shakespeare_round.run(str(play), cohort=2, pairs=2)
  assert sorted(seconds) == ['fed', 'plain_tf']
  assert all(len(v) == 2 and np.all(v > 0) for v in seconds.values())
  assert steps > 2  # Every sequence of the two roles, in batches of 8.
  with pytest.raises(ValueError, match="cohort=4 exceeds the play's 3 roles"):
    shakespeare_round.run(str(play), cohort=4, pairs=2)


def test_main_tiny_configuration(parsed_flags, tmp_path, capfd):
  csv_path = tmp_path / 'bench.csv'
  with flagsaver.flagsaver(
    timed_rounds=1,
    clients=4,
    examples=90,
    agreement_steps=2,
    agreement_tolerance=_TOLERANCE,
    csv=str(csv_path),
  ):
    fedavg_round.main(['fedavg_round'])  # Raises SystemExit if the check fails.

  # capfd, not capsys: TFF starts its C++ executor with sys.stdout as the
  # child's stdout, which needs a real file descriptor.
  table = capfd.readouterr().out
  assert 'tff_dataset_reduce' in table and 'tff_dataset_iterator' in table
  assert 'FAILED' not in table
  with open(csv_path, newline='') as f:
    rows = list(csv.DictReader(f))
  values = {row['metric']: float(row['value']) for row in rows}
  assert {row['benchmark'] for row in rows} == {'fedavg_round/clients=4,examples=90,batch=20'}
  for label in ('tff_dataset_reduce', 'tff_dataset_iterator', 'plain_tf'):
    seconds = values[f'median_seconds/{label}']
    assert math.isfinite(seconds) and seconds > 0, (label, seconds)
  for label in ('tff_dataset_reduce', 'tff_dataset_iterator'):
    ratio = values[f'ratio/{label}_over_plain_tf']
    assert math.isfinite(ratio) and ratio > 0
    # One timed block: one pair, no interval.
    assert values[f'ratio_low/{label}_over_plain_tf'] == -math.inf
    assert values[f'ratio_high/{label}_over_plain_tf'] == math.inf
    # Same work: the new global weights agree (four clients take at most
    # two steps each here, far from the chaotic regime).
    assert values[f'agreement_relative/{label}'] < _TOLERANCE
    assert values[f'full_round_agreement_relative/{label}'] < _TOLERANCE


def test_compare_weights_detects_a_different_update():
  start = [np.zeros((3, 2), np.float32), np.ones(4, np.float32)]
  update = [np.full((3, 2), 0.01, np.float32), np.linspace(-0.02, 0.02, 4, dtype=np.float32)]
  reference = [s + u for s, u in zip(start, update)]
  same = fedavg_round.compare_weights(start, [r.copy() for r in reference], reference)
  assert same.relative_difference == 0.0
  # A client step 1% larger (e.g. a wrong learning rate) must fail the check.
  scaled = [s + 1.01 * u for s, u in zip(start, update)]
  agreement = fedavg_round.compare_weights(start, scaled, reference)
  assert agreement.max_abs_update == pytest.approx(0.02)
  assert agreement.relative_difference == pytest.approx(0.01, rel=1e-3)
  assert agreement.relative_difference > _TOLERANCE
  nan = [np.full((3, 2), np.nan, np.float32), reference[1]]
  assert fedavg_round.compare_weights(start, nan, reference).relative_difference == math.inf


def test_client_sizes_unequal_and_exact():
  sizes = fedavg_workload.client_sizes(32, 4800, seed=0)
  assert sizes.sum() == 4800 and sizes.min() >= 1 and sizes.max() > 2 * sizes.min()
  np.testing.assert_array_equal(sizes, fedavg_workload.client_sizes(32, 4800, seed=0))
  assert fedavg_workload.client_sizes(5, 5, seed=3).tolist() == [1] * 5


def test_plain_round_is_traced_once_and_matches_hand_computed_mean():
  sizes = [3, 7, 1]
  datasets = fedavg_workload.client_datasets(
    fedavg_workload.synthetic_client_arrays(sizes, seed=1), batch_size=2
  )
  plain = fedavg_workload.PlainFedAvg(
    models.mcmahan_cnn(10, seed=0), client_learning_rate=0.1, server_learning_rate=1.0
  )
  start = plain.global_weights()
  plain.run_round(datasets)
  fedavg = plain.global_weights()
  # Independent oracle: each client alone (server lr 1 makes a one-client
  # round equal that client's local training), then the example-weighted mean.
  locals_ = []
  for dataset in datasets:
    plain.set_global_weights(start)
    plain.run_round([dataset])
    locals_.append(plain.global_weights())
  for index, value in enumerate(fedavg):
    expected = sum(n * w[index] for n, w in zip(sizes, locals_)) / sum(sizes)
    np.testing.assert_allclose(value, expected, atol=1e-6)
  assert plain.client_update_tracing_count == 1


def test_fedgs_main_tiny_configuration(parsed_flags, capsys):
  """bench/fedgs.py on 40-client graphs: the solver runs at N = 20 and is
  too_large at N = 40 (max_solver_clients=30); small instances of 6 clients."""
  with flagsaver.flagsaver(
    fg_graph_clients=40,
    fg_sizes=['20', '40'],
    fg_repeats=1,
    fg_time_limit=600.0,  # Never binding: the verdicts below must not depend on speed.
    fg_max_solver_clients=30,
    fg_small_size=6,
    fg_small_budget=2,
    fg_small_instances=2,
  ):
    bench_fedgs.main(['fedgs'])
  table = capsys.readouterr().out
  assert 'graph_distances (shortest paths)' in table
  lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
  assert 'too_large' in lines['40']
  assert 'optimal' in lines['20']
  assert 'solver: optimal on 2/2' in table


@pytest.mark.slow
def test_suite_quick_run_prints_every_section_and_writes_the_csv(parsed_flags, tmp_path, capfd):
  from bench import run as bench_run

  csv_path = tmp_path / 'suite.csv'
  leaf_dir = _leaf_femnist(tmp_path / 'leaf', [7, 3, 25])
  with flagsaver.flagsaver(
    quick=True,
    suite_pairs=2,
    suite_expensive_pairs=2,
    suite_csv=str(csv_path),
    suite_leaf_dir=leaf_dir,
  ):
    bench_run.main(['run'])
  table = capfd.readouterr().out
  assert 'machine: ' in table and 'logical cores, load average' in table
  for section in bench_run.SECTIONS:
    assert f'\n{section} ' in table, section
  with open(csv_path, newline='') as f:
    rows = list(csv.DictReader(f))
  by_name = {}
  for row in rows:
    assert row['cpu'] and int(row['logical_cores']) >= 1 and len(row['load_average'].split()) == 3
    by_name.setdefault(row['benchmark'], {})[row['metric']] = float(row['value'])
  # Less the two header lines, the column names and the 'Appended' line.
  assert len(by_name) == len(table.strip().splitlines()) - 4
  for name, metrics in by_name.items():
    assert metrics['value'] >= 0 and metrics['reference'] > 0, name
    assert metrics['ratio_low'] <= metrics['ratio'] <= metrics['ratio_high'], name
    assert metrics['pairs'] == 2, name


def _machine():
  from bench import run as bench_run

  return bench_run.Machine('Test CPU @ 1 GHz', 2, (0.5, 0.25, 0.75))


def test_suite_row_verdicts_table_and_csv_columns(tmp_path):
  from bench import run as bench_run

  missed = bench_run.Row('fedavg', 'x / y', [3.0, 1.5, 6.0], [2.0, 1.0, 4.0], 's', target=1.2)
  assert (missed.value, missed.reference) == (3.0, 2.0)
  assert missed.ratio == bench_run.stats.Estimate(1.5, 1.5, 1.5, 3)
  assert missed.verdict == 'missed'
  met = bench_run.Row('fedavg', 'x / y', [2.0, 2.0], [2.0, 2.0], 's', target=1.2)
  assert met.verdict == 'met'
  unresolved = bench_run.Row('fedavg', 'x / y', [1.0, 2.0], [1.0, 1.0], 's', target=1.2)
  assert unresolved.verdict == 'unresolved'
  informational = bench_run.Row('workers', 'x / y', [1.0, 1.0], [2.0, 2.0], 's')
  assert informational.verdict == ''

  table = bench_run.format_table([missed, informational], _machine()).splitlines()
  assert table[0] == (
    'machine: Test CPU @ 1 GHz, 2 logical cores, load average 0.50 0.25 0.75 '
    '(1, 5, 15 min) at the start'
  )
  assert table[3].split()[-6:] == ['1.5', '[1.5,', '1.5]', '3', '<=1.2', 'missed']
  rows = bench_run.csv_rows([missed], _machine())
  assert [r['metric'] for r in rows] == [
    'value',
    'reference',
    'ratio',
    'ratio_low',
    'ratio_high',
    'pairs',
  ]
  assert {(r['cpu'], r['logical_cores'], r['load_average']) for r in rows} == {
    ('Test CPU @ 1 GHz', '2', '0.50 0.25 0.75')
  }
  path = tmp_path / 'suite.csv'
  fedavg_round.append_csv(str(path), rows)
  fedavg_round.append_csv(str(path), rows)  # Appends.
  with open(path, newline='') as f:
    assert len(list(csv.DictReader(f))) == 2 * len(rows)
  old = tmp_path / 'old.csv'
  old.write_text('benchmark,metric,value,commit,timestamp\n')
  with pytest.raises(ValueError, match='has the columns'):
    fedavg_round.append_csv(str(old), rows)
  with pytest.raises(ValueError, match='Unknown or no sections'):
    bench_run.run_suite(['fedavg', 'gpu'], bench_run.Sizes.quick(), 2, 2)


@pytest.mark.slow
def test_seeds_per_call_quick(parsed_flags, capfd):
  with flagsaver.flagsaver(spc_quick=True):
    seeds_per_call.main(['seeds_per_call'])  # Raises if the two sides trained differently.
  table = capfd.readouterr().out
  medians = dict(re.findall(r'^(one_call|k_calls)\s+([\d.]+)$', table, re.M))
  assert set(medians) == {'one_call', 'k_calls'} and all(float(v) > 0 for v in medians.values())
  assert re.search(r'ratio one_call / k_calls: [\d.]+ \[-inf, inf\] \(1 pairs\)', table)
  assert 'saved per run:' in table


def test_seeds_per_call_names_every_column_a_seed_trained_differently_in(tmp_path):
  import fault_harness

  header = 'key,eval/accuracy,eval/loss,round_seconds\n'
  same = header + '0,0.1,2.0,\n1,0.3,1.5,0.7\n'
  for side, seed1 in (('one', '0,0.1,2.0,\n1,0.3,1.4,0.7\n'), ('alone', same[len(header) :])):
    fault_harness.write_run(tmp_path / side, 'x_seed0', {'seed': 0}, same)
    # Seed 1 differs in its loss alone; round_seconds (a timing) may differ freely.
    fault_harness.write_run(tmp_path / side, 'x_seed1', {'seed': 1}, header + seed1)
  (tmp_path / 'alone' / 'x_seed0' / 'metrics.csv').write_text(same.replace(',0.7', ',9.9'))
  assert seeds_per_call.disagreements(tmp_path / 'one', tmp_path / 'alone', 2) == [
    'seed 1: eval/loss'
  ]
  assert seeds_per_call.disagreements(tmp_path / 'one', tmp_path / 'alone', 1) == []


def _in_a_git_checkout() -> bool:
  import subprocess

  return (
    subprocess.run(
      ['git', '-C', revisions._REPO, 'rev-parse', 'HEAD'], capture_output=True, check=False
    ).returncode
    == 0
  )


@pytest.mark.slow
@pytest.mark.skipif(not _in_a_git_checkout(), reason="needs the repository's git history")
def test_revisions_quick_times_one_commit_against_itself(parsed_flags, capfd):
  with flagsaver.flagsaver(rev_quick=True, rev_base='HEAD', rev_head='HEAD'):
    revisions.main(['revisions'])  # Raises if the two sides trained differently.
  table = capfd.readouterr().out
  row = re.search(
    r'^uniform\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)  \[-inf, inf\] \(1 pairs\)$', table, re.M
  )
  assert row and all(float(v) > 0 for v in row.groups())


def test_revisions_refuses_a_commit_that_is_not_there(tmp_path):
  from absl import app

  for bad in ('not-a-commit-anywhere', f'--output={tmp_path / "stray.tar"}', 'HEAD:docs'):
    with pytest.raises(app.UsageError, match='No commit'):
      revisions.export(bad, str(tmp_path / 'tree'))
  assert list(tmp_path.iterdir()) == []  # Nothing written.


def test_disagreements_with_no_tolerance_see_the_last_bit(tmp_path):
  import fault_harness

  # The wall clock (round_seconds) may differ; simulated seconds are recorded values.
  header = 'key,eval/accuracy,system/cumulative_seconds,round_seconds\n'
  rows = '0,0.1,0.0,\n1,{},{},{}\n'
  for side, values in (('a', (0.3, 2.5, 0.7)), ('c', (0.3, 2.6, 0.7))):
    fault_harness.write_run(tmp_path / side, 'x_seed0', {'seed': 0}, header + rows.format(*values))
  nudged = repr(float(np.nextafter(np.float64(0.3), 1.0)))
  fault_harness.write_run(
    tmp_path / 'b', 'x_seed0', {'seed': 0}, header + rows.format(nudged, 2.5, 0.1)
  )
  assert seeds_per_call.disagreements(tmp_path / 'a', tmp_path / 'b', 1) == []
  assert seeds_per_call.disagreements(tmp_path / 'a', tmp_path / 'b', 1, tolerance=0.0) == [
    'seed 0: eval/accuracy'
  ]
  assert seeds_per_call.disagreements(tmp_path / 'a', tmp_path / 'c', 1) == [
    'seed 0: system/cumulative_seconds'
  ]


def test_seeds_per_call_command_keeps_the_cell_and_replaces_the_horizon():
  args = seeds_per_call.command(
    seeds_per_call._QUICK_CELL, 'md', rounds=3, rate=0.05, seed=2, seeds=4, root_output_dir='/tmp/x'
  )
  assert args[1:3] == ['-m', 'bin.benchmark']
  assert '--task=digits' in args and '--availability=LN-0.5' in args
  assert [a for a in args if a.startswith(('--rounds', '--eval_every', '--checkpoint_every'))] == [
    '--rounds=3',
    '--eval_every=3',
    '--checkpoint_every=3',
  ]
  assert args[-5:] == [
    '--sampling=md',
    '--seed=2',
    '--seeds=4',
    '--client_learning_rate=0.05',
    '--root_output_dir=/tmp/x',
  ]


def test_in_memory_clients_on_a_tiny_database(parsed_flags, tmp_path, capfd):
  rng = np.random.default_rng(0)
  tff_sqlite_fixtures.write_tff_database(
    str(tmp_path / 'emnist_all.sqlite'),
    {
      'all_train': tff_sqlite_fixtures.emnist_clients(rng, {'f0': 7, 'f1': 25, 'f2': 3}, 62),
      'all_test': tff_sqlite_fixtures.emnist_clients(rng, {'f0': 2, 'f1': 3}, 62),
    },
  )
  with flagsaver.flagsaver(imc_cache_dir=str(tmp_path), imc_pairs=1):
    in_memory_clients.main(['in_memory_clients'])  # Exits if the two sides' weights differ.
  table = capfd.readouterr().out
  assert '3 clients a round' in table and 'trained identical weights' in table
  medians = dict(re.findall(r'^\| (in_memory|sql) \| ([\d.]+) \|$', table, re.M))
  assert set(medians) == {'in_memory', 'sql'} and all(float(v) > 0 for v in medians.values())
  assert re.search(r'ratio in_memory / sql: [\d.]+ \[-inf, inf\] \(1 pairs\)', table)
