"""Bad input to every binary: one clear line, exit status 1, nothing else touched.

Three kinds of case:

* flag values that cannot be right (a learning rate of ``inf``, an accuracy of
  7, ``--mlp_hidden=abc``) are rejected while the flags are parsed, with an
  `IllegalFlagValueError` naming the flag, the value and the allowed range;
* bad files (a damaged TFF SQLite cache, run directories that ``bin.plot``
  cannot read) stop the binary's ``main`` with ``sys.exit('Error: …')``: one
  line naming the path, what is wrong and how to fix it; no file outside the
  run directory is created, changed or removed, and no process is left;
* bad task options given to the library raise a ValueError naming the option.

Every binary runs in this process, none in a subprocess, each with a flag
registry of its own (`fault_harness.flags_of`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3

from absl import flags
from absl.testing import flagsaver
from fault_harness import TreeSnapshot
from fault_harness import assert_one_line_error
from fault_harness import child_pids
from fault_harness import flags_of as _flags_of
from fault_harness import run_main
import pytest

import tasks

# --------------------------------------------------------------------------
# Flag values rejected while parsing.

PARSE_CASES = [
  # Learning rates: finite and > 0, in every binary that has them.
  ('fedavg', 'client_learning_rate', 'inf', r'finite number > 0'),
  ('fedavg', 'client_learning_rate', 'nan', r'finite number > 0'),
  ('fedavg', 'client_learning_rate', '0', r'finite number > 0'),
  ('fedavg', 'server_learning_rate', '-0.5', r'finite number > 0'),
  ('optimal_sampling', 'client_learning_rate', '-inf', r'finite number > 0'),
  ('mmfl', 'client_learning_rate', 'inf', r'finite number > 0'),
  ('mmfl', 'server_learning_rate', '0', r'finite number > 0'),
  # Lists of integers.
  ('fedavg', 'mlp_hidden', 'abc', r"comma-separated integers >= 1.*got 'abc'"),
  ('fedavg', 'mlp_hidden', '64,0', r"comma-separated integers >= 1.*got '0'"),
  ('fedavg', 'size_group_examples', '100,x', r"comma-separated integers >= 1.*got 'x'"),
  # Probabilities, fractions, seeds and other ranges of the shared flags.
  ('fedavg', 'availability_beta', '1.5', r'in \[0, 1\]'),
  ('fedavg', 'eval_fraction', '1.5', r'in \(0, 1\)'),
  ('fedavg', 'unbalance_removal_probability', '2', r'in \[0, 1\]'),
  ('fedavg', 'synthetic_alpha', 'nan', r'finite number >= 0'),
  ('fedavg', 'size_sigma', '-1', r'finite number >= 0'),
  ('fedavg', 'client_learning_rate_decay', '1.5', r'in \(0, 1\] \(the factor a round'),
  ('fedavg', 'client_learning_rate_decay', 'nan', r'in \(0, 1\]'),
  ('fedavg', 'seed', '-1', r'\[0, 4294967295\]'),
  ('fedavg', 'data_seed', '-1', r'\[0, 4294967295\]'),
  ('fedavg', 'crop_size', '40', r'32'),
  ('fedavg', 'min_client_size', '1', r'2'),
  # Each binary's own flags.
  ('optimal_sampling', 'expected_clients', '0', r'finite number > 0'),
  ('demo', 'expected_clients', 'inf', r'finite number > 0'),
  ('clustered_sampling', 'fedgs_alpha', '-1', r'finite number >= 0'),
  ('fedgs', 'graph_epsilon', '-5', r'in \[0, 1\]'),
  ('fedgs', 'graph_sigma2', '0', r'finite number > 0'),
  ('fedgs', 'solver_time_limit', 'nan', r'finite number > 0'),
  ('fedgs', 'fedprox_mu', 'inf', r'finite number >= 0'),
  ('fedgs', 'alpha', 'nan', r'finite number >= 0'),
  ('lefl', 'target_accuracy', '7', r'in \(0, 1\] \(an accuracy as a fraction'),
  ('lefl', 'sample_rate', '1.5', r'in \(0, 1\]'),
  ('demo', 'target_accuracy', '7', r'in \(0, 1\] \(an accuracy as a fraction'),
  ('demo', 'target_accuracy', '0', r'in \(0, 1\] \(an accuracy as a fraction'),
  ('mmfl', 'expected_clients', 'nan', r'finite number > 0'),
  ('mmfl', 'expected_clients', '0', r'finite number > 0'),
  ('mmfl', 'clients', '0', r'>= 1|positive'),
  ('mmfl', 'num_models', '0', r'>= 1|positive'),
  ('mmfl', 'seed', '-1', r'\[0, 4294967295\]'),
  ('plot', 'metric', 'top5', r"accuracy, loss or a metrics.csv column.*got 'top5'"),
  # Methods: every entry of a binary's method list.
  ('mmfl', 'sampling', 'optimal,best', r"--sampling has unknown value 'best'; choose from"),
  ('demo', 'methods', 'uniform,best', r"--methods has unknown value 'best'; choose from"),
]


@pytest.mark.parametrize(
  'binary,flag,value,allowed', PARSE_CASES, ids=[f'{b}--{f}={v}' for b, f, v, _ in PARSE_CASES]
)
def test_impossible_flag_value_is_rejected_while_parsing(binary, flag, value, allowed, tmp_path):
  sandbox = _sandbox(tmp_path)
  before, pids = TreeSnapshot(sandbox), child_pids()
  with _flags_of(binary):
    with pytest.raises(flags.IllegalFlagValueError) as raised:
      with flagsaver.as_parsed(**{flag: value}):
        pass
  message = str(raised.value)
  assert '\n' not in message.strip(), message
  assert f'--{flag}=' in message, message  # absl's prefix: flag --NAME=VALUE: …
  if flag not in ('mlp_hidden', 'size_group_examples', 'sampling', 'methods'):  # A list: ['…'].
    assert f'--{flag}={value}' in message, message
  assert re.search(allowed, message), (allowed, message)
  assert before.changes() == []
  assert child_pids() <= pids


def test_good_values_still_parse():
  """The validators accept ordinary values, and the defaults."""
  for binary, values, expected in [
    (
      'fedavg',
      dict(
        client_learning_rate='0.05',
        mlp_hidden='64,32',
        availability_beta='0',
        eval_fraction='0.2',
        seed='3',
      ),
      dict(client_learning_rate=0.05, mlp_hidden=['64', '32'], availability_beta=0.0),
    ),
    (
      'fedgs',
      dict(graph_epsilon='0', graph_sigma2='0.5', solver_time_limit='2'),
      dict(graph_epsilon=0.0),
    ),
    ('lefl', dict(target_accuracy='1', sample_rate='0.1'), dict(target_accuracy=1.0)),
    ('demo', dict(target_accuracy='0.7', expected_clients='3'), dict(target_accuracy=0.7)),
    ('mmfl', dict(client_learning_rate='0.1', expected_clients='12', clients='5'), dict(clients=5)),
    ('plot', {}, {}),
  ]:
    with _flags_of(binary):
      with flagsaver.as_parsed(**values):
        flags.FLAGS.validate_all_flags()  # The defaults too.
        for name, value in expected.items():
          assert flags.FLAGS[name].value == value, (binary, name)


# --------------------------------------------------------------------------
# Damaged TFF SQLite caches: every binary that builds a task.


def _sandbox(tmp_path):
  """``tmp_path/sandbox`` with the output root and a bystander ``victim`` folder."""
  sandbox = tmp_path / 'sandbox'
  (sandbox / 'victim').mkdir(parents=True, exist_ok=True)
  (sandbox / 'victim' / 'keep.txt').write_text('not yours\n')
  (sandbox / 'out').mkdir(exist_ok=True)
  return sandbox


def _write_cache(path, kind):
  path.parent.mkdir(parents=True, exist_ok=True)
  if kind == 'empty':
    path.write_bytes(b'')
  elif kind == 'random':
    path.write_bytes(os.urandom(3000))
  else:
    with contextlib.closing(sqlite3.connect(path)) as connection:
      if kind == 'other_table':
        connection.execute('CREATE TABLE other (x INTEGER);')
      elif kind == 'no_client_metadata':
        connection.execute(
          'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT '
          'NOT NULL, serialized_example_proto BLOB NOT NULL);'
        )
      connection.commit()


_WHAT = {
  'empty': 'is empty',
  'random': 'not an SQLite database',
  'other_table': "no table 'examples'",
  'no_client_metadata': "no table 'client_metadata'",
}

CACHE_CASES = [
  ('fedavg', dict(task='emnist'), 'emnist_all.sqlite', 'empty'),
  ('optimal_sampling', dict(task='emnist'), 'emnist_all.sqlite', 'random'),
  ('clustered_sampling', dict(task='shakespeare'), 'shakespeare.sqlite', 'other_table'),
  ('fedgs', dict(task='cifar100'), 'cifar100.sqlite', 'no_client_metadata'),
  ('lefl', dict(task='emnist_unbalanced_1'), 'emnist_all.sqlite', 'random'),
  ('demo', dict(task='shakespeare'), 'shakespeare.sqlite', 'random'),
  ('mmfl', dict(suite='leaf'), 'emnist_all.sqlite', 'empty'),
]


@pytest.mark.parametrize(
  'binary,task_flags,file_name,kind',
  CACHE_CASES,
  ids=[f'{c[0]}-{c[2]}-{c[3]}' for c in CACHE_CASES],
)
def test_damaged_sqlite_cache_is_one_line(binary, task_flags, file_name, kind, tmp_path):
  sandbox = _sandbox(tmp_path)
  cache = sandbox / 'cache' / file_name
  _write_cache(cache, kind)
  before, pids = TreeSnapshot(sandbox), child_pids()
  with _flags_of(binary) as module:
    outcome = run_main(
      module.main,
      rounds=1,
      root_output_dir=sandbox / 'out',
      cache_dir=sandbox / 'cache',
      **task_flags,
    )
  assert_one_line_error(outcome, rf'{_re(str(cache))}.*{_WHAT[kind]}.*load_data')
  assert before.changes(allowed=[sandbox / 'out']) == []
  assert child_pids() <= pids


def _re(text: str) -> str:
  return re.escape(text)


DEVICE_CASES = [
  (
    'optimal_sampling',
    dict(devices='lognormal'),
    r'--devices=lognormal: .*--sampling=uniform\+optimal ',
  ),
  ('optimal_sampling', dict(dropout=0.1), r'--dropout=0.1: this binary cannot simulate devices'),
  (
    'demo',
    dict(devices='lognormal', deadline_seconds=3.0),
    r'--devices=lognormal, --deadline_seconds=3.0: ',
  ),
]


@pytest.mark.parametrize('binary,device_flags,message', DEVICE_CASES)
def test_device_flags_are_refused_where_uploads_cannot_be_timed(
  binary, device_flags, message, tmp_path
):
  # bin.optimal_sampling used to ignore them, bin.demo to fail at its first run's start.
  sandbox = _sandbox(tmp_path)
  before, pids = TreeSnapshot(sandbox), child_pids()
  with _flags_of(binary) as module:
    outcome = run_main(module.main, rounds=1, root_output_dir=sandbox / 'out', **device_flags)
  assert_one_line_error(outcome, message)
  assert 'python -m bin.benchmark' in outcome.message
  assert before.changes() == []
  assert child_pids() <= pids


# --------------------------------------------------------------------------
# bin.plot: every run directory it cannot read.

_CSV = 'key,eval/accuracy,uplink/cumulative_bits\n0,0.1,0\n1,,100\n2,0.5,200\n'


def _run_dir(root, name, *, hparams=None, metrics=_CSV):
  """A run directory; `hparams`/`metrics` None leaves that file out, bytes are written raw."""
  path = root / name
  path.mkdir(parents=True)
  for file_name, content in (('hparams.json', hparams), ('metrics.csv', metrics)):
    if content is None:
      continue
    if isinstance(content, dict):
      content = json.dumps(content)
    (path / file_name).write_bytes(content if isinstance(content, bytes) else content.encode())
  return path


_GOOD_HPARAMS = dict(task='digits', sampling='uniform', seed=0)

PLOT_CASES = {
  # name: (run directories to make {name: kwargs}, --run_dirs entries, extra flags, pattern)
  'missing_dir': ({}, ['absent'], {}, r"Run directory '.*absent' does not exist"),
  'no_metrics_csv': (
    {'r': dict(hparams=_GOOD_HPARAMS, metrics=None)},
    ['r'],
    {},
    r"'.*r/metrics\.csv' does not exist",
  ),
  'no_hparams_json': ({'r': dict(hparams=None)}, ['r'], {}, r"'.*r/hparams\.json' does not exist"),
  'empty_metrics_csv': (
    {'r': dict(hparams=_GOOD_HPARAMS, metrics='')},
    ['r'],
    {},
    r"'.*r/metrics\.csv' has no 'key' column: it is empty",
  ),
  'header_only': (
    {'r': dict(hparams=_GOOD_HPARAMS, metrics='key,eval/accuracy,uplink/cumulative_bits\n')},
    ['r'],
    {},
    r"'.*r/metrics\.csv' has a header but no rounds",
  ),
  'garbage_metrics_csv': (
    {'r': dict(hparams=_GOOD_HPARAMS, metrics=b'\xff\xfe\x00garbage')},
    ['r'],
    {},
    r"'.*r/metrics\.csv' is not",
  ),
  'mismatched_columns': (
    {
      'a': dict(hparams=_GOOD_HPARAMS),
      'b': dict(
        hparams=dict(_GOOD_HPARAMS, seed=1),
        metrics='key,eval/loss,uplink/cumulative_bits\n0,2.3,0\n1,2.0,100\n',
      ),
    },
    ['a', 'b'],
    {},
    r"/b/metrics\.csv has no column 'eval/accuracy'.*--metric",
  ),
  'garbage_hparams_bytes': (
    {'r': dict(hparams=os.urandom(64) + b'\xff')},
    ['r'],
    {},
    r"'.*r/hparams\.json' is not .*JSON",
  ),
  'garbage_hparams_text': (
    {'r': dict(hparams='{"task": ')},
    ['r'],
    {},
    r"'.*r/hparams\.json' is not .*JSON",
  ),
  'hparams_not_object': (
    {'r': dict(hparams='[1, 2]')},
    ['r'],
    {},
    r"'.*r/hparams\.json' .*JSON object.*list",
  ),
  'missing_metric_column': (
    {'r': dict(hparams=_GOOD_HPARAMS)},
    ['r'],
    dict(metric='train/loss'),
    r"/r/metrics\.csv has no column 'train/loss'.*--metric",
  ),
  'glob_matches_nothing': ({}, ['nothing_*'], {}, r"pattern '.*nothing_\*' matches no"),
  'output_is_a_directory': (
    {'r': dict(hparams=_GOOD_HPARAMS)},
    ['r'],
    dict(output='{out}'),
    r"Cannot write --output='.*out'",
  ),
}


@pytest.mark.parametrize('case', list(PLOT_CASES))
def test_plot_bad_run_directories_are_one_line(case, tmp_path):
  make, entries, extra, pattern = PLOT_CASES[case]
  sandbox = _sandbox(tmp_path)
  runs = sandbox / 'runs'
  runs.mkdir()
  for name, kwargs in make.items():
    _run_dir(runs, name, **kwargs)
  flag_values = dict(
    run_dirs=','.join(str(runs / e) for e in entries), output=str(sandbox / 'out' / 'plot.png')
  )
  flag_values.update({k: v.format(out=sandbox / 'out') for k, v in extra.items()})
  before, pids = TreeSnapshot(sandbox), child_pids()
  with _flags_of('plot') as module:
    outcome = run_main(module.main, **flag_values)
  assert_one_line_error(outcome, pattern)
  assert before.changes(allowed=[]) == []  # Not even the output is written.
  assert child_pids() <= pids


def test_plot_still_plots_good_runs(tmp_path):
  sandbox = _sandbox(tmp_path)
  runs = sandbox / 'runs'
  for seed in range(2):
    _run_dir(runs, f'r{seed}', hparams=dict(_GOOD_HPARAMS, seed=seed))
  with _flags_of('plot') as module:
    outcome = run_main(module.main, run_dirs=f'{runs}/r*', output=sandbox / 'out' / 'p.png')
  assert outcome.exit_code == 0, outcome
  assert (sandbox / 'out' / 'p.png').read_bytes()[:4] == b'\x89PNG'


# --------------------------------------------------------------------------
# Task options given to the library.

TASK_OPTION_CASES = [
  ('digits', dict(mlp_hidden=('abc',)), r"mlp_hidden .*'abc'"),
  ('digits', dict(mlp_hidden='64'), r"mlp_hidden must be a non-empty list of integers.*'64'"),
  ('digits', dict(mlp_hidden=64), r'mlp_hidden must be a non-empty list of integers.*64'),
  ('digits', dict(mlp_hidden=()), r'mlp_hidden must be a non-empty list of integers'),
  ('emnist', dict(cache_dir=123), r'cache_dir must be a directory path or None, got 123'),
  (
    'cifar10',
    dict(size_group_examples=(10, 'x'), size_group_clients=(1, 1)),
    r"size_group_examples .*'x'",
  ),
]


@pytest.mark.parametrize(
  'task,options,message',
  TASK_OPTION_CASES,
  ids=[f'{t}-{sorted(o)[0]}={o[sorted(o)[0]]!r}' for t, o, _ in TASK_OPTION_CASES],
)
def test_bad_task_option_is_a_value_error_naming_it(task, options, message):
  with pytest.raises(ValueError, match=message):
    tasks.get_task(task, **options)


@pytest.mark.parametrize('kind', list(_WHAT))
def test_damaged_cache_is_a_value_error_from_the_library(kind, tmp_path):
  """`get_task` names the path, what is wrong and how to get a good file."""
  _write_cache(tmp_path / 'cifar100.sqlite', kind)
  with pytest.raises(ValueError, match=rf'{_WHAT[kind]}.*load_data') as raised:
    tasks.get_task('cifar100', cache_dir=str(tmp_path))
  assert '\n' not in str(raised.value)
  assert str(tmp_path / 'cifar100.sqlite') in str(raised.value)
