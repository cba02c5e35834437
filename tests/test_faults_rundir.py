"""Faults around the run directory: names, ownership, locking, damaged state, divergence.

Each binary case asserts the exit code, the one-line message, that nothing
outside the run directory changed and that no process was left behind
(`tests/fault_harness.py`).
"""

import glob
import json
import os

from absl import flags
from absl.testing import flagsaver
import fault_harness as fh
import numpy as np
import pytest
import tensorflow_federated as tff

from bin import fedavg
from tasks import multi_model as suites
from tff_sampling import program
from tff_sampling import samplers
from tff_sampling.learning import multi_model
from tff_sampling.program import multi_model as multi_model_program
from tff_sampling.runtime import run_dir

_COHORT = 5


@pytest.fixture
def sandbox(tmp_path):
  """A root output dir beside a user's folder that no run may touch."""
  root = tmp_path / 'root'
  victim = tmp_path / 'victim_md_seed0'
  victim.mkdir()
  (victim / 'thesis.tex').write_text('precious')
  root.mkdir()
  return tmp_path, root


@pytest.fixture(scope='module')
def process(small_digits_task):
  return tff.learning.algorithms.build_weighted_fed_avg(
    small_digits_task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )


def _config(output_dir, rounds, **kwargs):
  return program.RunConfig(
    output_dir=str(output_dir),
    rounds=rounds,
    seed=0,
    hparams={'seed': 0, 'task': 'digits'},
    **kwargs,
  )


_rows = fh.metrics_rows


def _run(task, process, output_dir, rounds, **kwargs):
  return program.train_model(
    task, process, samplers.UniformSampler(_COHORT, seed=0), _config(output_dir, rounds, **kwargs)
  )


# --- Names that would leave the output root -------------------------------------


@pytest.mark.parametrize('binary', ['fedavg', 'mmfl'])
@pytest.mark.parametrize(
  'name',
  ['../../victim', '/tmp/abs', 'a/b', '..', 'bad\nname', ''],
  ids=['dotdot', 'absolute', 'separator', 'parent', 'control', 'empty'],
)
def test_run_names_that_are_paths_are_rejected_at_parse_time(binary, name):
  # --experiment_name is one shared flag of every experiment binary (bin.common_flags).
  with fh.flags_of(binary):
    with pytest.raises(flags.IllegalFlagValueError, match='experiment_name'):
      with flagsaver.as_parsed(experiment_name=name):
        pass


def test_the_reported_deletion_outside_the_root_cannot_happen(sandbox):
  # The reported case: a comparison binary with --experiment_name=../victim
  # deleted <root>/../victim_md_seed0. The composed run name is checked too.
  tmp_path, root = sandbox
  before = fh.TreeSnapshot(tmp_path)
  with pytest.raises(ValueError, match=r"'\.\./victim_md_seed0' is a path, not a name"):
    run_dir.run_path(str(root), '../victim_md_seed0')
  with pytest.raises(ValueError, match='Refusing to delete'):
    run_dir.remove_run(str(tmp_path / 'victim_md_seed0'))
  assert before.changes() == []


# --- Resuming a run written before a flag was recorded ---------------------------------


def _stored_run(tmp_path, **hparams):
  path = tmp_path / 'old'
  path.mkdir()
  (path / 'hparams.json').write_text(json.dumps({'task': 'digits', 'seed': 0, **hparams}))
  return str(path)


def test_an_unrecorded_flag_resumes_at_its_default_only(tmp_path):
  path = _stored_run(tmp_path)
  current = {'task': 'digits', 'seed': 0, 'sketch_size': 1024}
  run_dir.check_resume_compatible(path, run_dir.HParams(current, defaults={'sketch_size': 1024}))
  run_dir.check_resume_compatible(path, current, defaults={'sketch_size': 1024})
  with pytest.raises(
    ValueError,
    match=(
      r'different configuration \(sketch_size: saved None \(written before sketch_size was '
      r'recorded: resumable at its default 1024\) vs now 64\)\. Use a new --experiment_name, '
      r'or start over with --reset'
    ),
  ):
    run_dir.check_resume_compatible(
      path, run_dir.HParams({**current, 'sketch_size': 64}, defaults={'sketch_size': 1024})
    )


def test_only_flags_have_defaults_and_a_recorded_value_must_match(tmp_path):
  path = _stored_run(tmp_path, sketch_size=64)
  # A recorded value is compared as it is, even against the default.
  with pytest.raises(ValueError, match=r'sketch_size: saved 64 vs now 1024'):
    run_dir.check_resume_compatible(
      path,
      run_dir.HParams(
        {'task': 'digits', 'seed': 0, 'sketch_size': 1024}, defaults={'sketch_size': 1024}
      ),
    )
  # A key without a default (not a flag, or a derived value) must be recorded.
  with pytest.raises(ValueError, match=r'task.num_clients: saved None vs now 100'):
    run_dir.check_resume_compatible(
      path,
      run_dir.HParams({'task': 'digits', 'seed': 0, 'sketch_size': 64, 'task.num_clients': 100}),
    )


def test_a_run_from_before_the_automatic_hparams_resumes_at_the_defaults(sandbox):
  tmp_path, root = sandbox
  common = dict(root_output_dir=root, experiment_name='run', clients_per_round=_COHORT)
  assert fh.run_main(fedavg.main, rounds=1, **common).exit_code == 0
  path = root / 'run' / 'hparams.json'
  recorded = json.loads(path.read_text())
  earlier = (
    'task',
    'rounds',
    'clients_per_round',
    'client_learning_rate',
    'client_steps',
    'server_learning_rate',
    'eval_every',
    'checkpoint_every',
    'seed',
    'root_output_dir',
    'availability',
    'availability_beta',
    'availability_period',
    'algorithm',
    'sampling',
    'experiment_name',
  )
  path.write_text(
    json.dumps({k: v for k, v in recorded.items() if k in earlier or k.startswith('task.')})
  )
  assert 'num_clients' in recorded and 'num_clients' not in json.loads(path.read_text())
  outcome = fh.run_main(fedavg.main, rounds=2, num_clients=50, **common)
  fh.assert_one_line_error(
    outcome,
    r'num_clients: saved None \(written before num_clients was '
    r'recorded: resumable at its default None\) vs now 50',
  )
  assert fh.run_main(fedavg.main, rounds=2, **common).exit_code == 0
  assert [r['key'] for r in _rows(root / 'run')] == ['0', '1', '2']
  assert json.loads(path.read_text()) == {**recorded, 'rounds': 2}  # Rewritten in full.


# --- Ownership: a user's folder is never written into or deleted ------------------


def test_a_users_folder_is_not_written_into_nor_reset(sandbox):
  tmp_path, root = sandbox
  users = root / 'notes'
  users.mkdir()
  (users / 'todo.txt').write_text('mine')
  before, children = fh.TreeSnapshot(tmp_path), fh.child_pids()
  for reset in ('false', 'true'):
    outcome = fh.run_main(
      fedavg.main, root_output_dir=root, experiment_name='notes', rounds=1, reset=reset
    )
    fh.assert_one_line_error(
      outcome,
      "notes'( exists and is not a tff_sampling run|: it is not "
      'a run directory created by tff_sampling)',
    )
  assert before.changes() == [] and fh.child_pids() <= children


def test_remove_run_only_removes_marked_real_directories(tmp_path):
  marked = tmp_path / 'marked'
  with run_dir.RunDirectory(str(marked)):
    pass
  (marked / 'metrics.csv').write_text('key\n0\n')
  assert run_dir.remove_run(str(marked)) and not marked.exists()
  assert not run_dir.remove_run(str(tmp_path / 'absent'))
  unmarked = tmp_path / 'unmarked'
  unmarked.mkdir()
  with pytest.raises(ValueError, match='no .tff_sampling_run marker'):
    run_dir.remove_run(str(unmarked))
  target = tmp_path / 'target'
  with run_dir.RunDirectory(str(target)):
    pass
  os.symlink(target, tmp_path / 'link')
  with pytest.raises(ValueError, match='Refusing to delete'):
    run_dir.remove_run(str(tmp_path / 'link'))
  assert (target / run_dir.MARKER_FILENAME).exists()


def test_an_earlier_run_without_marker_is_adopted_and_resumed(small_digits_task, process, tmp_path):
  _run(small_digits_task, process, tmp_path / 'run', 1)
  os.remove(tmp_path / 'run' / run_dir.MARKER_FILENAME)  # As written before markers.
  result = _run(small_digits_task, process, tmp_path / 'run', 2)
  assert result.resumed_from == 1
  assert run_dir.is_run_directory(str(tmp_path / 'run'))


# --- One process per run directory ---------------------------------------------------


def test_a_second_process_on_a_run_directory_is_refused_with_the_holders_pid(sandbox):
  tmp_path, root = sandbox
  with run_dir.RunDirectory(str(root / 'busy')):
    before, children = fh.TreeSnapshot(tmp_path), fh.child_pids()
    outcome = fh.run_main(fedavg.main, root_output_dir=root, experiment_name='busy', rounds=1)
    fh.assert_one_line_error(
      outcome,
      f"'{root / 'busy'}' is in use by another run "
      rf'\(pid {os.getpid()}\)',
    )
    assert before.changes() == [] and fh.child_pids() <= children
  # Released at the end of the holder's run: the same command now runs.
  assert (
    fh.run_main(fedavg.main, root_output_dir=root, experiment_name='busy', rounds=1).exit_code == 0
  )


# --- Damaged checkpoints and metrics --------------------------------------------------


def _damage(checkpoint_dir: str, how: str) -> None:
  if how == 'truncated_variables':
    for path in glob.glob(os.path.join(checkpoint_dir, 'variables', 'variables.data*')):
      with open(path, 'r+b') as f:
        f.truncate(max(os.path.getsize(path) // 3, 1))
  else:
    os.remove(os.path.join(checkpoint_dir, 'saved_model.pb'))


@pytest.mark.parametrize('how', ['truncated_variables', 'missing_saved_model_pb'])
def test_a_damaged_latest_checkpoint_falls_back_and_reproduces_the_run(
  small_digits_task, process, tmp_path, how, caplog
):
  full = _run(small_digits_task, process, tmp_path / 'full', 4)
  _run(small_digits_task, process, tmp_path / 'run', 3)
  _damage(str(tmp_path / 'run' / 'checkpoints' / 'program_state_3'), how)
  with caplog.at_level('WARNING', logger='absl'):
    resumed = _run(small_digits_task, process, tmp_path / 'run', 4)
  assert resumed.resumed_from == 2
  notices = [r.getMessage() for r in caplog.records if 'newest usable checkpoint' in r.getMessage()]
  assert len(notices) == 1 and 'round 3 (damaged' in notices[0] and '\n' not in notices[0]
  assert _rows(tmp_path / 'run') == _rows(tmp_path / 'full')  # Every cell, bit for bit.
  for a, b in zip(full.model_weights.trainable, resumed.model_weights.trainable):
    np.testing.assert_array_equal(a, b)


def test_metrics_rows_missing_after_the_checkpoint_resume_from_an_earlier_one(
  small_digits_task, process, tmp_path
):
  _run(small_digits_task, process, tmp_path / 'full', 4)
  _run(small_digits_task, process, tmp_path / 'run', 3)
  path = tmp_path / 'run' / 'metrics.csv'
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(''.join(lines[:3]))  # Header + rounds 0 and 1: rounds 2, 3 lost.
  resumed = _run(small_digits_task, process, tmp_path / 'run', 4)
  assert resumed.resumed_from == 1  # The first checkpoint is always kept.
  assert _rows(tmp_path / 'run') == _rows(tmp_path / 'full')


def test_deleted_metrics_stop_the_resume_with_a_clear_error(sandbox):
  tmp_path, root = sandbox
  assert (
    fh.run_main(fedavg.main, root_output_dir=root, experiment_name='run', rounds=2).exit_code == 0
  )
  os.remove(root / 'run' / 'metrics.csv')
  before, children = fh.TreeSnapshot(tmp_path), fh.child_pids()
  outcome = fh.run_main(fedavg.main, root_output_dir=root, experiment_name='run', rounds=3)
  fh.assert_one_line_error(
    outcome,
    r'Cannot resume .*no usable checkpoint \(round 2 '
    r'\(metrics.csv is missing\).*--reset',
  )
  # Nothing was changed but the lock's pid: the checkpoints are all still there.
  assert before.changes(allowed=[root / 'run' / run_dir.MARKER_FILENAME]) == []
  assert fh.child_pids() <= children


def test_garbage_hparams_json_on_resume_names_the_file(sandbox):
  tmp_path, root = sandbox
  assert (
    fh.run_main(fedavg.main, root_output_dir=root, experiment_name='run', rounds=1).exit_code == 0
  )
  (root / 'run' / 'hparams.json').write_bytes(b'\x00{not json')
  before = fh.TreeSnapshot(tmp_path)
  outcome = fh.run_main(fedavg.main, root_output_dir=root, experiment_name='run', rounds=2)
  fh.assert_one_line_error(outcome, r"hparams\.json' is not valid JSON.*restore it")
  assert before.changes(allowed=[root / 'run' / run_dir.MARKER_FILENAME]) == []


# --- Every binary resumes the same way --------------------------------------------------


def test_comparison_binaries_resume_instead_of_deleting(sandbox):
  tmp_path, root = sandbox
  common = dict(
    root_output_dir=root,
    experiment_name='cmp',
    rounds=1,
    seeds=1,
    sampling='md',
    num_clients=20,
    clients_per_round=4,
  )
  assert fh.run_binary('clustered_sampling', **common).exit_code == 0
  run = root / 'cmp_md_seed0'
  (run / 'sentinel').write_text('kept across a resume')
  before = fh.TreeSnapshot(tmp_path)
  assert fh.run_binary('clustered_sampling', **{**common, 'rounds': 2}).exit_code == 0
  assert (run / 'sentinel').exists()  # Resumed, not deleted.
  assert [r['key'] for r in _rows(run)] == ['0', '1', '2']
  assert os.path.isdir(run / 'checkpoints' / 'program_state_1')
  # Only the run directory and the comparison's plot changed.
  assert before.changes(allowed=[run, root / 'digits_accuracy.png']) == []
  assert fh.run_binary('clustered_sampling', **{**common, 'reset': 'true'}).exit_code == 0
  assert not (run / 'sentinel').exists()  # --reset started it over.
  assert [r['key'] for r in _rows(run)] == ['0', '1']


# --- A diverging run stops with a non-zero exit ------------------------------------------


@pytest.mark.parametrize('flag', ['client_learning_rate', 'server_learning_rate'])
def test_a_diverging_run_exits_non_zero_after_releasing_its_rows(sandbox, flag):
  tmp_path, root = sandbox
  before, children = fh.TreeSnapshot(tmp_path), fh.child_pids()
  outcome = fh.run_main(
    fedavg.main, root_output_dir=root, experiment_name='run', rounds=5, **{flag: '1e30'}
  )
  fh.assert_one_line_error(outcome, r'diverged in round \d: .*learning rate')
  keys = [int(r['key']) for r in _rows(root / 'run')]
  assert keys == list(range(len(keys))) and 2 <= len(keys) <= 5  # Rows up to the stop.
  assert before.changes(allowed=[root / 'run']) == [] and fh.child_pids() <= children


def test_a_diverging_multi_model_run_stops(tmp_path):
  suite = suites.create_suite('digits_synthetic', num_clients=6, client_epochs=1)
  process = multi_model.build_multi_model_process(
    [t.model_fn for t in suite],
    sampling='random',
    expected_clients=2,
    client_learning_rates=1e30,
    seed=3,
  )
  with pytest.raises(FloatingPointError, match=r'diverged in round 1: .*learning rate'):
    multi_model_program.train_multi_model(
      suite,
      process,
      program.RunConfig(output_dir=str(tmp_path / 'run'), rounds=3, seed=3, hparams={'run': 1}),
    )
  assert [r['key'] for r in _rows(tmp_path / 'run')] == ['0', '1']


# --- Plots beside the runs replace only this project's plots ------------------------------


def test_a_users_file_where_a_plot_goes_is_refused_before_any_run(sandbox):
  tmp_path, root = sandbox
  (root / 'digits_accuracy.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'a user image')
  before, children = fh.TreeSnapshot(tmp_path), fh.child_pids()
  outcome = fh.run_binary(
    'clustered_sampling',
    root_output_dir=root,
    experiment_name='cmp',
    rounds=1,
    seeds=1,
    sampling='md',
    num_clients=20,
    clients_per_round=4,
  )
  fh.assert_one_line_error(
    outcome,
    r"Refusing to overwrite '.*digits_accuracy\.png': it is not "
    'a plot written by tff_sampling',
  )
  assert before.changes() == [] and fh.child_pids() <= children


def test_save_figure_replaces_its_own_plots_only(tmp_path):
  from matplotlib import figure as mpl_figure

  from tff_sampling.analysis import plotting

  path = tmp_path / 'plot.png'
  plotting.save_figure(mpl_figure.Figure(), path)
  assert plotting.is_own_plot(path)
  plotting.save_figure(mpl_figure.Figure(figsize=(2, 2)), path)  # Its own: replaced.
  other = tmp_path / 'other.png'
  other.write_bytes(path.read_bytes().replace(b'tff_sampling', b'somebodyels'))
  with pytest.raises(ValueError, match='Refusing to overwrite'):
    plotting.save_figure(mpl_figure.Figure(), other)
  assert sorted(os.listdir(tmp_path)) == ['other.png', 'plot.png']  # No temporary left.


# --- A plain TFF process cannot receive a sampler's weights --------------------------------


def test_a_plain_process_with_a_weighting_sampler_is_refused_before_any_write(
  small_digits_task, process, tmp_path
):
  # build_weighted_fed_avg defaults to NUM_EXAMPLES: MD sampling's 1/m per draw
  # would silently become n_k / Σ n (a biased estimator).
  sampler = samplers.MDSampler(_COHORT, seed=0)
  with pytest.raises(
    ValueError,
    match='MDSampler sets aggregation weights, which a plain TFF '
    'process .* client_weighting=ClientWeighting.UNIFORM',
  ):
    _run_with(small_digits_task, process, sampler, tmp_path / 'run')
  with pytest.raises(ValueError, match='client_weighting=NUM_EXAMPLES replaces those weights'):
    _run_with(
      small_digits_task,
      process,
      sampler,
      tmp_path / 'run',
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    )
  assert not (tmp_path / 'run').exists()
  uniform = tff.learning.algorithms.build_weighted_fed_avg(
    small_digits_task.model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  result = _run_with(
    small_digits_task,
    uniform,
    sampler,
    tmp_path / 'run',
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  assert result.final_round == 1


def _run_with(task, process, sampler, output_dir, **kwargs):
  return program.train_model(task, process, sampler, _config(output_dir, 1), **kwargs)
