"""Tests for the benchmark's page (tff_sampling/analysis/benchmark_page.py, benchmark_report.py,
benchmark_heatmap.py) on hand-made runs: a tuning-only cell gives its rates to a reported cell,
which alone is ranked and drawn; cells whose runs are not all in say how far they are."""

import dataclasses
import os
import re

import fault_harness
import numpy as np
import pytest

from bin import experiment_config
from tff_sampling.analysis import benchmark_contrasts
from tff_sampling.analysis import benchmark_page
from tff_sampling.analysis import benchmark_report
from tff_sampling.analysis import benchmark_time
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import raw_metrics
from tff_sampling.runtime import results

COMMON = """\
--binary=benchmark
--methods=uniform,md
--baseline=uniform
--final_k=1
--targets=0.5
--task=digits
--rounds=2
"""
IDEAL = COMMON + '--title=ideal cell\n--learning_rates=0.2,0.1\n--tuning_seed=100\n--seeds=0\n'
SKEWED = COMMON + '--title=skewed cell\n--learning_rates_from=ideal\n--seeds=3\n'

# Final accuracy of each tuning run: uniform is best at 0.1, MD at 0.2.
TUNING = {('uniform', 0.2): 0.3, ('uniform', 0.1): 0.4, ('md', 0.2): 0.6, ('md', 0.1): 0.5}
# Reported seeds at those rates: MD is ahead by 0.1, 0.2, 0.15 (mean 0.15).
FINAL = {
  ('uniform', 0): 0.40,
  ('uniform', 1): 0.50,
  ('uniform', 2): 0.45,
  ('md', 0): 0.50,
  ('md', 1): 0.70,
  ('md', 2): 0.60,
}
# Clients active in rounds 1 and 2 of each reported seed, the same for every method.
ACTIVE = {0: 10, 1: 11, 2: 15}


def _csv(final, active='', examples=50, seconds=None):
  """Rounds 0-2, evaluated at each; 100 bits uploaded and `examples` trained a round; under a
  system model (`seconds` simulated a round) also the simulated time since round 1."""
  lines = [
    f'{results.ROUND_COLUMN},eval/accuracy,train/loss,round_seconds,{results.BITS_COLUMN},'
    f'{benchmark_report.ACTIVE_COLUMN},{evidence.EXAMPLES_COLUMN}',
    '0,0.1,,,0,,',
    f'1,0.2,1.0,1.0,100,{active},{examples}',
    f'2,{final},1.0,1.0,200,{active},{examples}',
  ]
  if seconds is not None:
    lines = [
      f'{line},{value}'
      for line, value in zip(lines, [evidence.SECONDS_COLUMN, 0, seconds, 2 * seconds])
    ]
  return '\n'.join(lines) + '\n'


def _per_seed(value, seed):
  """A method's simulated seconds a round: one for every seed, or a tuple by seed."""
  return value[seed] if isinstance(value, tuple) else value


def _cell(grid, name, text, runs, active=ACTIVE, seconds=None):
  folder = grid / name
  folder.mkdir(parents=True)
  config = folder / experiment_config.CONFIG_FILENAME
  config.write_text(text)
  if not runs:  # Not run yet: no raw metrics.
    return str(config)
  runs_dir = grid.parent / 'runs' / name
  made = [
    results.load_run(
      fault_harness.write_run(
        runs_dir / f'lr{rate:g}',
        f'{method}_seed{seed}',
        {'sampling': method, 'seed': seed, 'client_learning_rate': rate, 'rounds': 2},
        # A `+optimal` method trains three times the clients that upload.
        _csv(
          final,
          active.get(seed, ''),
          examples=150 if '+' in method else 50,
          seconds=None if seconds is None else _per_seed(seconds[method], seed),
        ),
      )
    )
    for method, rate, seed, final in runs
  ]
  raw_metrics.write(
    made, folder / raw_metrics.FILENAME, names=[os.path.relpath(r.path, runs_dir) for r in made]
  )
  return str(config)


@pytest.fixture
def page(tmp_path):
  grid = tmp_path / 'grid'
  ideal = _cell(grid, 'ideal', IDEAL, [(m, r, 100, final) for (m, r), final in TUNING.items()])
  rates = {'uniform': 0.1, 'md': 0.2}
  skewed = _cell(
    grid, 'skewed', SKEWED, [(m, rates[m], s, final) for (m, s), final in FINAL.items()]
  )
  cells = [experiment_config.committed_cell(c) for c in (ideal, skewed)]
  assert [cell.pending for cell in cells] == ['', '']  # Both complete.
  path = tmp_path / 'benchmark.md'
  written = benchmark_page.write(cells, str(path), command='regenerate')
  return grid, path.read_text(), written


def _section(text, title):
  return text.split(f'## {title}\n', 1)[1].split('\n## ', 1)[0]


def test_a_tuning_only_cell_shows_its_rates_and_is_not_ranked(page):
  grid, text, written = page
  ideal = _section(text, 'ideal cell')
  assert 'Tuning only (seed 100, no seed reported)' in ideal
  rows = {
    r.split('|')[1].strip(): [c.strip() for c in r.split('|')[2:-1]]
    for r in ideal.splitlines()
    if re.match(r'\| (uniform|md) ', r)
  }
  assert rows == {'uniform': ['0.3000', '**0.4000**'], 'md': ['**0.6000**', '0.5000']}
  assert not re.search(r'^\| \d+\. ', ideal, re.M)  # No ranking.
  assert not any(p.startswith(str(grid / 'ideal')) for p in written)  # Nothing drawn.


def test_the_reported_cell_ranks_at_the_borrowed_rates(page):
  grid, text, written = page
  skewed = _section(text, 'skewed cell')
  ranked = [r for r in skewed.splitlines() if re.match(r'\| \d+\. ', r)]
  assert [r.split('|')[1].strip() for r in ranked] == ['1. md (lr 0.2)', '2. uniform (lr 0.1)']
  md = [c.strip() for c in ranked[0].split('|')[1:-1]]
  assert md[1] == '3' and md[2] == '0.6000 ± 0.1000'
  # Paired differences 0.1, 0.2, 0.15: mean 0.15, sd 0.05, t(0.975, 2) = 4.303.
  half = 4.302653 * 0.05 / 3**0.5
  assert md[3] == f'+0.1500 [{0.15 - half:+.4f}, {0.15 + half:+.4f}] ahead'
  assert str(grid / 'skewed' / 'accuracy_bits.png') in written


def test_each_cell_and_the_grid_say_their_machine_time(page, tmp_path):
  grid, text, _ = page
  # Every run released rounds 1 and 2 at 1.0 s each (round 0 trains nothing): the tuning
  # cell's 4 runs trained 8 s, the reported cell's 6 runs 12 s.
  ideal, skewed = (
    experiment_config.committed_cell(str(grid / name / experiment_config.CONFIG_FILENAME))
    for name in ('ideal', 'skewed')
  )
  assert benchmark_report.machine_hours(ideal) == pytest.approx(8 / 3600, rel=1e-12)
  assert benchmark_report.machine_hours(skewed) == pytest.approx(12 / 3600, rel=1e-12)
  assert 'Machine time: 0.0 run-hours of training rounds over its 4 runs' in _section(
    text, 'ideal cell'
  )
  assert 'over its 6 runs' in _section(text, 'skewed cell')
  assert 'Machine time of the grid: 0.0 run-hours' in text


def test_a_reported_cell_says_how_many_clients_are_active_a_round(page, tmp_path):
  _, text, _ = page
  # The baseline's seeds 0, 1, 2 record 10, 11, 15 active clients in rounds 1 and 2 (round 0
  # records none): 12.0 on average. The tuning cell, which is not ranked, has no such line.
  assert 'Clients active a round: 12.0 on average' in _section(text, 'skewed cell')
  assert 'Clients active a round' not in _section(text, 'ideal cell')
  # Runs that do not record availability give no line.
  bare = _cell(
    tmp_path / 'bare',
    'bare',
    SKEWED.replace('--learning_rates_from=ideal', '--learning_rates=0.1\n--tuning_seed=100'),
    [(m, 0.1, s, 0.5) for m in ('uniform', 'md') for s in (0, 1, 2, 100)],
    active={},
  )
  cell = experiment_config.committed_cell(bare)
  assert not cell.pending and benchmark_report.active_clients(cell) is None


def test_the_overview_places_each_method_in_each_complete_cell(page, tmp_path):
  grid, text, _ = page
  glance = _section(text, 'At a glance')
  rows = {
    r.split('|')[1].strip(): [c.strip() for c in r.split('|')[2:-1]]
    for r in glance.splitlines()
    if re.match(r'\| \d+\. ', r)
  }
  # One reported cell (the tuning cell has no column): MD ahead at fixed rounds and, having
  # uploaded and trained what uniform does, at the fixed budget and client work too.
  assert rows == {'1. md': ['1 (+/+/+)', '1.0'], '2. uniform': ['2 (baseline)', '2.0']}
  assert re.search(r'^\| method +\| +skewed \| mean rank \|$', glance, re.M)
  # A second cell where MD is second and no difference is detected (pairs +0.1, −0.1, −0.01).
  later = _cell(
    grid,
    'later',
    SKEWED.replace('skewed cell', 'later cell'),
    [
      ('uniform', 0.1, 0, 0.40),
      ('uniform', 0.1, 1, 0.50),
      ('uniform', 0.1, 2, 0.45),
      ('md', 0.2, 0, 0.50),
      ('md', 0.2, 1, 0.40),
      ('md', 0.2, 2, 0.44),
    ],
  )
  cells = [
    experiment_config.committed_cell(str(grid / name / experiment_config.CONFIG_FILENAME))
    for name in ('ideal', 'later', 'skewed')
  ]
  assert later and all(not cell.pending for cell in cells)
  both = benchmark_page.benchmark_markdown(cells, command='regenerate', page_dir=str(tmp_path))
  rows = {
    r.split('|')[1].strip(): [c.strip() for c in r.split('|')[2:-1]]
    for r in _section(both, 'At a glance').splitlines()
    if re.match(r'\| \d+\. ', r)
  }
  # Mean ranks tie at 1.5: the names break the tie.
  assert rows == {
    '1. md': ['2 (=/=/=)', '1 (+/+/+)', '1.5'],
    '2. uniform': ['1 (baseline)', '2 (baseline)', '1.5'],
  }


def test_no_overview_until_a_reported_cell_is_complete(tmp_path):
  grid = tmp_path / 'grid'
  ideal = _cell(grid, 'ideal', IDEAL, [(m, r, 100, final) for (m, r), final in TUNING.items()])
  skewed = _cell(grid, 'skewed', SKEWED, [('uniform', 0.1, 0, 0.4)])
  cells = [experiment_config.committed_cell(c) for c in (ideal, skewed)]
  text = benchmark_page.benchmark_markdown(cells, command='regenerate', page_dir=str(tmp_path))
  assert '## At a glance' not in text


def test_bin_report_on_a_tuning_only_cell_writes_its_tuning_alone(page):
  grid, _, _ = page
  config = str(grid / 'ideal' / experiment_config.CONFIG_FILENAME)
  (path,) = evidence_report.write(
    experiment_config.load(config),
    experiment_config.committed_runs(config),
    grid / 'ideal',
    command='regenerate',
  )
  with open(path, encoding='utf-8') as f:
    text = f.read()
  assert sorted(os.listdir(grid / 'ideal')) == ['experiment.flags', 'results.md', 'runs.jsonl.gz']
  assert 'This experiment only tunes' in text and '`--learning_rates_from=ideal`' in text
  assert '## Tuning (seed 100)' in text and '| **0.6000** |' in text
  assert '## Verdicts' not in text and 'Seeds' not in text


def test_unfinished_cells_say_how_far_they_are_and_are_neither_ranked_nor_drawn(tmp_path):
  grid = tmp_path / 'grid'
  # MD's tuning at rate 0.1 is missing, and the skewed cell has not run.
  ideal = _cell(
    grid,
    'ideal',
    IDEAL,
    [(m, r, 100, final) for (m, r), final in TUNING.items() if (m, r) != ('md', 0.1)],
  )
  skewed = _cell(grid, 'skewed', SKEWED, [])
  cells = [experiment_config.committed_cell(c) for c in (ideal, skewed)]
  assert [cell.pending for cell in cells] == [
    '3 runs in, at least 1 to go',
    '0 runs in; it waits for the tuning of ideal',
  ]
  assert cells[1].spec.learning_rates == ()  # Not resolved: the sibling has not tuned.
  path = tmp_path / 'benchmark.md'
  written = benchmark_page.write(cells, str(path), command='regenerate')
  text = path.read_text()
  assert written == [str(path)]  # No plot.
  assert '**In progress:** 0 of 2 cells are complete' in text
  assert '*In progress:* 3 runs in, at least 1 to go.' in _section(text, 'ideal cell')
  assert '*In progress:* 0 runs in; it waits for the tuning of ideal.' in _section(
    text, 'skewed cell'
  )
  assert not re.search(r'^\| (\d+\. )?(uniform|md) ', text, re.M)  # No table at all.


def test_a_complete_tuning_cell_lets_its_sibling_wait_for_its_own_runs(tmp_path):
  grid = tmp_path / 'grid'
  ideal = _cell(grid, 'ideal', IDEAL, [(m, r, 100, final) for (m, r), final in TUNING.items()])
  # Two of the six reported runs are in.
  skewed = _cell(grid, 'skewed', SKEWED, [('uniform', 0.1, 0, 0.4), ('md', 0.2, 0, 0.5)])
  cells = [experiment_config.committed_cell(c) for c in (ideal, skewed)]
  assert [cell.pending for cell in cells] == ['', '2 runs in, at least 4 to go']
  text = benchmark_page.benchmark_markdown(cells, command='regenerate', page_dir=str(tmp_path))
  assert '**In progress:** 1 of 2 cells are complete' in text
  assert not re.search(r'^\| \d+\. ', text, re.M)  # The tuning cell is shown, nothing ranked.


def _three_seed_cell(tmp_path, name, finals, seconds=None):
  """A reported cell `name` (title '<name> cell') of the methods of `finals` (method -> final
  accuracy of seeds 0-2), all at rate 0.1; timed if `seconds` (method -> simulated seconds a
  round, or a tuple of them by seed)."""
  text = (
    COMMON.replace('--methods=uniform,md', f'--methods={",".join(finals)}')
    + f'--title={name} cell\n--learning_rates=0.1\n--tuning_seed=100\n--seeds=3\n'
  )
  runs = [(m, 0.1, s, v[s]) for m, v in finals.items() for s in range(3)]
  return experiment_config.committed_cell(
    _cell(tmp_path / 'grid', name, text, runs, seconds=seconds)
  )


def test_optimal_uploads_are_compared_with_the_same_sampler_alone(tmp_path):
  # MD with optimal uploads minus MD alone: 0.1, 0.05, 0.1 (mean 0.0833, sd 0.0289); every
  # run uploads the same bits, so the budget column pairs the same final evaluations. At
  # uniform's client work (100 examples) MD alone has trained its whole run (final accuracy)
  # and MD with optimal uploads, 150 examples a round, only round 0 (accuracy 0.1): 0.1 − 0.5,
  # 0.1 − 0.7, 0.1 − 0.6, mean −0.5, sd 0.1.
  finals = {
    'uniform': (0.40, 0.50, 0.45),
    'md': (0.50, 0.70, 0.60),
    'md+optimal': (0.60, 0.75, 0.70),
  }
  cell = _three_seed_cell(tmp_path, 'paired', finals)
  assert not cell.pending
  [effect] = benchmark_report.optimal_effects(cell)  # Uniform has no +optimal version.
  assert effect.sampler == 'md'
  assert effect.final.differences == pytest.approx((0.1, 0.05, 0.1))
  assert effect.budget.differences == pytest.approx((0.1, 0.05, 0.1))
  assert effect.work.differences == pytest.approx((-0.4, -0.6, -0.5))
  half = 4.302653 * (0.0025 / 3) ** 0.5 / 3**0.5  # t(0.975, 2) · sd / √3, sd² = 0.0025/3.
  expected = f'+0.0833 [{0.25 / 3 - half:+.4f}, {0.25 / 3 + half:+.4f}] ahead'
  text = benchmark_page.benchmark_markdown([cell], command='regenerate', page_dir=str(tmp_path))
  glance = _section(text, 'What optimal uploads change')
  assert re.search(r'^\| md +\| +\+/\+/− \|$', glance, re.M)
  assert not re.search(r'^\| uniform ', glance, re.M)
  row = [r for r in _section(text, 'paired cell').splitlines() if r.startswith('| md ')]
  half = 4.302653 * 0.1 / 3**0.5
  work = f'-0.5000 [{-0.5 - half:+.4f}, {-0.5 + half:+.4f}] behind'
  assert [c.strip() for c in row[0].split('|')[1:-1]] == ['md', expected, expected, work]


def test_no_optimal_section_without_a_sampler_run_both_ways(page):
  _, text, _ = page
  assert '## What optimal uploads change' not in text
  assert 'What optimal uploads change, sampler by sampler' not in text


def test_the_page_opens_with_the_picture_of_every_method_against_the_baseline(page):
  from scipy import stats

  from tff_sampling.analysis import benchmark_heatmap
  from tff_sampling.analysis import plotting

  grid_dir, text, written = page
  picture = str(grid_dir / benchmark_heatmap.FILENAME)
  assert picture in written and plotting.is_own_plot(picture)
  # Right after the regenerate command, before anything else.
  after_command = text.split('regenerate\n```\n', 1)[1].lstrip('\n')
  assert after_command.startswith(
    f'![every method against the baseline, every cell](grid/{benchmark_heatmap.FILENAME})'
  )
  cells = [
    experiment_config.committed_cell(str(grid_dir / name / experiment_config.CONFIG_FILENAME))
    for name in ('ideal', 'skewed')
  ]
  data = benchmark_heatmap.grid(cells)
  # The tuning-only cell is not drawn; MD against uniform in the skewed cell: +0.1, +0.2, +0.15.
  assert data.methods == ('md',) and data.cells == ('skewed',)
  # Every run ends within uniform's 200 bits and 100 examples trained.
  for panel in ('final', 'budget', 'work'):
    assert data.difference[panel][0, 0] == pytest.approx(0.15)
  # Each interval alone excludes 0 (p = 0.035), but Holm triples the smallest of the three
  # equal p-values to 0.1: no dot.
  p_value = stats.ttest_1samp([0.1, 0.2, 0.15], 0.0).pvalue
  assert p_value < 0.05 < 3 * p_value
  assert not any(data.decided[panel].any() for panel in ('final', 'budget', 'work'))


def test_the_leader_and_every_method_are_compared_with_the_next_and_with_full(tmp_path):
  finals = {
    'uniform': (0.40, 0.50, 0.45),
    'md': (0.50, 0.70, 0.60),
    'full': (0.62, 0.73, 0.66),
    'md+optimal': (0.60, 0.75, 0.70),
  }
  cell = _three_seed_cell(tmp_path, 'contrast', finals)
  ranked, budget = benchmark_report.rows(cell)
  # Means: md+optimal 0.6833, full 0.67, md 0.6, uniform 0.45; uniform trains 100 examples.
  assert [row.method for row in ranked] == ['md+optimal', 'full', 'md', 'uniform']
  assert budget.examples == 100 and budget.bits == 200
  leader = benchmark_contrasts.leader(ranked)
  assert [(c.first, c.second) for c in leader] == [
    ('md+optimal (lr 0.1)', 'full (lr 0.1)'),
    ('md+optimal (lr 0.1)', 'md (lr 0.1)'),
    ('md+optimal (lr 0.1)', 'uniform (lr 0.1)'),
  ]
  # md+optimal − md at fixed rounds: 0.1, 0.05, 0.1, ahead alone (p = 0.0198); in a family of
  # nine its Holm-adjusted p-value is larger.
  final, bits, work = leader[1].differences
  assert final.differences == pytest.approx((0.1, 0.05, 0.1))
  assert leader[1].raw[0] == 'ahead'
  # At 100 examples md+optimal has trained only round 0 (0.1); md its whole run.
  assert work.differences == pytest.approx((-0.4, -0.6, -0.5)) and leader[1].raw[2] == 'behind'
  p_values = [
    evidence.decisive_test(d, evidence.Direction.HIGHER)[0] for c in leader for d in c.differences
  ]
  adjusted = evidence.holm_adjusted(p_values)
  expected = [
    'ahead' if q < 0.05 and d.mean > 0 else 'behind' if q < 0.05 else evidence.Verdict.NO_DIFFERENCE
    for q, d in zip(adjusted, [d for c in leader for d in c.differences])
  ]
  assert [w for c in leader for w in c.holm] == expected
  # Full participation is compared with every other method, itself left out.
  against = benchmark_contrasts.against_full(ranked)
  assert [c.first for c in against] == ['md+optimal (lr 0.1)', 'md (lr 0.1)', 'uniform (lr 0.1)']
  assert all(c.second == 'full (lr 0.1)' for c in against)
  # uniform − full: −0.22, −0.23, −0.21 at fixed rounds.
  assert against[2].differences[0].differences == pytest.approx((-0.22, -0.23, -0.21))
  page = benchmark_page.benchmark_markdown([cell], command='regenerate', page_dir=str(tmp_path))
  section = _section(page, 'contrast cell')
  assert 'The leader against the next 3 (one Holm family):' in section
  assert 'Every method against full participation (one Holm family):' in section
  assert re.search(r'^\| uniform \(lr 0\.1\) − full \(lr 0\.1\) +\| +-0\.2200 \[', section, re.M)


def test_a_timed_cell_also_compares_at_the_baseline_s_simulated_time(tmp_path):
  # Uniform's rounds take 10 simulated seconds (20 s in all), MD's 15 s: by 20 s MD has
  # finished round 1 only (accuracy 0.2), uniform its whole run. MD − uniform at fixed time:
  # 0.2 − 0.40, 0.2 − 0.50, 0.2 − 0.45; at fixed rounds +0.1, +0.2, +0.15.
  finals = {'uniform': (0.40, 0.50, 0.45), 'md': (0.50, 0.70, 0.60)}
  cell = _three_seed_cell(tmp_path, 'timed', finals, seconds={'uniform': 10, 'md': 15})
  ranked, budget = benchmark_report.rows(cell)
  assert budget.seconds == 20
  assert benchmark_report.measures(budget) == (*benchmark_report.MEASURES, benchmark_report.TIME)
  md = ranked[0]
  assert md.method == 'md'
  assert md.time_difference.differences == pytest.approx((-0.2, -0.3, -0.25))
  assert md.final_difference.differences == pytest.approx((0.1, 0.2, 0.15))
  text = benchmark_page.benchmark_markdown([cell], command='regenerate', page_dir=str(tmp_path))
  table = _section(text, 'timed cell')
  assert 'accuracy at 20 simulated s' in table and 'Holm (final/bits/work/time)' in table
  assert f'{benchmark_page.READING_GUIDE} {benchmark_page.TIMED_GUIDE}' in text  # How to read it.
  # Time to the 50% target: uniform reaches it in seed 1 only, at round 2 (20 s); MD in every
  # seed at round 2 (30 s).
  assert 'simulated s to 50%' in table
  assert re.search(r'^\| 1\. md \(lr 0\.1\) .*\| +30 \| +[0-9.e-]+ \| +[0-9.]+ \|$', table, re.M)
  assert re.search(
    r'^\| 2\. uniform \(lr 0\.1\) .*\| +20 \(1/3\) \| +[0-9.e-]+ \| +[0-9.]+ \|$', table, re.M
  )
  half = 4.302653 * 0.05 / 3**0.5  # t(0.975, 2) · sd / √3 with sd 0.05.
  assert f'-0.2500 [{-0.25 - half:+.4f}, {-0.25 + half:+.4f}] behind' in table
  # The leader's contrast gains the same column, and the picture a fourth panel.
  [contrast] = benchmark_contrasts.leader(ranked, benchmark_report.measures(budget))
  assert contrast.differences[3].differences == pytest.approx((-0.2, -0.3, -0.25))
  from tff_sampling.analysis import benchmark_heatmap

  data = benchmark_heatmap.grid([cell])
  assert [panel for panel, _ in data.panels] == ['final', 'budget', 'work', 'time']
  assert data.difference['time'][0, 0] == pytest.approx(-0.25)
  # A cell no system model timed keeps its three measures, and the page says nothing of time.
  untimed = _three_seed_cell(tmp_path, 'untimed', finals)
  assert benchmark_report.measures(benchmark_report.rows(untimed)[1]) == benchmark_report.MEASURES
  page = benchmark_page.benchmark_markdown([untimed], command='regenerate', page_dir=str(tmp_path))
  assert 'simulated s' not in page and 'simulated time' not in page
  assert [p for p, _ in benchmark_heatmap.grid([untimed]).panels] == ['final', 'budget', 'work']
  # Beside it, the time panel draws the timed cell alone; the other panels both cells.
  both = benchmark_heatmap.grid([cell, untimed])
  assert both.cells == ('timed', 'untimed') and np.isnan(both.difference['time'][0, 1])
  picture = benchmark_heatmap.figure(both, 'uniform')
  labels = [[t.get_text() for t in ax.get_xticklabels()] for ax in picture.axes[:4]]
  assert labels == [['timed', 'untimed']] * 3 + [['timed']]


def test_a_timed_cell_compares_the_time_to_target_with_runs_that_never_reach_it_as_bounds(tmp_path):
  # The 50% target is reached at round 2 or never; a run that never reaches it counts its
  # 2 rounds' seconds. Uniform: 20 s in every seed. MD: 30, 28, 32 s, so MD − uniform = 10, 8,
  # 12 (sd 2): later. MD+optimal never reaches it: 10 s bounds, −10 each, which would say
  # sooner had it reached it: undecided.
  finals = {
    'uniform': (0.50, 0.60, 0.55),
    'md': (0.50, 0.70, 0.60),
    'md+optimal': (0.40, 0.45, 0.30),
  }
  seconds = {'uniform': 10, 'md': (15, 14, 16), 'md+optimal': 5}
  cell = _three_seed_cell(tmp_path, 'timed', finals, seconds=seconds)
  times = {t.label.split(' ')[0]: t for t in benchmark_time.cell_times(cell)}
  assert times['md'].seconds == {0: 30, 1: 28, 2: 32} and not times['md'].censored
  assert times['md+optimal'].censored == {0, 1, 2}
  assert times['md'].difference.differences == pytest.approx((10, 8, 12))
  half = 4.302653 * 2 / 3**0.5  # t(0.975, 2) · sd / √3 with sd 2.
  assert (times['md'].difference.low, times['md'].difference.high) == pytest.approx(
    (10 - half, 10 + half), abs=1e-4
  )
  # Holm over the two comparisons: MD+optimal's cannot be decided (censored), so it enters
  # with p = 1 and MD's p (t = 10 / (2 / √3), 2 df), 0.013, is doubled: 0.026 < 0.05.
  assert (times['md'].raw, times['md'].holm) == ('later', 'later')
  assert (times['md+optimal'].raw, times['md+optimal'].holm) == ('undecided', 'undecided')
  assert times['uniform'].difference is None
  section = '\n'.join(benchmark_time.section(cell))
  assert 'Simulated seconds to 50% against uniform' in section
  assert re.search(
    r'^\| md \(lr 0\.1\) +\| +30 \| +\+10 \[\+5\.032, \+14\.97\] later \|$', section, re.M
  )
  assert re.search(
    r'^\| md\+optimal \(lr 0\.1\) +\| +≥ 10 \(0/3 reach\) \| .* undecided \|$', section, re.M
  )
  page = benchmark_page.benchmark_markdown([cell], command='regenerate', page_dir=str(tmp_path))
  assert section in page
  # Uniform misses the target in seeds 0 and 2 (20 s bounds): MD, 10 s later than those bounds,
  # is not found later, since uniform's true times may be longer: undecided again.
  finals = {'uniform': (0.40, 0.50, 0.45), 'md': (0.50, 0.70, 0.60)}
  censored = _three_seed_cell(tmp_path, 'censored', finals, seconds={'uniform': 10, 'md': 15})
  [md] = [t for t in benchmark_time.cell_times(censored) if t.label.startswith('md ')]
  assert md.difference.differences == pytest.approx((10, 10, 10))
  assert (md.raw, md.holm) == ('undecided', 'undecided')
  # No section without a system model.
  assert benchmark_time.section(_three_seed_cell(tmp_path, 'untimed', finals)) == []


def test_ranking_shift_between_two_versions_of_a_cell(tmp_path):
  from tools import ranking_shift

  # Before: MD − uniform = 0.1, 0.1001, 0.0999 (p ≈ 1e-5), ahead even after Holm over its
  # three measures; MD first. After: −0.1, +0.02, −0.05, no difference detected; uniform first.
  before = _three_seed_cell(
    tmp_path / 'before', 'shift', {'uniform': (0.40, 0.50, 0.45), 'md': (0.50, 0.6001, 0.5499)}
  )
  after = _three_seed_cell(
    tmp_path / 'after', 'shift', {'uniform': (0.60, 0.70, 0.65), 'md': (0.50, 0.72, 0.60)}
  )
  old, new = ranking_shift.standings(before), ranking_shift.standings(after)
  assert old['md'] == ranking_shift.Standing('0.1', 1, pytest.approx(0.55), ('+*', '+*'))
  assert new['md'] == ranking_shift.Standing('0.1', 2, pytest.approx(1.82 / 3), ('=', '='))
  assert new['uniform'].verdicts == () and new['uniform'].rank == 1
  lines = ranking_shift.shift_table(old, new).splitlines()
  assert lines[2:4] == [
    '| uniform | 0.1 → 0.1 | 2 → 1 | 0.450 → 0.650 | · → · | · → · |',
    '| md | 0.1 → 0.1 | 1 → 2 | 0.550 → 0.607 | +* → = | +* → = |',
  ]
  # Two methods in swapped order: tau −1; MD's two verdicts both changed.
  assert lines[-1] == (
    "Kendall's tau between the rankings: -1.00 over 2 methods; "
    '2 of 2 verdicts against the baseline changed.'
  )


def test_ranking_shift_names_a_missing_cell_or_revision(tmp_path):
  from tools import ranking_shift

  with pytest.raises(ValueError, match=r"No cell 'nope' in the working tree"):
    ranking_shift.cells_at(None, ['nope'], str(tmp_path))
  with pytest.raises(ValueError, match=r"git cannot read docs/benchmark at 'no-such-revision'"):
    ranking_shift.cells_at('no-such-revision', ['synthetic_LDF'], str(tmp_path))
  assert not os.listdir(tmp_path)


def test_a_cell_s_findings_open_its_section_once_it_is_complete(tmp_path):
  finals = {'uniform': (0.40, 0.50, 0.45), 'md': (0.50, 0.70, 0.60)}
  cell = _three_seed_cell(tmp_path, 'noted', finals)
  (tmp_path / 'grid' / 'noted' / benchmark_page.FINDINGS).write_text('**Noted.** MD leads.\n')
  page = tmp_path / 'benchmark.md'
  benchmark_page.write([cell], str(page), command='regenerate')
  section = _section(page.read_text(), 'noted cell')
  # Under the heading and the configuration, above the ranking.
  assert '**Noted.** MD leads.' in section
  assert section.index('**Noted.** MD leads.') < section.index('| 1. md (lr 0.1)')
  assert section.index('Machine time:') < section.index('**Noted.**')
  # A cell whose runs are not all in shows how far it is, not its findings.
  pending = dataclasses.replace(cell, pending='1 of 6 runs to go')
  text = benchmark_page.benchmark_markdown(
    [pending], command='regenerate', page_dir=str(tmp_path), findings={cell.folder: 'Noted.'}
  )
  assert '*In progress:* 1 of 6 runs to go.' in text and 'Noted.' not in text
