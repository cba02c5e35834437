"""bin.experiment end to end on `digits`, and every committed experiment report
regenerated exactly from its committed raw metrics."""

import dataclasses
import glob
import os
import re
import subprocess
import sys
import time

import fault_harness as fh
import numpy as np
import pytest

from bin import experiment_config
from bin import experiment_jobs
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import raw_metrics
from tff_sampling.runtime import files
from tff_sampling.runtime import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Kills a binary at a chosen checkpoint (tests/crash_at_checkpoint/sitecustomize.py).
CRASH_HOOK = os.path.join(REPO, 'tests', 'crash_at_checkpoint')
COMMITTED = sorted(
  os.path.dirname(p)
  for p in glob.glob(
    os.path.join(REPO, 'docs', 'experiments', '*', experiment_config.CONFIG_FILENAME)
  )
)

CONFIG = """\
--binary=demo
--title=Driver check
--methods=uniform,full
--baseline=uniform
--learning_rates=0.3,0.05
--tuning_seed=7
--seeds=2
--final_k=2
--targets=0.2
--claims=full>uniform:final,full<uniform:rounds_to_0.2
--task=digits
--num_clients=20
--clients_per_round=5
--rounds=2
--eval_every=1
--checkpoint_every=2
"""


def _files(root):
  return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


@pytest.fixture
def driver(capsys, monkeypatch):
  """``driver(**flags)`` runs bin.experiment's ``main`` in this process and returns how it
  ended (`fault_harness.Outcome`: exit status, ``sys.exit`` message) and what it printed
  (``.out``, ``.err``). It runs from the repository root, where its binary calls
  (``python -m bin.<binary>``, processes of their own as in a real run) find ``bin``."""
  monkeypatch.chdir(REPO)

  def run(**flag_values):
    capsys.readouterr()
    outcome = fh.run_binary('experiment', **flag_values)
    return outcome, capsys.readouterr()

  return run


@pytest.mark.slow
def test_tune_evaluate_export_report_and_rerun(tmp_path, driver):
  folder = tmp_path / 'docs' / 'experiments' / 'driver_check'
  folder.mkdir(parents=True)
  config = folder / experiment_config.CONFIG_FILENAME
  config.write_text(CONFIG)
  runs_dir = tmp_path / 'runs'
  outcome, done = driver(config=config, runs_dir=runs_dir, parallel=2, seeds_per_call=2)
  assert outcome.exit_code == 0, (outcome, done.err[-2000:])
  assert '0 of 4 runs done; 4 to train.' in done.out  # Tuning: 2 methods x 2 rates.

  # The chosen rate is the one whose tuning run has the higher mean of its last 2
  # evaluations, read here straight from the run directories.
  spec = experiment_config.load(str(config))
  chosen = {}
  for method in spec.methods:
    scores = {}
    for rate in spec.learning_rates:
      (run_path,) = glob.glob(str(runs_dir / f'lr{rate:g}' / f'*_{method}_seed7'))
      accuracy = results.load_run(run_path).column('eval/accuracy')
      scores[rate] = accuracy[-2:].mean()
    chosen[method] = max(scores, key=lambda r: (scores[r], r))
  assert f'Learning rates: uniform {chosen["uniform"]:g}, full {chosen["full"]:g}' in done.out
  for method, rate in chosen.items():
    for seed in (0, 1):
      assert glob.glob(str(runs_dir / f'lr{rate:g}' / f'*_{method}_seed{seed}'))

  # Common random numbers: within a seed both methods drew the same cohorts (whatever their
  # rates), across seeds they did not.
  def counts(method, seed):
    (path,) = glob.glob(str(runs_dir / f'lr{chosen[method]:g}' / f'*_{method}_seed{seed}'))
    return results.load_run(path).selection_counts

  for seed in (0, 1):
    assert list(counts('uniform', seed)) == list(counts('full', seed))
  assert list(counts('uniform', 0)) != list(counts('uniform', 1))

  # Each method's two evaluation seeds trained in one call (--seeds_per_call=2), and each run's
  # end names it. (That a seed trained second in a call is the run it would be alone:
  # test_bench_smoke.test_seeds_per_call_quick, whose benchmark compares every column.)
  for method, rate in chosen.items():
    call = f'lr{rate:g}_{method}_seed0-1'
    assert (runs_dir / 'logs' / f'{call}.log').is_file()
    for seed in (0, 1):
      assert f'lr{rate:g}_{method}_seed{seed}: finished (call {call}: ' in done.out
    assert done.out.count(f'(call {call}: ') == 2
    assert re.search(rf'\(call {call}: \d+ s\)', done.out)
  # After each ended call, runs trained and to go and the time left (no run is left at last).
  assert re.search(r'\d run\(s\) trained, 0 to go; about 0:00 left, 2 at a time', done.out)
  # While tuning, the 4 evaluation runs (2 methods x 2 seeds) are estimated too.
  assert re.search(
    r'2 at a time \(each method at its runs so far[^)]*\)\. Then 4 evaluation runs, about \d+:\d\d '
    r'more',
    done.out,
  )
  # Exports while calls train count the runs still training without naming them; the last
  # export holds every run, finished.
  assert 'Note: unfinished runs' not in done.out
  assert re.search(r'Wrote 8 runs to \S+runs\.jsonl\.gz\n', done.out)

  # Only the runs directory and the raw metrics file were written.
  assert _files(folder) == {'experiment.flags', 'runs.jsonl.gz'}
  archived = raw_metrics.read(folder / 'runs.jsonl.gz')
  assert len(archived) == 8 and all(r.path.split('#')[1].startswith('lr') for r in archived)

  # A rerun trains nothing and leaves the runs as they were.
  before = {p: os.path.getmtime(p) for p in glob.glob(str(runs_dir / 'lr*' / '*' / 'metrics.csv'))}
  outcome, again = driver(config=config, runs_dir=runs_dir)
  assert outcome.exit_code == 0, (outcome, again.err[-2000:])
  assert again.out.count('runs done; 0 to train.') == 2
  assert before == {p: os.path.getmtime(p) for p in before}

  # A new machine (an empty runs directory) resumes from the committed raw metrics: nothing
  # finished is trained again and the file comes out the same, byte for byte.
  committed = (folder / 'runs.jsonl.gz').read_bytes()
  outcome, fresh = driver(config=config, runs_dir=tmp_path / 'new_machine')
  assert outcome.exit_code == 0, (outcome, fresh.err[-2000:])
  assert fresh.out.count('runs done; 0 to train.') == 2
  assert not (tmp_path / 'new_machine').exists()
  assert (folder / 'runs.jsonl.gz').read_bytes() == committed

  # With only the tuning runs committed, a new machine trains just the evaluation runs;
  # --noreuse_raw_metrics trains everything again.
  assert evidence_spec.missing_runs(spec, archived) == []
  tuning_only = [r for r in archived if r.hparams['seed'] == 7]
  raw_metrics.write(
    tuning_only, folder / 'runs.jsonl.gz', names=[r.path.split('#')[1] for r in tuning_only]
  )
  assert evidence_spec.missing_runs(spec, tuning_only) == [
    f'{m} at {chosen[m]:g}, seed {s}' for s in (0, 1) for m in ('uniform', 'full')
  ]
  outcome, partial = driver(config=config, runs_dir=tmp_path / 'new_machine', dry_run=True)
  assert outcome.exit_code == 0, (outcome, partial.err[-2000:])
  assert '4 of 4 runs done; 0 to train.' in partial.out
  assert '0 of 4 runs done; 4 to train.' in partial.out
  assert partial.out.count('--seed=7') == 0
  outcome, again_all = driver(
    config=config, runs_dir=tmp_path / 'new_machine', dry_run=True, reuse_raw_metrics=False
  )
  assert outcome.exit_code == 0, (outcome, again_all.err[-2000:])
  assert '0 of 4 runs done; 4 to train.' in again_all.out
  assert again_all.out.count('--seed=7') == 4
  assert not (tmp_path / 'new_machine').exists()
  (folder / 'runs.jsonl.gz').write_bytes(committed)

  # A configuration edited after its runs started is refused, naming the setting.
  config.write_text(CONFIG.replace('--rounds=2', '--rounds=3'))
  edited, _ = driver(config=config, runs_dir=runs_dir)
  assert edited.exit_code != 0
  assert 'was trained with rounds=2, but the configuration says --rounds=3' in edited.message
  config.write_text(CONFIG)

  # The report from the raw metrics equals the report from the run directories.
  from_file = evidence_report.results_markdown(
    spec, archived, command=evidence_report.regenerate_command(config)
  )
  from_dirs = evidence_report.results_markdown(
    spec,
    [results.load_run(os.path.dirname(p)) for p in before],
    command=evidence_report.regenerate_command(config),
  )
  assert from_file == from_dirs
  assert 'python -m bin.report --experiment=docs/experiments/driver_check/experiment.flags' in (
    from_file
  )
  assert (
    f'**{evidence.Verdict.NO_DIFFERENCE}**' in from_file
    or f'**{evidence.Verdict.REPRODUCED}**' in from_file
  )

  # A sibling that borrows this tuning trains every method at the rate chosen here, read from
  # the committed raw metrics (no runs directory of this name beside its own).
  sibling = tmp_path / 'docs' / 'experiments' / 'driver_borrow'
  sibling.mkdir()
  (sibling / experiment_config.CONFIG_FILENAME).write_text(
    CONFIG.replace('--learning_rates=0.3,0.05', '--learning_rates_from=driver_check')
  )
  outcome, borrowed = driver(
    config=sibling / experiment_config.CONFIG_FILENAME,
    runs_dir=tmp_path / 'borrow_runs',
    dry_run=True,
  )
  assert outcome.exit_code == 0, (outcome, borrowed.err[-2000:])
  assert f'Learning rates: uniform {chosen["uniform"]:g}, full {chosen["full"]:g}' in (borrowed.out)
  assert borrowed.out.count('--client_learning_rate=') == 4  # 2 methods x 2 seeds, no tuning.


def _timed_run(spec, method, seconds):
  return results.Run(
    path=f'lr0.1/x_{method}_seed0',
    hparams={spec.label_key: method},
    metrics={'round_seconds': np.asarray(seconds, dtype=float)},
    rounds=np.arange(len(seconds)),
  )


def test_longest_first_starts_the_slowest_methods_and_keeps_the_order_otherwise(tmp_path):
  config = tmp_path / experiment_config.CONFIG_FILENAME
  config.write_text(CONFIG.replace('--methods=uniform,full', '--methods=uniform,full,optimal'))
  spec = experiment_config.load(str(config))
  jobs = [experiment_jobs.Job(m, 0.1, s) for s in (0, 1) for m in ('uniform', 'full', 'optimal')]
  # Medians: uniform 1 s, full 5 s; optimal has no timed run, so it counts as the longest.
  timed = [_timed_run(spec, 'uniform', [1.0, 1.0, 9.0]), _timed_run(spec, 'full', [4.0, 5.0, 6.0])]
  ordered = experiment_jobs.longest_first(spec, jobs, timed)
  assert [(j.method, j.seed) for j in ordered] == [
    ('optimal', 0),
    ('optimal', 1),
    ('full', 0),
    ('full', 1),
    ('uniform', 0),
    ('uniform', 1),
  ]
  # With nothing timed, the order is the given one.
  assert experiment_jobs.longest_first(spec, jobs, []) == jobs


def test_a_run_that_has_not_released_a_round_is_not_listed_yet(tmp_path):
  # The driver lists the runs (to export them) while another call's run has just started:
  # its metrics.csv is empty, or holds a header only, until round 0 is released.
  config = tmp_path / experiment_config.CONFIG_FILENAME
  config.write_text(CONFIG)
  spec = experiment_config.load(str(config))
  runs_dir = tmp_path / 'runs'
  hparams = {spec.label_key: 'uniform', 'seed': 0, 'client_learning_rate': 0.3}
  fh.write_run(runs_dir / 'lr0.3', 'x_uniform_seed0', hparams, 'key,eval/accuracy\n0,0.5\n')
  fh.write_run(runs_dir / 'lr0.3', 'x_uniform_seed1', dict(hparams, seed=1), 'key,eval/accuracy\n')
  fh.write_run(runs_dir / 'lr0.3', 'x_full_seed0', dict(hparams, **{spec.label_key: 'full'}), '')
  assert list(experiment_jobs.all_runs(spec, str(runs_dir))) == ['lr0.3/x_uniform_seed0']
  seed1 = experiment_jobs.Job('uniform', 0.3, 1)
  assert experiment_jobs.find_run(spec, seed1, str(runs_dir)) is None
  for started in ('x_uniform_seed1', 'x_full_seed0'):
    with pytest.raises(results.NoRoundsYet, match='rerun the training command'):
      results.load_run(runs_dir / 'lr0.3' / started)
  # A damaged file is still an error.
  fh.write_run(runs_dir / 'lr0.3', 'x_full_seed1', dict(hparams, seed=1), 'round,accuracy\n0,1\n')
  with pytest.raises(ValueError, match="has no 'key' column"):
    experiment_jobs.all_runs(spec, str(runs_dir))


def _uniform_runs(tmp_path):
  """The driver's CONFIG (--rounds=2) as a spec, its runs directory, and ``write(seed, rows)``
  giving hand-made run x_uniform_seed<seed> at rate 0.3 the metrics `rows` (after the header
  ``key,eval/accuracy,train/loss``), creating the run if it is new."""
  config = tmp_path / experiment_config.CONFIG_FILENAME
  config.write_text(CONFIG)
  spec = experiment_config.load(str(config))
  runs_dir = tmp_path / 'runs'
  hparams = {spec.label_key: 'uniform', 'client_learning_rate': 0.3, 'rounds': 2}
  header = 'key,eval/accuracy,train/loss\n'

  def write(seed, rows):
    run = runs_dir / 'lr0.3' / f'x_uniform_seed{seed}'
    if run.exists():
      (run / 'metrics.csv').write_text(header + rows)
    else:
      fh.write_run(run.parent, run.name, dict(hparams, seed=seed), header + rows)

  return spec, str(runs_dir), write


def test_done_jobs_are_the_runs_that_trained_every_round_or_diverged(tmp_path):
  # What the driver exports while a call of several seeds still trains its later ones.
  spec, runs_dir, write = _uniform_runs(tmp_path)
  write(0, '2,0.5,1\n')
  write(1, '1,0.5,1\n')
  write(2, '1,0.1,inf\n')
  jobs = [experiment_jobs.Job('uniform', 0.3, seed) for seed in range(4)]  # Seed 3: not started.
  assert experiment_jobs.done_jobs(spec, jobs, runs_dir) == {jobs[0], jobs[2]}


def test_the_evaluation_runs_to_train_leave_out_those_done_at_any_rate(tmp_path):
  # CONFIG reports seeds 0 and 1 of uniform and full; its tuning seed is 7.
  spec, runs_dir, write = _uniform_runs(tmp_path)
  write(0, '1,0.5,1\n2,0.6,1\n')  # Done (at 0.3, whatever rate the tuning picks).
  write(1, '1,0.5,1\n')  # Started, not done.
  write(7, '1,0.5,1\n2,0.6,1\n')  # A tuning run.
  with fh.flags_of('experiment') as experiment:
    left = experiment._evaluation_to_train(spec, runs_dir, {})
  assert left == ['full', 'uniform', 'full']  # Seed 0's full, seed 1's uniform and full.


def test_the_lookout_reports_each_run_ended_inside_a_call_once(tmp_path, monkeypatch):
  # Every _LOOK_EVERY seconds the driver looks for runs ended inside calls of several seeds
  # still training; a call of one seed is exported when the call ends.
  spec, runs_dir, write = _uniform_runs(tmp_path)
  write(0, '1,0.5,1\n')
  write(1, '1,0.5,1\n')
  write(2, '1,0.5,1\n2,0.6,1\n')  # Ended, alone in its call.
  with fh.flags_of('experiment') as experiment:

    def call(*seeds):
      jobs = tuple(experiment_jobs.Job('uniform', 0.3, s) for s in seeds)
      return experiment._Call(jobs, process=None, started=0.0, log_path='', log_start=0)

    running = [call(0, 1), call(2)]
    lookout = experiment._Lookout()
    monkeypatch.setattr(experiment, '_LOOK_EVERY', 0.0)
    assert not lookout.found(spec, running, runs_dir)
    write(0, '1,0.5,1\n2,0.6,1\n')
    monkeypatch.setattr(experiment, '_LOOK_EVERY', 1e9)
    assert not lookout.found(spec, running, runs_dir)  # Not yet time to look again.
    monkeypatch.setattr(experiment, '_LOOK_EVERY', 0.0)
    assert lookout.found(spec, running, runs_dir)  # Seed 0 ended inside its call.
    assert not lookout.found(spec, running, runs_dir)  # Nothing new.
    write(1, '1,0.5,1\n2,0.6,1\n')
    assert lookout.found(spec, running, runs_dir)  # Seed 1 ended.


def test_runs_ended_inside_a_call_count_at_its_seconds_so_far_shared_among_them():
  job = lambda method, seed: experiment_jobs.Job(method, 0.1, seed)
  three, alone = [job('full', s) for s in range(3)], [job('uniform', 0)]
  # The call of three started at 100 s and has ended two runs by 400 s: 150 s each; the call
  # of one has ended none.
  trained, going = experiment_jobs.inside_calls(
    [(three, 100.0), (alone, 350.0)], {three[0], three[1], job('md', 9)}, now=400.0
  )
  assert trained == [('full', 150.0), ('full', 150.0)]
  assert going == [three[2], alone[0]]
  assert experiment_jobs.inside_calls([(three, 0.0)], set(), now=10.0) == ([], three)


def test_a_run_ended_inside_a_call_is_counted_trained_in_the_progress_line(tmp_path):
  # With --seeds_per_call=5 a call of 500-round runs can take hours; the line printed when the
  # lookout finds a run ended inside it counts that run trained, not to go.
  spec, _, _ = _uniform_runs(tmp_path)
  with fh.flags_of('experiment') as experiment:
    jobs = tuple(experiment_jobs.Job('uniform', 0.3, s) for s in range(3))
    call = experiment._Call(jobs, process=None, started=time.monotonic(), log_path='', log_start=0)
    todo = [experiment_jobs.Job('full', 0.3, 0)]
    line = experiment._progress(spec, [('full', 9.0)], todo, [call], {jobs[0]}, [], [])
  assert line.startswith('2 run(s) trained, 3 to go; about '), line


def _config(folder, *edits):
  """Writes CONFIG with each (old, new) of `edits` replaced into `folder`'s configuration file
  (a new folder); returns its path. Its binary is bin.benchmark, which builds one process for
  all the seeds of a call and draws no plot: cheaper than demo, whose cohorts the tuning test
  needs."""
  text = CONFIG.replace('--binary=demo', '--binary=benchmark')
  for old, new in edits:
    assert old in text, old
    text = text.replace(old, new)
  folder.mkdir()
  config = folder / experiment_config.CONFIG_FILENAME
  config.write_text(text)
  return config


def _assert_same_as_alone(config, runs_dir, alone, seed, method='uniform', rate=0.3):
  """Asserts that the driver's run of `method` at `rate` and `seed` in `runs_dir` is the run
  that one call of the binary trains alone, in a new process, into `alone`."""
  spec = experiment_config.load(str(config))
  single = subprocess.run(
    [
      sys.executable,
      '-m',
      f'bin.{spec.binary}',
      *spec.binary_flags,
      f'--{spec.method_flag}={method}',
      *experiment_config.run_name_flags(spec, method),
      f'--seed={seed}',
      '--seeds=1',
      f'--client_learning_rate={rate:g}',
      f'--root_output_dir={alone}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    stdin=subprocess.DEVNULL,
  )
  assert single.returncode == 0, single.stderr[-2000:]
  (driven_path,) = glob.glob(str(runs_dir / f'lr{rate:g}' / f'*_{method}_seed{seed}'))
  (alone_path,) = glob.glob(str(alone / f'*_{method}_seed{seed}'))
  driven, reference = results.load_run(driven_path), results.load_run(alone_path)
  np.testing.assert_array_equal(driven.selection_counts, reference.selection_counts)
  measured = [c for c in reference.metrics if 'seconds' not in c]
  assert 'eval/accuracy' in measured and sorted(driven.metrics) == sorted(reference.metrics)
  for column in measured:
    np.testing.assert_allclose(
      driven.column(column), reference.column(column), rtol=1e-6, atol=1e-9, err_msg=column
    )


@pytest.mark.slow
def test_a_run_the_binary_refuses_stops_the_driver_at_once_saying_why(tmp_path, driver):
  # clients_per_round above the population: the binary refuses it before training (the
  # driver's check of the flags cannot know the task's size), and would every time.
  config = _config(tmp_path / 'bad', ('--clients_per_round=5', '--clients_per_round=50'))
  folder = config.parent
  outcome, done = driver(config=config, runs_dir=tmp_path / 'runs')
  assert outcome.exit_code == 1
  log = tmp_path / 'runs' / 'logs' / 'lr0.3_uniform_seed7.log'
  # Its exit message (stderr in a process of its own) is the one error line.
  stderr = done.err + outcome.message
  (error,) = [line for line in stderr.splitlines() if line.startswith('Error: ')]
  assert error.startswith(
    'Error: Run lr0.3_uniform_seed7 failed (exit 1): clients_per_round='
  ) and error.endswith(f'[log: {log}]'), error
  assert 'training again' not in done.out  # Not retried: it would be refused again.
  assert log.read_text().count('Error: ') == 1
  assert not (folder / 'runs.jsonl.gz').exists()


@pytest.mark.slow
def test_a_crashed_call_trains_again_from_its_checkpoint_and_the_run_is_unchanged(tmp_path):
  config = _config(
    tmp_path / 'crash',
    ('--methods=uniform,full', '--methods=uniform'),
    ('--learning_rates=0.3,0.05', '--learning_rates=0.3'),
    ('--tuning_seed=7\n', ''),
    ('--claims=full>uniform:final,full<uniform:rounds_to_0.2\n', ''),
    ('--seeds=2', '--seeds=1'),
    ('--rounds=2', '--rounds=8'),
    ('--checkpoint_every=2', '--checkpoint_every=1'),
  )
  runs_dir, crashed = tmp_path / 'runs', tmp_path / 'crashed'
  driver = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'bin.experiment',
      f'--config={config}',
      f'--runs_dir={runs_dir}',
      '--stage=evaluate',
    ],
    cwd=REPO,
    env={
      **os.environ,
      # The killed binary cannot remove its temporary directory: it stays in this test's.
      'TMPDIR': str(tmp_path),
      # The binary dies as a segfaulting TFF worker takes it down: SIGKILL, right after its
      # round-2 checkpoint is complete, the first time only (no clock, no race).
      'PYTHONPATH': os.pathsep.join([CRASH_HOOK, *filter(None, [os.environ.get('PYTHONPATH')])]),
      'CRASH_AT_CHECKPOINT': f'program_state_2:{crashed}',
    },
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    stdin=subprocess.DEVNULL,
  )
  try:
    out, err = driver.communicate(timeout=900)
  finally:
    driver.kill()
  assert driver.returncode == 0, err[-2000:]
  assert crashed.is_file()  # The hook fired: the first call died at its round-2 checkpoint.
  assert 'lr0.3_uniform_seed0: call lr0.3_uniform_seed0 failed (exit -9: killed by SIGKILL; ' in out
  assert 'lr0.3_uniform_seed0: finished in ' in out
  # The second attempt resumed from the checkpoint, not from round 0.
  log = (runs_dir / 'logs' / 'lr0.3_uniform_seed0.log').read_text()
  assert re.search(r'Resuming \S+_uniform_seed0 after round 2\.', log), log[-3000:]

  # The run equals one trained without a fault.
  _assert_same_as_alone(config, runs_dir, tmp_path / 'alone', seed=0)


def test_the_progress_line_estimates_the_time_left_from_the_runs_so_far():
  # With no method timed, every run counts alike: the median of 100, 300, 200 s = 200 s;
  # 5 runs to go, 2 at a time: 5 × 200 / 2 = 500 s = 0:08 (whole minutes, rounded down).
  line = experiment_jobs.progress_line([('a', 100.0), ('a', 300.0), ('a', 200.0)], ['a'] * 5, 2)
  assert line == (
    '3 run(s) trained, 5 to go; about 0:08 left, 2 at a time (every run at the median run so far).'
  )
  # 7,300 s left: 2 hours and 1 minute.
  assert 'about 2:01 left' in experiment_jobs.progress_line([('a', 3650.0)], ['a', 'a'], 1)
  assert 'about 0:00 left' in experiment_jobs.progress_line([('a', 50.0)], [], 1)


def test_the_progress_line_estimates_each_run_by_its_methods_runs():
  # A run of full participation trains for 5,000 s, one of uniform for 50 s; each run trained
  # took 30 s more (start-up, evaluations). One full and two uniform runs to go, one at a
  # time: 5,030 + 2 × 80 = 5,190 s = 1:26. The evaluation's 5 full runs and one run of a
  # method not timed yet (the median method, 2,525 s, + 30): 25,150 + 2,555 = 27,705 s = 7:41.
  run_seconds = {'full': 5000.0, 'uniform': 50.0}
  trained = [('uniform', 80.0), ('full', 5030.0)]
  line = experiment_jobs.progress_line(
    trained,
    ['full', 'uniform', 'uniform'],
    1,
    later=['full'] * 5 + ['tifl'],
    run_seconds=run_seconds,
  )
  assert line == (
    '2 run(s) trained, 3 to go; about 1:26 left, 1 at a time (each method at its runs so far;'
    ' 1 method(s) not timed yet, at the median method). Then 6 evaluation runs, about 7:41 more'
    " (not counting runs past the grid's edge)."
  )
  # Once every method still to train has a timed run, the line says no more.
  assert experiment_jobs.progress_line(trained, ['full'], 1, run_seconds=run_seconds).endswith(
    '1 at a time (each method at its runs so far).'
  )
  # Counted alike, the same runs would be estimated at the median run trained (2,555 s):
  # 3 × 2,555 = 7,665 s = 2:07.
  assert 'about 2:07 left' in experiment_jobs.progress_line(
    trained, ['full', 'uniform', 'uniform'], 1
  )
  # Runs faster than their method's runs so far add nothing below 0.
  faster = experiment_jobs.progress_line([('full', 4000.0)], ['full'], 1, run_seconds=run_seconds)
  assert 'about 1:23 left' in faster  # 5,000 s.
  # No run trained yet (those that ended diverged): the methods' runs alone, or no estimate.
  none_yet = experiment_jobs.progress_line([], ['full'], 1, run_seconds=run_seconds)
  assert none_yet.startswith('0 run(s) trained, 1 to go; about 1:23 left')
  assert experiment_jobs.progress_line([], ['full'], 1) == '0 run(s) trained, 1 to go.'


def test_method_run_seconds_are_each_methods_median_training_seconds_a_run(tmp_path):
  config = tmp_path / experiment_config.CONFIG_FILENAME
  config.write_text(CONFIG.replace('--methods=uniform,full', '--methods=uniform,full,optimal'))
  spec = experiment_config.load(str(config))  # --rounds=2.
  assert experiment_jobs.spec_rounds(spec) == 2

  def run(method, seconds, **hparams):
    timed = _timed_run(spec, method, seconds)
    timed.hparams.update(hparams)
    return timed

  sibling = run('full', [1.0, 1.0, 1.0, 1.0], rounds=4)
  sibling = dataclasses.replace(sibling, rounds=np.arange(1, 5))
  diverged = run('optimal', [1.0, 2.0])
  diverged.metrics['train/loss'] = np.asarray([0.5, np.inf])
  untimed = run('optimal', [1.0, 2.0])
  del untimed.metrics['round_seconds']
  timed = [
    run('uniform', [0.1, 0.3]),  # 0.4 s in all.
    run('full', [4.0, 6.0]),  # 10 s,
    run('full', [5.0, 7.0]),  # 12 s,
    run('full', [20.0, 30.0]),  # 50 s: median 12 s.
    sibling,  # A sibling's 4 rounds: 2 s at 2 rounds.
    # Left out: a diverged run, an unfinished one, one without seconds, another method's.
    diverged,
    run('optimal', [1.0, 2.0], rounds=5),
    untimed,
    run('power_of_choice', [9.0, 9.0]),
  ]
  assert experiment_jobs.method_run_seconds(spec, timed) == pytest.approx(
    {'uniform': 0.4, 'full': 11.0}
  )


def test_batches_group_consecutive_seeds_of_one_method_and_rate():
  job = experiment_jobs.Job
  jobs = [job(m, r, s) for s in (0, 1, 2, 4) for m in ('a', 'b') for r in (0.1,)]
  jobs += [job('a', 0.05, 0), job('a', 0.05, 1)]
  calls = experiment_jobs.batches(jobs, 2)
  assert [[(j.method, j.rate, j.seed) for j in c] for c in calls] == [
    [('a', 0.1, 0), ('a', 0.1, 1)],
    [('b', 0.1, 0), ('b', 0.1, 1)],
    [('a', 0.1, 2)],  # The call of seeds 0-1 is full.
    [('b', 0.1, 2)],
    [('a', 0.1, 4)],  # Seed 3 is not a job: 4 does not follow 2.
    [('b', 0.1, 4)],
    [('a', 0.05, 0), ('a', 0.05, 1)],  # Another rate, another call.
  ]
  assert sorted(j.name for c in calls for j in c) == sorted(j.name for j in jobs)
  assert experiment_jobs.batches(jobs, 1) == [(j,) for j in jobs]
  assert [len(c) for c in experiment_jobs.batches(jobs, 5)] == [3, 3, 1, 1, 2]
  assert experiment_jobs.call_name(calls[0]) == 'lr0.1_a_seed0-1'
  assert experiment_jobs.call_name(calls[2]) == 'lr0.1_a_seed2'
  with pytest.raises(ValueError, match='at least one run'):
    experiment_jobs.batches(jobs, 0)


@pytest.mark.slow
def test_a_divergence_ends_its_call_and_the_later_seeds_train_in_a_new_call(tmp_path, driver):
  # At client rate 1e30 every run diverges in round 1, and the binary stops at the first one;
  # the seeds after it train in a new call, itself of several seeds. (That a seed trained
  # second in a call equals the seed trained alone: test_bench_smoke.test_seeds_per_call_quick.)
  config = _config(
    tmp_path / 'diverging',
    ('--methods=uniform,full', '--methods=uniform'),
    ('--learning_rates=0.3,0.05', '--learning_rates=uniform:1e30'),
    ('--tuning_seed=7\n', ''),
    ('--claims=full>uniform:final,full<uniform:rounds_to_0.2\n', ''),
    ('--seeds=2', '--seeds=3'),
  )
  runs_dir = tmp_path / 'runs'
  outcome, done = driver(config=config, runs_dir=runs_dir, seeds_per_call=3)
  assert outcome.exit_code == 0, (outcome, done.err[-2000:])
  assert '0 of 3 runs done; 3 to train.' in done.out

  # Each divergence ended its call; the seeds after it trained in a new call.
  diverged = sorted(line for line in done.out.splitlines() if 'diverged in round 1' in line)
  assert len(diverged) == 3, done.out
  assert diverged[0].startswith('lr1e+30_uniform_seed0: ')
  assert '(call lr1e+30_uniform_seed0-2: ' in diverged[0]
  assert diverged[1].startswith('lr1e+30_uniform_seed1: ')
  assert '(call lr1e+30_uniform_seed1-2: ' in diverged[1]
  assert diverged[2].startswith('lr1e+30_uniform_seed2: ') and '(call' not in diverged[2]
  assert sorted(os.listdir(runs_dir / 'logs')) == [
    'lr1e+30_uniform_seed0-2.log',
    'lr1e+30_uniform_seed1-2.log',
    'lr1e+30_uniform_seed2.log',
  ]


@pytest.mark.parametrize('folder', COMMITTED, ids=[os.path.basename(f) for f in COMMITTED])
def test_committed_report_regenerates_exactly(folder):
  archive = os.path.join(folder, raw_metrics.FILENAME)
  if not os.path.exists(archive):
    pytest.skip(f'{os.path.basename(folder)}: configured, its runs are not in yet')
  config = os.path.join(folder, experiment_config.CONFIG_FILENAME)
  # Borrowed rates come from the sibling's committed raw metrics, as bin.report reads them.
  spec = experiment_config.load_committed(config)
  runs = raw_metrics.read(archive)
  if not os.path.exists(os.path.join(folder, 'results.md')):
    # Runs are committed as they finish, so that a new machine resumes the experiment; its
    # report comes once it is complete.
    missing = evidence_spec.missing_runs(spec, runs)
    assert missing, f'{os.path.basename(folder)} is complete but has no results.md: bin.report'
    pytest.skip(f'{os.path.basename(folder)}: in progress, at least {len(missing)} runs to go')
  # results.md and the plots, byte for byte (as `bin.report --check`).
  outputs = evidence_report.report_files(
    spec, runs, folder, command=evidence_report.regenerate_command(config)
  )
  assert files.differing(outputs) == [], 'regenerate with bin.report --experiment'
