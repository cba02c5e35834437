"""Tests for tff_sampling/comparisons/benchmark.py, bin/benchmark.py and bin/benchmark_grid.py."""

import os
import re
import signal
import subprocess
import sys
import time

import fault_harness as fh
import numpy as np
import psutil
import pytest

from bin import experiment_config
from tff_sampling import communication
from tff_sampling.comparisons import benchmark
from tff_sampling.runtime import results


def test_methods_are_samplers_alone_or_with_optimal_uploads():
  assert benchmark.parse_method('md') == ('md', False)
  assert benchmark.parse_method('clustered_similarity+optimal') == ('clustered_similarity', True)
  with pytest.raises(ValueError, match="Unknown method 'optimal'.*followed by \\+optimal"):
    benchmark.parse_method('optimal')
  methods = benchmark.all_methods()
  assert len(methods) == 2 * len(benchmark.SAMPLERS) and methods[-1] == 'full+optimal'
  assert 'benchmark' in experiment_config.BINARIES  # The driver can run a benchmark cell.


def test_cohorts_and_recorded_settings():
  settings = benchmark.BenchmarkMethods(4, 12, 0.1)
  assert settings.cohort('md') == 4 and settings.cohort('md+optimal') == 12
  assert settings.method_hparams('power_of_choice+optimal') == dict(
    sampler='power_of_choice', uploads='optimal', cohort=12, num_candidates=24
  )
  with pytest.raises(ValueError, match='training_cohort=4 must exceed clients_per_round=4'):
    benchmark.BenchmarkMethods(4, 4, 0.1)


def test_uplink_counts_what_each_kind_uploads():
  plain = benchmark.uplink({'aggregator': {}}, 7)
  assert plain == communication.Uplink(model_uploads=7, extra_scalars=0)
  sampled = benchmark.uplink({'aggregator': {'uploads': 2, 'extra_scalars_per_client': 11}}, 7)
  assert sampled == communication.Uplink(model_uploads=2, extra_scalars=77)


@pytest.mark.slow
def test_binary_runs_each_kind_and_uploads_about_m(tmp_path):
  outcome = fh.run_binary(
    'benchmark',
    task='digits',
    availability='LN-0.5',
    rounds=3,
    eval_every=3,
    sampling='md,md+optimal,full',
    clients_per_round=3,
    training_cohort=9,
    seeds=1,
    root_output_dir=tmp_path,
  )
  assert outcome.exit_code == 0, outcome
  runs = {
    m: results.load_run(str(tmp_path / f'digits_LN-0.5_{m}_seed0'))
    for m in ('md', 'md+optimal', 'full')
  }
  md, sampled, full = runs['md'], runs['md+optimal'], runs['full']
  assert md.hparams['uploads'] == 'all' and sampled.hparams['uploads'] == 'optimal'
  # MD alone: 3 trainers, all upload. With optimal uploads: 9 train, and the
  # aggregator's upload count is what the bits count.
  np.testing.assert_array_equal(md.column('cohort_size')[1:], 3)
  np.testing.assert_array_equal(md.column('uplink/model_uploads')[1:], 3)
  np.testing.assert_array_equal(sampled.column('cohort_size')[1:], 9)
  np.testing.assert_array_equal(
    sampled.column('uplink/model_uploads')[1:], sampled.column('process/aggregator/uploads')[1:]
  )
  assert np.all(sampled.column('process/aggregator/expected_uploads')[1:] <= 3 + 1e-5)
  # Full participation: every active client (LN availability: fewer than all 100).
  active = full.column('availability/active_clients')[1:]
  np.testing.assert_array_equal(full.column('cohort_size')[1:], active)
  assert np.all(active < 100)


@pytest.mark.slow
def test_every_sampler_kind_runs_in_process(tmp_path):
  # The samplers the quick grid leaves out: sketches, a loss probe, pre-processing.
  outcome = fh.run_binary(
    'benchmark',
    task='digits',
    availability='IDL',
    rounds=2,
    eval_every=2,
    sampling='clustered_similarity+optimal,power_of_choice,power_of_choice_all,lefl,clustered_size',
    clients_per_round=3,
    training_cohort=6,
    seeds=1,
    root_output_dir=tmp_path,
  )
  assert outcome.exit_code == 0, outcome
  lefl = results.load_run(str(tmp_path / 'digits_IDL_lefl_seed0'))
  # LEFL's soft-label upload is counted before round 1, so its round-0 bits are not zero.
  assert lefl.column(results.BITS_COLUMN)[0] > 0
  similarity = results.load_run(str(tmp_path / 'digits_IDL_clustered_similarity+optimal_seed0'))
  np.testing.assert_array_equal(similarity.column('cohort_size')[1:], 6)


def _ranked(section):
  """A page section's ranking rows (`| 1. method ...`)."""
  return [line for line in section.splitlines() if re.match(r'\| \d+\. ', line)]


def _method(row):
  return re.match(r'\| \d+\. (\S+) ', row).group(1)


@pytest.mark.slow
def test_quick_grid_writes_its_page_inside_its_runs_dir_only(tmp_path, capsys):
  # The grid's main runs in this process (its bin.experiment drivers and their binary calls
  # are processes of their own, as in a real run); its exit message is what it would print
  # on stderr.
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  quick = os.path.join(repo, 'docs', 'benchmark', 'quick')
  before = fh.TreeSnapshot(quick)
  runs_dir = tmp_path / 'quick'
  done = fh.run_binary(
    'benchmark_grid', quick='true', runs_dir=runs_dir, parallel=2, seeds_per_call=2
  )
  assert done.exit_code == 0, (done, capsys.readouterr().err[-3000:])
  # Each method's two reported seeds were trained by one call (its log's name says so).
  logs = set(os.listdir(runs_dir / 'digits_LN' / 'logs'))
  spec = experiment_config.load(os.path.join(quick, 'digits_LN', 'experiment.flags'))
  assert {f'lr0.1_{m}_seed0-1.log' for m in spec.methods} <= logs
  assert not [name for name in logs if name.endswith(('_seed0.log', '_seed1.log'))]
  assert before.changes() == []  # The quick grid's own files are untouched.
  page = (runs_dir / 'benchmark.md').read_text()
  sections = {part.splitlines()[0]: part for part in page.split('\n## ')}
  # The cell's ranking has every method once, two seeds each; so has the overview.
  rows = _ranked(next(part for title, part in sections.items() if title.startswith('Quick check')))
  assert sorted(map(_method, rows)) == sorted(spec.methods)
  assert all(re.search(r'\|\s+2 \|', r) for r in rows)  # Two seeds each.
  assert sorted(map(_method, _ranked(sections['At a glance']))) == sorted(spec.methods)
  assert '(baseline)' in page and 'accuracy at' in page
  assert (runs_dir / 'configs' / 'digits_LN' / 'accuracy_bits.png').is_file()
  # The report stage alone regenerates the same page from the raw metrics.
  again = fh.run_binary('benchmark_grid', quick='true', runs_dir=runs_dir, stage='report')
  assert again.exit_code == 0, again
  assert (runs_dir / 'benchmark.md').read_text() == page

  # --stage=check passes on that page, and fails in one line once the page is edited by hand.
  def check():
    """The check stage's outcome; nothing else may have gone to stderr."""
    capsys.readouterr()
    outcome = fh.run_binary('benchmark_grid', quick='true', runs_dir=runs_dir, stage='check')
    assert capsys.readouterr().err.strip() == '', outcome
    return outcome

  passed = check()
  assert passed.exit_code == 0, passed
  (runs_dir / 'benchmark.md').write_text(page.replace('(baseline)', '(the baseline)', 1))
  failed = check()
  assert failed.exit_code == 1
  assert failed.message.strip() == (
    f'Error: Not what the raw metrics give: '
    f'{runs_dir / "benchmark.md"}; rewrite with --stage=report.'
  )
  # A plot edited by hand is named too.
  (runs_dir / 'benchmark.md').write_text(page)
  plot = runs_dir / 'configs' / 'digits_LN' / 'accuracy_bits.png'
  plot.write_bytes(plot.read_bytes() + b'\0')
  failed = check()
  assert failed.exit_code == 1
  assert failed.message.strip() == (
    f'Error: Not what the raw metrics give: {plot}; rewrite with --stage=report.'
  )


def _children_if_running(process: psutil.Process) -> list[psutil.Process]:
  # A binary that ended between the two snapshots has no children left to check.
  try:
    return process.children(recursive=True)
  except psutil.NoSuchProcess:
    return []


@pytest.mark.slow
def test_sigterm_stops_the_grid_and_every_process_it_started(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  grid = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'bin.benchmark_grid',
      '--quick',
      f'--runs_dir={tmp_path / "quick"}',
      '--stage=train',
    ],
    cwd=repo,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    stdin=subprocess.DEVNULL,
  )
  try:
    # Wait for a training binary with its TFF worker: the grid's great-grandchild.
    while not [
      p for p in psutil.Process(grid.pid).children(recursive=True) if 'worker_binary' in p.name()
    ]:
      assert grid.poll() is None, grid.communicate()
      time.sleep(0.05)
    (driver,) = psutil.Process(grid.pid).children()
    binaries = driver.children()
    workers = [w for b in binaries for w in _children_if_running(b)]
    grid.send_signal(signal.SIGTERM)
    out, err = grid.communicate(timeout=300)
  finally:
    grid.kill()
  assert grid.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert 'Stopped by SIGTERM; rerun the same command to resume.' in out
  # The driver has stopped its binaries before exiting, and the grid waited for the driver.
  assert binaries and not [p for p in (driver, *binaries) if p.is_running()]
  # A binary's TFF workers die with it (Linux signals them when their parent dies).
  assert workers
  _, alive = psutil.wait_procs(workers, timeout=60)
  assert alive == []


@pytest.mark.slow
def test_the_committed_benchmark_page_is_what_its_raw_metrics_give():
  """docs/benchmark.md regenerates exactly from the raw metrics committed in docs/benchmark/
  (the grid's cells in progress included); it must exist once any cell has run."""
  done = fh.run_binary('benchmark_grid', stage='check')
  assert done.exit_code == 0, done
