"""Tests for tff_sampling/analysis/report.py and bin/report.py on hand-written runs.

Every expected number below is computed by hand from the runs in `RUNS`;
standard deviations are sample standard deviations over seeds (ddof = 1).
"""

import json
import os

from absl.testing import flagsaver
import fault_harness
import pytest

from tff_sampling.analysis import plotting
from tff_sampling.analysis import report
from tff_sampling.analysis import run_groups
from tff_sampling.analysis import tables

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

# (sampling, seed) -> per round 0..4: eval accuracy and loss (evaluated at
# rounds 0, 2, 4; None = no evaluation), cumulative uploaded bits, seconds
# (None at round 0), selection/weight_variance (None = column absent).
RUNS = {
  ('optimal', 0): dict(
    accuracy=[0.10, None, 0.50, None, 0.70],
    loss=[2.0, None, 1.2, None, 0.8],
    bits=[0, 100, 200, 300, 400],
    seconds=[None, 1, 2, 3, 4],
    variance=[None, 0.1, 0.2, 0.3, 0.4],
  ),
  ('optimal', 1): dict(
    accuracy=[0.10, None, 0.40, None, 0.60],
    loss=[2.0, None, 1.4, None, 1.0],
    bits=[0, 150, 300, 450, 600],
    seconds=[None, 1, 1, 1, 5],
    variance=[None, 0.2, 0.2, 0.2, 0.2],
  ),
  # Never reaches 0.5; its best accuracy (0.48) is not its final one (0.45).
  ('optimal', 2): dict(
    accuracy=[0.10, None, 0.48, None, 0.45],
    loss=[2.0, None, 1.6, None, 1.3],
    bits=[0, 200, 400, 600, 800],
    seconds=[None, 2, 2, 2, 2],
    variance=[None, 0.3, 0.3, 0.3, 0.3],
  ),
  ('uniform', 0): dict(
    accuracy=[0.10, None, 0.20, None, 0.30],
    loss=[2.0, None, 1.9, None, 1.8],
    bits=[0, 500, 1000, 1500, 2000],
    seconds=[None, 3, 3, 3, 3],
    variance=None,
  ),
  ('uniform', 1): dict(
    accuracy=[0.10, None, 0.25, None, 0.35],
    loss=[2.0, None, 1.85, None, 1.7],
    bits=[0, 750, 1500, 2250, 3000],
    seconds=[None, 3, 3, 3, 3],
    variance=None,
  ),
  ('full', 0): dict(
    accuracy=[0.10, None, 0.55, None, 0.80],
    loss=[2.0, None, 1.0, None, 0.5],
    bits=[0, 1000, 2000, 3000, 4000],
    seconds=[None, 4, 4, 4, 4],
    variance=None,
  ),
}

# By hand, target 0.5, bits in kbit (the largest mean total, 4000 bits, is >= 1e3):
#   optimal final accuracy 0.70, 0.60, 0.45: mean 0.58333, std sqrt(0.031667/2) = 0.12583
#           final loss 0.8, 1.0, 1.3: mean 1.03333, std sqrt(0.126667/2) = 0.25166
#           best accuracy 0.70, 0.60, 0.48: mean 0.59333, std sqrt(0.024267/2) = 0.11015
#           rounds to 0.5: seed 0 at 2, seed 1 at 4, seed 2 never: mean 3, std sqrt(2) = 1.414
#           bits at those rounds: 200, 600: 0.400 ± 0.283 kbit (2/3)
#           total bits 400, 600, 800: 0.600 ± 0.200 kbit
#           seconds, all rounds of all seeds 1,2,3,4,1,1,1,5,2,2,2,2: median (2 + 2)/2 = 2.00
#             (not the mean of per-seed medians, (2.5 + 1 + 2)/3)
#           weight variance per seed 0.25, 0.2, 0.3: mean 0.25, std 0.05
#   uniform final accuracy 0.30, 0.35: mean 0.325, std 0.05/sqrt(2) = 0.03536
#           final loss 1.8, 1.7: mean 1.75, std 0.1/sqrt(2) = 0.07071; never reaches 0.5
#           total bits 2000, 3000: 2.500 ± 0.707 kbit; 3.00 s/round; no weight variance
#   full    one seed (no ±): 0.8000, 0.5000, 0.8000, round 2, 2.000 kbit, 4.000 kbit, 4.00 s
EXPECTED_ROWS = [
  [
    'optimal',
    '3',
    '4',
    '0.5833 ± 0.1258',
    '1.0333 ± 0.2517',
    '0.5933 ± 0.1102',
    '3.0 ± 1.4 (2/3)',
    '0.400 ± 0.283 (2/3)',
    '0.600 ± 0.200',
    '2.00',
    '0.2500 ± 0.0500',
  ],
  [
    'uniform',
    '2',
    '4',
    '0.3250 ± 0.0354',
    '1.7500 ± 0.0707',
    '0.3250 ± 0.0354',
    'never (0/2)',
    'never (0/2)',
    '2.500 ± 0.707',
    '3.00',
    '—',
  ],
  [
    'full',
    '1',
    '4',
    '0.8000',
    '0.5000',
    '0.8000',
    '2.0 (1/1)',
    '2.000 (1/1)',
    '4.000',
    '4.00',
    '—',
  ],
]
EXPECTED_HEADER = [
  'sampling',
  'seeds',
  'last round',
  'final accuracy',
  'final loss',
  'best accuracy',
  'rounds to 50%',
  'kbit to 50%',
  'total kbit',
  's/round (median)',
  'selection/weight_variance (mean/round)',
]
VARIANCE = 'selection/weight_variance'


def metrics_csv(values):
  """The metrics.csv of one run, every cell quoted as the release manager writes it."""
  header = ['key', 'eval/accuracy', 'eval/loss', 'round_seconds', 'uplink/cumulative_bits']
  if values['variance'] is not None:
    header.append(VARIANCE)
  lines = [header]
  for key in range(5):
    row = [
      key,
      values['accuracy'][key],
      values['loss'][key],
      values['seconds'][key],
      values['bits'][key],
    ]
    if values['variance'] is not None:
      row.append(values['variance'][key])
    lines.append(['' if cell is None else cell for cell in row])
  return '\n'.join(','.join(f'"{cell}"' for cell in line) for line in lines) + '\n'


def write_run(root, sampling, seed, values, rounds=4, **extra_hparams):
  name = f'digits_{sampling}_seed{seed}'
  run_dir = os.path.join(root, name)
  os.makedirs(run_dir)
  hparams = dict(
    task='digits',
    sampling=sampling,
    seed=seed,
    rounds=rounds,
    clients_per_round=10,
    experiment_name=name,
    root_output_dir=str(root),
    **extra_hparams,
  )
  with open(os.path.join(run_dir, 'hparams.json'), 'w') as f:
    json.dump(hparams, f)
  with open(os.path.join(run_dir, 'metrics.csv'), 'w') as f:
    f.write(metrics_csv(values))
  return run_dir


@pytest.fixture
def root(tmp_path):
  root = tmp_path / 'results'
  for (sampling, seed), values in RUNS.items():
    write_run(root, sampling, seed, values)
  return root


def load(root):
  # Glob order is alphabetical; list the groups in the order of EXPECTED_ROWS.
  return plotting.load_runs(
    [f'{root}/digits_optimal_*', f'{root}/digits_uniform_*', f'{root}/digits_full_*']
  )


def parse_table(table):
  lines = table.splitlines()
  # Aligned source: every line as long as the header.
  assert len({len(line) for line in lines}) == 1, table
  # Inside a cell, parts are padded to line up with the column (`2.0       (1/1)`).
  rows = [[' '.join(cell.split()) for cell in line.strip('|').split('|')] for line in lines]
  return rows[0], rows[1], rows[2:]


def test_table_matches_hand_computed_values(root):
  groups = run_groups.group(load(root), 'sampling')
  summaries = run_groups.summarize(groups, target=0.5, extra_columns=[VARIANCE])
  table = tables.markdown_table(summaries, label_header='sampling', extra_columns=[VARIANCE])
  header, rule, rows = parse_table(table)
  assert header == EXPECTED_HEADER
  assert rule[0] == '-' * len(rule[0]) and all(cell.endswith(':') for cell in rule[1:])
  assert rows == EXPECTED_ROWS
  # Labels left-justified, numbers right-justified, ± under ± in the source.
  lines = table.splitlines()
  assert lines[4].startswith('| full     |     1 |')
  assert lines[2].index('±') == lines[3].index('±')


def test_summary_numbers(root):
  groups = run_groups.group(load(root), 'sampling')
  optimal, uniform, full = run_groups.summarize(groups, target=0.5, extra_columns=[VARIANCE])
  assert optimal.final_accuracy.mean == pytest.approx(0.7 / 3 + 0.6 / 3 + 0.45 / 3)
  assert optimal.final_accuracy.std == pytest.approx((0.031666667 / 2) ** 0.5)
  assert optimal.final_accuracy.n == 3
  assert optimal.rounds_to_target == run_groups.Stat(3.0, pytest.approx(2**0.5), 2)
  assert optimal.bits_to_target.mean == 400 and optimal.bits_to_target.n == 2
  assert optimal.seconds_per_round == 2.0
  assert optimal.extras[VARIANCE].mean == pytest.approx(0.25)
  assert optimal.extras[VARIANCE].std == pytest.approx(0.05)
  assert uniform.rounds_to_target.n == 0 and uniform.extras[VARIANCE].n == 0
  assert full.final_accuracy.mean == 0.8 and full.final_accuracy.std != full.final_accuracy.std
  assert tables.bit_unit([optimal, uniform, full]) == (1e3, 'kbit')


def test_default_grouping_and_no_target(root):
  groups = run_groups.group(load(root))
  assert list(groups) == ['sampling=optimal', 'sampling=uniform', 'sampling=full']
  summaries = run_groups.summarize(groups)
  header, _, rows = parse_table(tables.markdown_table(summaries))
  assert header == [
    'group',
    'seeds',
    'last round',
    'final accuracy',
    'final loss',
    'best accuracy',
    'total kbit',
    's/round (median)',
  ]
  assert rows[0][3] == '0.5833 ± 0.1258'


def test_truncate_and_unfinished_runs(root):
  runs = load(root)
  cut = [run_groups.truncate(run, 2) for run in runs]
  groups = run_groups.group(cut, 'sampling')
  optimal = run_groups.summarize(groups, target=0.5)[0]
  # At round 2: accuracy 0.50, 0.40, 0.48: mean 0.46, std sqrt((0.0016+0.0036+0.0004)/2) = 0.05292.
  assert optimal.final_accuracy.mean == pytest.approx(0.46)
  assert optimal.final_accuracy.std == pytest.approx(0.0028**0.5)
  assert optimal.rounds_to_target == run_groups.Stat(
    2.0, pytest.approx(float('nan'), nan_ok=True), 1
  )
  assert optimal.total_bits.mean == 300 and optimal.last_rounds == (2, 2, 2)
  assert run_groups.incomplete_runs(runs) == []
  assert [(r.name, last, planned) for r, last, planned in run_groups.incomplete_runs(cut, 3)] == [
    (r.name, 2, 3) for r in runs
  ]
  with pytest.raises(ValueError, match='has no round <= -1'):
    run_groups.truncate(runs[0], -1)


def test_label_key_refuses_to_average_different_configurations(tmp_path):
  root = tmp_path / 'results'
  write_run(root, 'optimal', 0, RUNS[('optimal', 0)], client_learning_rate=0.1)
  write_run(root, 'optimal', 1, RUNS[('optimal', 1)], client_learning_rate=0.3)
  runs = plotting.load_runs([f'{root}/digits_*'])
  with pytest.raises(
    ValueError,
    match=r"sampling=optimal differ in 'client_learning_rate' "
    r'\(digits_optimal_seed0: 0.1, digits_optimal_seed1: 0.3\)',
  ):
    run_groups.group(runs, 'sampling')
  with pytest.raises(ValueError, match="has no hyper-parameter 'optimizer'"):
    run_groups.group(runs, 'optimizer')


def assert_png(path):
  with open(path, 'rb') as f:
    assert f.read(8) == PNG_MAGIC
  assert plotting.is_own_plot(path)


def _report_main(**flag_values):
  """``bin.report``'s main with `flag_values`, under its own flags.

  (They clash with ``bin.plot``'s.)
  """
  with fault_harness.flags_of('report') as report_bin, flagsaver.as_parsed(**flag_values):
    report_bin.main(['report'])


def flag_values(root, output_dir):
  """The flags of a full report, as strings for `flagsaver.as_parsed`."""
  return dict(
    run_dirs=f'{root}/digits_*',
    label_key='sampling',
    target_accuracy='0.5',
    output_dir=str(output_dir),
    extra_columns=VARIANCE,
    title='Digits',
  )


def test_main_writes_report_and_rewrites_its_own(root, tmp_path, capsys):
  output_dir = tmp_path / 'docs' / 'experiments' / 'digits'
  for _ in range(2):  # The second run replaces the files the first one wrote.
    _report_main(**flag_values(root, output_dir))
  printed = capsys.readouterr().out
  header, _, rows = parse_table('\n'.join(printed.splitlines()[:5]))
  assert header == EXPECTED_HEADER
  # Glob order: full, optimal, uniform.
  assert rows == [EXPECTED_ROWS[2], EXPECTED_ROWS[0], EXPECTED_ROWS[1]]
  assert_png(output_dir / 'accuracy_rounds.png')
  assert_png(output_dir / 'accuracy_bits.png')
  text = (output_dir / 'results.md').read_text()
  assert text.splitlines()[0] == report.MARKER
  assert '# Digits' in text
  assert (
    f"python -m bin.report --run_dirs='{root}/digits_*' --label_key=sampling "
    f'--target_accuracy=0.5 --extra_columns=selection/weight_variance --title=Digits '
    f'--output_dir={output_dir}'
  ) in text
  assert '| optimal  |     3 |' in text
  assert '![eval/accuracy vs round](accuracy_rounds.png)' in text
  assert '| clients_per_round | 10' in text
  assert 'seeds             | full: 0; optimal: 0, 1, 2; uniform: 0, 1' in text


def test_refuses_to_overwrite_a_foreign_results_md(root, tmp_path):
  output_dir = tmp_path / 'report'
  output_dir.mkdir()
  notes = output_dir / 'results.md'
  notes.write_text('# Hand-written notes\n')
  with pytest.raises(SystemExit) as exit_info:
    _report_main(run_dirs=f'{root}/digits_*', output_dir=str(output_dir))
  message = str(exit_info.value.code)
  assert message.startswith('Error: Refusing to overwrite') and '\n' not in message
  assert notes.read_text() == '# Hand-written notes\n'
  assert sorted(os.listdir(output_dir)) == ['results.md']  # No plot written either.


@pytest.mark.parametrize(
  'make_input, expected',
  [
    (lambda root: f'{root}/cifar_*', "Error: The pattern '.*/cifar_\\*' matches no directory."),
    (
      lambda root: write_run(root, 'broken', 0, dict(RUNS[('uniform', 0)], accuracy=[None] * 5)),
      "Error: '.*digits_broken_seed0/metrics.csv' has no 'eval/accuracy' value yet",
    ),
  ],
)
def test_bad_input_is_one_error_line(tmp_path, make_input, expected):
  root = tmp_path / 'results'
  root.mkdir()
  with pytest.raises(SystemExit, match=expected) as exit_info:
    _report_main(run_dirs=str(make_input(root)), output_dir=str(tmp_path / 'out'))
  assert '\n' not in str(exit_info.value.code)
  assert not (tmp_path / 'out').exists()


def test_unknown_extra_column_lists_the_columns(root, tmp_path):
  groups = run_groups.group(load(root), 'sampling')
  with pytest.raises(
    ValueError,
    match="No run has a numeric column 'selection/label_kl'; the "
    'columns are: eval/accuracy, eval/loss',
  ):
    run_groups.summarize(groups, extra_columns=['selection/label_kl'])


def test_binary_end_to_end(root, tmp_path, capfd):
  output_dir = tmp_path / 'out'
  outcome = fault_harness.run_binary(
    'report',
    run_dirs=f'{root}/digits_optimal_*',
    label_key='sampling',
    target_accuracy=0.5,
    max_round=2,
    output_dir=output_dir,
  )
  assert outcome.exit_code == 0, outcome
  header, _, rows = parse_table('\n'.join(capfd.readouterr().out.splitlines()[:3]))
  # Bits in bit: the largest mean total (300 at round 2) is < 1e3.
  assert header[6:8] == ['rounds to 50%', 'bit to 50%']
  # Seconds of rounds 1-2: 1, 2, 1, 1, 2, 2: median 1.5.
  assert rows == [
    [
      'optimal',
      '3',
      '2',
      '0.4600 ± 0.0529',
      '1.4000 ± 0.2000',
      '0.4600 ± 0.0529',
      '2.0 (1/3)',
      '200 (1/3)',
      '300 ± 100',
      '1.50',
    ]
  ]
  assert 'Only rounds up to 2 are counted.' in (output_dir / 'results.md').read_text()
  assert_png(output_dir / 'accuracy_bits.png')


def test_panels_pivot_tables_match_hand_computed_values(tmp_path):
  # Two availability modes; each panel is grouped by sampling on its own.
  for mode, sampling, seed, values in [
    ('IDL', 'optimal', 0, RUNS['optimal', 0]),
    ('IDL', 'optimal', 1, RUNS['optimal', 1]),
    ('IDL', 'uniform', 0, RUNS['uniform', 0]),
    ('IDL', 'uniform', 1, RUNS['uniform', 1]),
    ('LN', 'optimal', 0, RUNS['optimal', 2]),
    ('LN', 'full', 0, RUNS['full', 0]),
  ]:
    write_run(tmp_path / 'runs' / mode, sampling, seed, values, availability=mode)
  runs = plotting.load_runs(f'{tmp_path}/runs/*/digits_*')
  written = report.write_report(
    runs, tmp_path / 'out', command='regenerate', label_key='sampling', panel_key='availability'
  )
  text = (tmp_path / 'out' / 'results.md').read_text().split('\n\n')
  accuracy = text.index('Final accuracy (eval/accuracy), mean ± std over seeds:') + 1
  loss = text.index('Lowest evaluation loss (eval/loss), mean ± std over seeds:') + 1
  # By hand: optimal/IDL final 0.70, 0.60 -> 0.65 ± 0.0707, lowest loss 0.8, 1.0 -> 0.9 ± 0.1414;
  # uniform/IDL 0.30, 0.35 -> 0.325 ± 0.0354, losses 1.8, 1.7 -> 1.75 ± 0.0707;
  # optimal/LN (one seed) 0.45, 1.3; full/LN 0.80, 0.5; uniform never ran under LN, full
  # never under IDL.
  header, _, rows = parse_table(text[accuracy])
  assert header == ['sampling', 'IDL', 'LN']
  assert rows == [
    ['optimal', '0.6500 ± 0.0707', '0.4500'],
    ['uniform', '0.3250 ± 0.0354', '—'],
    ['full', '—', '0.8000'],
  ]
  _, _, rows = parse_table(text[loss])
  assert rows == [
    ['optimal', '0.9000 ± 0.1414', '1.3000'],
    ['uniform', '1.7500 ± 0.0707', '—'],
    ['full', '—', '0.5000'],
  ]
  assert [s.label for s in written.summaries] == [
    'IDL · optimal',
    'IDL · uniform',
    'LN · full',
    'LN · optimal',
  ]
  assert written.table.splitlines()[0].startswith('| availability · sampling ')
  for path in written.plot_paths:
    assert_png(path)
  write_run(tmp_path / 'runs' / 'none', 'uniform', 0, RUNS['uniform', 0])
  with pytest.raises(ValueError, match="has no hyper-parameter 'availability' to split"):
    report.write_report(
      plotting.load_runs(f'{tmp_path}/runs/*/digits_*'),
      tmp_path / 'out',
      command='regenerate',
      label_key='sampling',
      panel_key='availability',
    )
