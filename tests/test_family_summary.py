"""Several experiments side by side (`evidence_report.family_markdown`, bin.report --summary)."""

import glob
import os
import re
import shlex

import numpy as np
import pytest

from bin import experiment_config
from tff_sampling import evidence_report
from tff_sampling import results
from tff_sampling.experiments import evidence_spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(method, seed, loss_values, rate):
  """A 3-round run evaluated at rounds 0 and 2, with the given losses there."""
  metrics = {
    'eval/accuracy': np.array([0.1, np.nan, 0.5]),
    'eval/loss': np.array([loss_values[0], np.nan, loss_values[1]]),
  }
  hparams = dict(sampling=method, seed=seed, client_learning_rate=rate, rounds=2)
  return results.Run(path=f'{method}{seed}', hparams=hparams, metrics=metrics,
                     rounds=np.arange(3))


def _spec(name):
  return evidence_spec.ExperimentSpec(
    name=name, title=name, binary='fedgs', binary_flags=(), methods=('fedgs', 'uniform'),
    baseline='uniform', learning_rates=(0.1,), tuning_seed=100, seeds=2, final_k=1,
    targets=(), claims=(evidence_spec.parse_claim('fedgs<uniform:best_loss'),))


def test_summary_by_hand():
  # Lowest losses: IDL fedgs 1.0, 2.0 (mean 1.5), uniform 2.0, 2.0; LN fedgs 1.8, 1.8 (mean
  # 1.8, +20% against IDL), uniform 3.0, 2.0 (mean 2.5, +25%).
  idl = [_run('fedgs', 0, (3, 1.0), 0.1), _run('fedgs', 1, (3, 2.0), 0.1),
         _run('uniform', 0, (3, 2.0), 0.1), _run('uniform', 1, (3, 2.0), 0.1)]
  ln = [_run('fedgs', 0, (3, 1.8), 0.1), _run('fedgs', 1, (1.8, 4), 0.1),
        _run('uniform', 0, (3, 3.0), 0.1), _run('uniform', 1, (3, 2.0), 0.1)]
  text = evidence_report.family_markdown(
    [evidence_report.Member(_spec('fam_IDL'), idl, 'fam_IDL/results.md'),
     evidence_report.Member(_spec('fam_LN'), ln, 'fam_LN/results.md')],
    title='Family', command='cmd', relative_to='fam_IDL')
  lines = text.splitlines()
  # Verdict rows: IDL fedgs − uniform = −1, 0 (mean −0.5); LN −1.2, −0.2 (mean −0.7).
  (idl_row,) = [line for line in lines if line.startswith('| [IDL](fam_IDL/results.md)')]
  assert '-0.5 [' in idl_row and '1.5000' in idl_row and '2.0000' in idl_row
  (ln_row,) = [line for line in lines if line.startswith('| [LN](fam_LN/results.md)')]
  assert '-0.7 [' in ln_row
  start = text.index('## Lowest evaluation loss')
  loss_section = text[start : text.index('## ', start + 3)]
  (fedgs,) = [line for line in loss_section.splitlines() if line.startswith('| fedgs')]
  assert re.search(r'1\.5000 ± 0\.7071 \|\s+1\.8000 ± 0\.0000 \(\+20\.0%\)', fedgs)
  (uniform,) = [line for line in loss_section.splitlines() if line.startswith('| uniform')]
  assert '2.5000 ± 0.7071 (+25.0%)' in uniform


def test_relative_to_must_name_a_member():
  with pytest.raises(ValueError, match='none of the experiments'):
    evidence_report.family_markdown(
      [evidence_report.Member(_spec('a'), [_run('fedgs', 0, (1, 1), 0.1)], 'a/results.md')],
      title='t', command='c', relative_to='b')


COMMITTED = sorted(glob.glob(os.path.join(REPO, 'docs', 'experiments', '*_summary.md')))


@pytest.mark.parametrize('path', COMMITTED, ids=[os.path.basename(p) for p in COMMITTED])
def test_committed_summary_regenerates_exactly(path, monkeypatch):
  with open(path, encoding='utf-8') as f:
    text = f.read()
  (command,) = re.findall(r'```sh\n(python -m bin\.report --summary=.*)\n```', text)
  args = dict(a[2:].split('=', 1) for a in shlex.split(command)[3:])
  monkeypatch.chdir(REPO)  # The command's paths are relative to the repository.
  assert experiment_config.summary_text(
    args['summary'], args['experiments'].split(','), title=args.get('title'),
    relative_to=args.get('relative_to')) == text
