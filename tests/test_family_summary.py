"""Several experiments side by side (`family_report.family_markdown`, bin.report --summary)."""

import dataclasses
import glob
import os
import re
import shlex

import numpy as np
import pytest

from bin import experiment_config
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import family_report
from tff_sampling.runtime import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(method, seed, loss_values, rate):
  """A 3-round run evaluated at rounds 0 and 2, with the given losses there."""
  metrics = {
    'eval/accuracy': np.array([0.1, np.nan, 0.5]),
    'eval/loss': np.array([loss_values[0], np.nan, loss_values[1]]),
  }
  hparams = dict(sampling=method, seed=seed, client_learning_rate=rate, rounds=2)
  return results.Run(path=f'{method}{seed}', hparams=hparams, metrics=metrics, rounds=np.arange(3))


RATES = {'fedgs': 0.1, 'uniform': 0.3, 'md': 0.3}


def _spec(name, methods=('fedgs', 'uniform')):
  return evidence_spec.ExperimentSpec(
    name=name,
    title=name,
    binary='fedgs',
    binary_flags=(),
    methods=methods,
    baseline='uniform',
    learning_rates=(0.3, 0.1),
    tuning_seed=100,
    seeds=2,
    final_k=1,
    targets=(),
    claims=(evidence_spec.parse_claim('fedgs<uniform:best_loss'),),
    fixed_rates=tuple((m, RATES[m]) for m in methods),
  )


def _rows(text, heading):
  """The table rows under `heading`, by their first cell."""
  start = text.index(heading)
  end = text.find('\n## ', start + 3)
  section = text[start : end if end > 0 else None]
  return {
    line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
    for line in section.splitlines()
    if line.startswith('| ') and not line.startswith('| method') and '---' not in line
  }


def test_summary_by_hand():
  # Lowest losses. IDL: fedgs 1.0, 2.0 (mean 1.5); uniform 2.0, 2.0; md 3.0, 1.0 (IDL only).
  # LN: fedgs 1.8, 1.8 (+20% against IDL); uniform seed 0 only, 3.0 (+50%).
  idl = [
    _run('fedgs', 0, (3, 1.0), 0.1),
    _run('fedgs', 1, (3, 2.0), 0.1),
    _run('uniform', 0, (3, 2.0), 0.3),
    _run('uniform', 1, (3, 2.0), 0.3),
    _run('md', 0, (3, 3.0), 0.3),
    _run('md', 1, (1.0, 4), 0.3),
  ]
  ln = [
    _run('fedgs', 0, (3, 1.8), 0.1),
    _run('fedgs', 1, (1.8, 4), 0.1),
    _run('uniform', 0, (3, 3.0), 0.3),
  ]
  text = family_report.family_markdown(
    [
      family_report.Member(_spec('fam_IDL', ('fedgs', 'uniform', 'md')), idl, 'fam_IDL/results.md'),
      family_report.Member(_spec('fam_LN'), ln, 'fam_LN/results.md'),
    ],
    title='Family',
    command='cmd',
    relative_to='fam_IDL',
  )
  verdicts = {
    line.split('|')[1].strip(): [c.strip() for c in line.split('|')[2:-1]]
    for line in text.splitlines()
    if line.startswith('| [')
  }
  # IDL differences −1, 0: mean −0.5, standard error 0.5, t(0.975, 1) = 12.706.
  assert verdicts['[IDL](fam_IDL/results.md)'][4:] == [
    '2',
    '-0.5 [-6.853, +5.853]',
    '12.71',
    '**no difference detected**',
    'no difference detected',  # Holm, the experiment's one claim as its family.
    # Seeds to decide: sd 0.7071; t(0.975, 9) · 0.7071 / √10 = 0.506 > 0.5, t(0.975, 10) · 0.7071
    # / √11 = 0.475 < 0.5.
    '11',
  ]
  # LN pairs seed 0 only (uniform lacks seed 1): 1.8 − 3.0, no interval.
  assert verdicts['[LN](fam_LN/results.md)'][4:7] == ['1', '-1.2', '—']
  loss = _rows(text, '## Lowest evaluation loss')
  assert loss['fedgs'] == ['1.5000 ± 0.7071', '1.8000 ± 0.0000 (+20.0%)']
  assert loss['uniform'] == ['2.0000 ± 0.0000', '3.0000 (1/2 seeds) (+50.0%)']
  assert loss['md'] == ['2.0000 ± 1.4142', '—']
  assert _rows(text, '## Client learning rates') == {
    'fedgs': ['0.1', '0.1'],
    'uniform': ['0.3', '0.3'],
    'md': ['0.3', '—'],
  }


def test_a_family_refuses_repeats_and_mixed_final_k():
  runs = [_run('fedgs', 0, (1, 1), 0.1), _run('uniform', 0, (1, 1), 0.3)]
  with pytest.raises(ValueError, match='given twice'):
    family_report.family_markdown(
      [family_report.Member(_spec('a'), runs, 'a'), family_report.Member(_spec('a'), runs, 'b')],
      title='t',
      command='c',
    )
  other_k = dataclasses.replace(_spec('b'), final_k=3)
  with pytest.raises(ValueError, match='different final_k'):
    family_report.family_markdown(
      [family_report.Member(_spec('a'), runs, 'a'), family_report.Member(other_k, runs, 'b')],
      title='t',
      command='c',
    )


def test_relative_to_must_name_a_member():
  with pytest.raises(ValueError, match='none of the experiments'):
    family_report.family_markdown(
      [family_report.Member(_spec('a'), [_run('fedgs', 0, (1, 1), 0.1)], 'a/results.md')],
      title='t',
      command='c',
      relative_to='b',
    )


COMMITTED = sorted(glob.glob(os.path.join(REPO, 'docs', 'experiments', '*_summary.md')))


@pytest.mark.parametrize('path', COMMITTED, ids=[os.path.basename(p) for p in COMMITTED])
def test_committed_summary_regenerates_exactly(path, monkeypatch):
  with open(path, encoding='utf-8') as f:
    text = f.read()
  (command,) = re.findall(r'```sh\n(python -m bin\.report --summary=.*)\n```', text)
  args = dict(a[2:].split('=', 1) for a in shlex.split(command)[3:])
  monkeypatch.chdir(REPO)  # The command's paths are relative to the repository.
  assert os.path.abspath(args['summary']) == path
  assert (
    experiment_config.summary_text(
      args['summary'],
      [e.strip() for e in args['experiments'].split(',')],
      title=args.get('title'),
      relative_to=args.get('relative_to'),
    )
    == text
  )
