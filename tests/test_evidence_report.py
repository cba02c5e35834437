"""The tables of an experiment's results.md (`evidence_report`), checked by hand."""

import dataclasses
import types

import numpy as np
import pytest

from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.runtime import results

ACTIVE = 'availability/active_clients'


def _run(method, seed, active):
  """A 3-round run evaluated at rounds 0 and 2, with `active` clients in rounds 1 and 2."""
  metrics = {
    'eval/accuracy': np.array([0.1, np.nan, 0.5]),
    'eval/loss': np.array([2.0, np.nan, 1.0]),
    ACTIVE: np.array([np.nan, *active]),
    'uplink/cumulative_bits': np.array([0.0, 1e9, 2e9]),
  }
  hparams = dict(sampling=method, seed=seed, client_learning_rate=0.1, rounds=2)
  return results.Run(path=f'{method}{seed}', hparams=hparams, metrics=metrics, rounds=np.arange(3))


def _rows(text, heading):
  """The table rows under `heading`, by their first two cells."""
  start = text.index(heading)
  section = text[start : text.find('\n## ', start + 3)]
  return {
    tuple(c.strip() for c in line.split('|')[1:3]): [c.strip() for c in line.split('|')[3:-1]]
    for line in section.splitlines()
    if line.startswith('| ') and not line.startswith('| method') and '---' not in line
  }


def _spec(**changes):
  """FedGS against uniform at one fixed rate, 2 seeds, no claims; `changes` replaced."""
  spec = evidence_spec.ExperimentSpec(
    name='e',
    title='e',
    binary='fedgs',
    binary_flags=(),
    methods=('fedgs', 'uniform'),
    baseline='uniform',
    learning_rates=(0.1,),
    tuning_seed=100,
    seeds=2,
    final_k=1,
    targets=(),
    claims=(),
    fixed_rates=(('fedgs', 0.1), ('uniform', 0.1)),
  )
  return dataclasses.replace(spec, **changes)


def test_extra_columns_are_averaged_per_run_and_over_seeds():
  spec = _spec(extra_columns=(ACTIVE,))
  # Per run, the mean over the rounds that record it: seed 0 (4 + 6) / 2 = 5, seed 1 (2 + 2) / 2
  # = 2; over the seeds 3.5 ± sqrt(((5 − 3.5)² + (2 − 3.5)²) / 1) = 2.121. Uniform is missing
  # seed 1.
  runs = [_run('fedgs', 0, [4, 6]), _run('fedgs', 1, [2, 2]), _run('uniform', 0, [3, 3])]
  text = evidence_report.results_markdown(spec, runs, command='cmd')
  label = f'{ACTIVE} (mean/round)'
  assert _rows(text, '## Per seed')[('fedgs (lr 0.1)', label)] == ['5.000', '2.000']
  assert _rows(text, '## Per seed')[('uniform (lr 0.1)', label)] == ['3.000', '—']
  summary = _rows(text, '## Summaries over seeds')
  header = next(
    line for line in text.splitlines() if line.startswith('| method') and 'Gbit' in line
  )
  column = [c.strip() for c in header.split('|')[1:-1]].index(label)
  assert summary[('fedgs (lr 0.1)', '2')][column - 2] == '3.500 ± 2.121'
  assert summary[('uniform (lr 0.1)', '1')][column - 2] == '3.000'


def _diverging(accuracy, at, rounds=20):
  """Evaluated every 5 rounds from 0 with `accuracy`; its training loss infinite at round `at`."""
  steps = np.arange(at + 1)
  metrics = {
    'eval/accuracy': np.full(steps.size, np.nan),
    'eval/loss': np.full(steps.size, np.nan),
    'train/loss': np.ones(steps.size),
    'round_seconds': np.ones(steps.size),
    'uplink/cumulative_bits': steps * 1e6,
  }
  for i, value in enumerate(accuracy):
    metrics['eval/accuracy'][5 * i] = value
    metrics['eval/loss'][5 * i] = 2.0 - value
  metrics['train/loss'][at] = np.inf
  hparams = dict(sampling='uniform', seed=0, client_learning_rate=0.1, rounds=rounds)
  return results.Run(path='diverged', hparams=hparams, metrics=metrics, rounds=steps)


def test_a_diverged_run_scores_as_failed():
  # Evaluated at rounds 0, 5, 10 (0.2, 0.5, 0.6); diverged in round 12 of 20.
  run = _diverging([0.2, 0.5, 0.6], at=12)
  assert evidence_spec.diverged(run) == 12
  failed = evidence_spec.failed_run(run)
  np.testing.assert_array_equal(failed.rounds, [*range(12), 12, 20])
  assert evidence.final_mean(run, 2) == pytest.approx(0.55)  # What the rule replaces.
  assert evidence.final_mean(failed, 2) == 0.0
  # Trapezoids over 0-5-10-12-20: (1.75 + 2.75 + 0.6 + 0) / 20.
  assert evidence.curve_mean(failed) == pytest.approx(5.1 / 20)
  assert evidence.to_target(failed, 0.5, bits=False) == (5.0, False)  # Reached before.
  assert evidence.to_target(failed, 0.7, bits=False) == (20.0, True)  # Never: censored at 20.
  assert evidence.to_target(failed, 0.7, bits=True) == (12e6, True)  # Uploads as they stood.
  assert evidence.lowest(failed) == pytest.approx(1.4)  # The lowest loss it reached.
  spec = types.SimpleNamespace(final_k=2)
  assert evidence_report.metric_values(spec, {0: run}, evidence_spec.FINAL) == {0: 0.0}
  healthy = _diverging([0.2, 0.5, 0.6], at=19)
  healthy.metrics['train/loss'][19] = 1.0
  assert evidence_spec.failed_run(healthy) is healthy


def test_simulated_time_gets_its_column_claim_and_plot(tmp_path):
  # Runs under a system model carry system/cumulative_seconds: fedgs reaches 0.5 at round 2
  # after 3 s (seed 0) and 5 s (seed 1); uniform after 6 s and 9 s. Paired differences −3, −4:
  # mean −3.5.
  spec = _spec(targets=(0.5,), claims=(evidence_spec.parse_claim('fedgs<uniform:seconds_to_0.5'),))
  runs = []
  for method, seed, total in (
    ('fedgs', 0, 3.0),
    ('fedgs', 1, 5.0),
    ('uniform', 0, 6.0),
    ('uniform', 1, 9.0),
  ):
    run = _run(method, seed, [1, 1])
    run.metrics[evidence.SECONDS_COLUMN] = np.array([np.nan, total / 2, total])
    runs.append(run)
  text = evidence_report.results_markdown(spec, runs, command='cmd')
  verdict = next(line for line in text.splitlines() if '`fedgs<uniform:seconds_to_0.5`' in line)
  assert 'simulated seconds to 50%' in verdict and '-3.5 [' in verdict
  assert 'simulated seconds to 50%' in text.split('## Summaries over seeds')[1]
  assert '![accuracy vs simulated seconds](accuracy_seconds.png)' in text
  files = evidence_report.report_files(spec, runs, tmp_path, command='cmd')
  assert str(tmp_path / 'accuracy_seconds.png') in files
  # Without simulated time, neither the column nor the plot.
  plain = [_run('fedgs', 0, [1, 1]), _run('uniform', 0, [1, 1])]
  spec = dataclasses.replace(spec, seeds=1, claims=())
  text = evidence_report.results_markdown(spec, plain, command='cmd')
  assert 'simulated seconds' not in text
  assert str(tmp_path / 'accuracy_seconds.png') not in evidence_report.report_files(
    spec, plain, tmp_path, command='cmd'
  )
