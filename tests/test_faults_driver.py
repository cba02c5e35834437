"""Bad input to the experiment driver, the report and the benchmark grid: one clear line,
exit status 1, before any run starts, and nothing outside the run directory touched.

The cases mirror `tests/test_faults_inputs.py` for the training binaries: paths that cannot
be what their flag needs are refused while parsing; damaged raw-metrics archives, bad
configurations and a binary that refuses its input end ``main`` with ``Error: …``;
``bin.report --check`` names the files that are not what the runs give.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil

from absl import flags
from absl.testing import flagsaver
import fault_harness as fh
import pytest

from bin import binary_flags
from bin import experiment_config
from bin import experiment_jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = os.path.join(REPO, 'docs', 'experiments', 'mmfl_femnist_noniid')

CONFIG = """\
--binary=demo
--methods=uniform,full
--baseline=uniform
--learning_rates=0.3,0.05
--tuning_seed=7
--seeds=2
--final_k=2
--targets=0.2
--claims=full>uniform:final
--task=digits
--num_clients=20
--clients_per_round=5
--rounds=2
"""


@pytest.fixture
def sandbox(tmp_path):
  """``tmp_path/sandbox``: a configuration in ``docs/experiments/check``, a user's file
  ``notes.txt`` and a bystander folder ``victim``."""
  root = tmp_path / 'sandbox'
  folder = root / 'docs' / 'experiments' / 'check'
  folder.mkdir(parents=True)
  (folder / 'experiment.flags').write_text(CONFIG)
  (root / 'notes.txt').write_text('a user file\n')
  (root / 'victim').mkdir()
  (root / 'victim' / 'keep.txt').write_text('not yours\n')
  return root


def _config(sandbox):
  return sandbox / 'docs' / 'experiments' / 'check' / 'experiment.flags'


# --------------------------------------------------------------------------
# Paths: refused while parsing, naming the flag, the path and what it must be.

PATH_CASES = [
  ('experiment', 'runs_dir', 'notes.txt', r'is a file, not a directory; give a directory path'),
  (
    'experiment',
    'runs_dir',
    'notes.txt/runs',
    r'cannot be made: \S+notes.txt is a file, not a directory',
  ),
  (
    'experiment',
    'config',
    'docs/experiments/check',
    r'is a directory, not a file; give a file in it \(the experiment.flags file',
  ),
  ('experiment', 'config', 'missing.flags', r'does not exist; give an existing file'),
  ('experiment', 'raw_metrics', 'victim', r'is a directory, not a file; give a file name'),
  ('experiment', 'raw_metrics', 'notes.txt/runs.jsonl.gz', r'cannot be made: \S+notes.txt'),
  ('experiment', 'cache_dir', 'notes.txt', r'is a file, not a directory; give a directory'),
  ('report', 'experiment', 'victim', r'is a directory, not a file'),
  ('report', 'output_dir', 'notes.txt', r'is a file, not a directory'),
  ('report', 'summary', 'notes.txt/summary.md', r'cannot be made: \S+notes.txt'),
  ('benchmark_grid', 'runs_dir', 'notes.txt', r'is a file, not a directory'),
  ('benchmark_grid', 'cache_dir', 'no_such_cache', r'does not exist; give an existing directory'),
]


@pytest.mark.parametrize(
  'binary,flag,path,message', PATH_CASES, ids=[f'{b}--{f}={p}' for b, f, p, _ in PATH_CASES]
)
def test_a_path_that_cannot_be_what_its_flag_needs_is_refused_while_parsing(
  sandbox, binary, flag, path, message
):
  before, pids = fh.TreeSnapshot(sandbox), fh.child_pids()
  value = str(sandbox / path)
  with fh.flags_of(binary):
    with pytest.raises(flags.IllegalFlagValueError) as raised:
      with flagsaver.as_parsed(**{flag: value}):
        pass
  text = str(raised.value).strip()
  assert '\n' not in text and f'--{flag}={value} ' in text, text
  assert re.search(message, text), (message, text)
  assert before.changes() == [] and fh.child_pids() <= pids


# --------------------------------------------------------------------------
# Damaged raw-metrics archives: one line naming the file and what to do.


def _damage(path, kind):
  good = path.read_bytes() if path.exists() else gzip.compress(b'{}\n')
  if kind == 'corrupt data':  # A valid gzip header, then bytes flipped in the deflate stream.
    data = bytearray(good)
    for i in range(20, min(len(data) - 8, 60)):
      data[i] ^= 0xFF
    path.write_bytes(bytes(data))
  elif kind == 'truncated':
    path.write_bytes(good[: len(good) // 2])
  else:  # A foreign file under the archive's name.
    path.write_text('name,accuracy\nx,0.5\n')


@pytest.mark.parametrize('kind', ['corrupt data', 'truncated', 'foreign'])
@pytest.mark.parametrize('binary', ['experiment', 'report'])
def test_a_damaged_raw_metrics_archive_is_one_line_saying_what_to_do(
  sandbox, tmp_path, kind, binary
):
  folder = tmp_path / 'committed'
  shutil.copytree(COMMITTED, folder)
  archive = folder / 'runs.jsonl.gz'
  _damage(archive, kind)
  before, pids = fh.TreeSnapshot(tmp_path), fh.child_pids()
  if binary == 'experiment':
    outcome = fh.run_binary(
      'experiment', config=folder / 'experiment.flags', runs_dir=sandbox / 'runs'
    )
  else:
    outcome = fh.run_binary('report', experiment=folder / 'experiment.flags')
  fh.assert_one_line_error(
    outcome,
    re.escape(f"Error: Raw metrics file '{archive}' is damaged or not a raw metrics file ("),
  )
  assert f'git checkout -- {archive}' in outcome.message and '--stage=export' in outcome.message
  assert before.changes() == [] and fh.child_pids() <= pids


# --------------------------------------------------------------------------
# Configurations: the whole file is checked before any run starts.

# What the training binary refuses, found by parsing its flags with its own definitions
# (`bin.binary_flags`, a process that imports TensorFlow): the driver's two forms of the
# message, end to end below; each refusal's reason (the start of its line), in one call of the
# check (`test_the_binary_s_own_definitions_refuse_each_bad_flag`).
BINARY_FLAG_CASES = [
  (
    'flag of another task',
    ('--num_clients=20', '--num_clients=20\n--synthetic_alpha=0.5'),
    '--synthetic_alpha does not apply to --task=digits',
  ),
  (
    'impossible value',
    ('--rounds=2', '--rounds=0'),
    'flag --rounds=0: 0 is not a positive integer',
  ),
  (
    'unknown availability mode',
    ('--rounds=2', '--rounds=2\n--availability=XX'),
    "Unknown --availability mode 'XX'",
  ),
  ('unknown flag', ('--rounds=2', '--rounds=2\n--roundz=3'), "Unknown command line flag 'roundz'"),
]

CONFIG_CASES = [
  (
    'unknown method',
    ('--methods=uniform,full', '--methods=uniform,full,best'),
    r"bin.demo refuses method 'best' \(--methods=best\): flag --methods=\['best'\]: --methods "
    r"has unknown value 'best'; choose from",
  ),
  (
    'unknown flag',
    ('--rounds=2', '--rounds=2\n--roundz=3'),
    r"bin.demo refuses its flags: Unknown command line flag 'roundz'",
  ),
  # What the configuration itself gets wrong.
  (
    'claim naming no method',
    ('--claims=full>uniform:final', '--claims=fill>uniform:final'),
    r"Claim 'fill>uniform:final' names 'fill', not one of",
  ),
  (
    'rate that is no number',
    ('--learning_rates=0.3,0.05', '--learning_rates=0.3,fast'),
    r'--learning_rates=0.3,fast: give comma-separated numbers',
  ),
  (
    'negative rate',
    ('--learning_rates=0.3,0.05', '--learning_rates=0.3,-1'),
    r'Learning rates must be finite and > 0',
  ),
  (
    'tuning on a reported seed',
    ('--tuning_seed=7', '--tuning_seed=1'),
    r'The tuning seed 1 is a reported seed',
  ),
  (
    'target that is no accuracy',
    ('--targets=0.2', '--targets=20'),
    r'Targets are accuracies in \(0, 1\], got 20',
  ),
  (
    'flag the driver sets',
    ('--rounds=2', '--rounds=2\n--seed=3'),
    r'--seed is set per run by bin.experiment; leave it out',
  ),
]


@pytest.mark.parametrize(
  'edit,message', [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_a_bad_configuration_is_refused_before_any_run(sandbox, edit, message):
  config = _config(sandbox)
  config.write_text(CONFIG.replace(*edit))
  before, pids = fh.TreeSnapshot(sandbox), fh.child_pids()
  outcome = fh.run_binary('experiment', config=config, runs_dir=sandbox / 'runs')
  fh.assert_one_line_error(outcome, message)
  assert str(config) in outcome.message  # The file it comes from.
  assert not (sandbox / 'runs').exists()
  assert before.changes() == [] and fh.child_pids() <= pids


def test_the_binary_s_own_definitions_refuse_each_bad_flag(sandbox):
  # The lines the driver puts after "bin.demo refuses its flags: " (the end-to-end cases
  # above), for every configuration at once; the good one passes.
  specs = []
  for name, edit, _ in [('good', ('', ''), None), *BINARY_FLAG_CASES]:
    folder = sandbox / 'docs' / 'experiments' / name.replace(' ', '_')
    folder.mkdir()
    (folder / 'experiment.flags').write_text(CONFIG.replace(*edit))
    specs.append(experiment_config.load(str(folder / 'experiment.flags')))
  found = binary_flags.problems(
    'demo', [[*spec.binary_flags, '--methods=uniform'] for spec in specs]
  )
  assert found[0] is None and len(found) == len(specs)
  for (name, _, message), problem in zip(BINARY_FLAG_CASES, found[1:]):
    assert problem is not None and problem.startswith(message), (name, problem)


def test_a_good_configuration_passes_the_check_and_lists_its_runs(sandbox, capsys):
  outcome = fh.run_binary(
    'experiment', config=_config(sandbox), runs_dir=sandbox / 'runs', dry_run='true'
  )
  assert outcome.exit_code == 0, outcome
  assert capsys.readouterr().out.count('--client_learning_rate=') == 4  # 2 methods x 2 rates.
  assert not (sandbox / 'runs').exists()


# --------------------------------------------------------------------------
# A failed call: the driver says why, and does not train again what would fail again.


@pytest.mark.parametrize(
  'output,reason,refused',
  [
    (
      'I1127 training\nError: --clients_per_round=50 exceeds the 20 clients.\n',
      'Error: --clients_per_round=50 exceeds the 20 clients.',
      True,
    ),
    (
      'FATAL Flags parsing error: flag --rounds=0: 0 is not a positive integer\n'
      'Pass --helpshort or --helpfull to see help on flags.\n',
      'FATAL Flags parsing error: flag --rounds=0: 0 is not a positive integer',
      True,
    ),
    (
      'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: worker died\n\n',
      'RuntimeError: worker died',
      False,
    ),
    (  # A crash after rounds trained (a TFF worker died): resumed, not refused.
      'round  99/300 |   1.09s  ETA 0:03:12\nI1202 progress.py:30] round 100/300 |   0.91s\n'
      'Error: Cannot invoke RPC on closed channel!\n',
      'Error: Cannot invoke RPC on closed channel!',
      False,
    ),
    (  # TFF's worker died before the first round (resumed or not): a crash, not bad input.
      "Devices: ['/device:CPU:0']; model parameters: 610; clients: 100.\n"
      'Error: Cannot invoke RPC on closed channel!\n',
      'Error: Cannot invoke RPC on closed channel!',
      False,
    ),
    ('', '', False),  # Killed before it printed anything.
  ],
)
def test_a_failed_calls_output_says_why_and_whether_it_was_refused(output, reason, refused):
  assert experiment_jobs.read_failure(output) == experiment_jobs.Failure(reason, refused)


# --------------------------------------------------------------------------
# bin.report --check: nothing written; the files that differ named.


@pytest.fixture
def committed(tmp_path):
  """A copy of a committed experiment, where `bin.report` regenerates it."""
  folder = tmp_path / 'docs' / 'experiments' / 'mmfl_femnist_noniid'
  shutil.copytree(COMMITTED, folder)
  return folder


def _check(folder):
  return fh.run_binary('report', experiment=folder / 'experiment.flags', check='true')


def test_report_check_passes_on_a_committed_report_and_writes_nothing(committed, capsys):
  before = fh.TreeSnapshot(committed.parent)
  outcome = _check(committed)
  assert outcome.exit_code == 0, outcome
  assert capsys.readouterr().out.startswith('3 files are what the runs give: ')
  assert before.changes() == []


@pytest.mark.parametrize('edit', ['results.md edited', 'plot edited', 'plot missing'])
def test_report_check_names_each_file_that_is_not_what_the_runs_give(committed, edit):
  results_md, plot = committed / 'results.md', committed / 'accuracy_bits.png'
  if edit == 'results.md edited':
    results_md.write_text(results_md.read_text().replace('optimal', 'best', 1))
    stale = results_md
  elif edit == 'plot edited':
    plot.write_bytes(plot.read_bytes()[:-1])
    stale = plot
  else:
    plot.unlink()
    stale = plot
  before = fh.TreeSnapshot(committed.parent)
  fh.assert_one_line_error(
    _check(committed),
    re.escape(
      f'Error: Not what the runs give: {stale}; rerun the same '
      'command without --check to regenerate.'
    ),
  )
  assert before.changes() == []
  # Without --check the report is regenerated, and then passes.
  assert fh.run_binary('report', experiment=committed / 'experiment.flags').exit_code == 0
  assert _check(committed).exit_code == 0
  with open(os.path.join(COMMITTED, 'results.md'), 'rb') as f:
    assert (committed / 'results.md').read_bytes() == f.read()


def test_report_check_of_run_directories(tmp_path):
  hparams = {'sampling': 'uniform', 'seed': 0}
  csv = 'key,eval/accuracy,uplink/cumulative_bits\n0,0.1,0\n1,0.5,100\n'
  run = fh.write_run(tmp_path / 'runs', 'digits_uniform_seed0', hparams, csv)
  out = tmp_path / 'out'
  flags_ = dict(run_dirs=run, output_dir=out, label_key='sampling')
  assert fh.run_binary('report', check='true', **flags_).exit_code == 1  # Nothing written yet.
  assert not out.exists()
  assert fh.run_binary('report', **flags_).exit_code == 0
  assert fh.run_binary('report', check='true', **flags_).exit_code == 0
  (out / 'results.md').write_text((out / 'results.md').read_text() + 'a note\n')
  fh.assert_one_line_error(
    fh.run_binary('report', check='true', **flags_),
    re.escape(f'Not what the runs give: {out / "results.md"};'),
  )
