"""Smoke and bad-input tests of the binaries: 2-round runs on `digits`.

Two tests start a binary as a subprocess, where a fresh process is the point
(TensorFlow's start-up log, absl's log prefix); the others run ``main`` in this
process under the binary's own flag registry (`fault_harness.run_binary`).
"""

import logging
import os
import re
import subprocess
import sys

from absl import flags
from absl.testing import flagsaver
import fault_harness as fh
import numpy as np
import pytest

from bin import demo
from bin import fedavg
import tasks
from tff_sampling import comparisons
from tff_sampling import samplers
from tff_sampling.comparisons import fedgs as fedgs_experiment
from tff_sampling.runtime import results

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_module(module, *args):
  return subprocess.run(
    [sys.executable, '-m', module, *args], cwd=_REPO, capture_output=True, text=True, timeout=300
  )


_GC_PROBE = """
import gc, sys
sys.argv = ['-m']  # As `python -m bin.<name>` while it imports the package.
import bin
from absl import app
paused = not gc.isenabled()
app.run(lambda argv: print(paused, gc.isenabled(), gc.get_freeze_count() > 0))
"""


def test_a_binary_imports_with_the_collector_paused_and_collects_once_its_main_runs():
  # bin/__init__.py: paused while `python -m bin.<name>` imports; frozen and resumed by absl.
  probe = subprocess.run(
    [sys.executable, '-c', _GC_PROBE], cwd=_REPO, capture_output=True, text=True, timeout=60
  )
  assert probe.returncode == 0, probe.stderr[-2000:]
  assert probe.stdout.split() == ['True', 'True', 'True']


@pytest.mark.slow
def test_fedavg_two_rounds_subprocess(tmp_path):
  proc = _run_module(
    'bin.fedavg',
    '--task=digits',
    '--rounds=2',
    '--clients_per_round=5',
    f'--root_output_dir={tmp_path}',
    '--experiment_name=smoke',
    '--verbose',
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'round 2/2' in proc.stderr and 'smoke: round 2, ' in proc.stdout
  # --verbose gives absl's prefix back (and TensorFlow's own log, where it has any).
  assert re.search(r'^I\d{4} [\d:.]+ +\d+ progress\.py:\d+\] round 2/2', proc.stderr, re.M)
  run = results.load_run(tmp_path / 'smoke')
  assert list(run.rounds) == [0, 1, 2]
  assert run.hparams['clients_per_round'] == 5 and run.hparams['sampling'] == 'uniform'
  assert run.hparams['task.num_clients'] == 100  # The task's options are recorded too.


@pytest.mark.slow
def test_demo_two_rounds_subprocess(tmp_path):
  proc = _run_module(
    'bin.demo',
    '--rounds=2',
    '--seeds=1',  # Several seeds in one call: test_experiment_driver (--seeds_per_call=2).
    '--methods=optimal,full',
    '--eval_every=1',
    f'--root_output_dir={tmp_path}',
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Quiet by default: our lines only, no TensorFlow C++ log, absl prefix or traceback.
  noise = [
    line
    for line in proc.stderr.splitlines()
    if re.match(r'\d{4}-\d\d-\d\d [\d:.]+: [IWEF] |[IWEF]\d{4} [\d:.]+ +\d+ ', line)
    or 'Traceback' in line
    or 'never used' in line
  ]
  assert not noise, noise[:5]
  assert re.search(r'^round 2/2 \| ', proc.stderr, re.M), proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert any(line.startswith('optimal ') for line in lines), proc.stdout
  assert any(line.startswith('full ') for line in lines), proc.stdout
  with open(tmp_path / 'accuracy.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert sorted(os.listdir(tmp_path)) == [
    'accuracy.png',
    'digits_full_seed0',
    'digits_optimal_seed0',
  ]
  full = results.load_run(tmp_path / 'digits_full_seed0')
  assert np.all(full.metrics['uplink/model_uploads'][1:] == 32)  # Everyone uploads.
  assert full.hparams['task.preset'] == 'unbalanced'


@pytest.mark.parametrize(
  'overrides,message',
  [
    (dict(clients_per_round='500'), 'clients_per_round=500 exceeds the population of 100'),
    (
      dict(sequence_length='5'),
      r'--sequence_length does not apply to --task=digits \(it applies to: shakespeare\)',
    ),
    (
      dict(synthetic_alpha='1.0'),
      r'--synthetic_alpha does not apply to --task=digits \(it applies to: synthetic\); '
      r"the flags of task 'digits' are --client_batch_size, --data_seed",
    ),
    (
      dict(cache_dir='/tmp'),
      r'--cache_dir does not apply to --task=digits \(it applies to: '
      r'emnist, emnist_skewed, emnist_unbalanced_1, .*, cifar100\)',
    ),
    (dict(dirichlet_alpha='-1'), 'dirichlet_alpha'),
    (dict(task='emnist', cache_dir='{tmp}/empty'), r'emnist_all\.sqlite.*cache_dir'),
  ],
)
def test_fedavg_bad_input_exits_with_a_clear_message(overrides, message, tmp_path):
  overrides = {k: v.format(tmp=tmp_path) for k, v in overrides.items()}
  with flagsaver.as_parsed(rounds='1', root_output_dir=str(tmp_path), **overrides):
    with pytest.raises(SystemExit, match=message):
      fedavg.main(['fedavg'])


@pytest.mark.parametrize(
  'flag,value', [('rounds', '0'), ('clients_per_round', '-1'), ('num_clients', '0')]
)
def test_non_positive_counts_are_rejected_at_parse_time(flag, value):
  with pytest.raises(flags.IllegalFlagValueError, match=f'{flag}=.*{value}|>= 1'):
    with flagsaver.as_parsed(**{flag: value}):
      pass


def test_extra_arguments_are_rejected():
  with flagsaver.as_parsed(rounds='1'):
    with pytest.raises(Exception, match='Unexpected arguments: stray'):
      fedavg.main(['fedavg', 'stray'])
    with pytest.raises(Exception, match='Unexpected arguments: stray'):
      demo.main(['demo', 'stray'])
  with pytest.raises(flags.IllegalFlagValueError, match="--methods has unknown value 'best'"):
    with flagsaver.as_parsed(rounds='1', methods='optimal,best'):
      pass


def test_resume_with_other_flags_is_rejected(tmp_path):
  common = dict(
    rounds='1', clients_per_round='5', root_output_dir=str(tmp_path), experiment_name='run'
  )
  with flagsaver.as_parsed(**common):
    fedavg.main(['fedavg'])
  with flagsaver.as_parsed(client_learning_rate='0.5', **common):
    with pytest.raises(SystemExit, match='different configuration.*client_learning_rate'):
      fedavg.main(['fedavg'])


def test_optimal_sampling_two_rounds(tmp_path):
  outcome = fh.run_binary(
    'optimal_sampling',
    task='digits',
    rounds=2,
    sampling='optimal',
    algorithm='dsgd',
    root_output_dir=tmp_path,
    experiment_name='smoke',
  )
  assert outcome.exit_code == 0, outcome
  run = results.load_run(tmp_path / 'smoke')
  assert list(run.rounds) == [0, 1, 2]
  # The paper's defaults for the task filled the unset flags.
  assert run.hparams['clients_per_round'] == 32 and run.hparams['expected_clients'] == 3.0
  uploads = run.metrics['uplink/model_uploads'][1:]
  assert np.all(uploads == run.metrics['process/aggregator/uploads'][1:])
  # Bits: uploads × 4,810 parameters + 18 protocol scalars × 32 clients, 32 bits each.
  np.testing.assert_array_equal(
    run.metrics['uplink/round_bits'][1:], 32 * (uploads * 4810 + 18 * 32)
  )


def test_fedavg_over_two_local_workers_equals_one_process(tmp_path, caplog):
  common = dict(task='digits', rounds=2, clients_per_round=5, root_output_dir=tmp_path)
  assert fh.run_binary('fedavg', experiment_name='one', **common).exit_code == 0
  children = fh.child_pids()  # With TFF's own local worker, started by the first run.
  with caplog.at_level(logging.INFO, logger='absl'):
    two = fh.run_binary(
      'fedavg', experiment_name='two', local_workers=2, clients_per_call=2, **common
    )
  assert two.exit_code == 0, two
  assert 'clients are split over 2 TFF workers' in caplog.text
  assert fh.child_pids() <= children  # The run's 2 workers stopped with it.
  a, b = results.load_run(tmp_path / 'one'), results.load_run(tmp_path / 'two')
  np.testing.assert_allclose(b.metrics['eval/loss'], a.metrics['eval/loss'], rtol=1e-5)
  np.testing.assert_array_equal(b.metrics['uplink/round_bits'], a.metrics['uplink/round_bits'])


def test_optimal_sampling_refuses_workers_with_the_reason(tmp_path):
  outcome = fh.run_binary(
    'optimal_sampling',
    task='digits',
    rounds=1,
    sampling='optimal',
    local_workers=2,
    root_output_dir=tmp_path,
    experiment_name='smoke',
  )
  fh.assert_one_line_error(outcome, 'cannot run over several TFF workers')
  assert not os.listdir(tmp_path)  # Refused before anything was written.


def test_clustered_sampling_two_rounds(tmp_path):
  outcome = fh.run_binary(
    'clustered_sampling',
    rounds=2,
    eval_every=1,
    sampling='md,clustered_similarity,target,fedgs',
    client_epochs=1,
    availability='LN',
    root_output_dir=tmp_path,
  )
  assert outcome.exit_code == 0, outcome
  assert sorted(os.listdir(tmp_path)) == [
    'digits_accuracy.png',
    'digits_clustered_similarity_seed0',
    'digits_fedgs_seed0',
    'digits_md_seed0',
    'digits_target_seed0',
  ]
  fedgs = results.load_run(tmp_path / 'digits_fedgs_seed0')
  np.testing.assert_array_equal(
    fedgs.metrics['cohort_size'][1:],
    np.minimum(10, fedgs.metrics['availability/active_clients'][1:]),
  )
  target = results.load_run(tmp_path / 'digits_target_seed0')
  # Shards: one client per digit among the active ones.
  assert np.all(
    target.metrics['selection/distinct_labels'][1:] == target.metrics['cohort_size'][1:]
  )
  assert target.hparams['task.preset'] == 'shards'
  similarity = results.load_run(tmp_path / 'digits_clustered_similarity_seed0')
  assert np.all(similarity.metrics['cohort_size'][1:] == 10)  # m draws, with repeats.


@pytest.mark.parametrize(
  'binary,sampling,message',
  [
    ('clustered_sampling', 'md,best', "--sampling has unknown value 'best'; choose from uniform,"),
    ('fedgs', 'uniform,best', "--sampling has unknown value 'best'; choose from"),
    ('lefl', 'best', "--sampling has unknown value 'best'; choose from"),
    ('benchmark', 'md+best', "Unknown method 'md+best': give a sampler of"),
    ('benchmark', '', '--sampling is empty; give at least one value.'),
  ],
)
def test_unknown_methods_are_refused_while_parsing(binary, sampling, message, tmp_path):
  with fh.flags_of(binary):
    with pytest.raises(flags.IllegalFlagValueError) as raised:
      with flagsaver.as_parsed(rounds='1', sampling=sampling, root_output_dir=str(tmp_path)):
        pass
  assert '\n' not in str(raised.value).strip() and message in str(raised.value), raised.value
  assert not os.listdir(tmp_path)


def test_availability_flag_limits_every_round(tmp_path):
  common = dict(
    rounds='2',
    clients_per_round='30',
    root_output_dir=str(tmp_path),
    experiment_name='ln',
    availability='LN',
  )
  with flagsaver.as_parsed(**common):
    fedavg.main(['fedavg'])
  run = results.load_run(tmp_path / 'ln')
  active = run.metrics['availability/active_clients'][1:]
  assert np.all(active < 100) and np.all(active >= 1)
  # The cohort is capped by the active clients: min(30, |A_t|).
  np.testing.assert_array_equal(run.metrics['cohort_size'][1:], np.minimum(30, active))
  assert run.hparams['availability'] == 'LN' and run.hparams['availability_beta'] == 0.5


@pytest.mark.slow
def test_fedgs_binary_table_over_modes_and_methods(tmp_path, capfd):
  outcome = fh.run_binary(
    'fedgs',
    rounds=2,
    eval_every=1,
    availability='IDL,MDF-0.5',
    sampling='fedgs,uniform,md,power_of_choice,power_of_choice_all,fedprox',
    root_output_dir=tmp_path,
  )
  assert outcome.exit_code == 0, outcome
  stdout = capfd.readouterr().out
  methods = ('fedgs', 'uniform', 'md', 'power_of_choice', 'power_of_choice_all', 'fedprox')
  runs = {
    (mode, m): results.load_run(tmp_path / f'synthetic_{mode}_{m}_seed0')
    for mode in ('IDL', 'MDF-0.5')
    for m in methods
  }
  # The paper's Synthetic setting filled the unset flags.
  fedgs = runs['MDF-0.5', 'fedgs']
  assert fedgs.hparams['clients_per_round'] == 6 and fedgs.hparams['task.num_clients'] == 30
  assert fedgs.hparams['client_steps'] == 10 and fedgs.hparams['availability'] == 'MDF'
  assert fedgs.hparams['availability_beta'] == 0.5 and fedgs.hparams['graph'] == 'oracle'
  assert runs['IDL', 'fedprox'].hparams['fedprox_mu'] == 0.01
  assert runs['IDL', 'power_of_choice'].hparams['num_candidates'] == 12  # d = 2m.
  assert runs['IDL', 'power_of_choice_all'].hparams['num_candidates'] == 'all active'
  # Every method saw the same active clients in each round (seed-only masks),
  # and picked min(m, |A_t|) of them; IDL has everyone active.
  active = fedgs.metrics['availability/active_clients'][1:]
  assert np.all(active < 30)
  for m in methods:
    np.testing.assert_array_equal(
      runs['MDF-0.5', m].metrics['availability/active_clients'][1:], active
    )
    np.testing.assert_array_equal(runs['IDL', m].metrics['availability/active_clients'][1:], 30)
    if m != 'md':  # MD draws m times with replacement.
      np.testing.assert_array_equal(
        runs['MDF-0.5', m].metrics['cohort_size'][1:], np.minimum(6, active)
      )
    np.testing.assert_array_equal(
      runs['MDF-0.5', m].selection_counts.sum(), runs['MDF-0.5', m].metrics['cohort_size'][1:].sum()
    )
  # FedGS with α = 1 after 2 rounds: nobody picked twice unless forced.
  assert fedgs.selection_counts.max() == 1
  lines = stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith('method') and 'IDL' in line)
  assert 'MDF-0.5' in lines[header]
  assert [line.split()[0] for line in lines[header + 2 : header + 8]] == list(methods)
  assert (tmp_path / 'synthetic_sampling_counts.png').stat().st_size > 0


def test_power_of_choice_all_takes_every_active_client_as_a_candidate():
  task = tasks.get_task('synthetic', num_clients=20)
  methods = fedgs_experiment.FedGSMethods(clients_per_round=4, client_learning_rate=0.1)
  sampler = methods.make_sampler(task, 'power_of_choice_all', 0, {})
  pairs = methods.make_sampler(task, 'power_of_choice', 0, {})
  state = sampler.initialize(samplers.Population(num_examples=task.client_num_examples))
  available = np.zeros(20, bool)
  available[[1, 4, 5, 9, 13, 17, 18]] = True
  candidates = sampler.candidates(state, 3, available)
  assert sorted(candidates.tolist()) == [1, 4, 5, 9, 13, 17, 18]
  assert len(pairs.candidates(state, 3, available)) == 7  # d = 2m = 8, capped at |A_t| = 7.
  available[:] = True
  assert len(pairs.candidates(state, 3, available)) == 8
  assert len(sampler.candidates(state, 3, available)) == 20


@pytest.mark.parametrize(
  'availability,message',
  [
    ('XX', "Unknown --availability mode 'XX'"),
    ('LN-abc', "β 'abc' is not a number"),
    ('LN-1.5', '`beta` must be in [0, 1], got 1.5'),
  ],
)
def test_fedgs_binary_rejects_bad_availability(tmp_path, availability, message):
  outcome = fh.run_binary(
    'fedgs', rounds=1, availability=availability, sampling='uniform', root_output_dir=tmp_path
  )
  fh.assert_one_line_error(outcome, re.escape(message))


def test_parse_availability_defaults_and_conflicts():
  from bin import experiment_flags as ef

  assert ef.parse_availability('ln') == comparisons.AvailabilitySpec('LN', 0.5, 24)
  assert ef.parse_availability('YC-0.3').label == 'YC-0.3'
  assert ef.parse_availability('IDL').label == 'IDL'
  with flagsaver.flagsaver(availability_beta=0.2):
    assert ef.parse_availability('MDF').beta == 0.2
    with pytest.raises(ValueError, match='give it once'):
      ef.parse_availability('MDF-0.7')
  with flagsaver.flagsaver(availability=['LN', 'MDF']):
    assert [s.mode for s in ef.availability_specs()] == ['LN', 'MDF']
    with pytest.raises(ValueError, match='runs one availability mode'):
      ef.availability_spec()


def test_lefl_binary_two_rounds(tmp_path, capfd):
  outcome = fh.run_binary(
    'lefl',
    rounds=2,
    eval_every=1,
    pretrain_epochs=1,
    public_examples=50,
    availability='LN',
    experiment_name='lf',
    root_output_dir=tmp_path,
  )
  assert outcome.exit_code == 0, outcome
  stdout = capfd.readouterr().out
  # --experiment_name prefixes the runs of a comparison.
  lefl = results.load_run(tmp_path / 'lf_lefl_seed0')
  uniform = results.load_run(tmp_path / 'lf_uniform_seed0')
  assert lefl.hparams['public_data'] == 'noise' and lefl.hparams['allocation'] == 'per_cluster'
  # Pre-processing: 100 clients upload 50 × 10 soft labels and download 50 × 64 inputs.
  assert lefl.metrics['uplink/round_bits'][0] == 100 * 50 * 10 * 32
  assert lefl.metrics['downlink/preprocessing_bits'][0] == 100 * 50 * 64 * 32
  assert uniform.metrics['uplink/round_bits'][0] == 0
  # Both saw the same active clients; both report the label KL every round.
  np.testing.assert_array_equal(
    lefl.metrics['availability/active_clients'], uniform.metrics['availability/active_clients']
  )
  assert np.all(np.isfinite(lefl.metrics['selection/label_kl'][1:]))
  assert np.all(lefl.metrics['selection/label_kl'][1:] >= 0)
  assert 'lefl' in stdout and 'uniform' in stdout
  assert (tmp_path / 'digits_selection_label_kl.png').stat().st_size > 0


def test_lefl_binary_rejects_more_clusters_than_clients(tmp_path):
  # (--sample_rate=1.5 is refused while parsing: tests/test_faults_inputs.py.)
  outcome = fh.run_binary(
    'lefl',
    rounds=1,
    sampling='lefl',
    pretrain_epochs=1,
    public_examples=20,
    num_clusters=101,
    root_output_dir=tmp_path,
  )
  fh.assert_one_line_error(outcome, 'num_clusters=101 exceeds the number of clients N=100')


def test_a_run_that_learns_nothing_says_so_and_goes_on(tmp_path, capsys):
  # lr 1000 on digits: the loss blows up (finite) and the accuracy sits at chance. The run
  # is not stopped (exit 0), but warns once for each and records both in warnings.txt.
  outcome = fh.run_binary(
    'optimal_sampling',
    task='digits',
    rounds=10,
    sampling='full',
    client_learning_rate=1000,
    eval_every=5,
    num_clients=20,
    clients_per_round=5,
    expected_clients=50,
    root_output_dir=tmp_path,
    experiment_name='blowup',
  )
  assert outcome.exit_code == 0, outcome
  run = results.load_run(tmp_path / 'blowup')
  loss, initial = run.last_finite('eval/loss'), run.column('eval/loss')[0]
  assert loss > 10 * initial
  lines = (tmp_path / 'blowup' / 'warnings.txt').read_text().splitlines()
  # Measured: loss 492.6 at round 5 (209x the initial 2.36), accuracy 0.1003 at round 10.
  assert len(lines) == 2, lines
  assert lines[0].startswith('round 5: The evaluation loss is')  # Once, at its first sign.
  assert 'x its round-0 value' in lines[0] and 'learning rate is the likely cause' in lines[0]
  assert run.last_finite('eval/accuracy') <= 0.11
  assert lines[1].startswith('round 10: The evaluation accuracy is')
  assert 'chance level for 10 classes' in lines[1]
  # --expected_clients=50 with a cohort of 5: said once, before training.
  out = capsys.readouterr().out
  assert out.count('--expected_clients=50 is at least the cohort of 5') == 1


def test_a_run_that_learns_writes_no_warnings(tmp_path):
  outcome = fh.run_binary(
    'optimal_sampling',
    task='digits',
    rounds=2,
    sampling='optimal',
    root_output_dir=tmp_path,
    experiment_name='fine',
  )
  assert outcome.exit_code == 0, outcome
  assert not (tmp_path / 'fine' / 'warnings.txt').exists()
