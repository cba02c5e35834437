"""Tests for an experiment's configuration (bin/experiment_config.py) and its spec
(tff_sampling/analysis/evidence_spec.py): claims, refusals, tuning, divergence."""

import dataclasses
import math
import os
import re
import textwrap

import fault_harness
import numpy as np
import pytest

from bin import experiment_config
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.runtime import results
from tff_sampling.runtime import run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = """\
# A comment line.
--binary=demo
--title=Demo check
--methods=optimal,uniform
--baseline=uniform
--learning_rates=0.2,0.1
--tuning_seed=50
--seeds=5
--final_k=2
--targets=0.5
--claims=optimal>uniform:final,optimal=uniform:auc@0.02,optimal<uniform:bits_to_0.5
--task=digits
--rounds=4
"""


def write_config(tmp_path, text=CONFIG, folder='my_experiment'):
  path = tmp_path / folder / experiment_config.CONFIG_FILENAME
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return str(path)


def test_load_splits_experiment_and_binary_flags(tmp_path):
  spec = experiment_config.load(write_config(tmp_path))
  assert spec.name == 'my_experiment'
  assert spec.title == 'Demo check'
  assert spec.binary == 'demo'
  assert spec.binary_flags == ('--task=digits', '--rounds=4')
  assert spec.methods == ('optimal', 'uniform')
  assert spec.learning_rates == (0.2, 0.1)
  assert spec.tuning_seed == 50 and spec.seeds == 5 and spec.final_k == 2
  assert spec.targets == (0.5,)
  assert [c.text for c in spec.claims] == [
    'optimal>uniform:final',
    'optimal=uniform:auc@0.02',
    'optimal<uniform:bits_to_0.5',
  ]
  assert spec.claims[1].direction == evidence.Direction.EQUAL and spec.claims[1].margin == 0.02
  assert spec.claims[2].target == 0.5
  assert spec.tuned and list(spec.reported_seeds) == [0, 1, 2, 3, 4]
  assert spec.extra_columns == ()
  with_columns = experiment_config.load(
    write_config(tmp_path, CONFIG + '--extra_columns=a/b,c\n', folder='other')
  )
  assert with_columns.extra_columns == ('a/b', 'c')
  assert with_columns.binary_flags == spec.binary_flags


@pytest.mark.parametrize(
  'change, message',
  [
    ('--seed=3\n', '--seed is set per run by bin.experiment'),
    ('--client_learning_rate=0.1\n', '--client_learning_rate is set per run'),
    ('--cache_dir=/data\n', '--cache_dir is set per run'),
    ('--noreset\n', '--noreset is set per run'),
    ('--tuning_seed=2\n', 'The tuning seed 2 is a reported seed'),
    ('--claims=optimal>full:final\n', "names 'full'"),
    ('--claims=optimal<uniform:rounds_to_0.9\n', 'add it to the targets'),
    ('--claims=optimal=uniform:final\n', 'give its margin'),
    ('--claims=optimal>uniform:best\n', "metric 'best'"),
    ('--learning_rates=optimal:0.1\n', 'give exactly one for each method'),
    ('--learning_rates=optimal:0.1,0.05\n', 'give every method a rate'),
    ('--learning_rates=optimal:0.1,uniform:fast\n', 'give comma-separated numbers'),
    ('--claims=optimal>>uniform:final\n', 'is not <method><op><baseline>'),
    ('--baseline=full\n', "The baseline 'full' is not one of the methods"),
    ('--learning_rates=0.1,fast\n', 'give comma-separated numbers'),
    ('--learning_rates=0.1,-1\n', 'finite and > 0'),
    ('--targets=50\n', 'in (0, 1]'),
    ('--binary=train\n', 'binary'),
    ('--seeds=-1\n', 'seeds must be >= 1 (0 only for a tuning-only experiment'),
    ('--seeds=0\n', 'A tuning-only experiment (seeds=0) reports nothing: drop its claims'),
  ],
)
def test_bad_configurations_are_refused_in_one_line(tmp_path, change, message):
  path = write_config(tmp_path, CONFIG + change)
  with pytest.raises(ValueError, match=re.escape(message)) as error:
    experiment_config.load(path)
  assert '\n' not in str(error.value) and path in str(error.value)


def test_required_flags_and_missing_files(tmp_path):
  with pytest.raises(ValueError, match='--methods is required'):
    experiment_config.load(write_config(tmp_path, '--binary=demo\n'))
  with pytest.raises(FileNotFoundError):
    experiment_config.load(str(tmp_path / 'nowhere.flags'))


def run_csv(accuracies, losses=None, bits=False):
  """Rows 0..n-1 evaluated every round; round 0 has no training metrics; with `bits`, r bits
  uploaded by round r."""
  lines = ['key,eval/accuracy,train/loss,round_seconds' + (',uplink/cumulative_bits' * bits)]
  for r, a in enumerate(accuracies):
    loss = '' if r == 0 else (losses[r] if losses else 1.0)
    seconds = '' if r == 0 else 1.0
    lines.append(f'{r},{a},{loss},{seconds}' + (f',{r}' * bits))
  return '\n'.join(lines) + '\n'


def test_tune_picks_the_best_rate_and_leaves_diverged_runs_out(tmp_path):
  spec = experiment_config.load(write_config(tmp_path))
  made = []
  rows = {
    # method, rate: final accuracies (final_k = 2 averages the last two).
    ('optimal', 0.2): ([0.1, 0.5, 0.7], None),  # 0.6
    ('optimal', 0.1): ([0.1, 0.4, 0.6], None),  # 0.5
    ('uniform', 0.2): ([0.1, 0.9, 0.9], [None, 1.0, 'nan']),  # NaN loss in round 2: diverged.
    ('uniform', 0.1): ([0.1, 0.2, 0.4], None),  # 0.3
  }
  for (method, rate), (accuracy, losses) in rows.items():
    made.append(
      fault_harness.write_run(
        tmp_path / f'lr{rate:g}',
        f'{method}_seed50',
        {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
        run_csv(accuracy, losses),
      )
    )
  tuning = evidence_spec.tune(spec, [results.load_run(d) for d in made])
  assert tuning.chosen == {'optimal': 0.2, 'uniform': 0.1}
  assert tuning.scores[('optimal', 0.2)] == pytest.approx(0.6)
  assert tuning.scores[('optimal', 0.1)] == pytest.approx(0.5)
  assert tuning.diverged_at == {('uniform', 0.2): 2}
  assert math.isnan(tuning.scores[('uniform', 0.2)])
  # A tuning run still training does not score (rounds 2 planned, 1 written).
  unfinished = fault_harness.write_run(
    tmp_path / 'lr0.05',
    'optimal_seed50',
    {'sampling': 'optimal', 'seed': 50, 'client_learning_rate': 0.2, 'rounds': 2},
    run_csv([0.1, 0.99]),
  )
  partial = evidence_spec.tune(spec, [*map(results.load_run, made), results.load_run(unfinished)])
  assert partial.scores[('optimal', 0.2)] == pytest.approx(0.6)
  # A grid rate not trained yet leaves the choice provisional: it is pending, not skipped.
  without = evidence_spec.tune(spec, [results.load_run(made[i]) for i in (0, 2, 3)])
  assert without.pending == {'optimal': 0.1} and without.chosen['optimal'] == 0.2
  # Without runs for a method, tuning says what to do.
  with pytest.raises(ValueError, match="Method 'uniform' has no finished tuning run"):
    evidence_spec.tune(spec, [results.load_run(d) for d in made[:2]])


def test_tuning_on_the_lowest_loss_picks_the_rate_of_the_lowest_loss(tmp_path):
  # Final accuracy (final_k = 2) prefers 0.2 for optimal; the lowest evaluation loss prefers
  # 0.1 (0.5 < 0.8), and a tie in loss goes to the larger rate (uniform: 0.2).
  config = write_config(tmp_path, CONFIG + '--tune_on=best_loss\n')
  spec = experiment_config.load(config)
  assert spec.tune_on == 'best_loss'
  made = []
  for (method, rate), (accuracy, loss) in {
    ('optimal', 0.2): ([0.1, 0.5, 0.7], [2.0, 0.9, 0.8]),
    ('optimal', 0.1): ([0.1, 0.4, 0.6], [2.0, 0.5, 0.7]),
    ('uniform', 0.2): ([0.1, 0.3, 0.3], [2.0, 1.0, 1.5]),
    ('uniform', 0.1): ([0.1, 0.4, 0.4], [2.0, 1.5, 1.0]),
  }.items():
    rows = ['key,eval/accuracy,eval/loss,train/loss,round_seconds']
    rows += [
      f'{r},{a},{x},{"" if r == 0 else 1.0},{"" if r == 0 else 1.0}'
      for r, (a, x) in enumerate(zip(accuracy, loss))
    ]
    made.append(
      fault_harness.write_run(
        tmp_path / f'lr{rate:g}',
        f'{method}_seed50',
        {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
        '\n'.join(rows) + '\n',
      )
    )
  runs = [results.load_run(d) for d in made]
  tuning = evidence_spec.tune(spec, runs)
  assert tuning.chosen == {'optimal': 0.1, 'uniform': 0.2}
  assert tuning.scores[('optimal', 0.1)] == pytest.approx(0.5)
  by_accuracy = evidence_spec.tune(dataclasses.replace(spec, tune_on='final'), runs)
  assert by_accuracy.chosen == {'optimal': 0.2, 'uniform': 0.1}
  with pytest.raises(ValueError, match="tune_on must be one of final, best_loss, got 'loss'"):
    dataclasses.replace(spec, tune_on='loss')


def test_a_tuning_only_experiment_wants_the_grid_and_nothing_else(tmp_path):
  text = CONFIG.replace('--seeds=5', '--seeds=0').replace(
    '--claims=optimal>uniform:final,optimal=uniform:auc@0.02,optimal<uniform:bits_to_0.5\n', ''
  )
  spec = experiment_config.load(write_config(tmp_path, text))
  assert spec.tuning_only and spec.tuned and list(spec.reported_seeds) == []
  assert not experiment_config.load(write_config(tmp_path, folder='reported')).tuning_only
  grid = [(m, r) for r in (0.2, 0.1) for m in ('optimal', 'uniform')]
  assert evidence_spec.missing_runs(spec, []) == [f'{m} at {r:g}, seed 50' for m, r in grid]
  runs = [
    results.load_run(
      fault_harness.write_run(
        tmp_path / f'lr{rate:g}',
        f'{method}_seed50',
        {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
        run_csv([0.1, 0.3, 0.3]),
      )
    )
    for method, rate in grid
  ]
  assert evidence_spec.missing_runs(spec, runs) == []  # No reported seed is wanted.
  # Without a grid there is nothing to tune: one rate and no seeds is refused.
  with pytest.raises(ValueError, match='seeds must be >= 1'):
    experiment_config.load(
      write_config(
        tmp_path, text.replace('--learning_rates=0.2,0.1', '--learning_rates=0.1'), 'one_rate'
      )
    )


def test_ties_go_to_the_larger_rate(tmp_path):
  spec = experiment_config.load(write_config(tmp_path))
  made = [
    fault_harness.write_run(
      tmp_path / f'lr{rate:g}',
      f'{method}_seed50',
      {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
      run_csv([0.1, 0.5, 0.5]),
    )
    for method in ('optimal', 'uniform')
    for rate in (0.1, 0.2)
  ]
  tuning = evidence_spec.tune(spec, [results.load_run(d) for d in made])
  assert tuning.chosen == {'optimal': 0.2, 'uniform': 0.2}


def _run(metrics, rounds):
  return results.Run(
    path='x',
    hparams={},
    metrics={k: np.asarray(v, np.float64) for k, v in metrics.items()},
    rounds=np.asarray(rounds, np.int64),
  )


def test_diverged_reads_the_signs_the_loop_stops_on():
  nan, inf = math.nan, math.inf
  assert (
    evidence_spec.diverged(
      _run({'train/loss': [nan, 1, 2], 'round_seconds': [nan, 1, 1]}, [0, 1, 2])
    )
    is None
  )
  assert (
    evidence_spec.diverged(
      _run({'train/loss': [nan, 1, nan], 'round_seconds': [nan, 1, 1]}, [0, 1, 2])
    )
    == 2
  )
  assert evidence_spec.diverged(_run({'eval/loss': [2, inf]}, [0, 5])) == 5
  # A NaN evaluation loss counts where the evaluation ran (its accuracy is there), not in a
  # row that was not evaluated.
  evaluated = {'eval/loss': [2, nan, nan], 'eval/accuracy': [0.1, nan, 0.1]}
  assert evidence_spec.diverged(_run(evaluated, [0, 1, 2])) == 2
  evaluated['eval/loss'] = [2, nan, 1]
  assert evidence_spec.diverged(_run(evaluated, [0, 1, 2])) is None
  assert evidence_spec.diverged(_run({'eval/loss': [2, nan]}, [0, 5])) is None
  assert (
    evidence_spec.diverged(_run({'process/finalizer/update_non_finite': [nan, 0, 1]}, [0, 1, 2]))
    == 2
  )


def test_a_run_without_tuning_uses_its_one_rate(tmp_path):
  text = CONFIG.replace('--learning_rates=0.2,0.1', '--learning_rates=0.1').replace(
    '--tuning_seed=50', '--tuning_seed=0'
  )
  spec = experiment_config.load(write_config(tmp_path, textwrap.dedent(text)))
  assert not spec.tuned
  assert evidence_spec.tune(spec, []).chosen == {'optimal': 0.1, 'uniform': 0.1}


def test_fixed_rates_per_method_need_no_tuning(tmp_path):
  text = CONFIG.replace('--learning_rates=0.2,0.1', '--learning_rates=optimal:0.1,uniform:0.03')
  text = text.replace('--tuning_seed=50', '--tuning_seed=0')  # Free: nothing is tuned.
  spec = experiment_config.load(write_config(tmp_path, text))
  assert not spec.tuned
  assert spec.learning_rates == (0.1, 0.03)
  assert evidence_spec.tune(spec, []).chosen == {'optimal': 0.1, 'uniform': 0.03}


def test_best_loss_claims_parse():
  claim = evidence_spec.parse_claim('fedgs<uniform:best_loss')
  assert claim.metric == evidence_spec.BEST_LOSS and claim.direction == evidence.Direction.LOWER


def test_claims_name_a_sampler_followed_by_optimal_uploads():
  claim = evidence_spec.parse_claim('oort+optimal<oort:seconds_to_0.5')
  assert (claim.method, claim.baseline) == ('oort+optimal', 'oort')
  assert claim.metric == 'seconds_to_0.5' and claim.direction == evidence.Direction.LOWER


def test_method_flag_compares_values_of_another_flag(tmp_path):
  text = (
    CONFIG.replace('--binary=demo', '--binary=fedgs\n--method_flag=alpha')
    .replace('--methods=optimal,uniform', '--methods=0,1')
    .replace('--baseline=uniform', '--baseline=0')
  )
  text = text.replace('--claims=', '# ') + '--sampling=fedgs\n'
  spec = experiment_config.load(write_config(tmp_path, text))
  assert spec.method_flag == 'alpha' and spec.label_key == 'alpha'
  assert spec.binary_flags[-1] == '--sampling=fedgs'  # The binary's own method flag is free.
  run = results.Run(path='r', hparams={'alpha': 1.0}, metrics={}, rounds=np.zeros(1, np.int64))
  assert evidence_spec.run_method(run, spec) == '1'  # The recorded 1.0 is method '1'.
  with pytest.raises(ValueError, match='--alpha is set per run'):
    experiment_config.load(write_config(tmp_path, text + '--alpha=2\n', folder='other'))
  # Each value's runs get a directory of their own: the binary's run name holds only
  # --sampling, and two values sharing one would resume (or lock) each other's run.
  names = [experiment_config.run_name_flags(spec, m) for m in ('0', '0.5', '1')]
  assert names == [
    ['--experiment_name=alpha0'],
    ['--experiment_name=alpha0.5'],
    ['--experiment_name=alpha1'],
  ]
  for [flag] in names:
    run_dir.check_run_name(flag.split('=', 1)[1])
  # The default: the binary's method flag, runs labelled by their `sampling`, named by the
  # binary as before.
  default = experiment_config.load(write_config(tmp_path, CONFIG, folder='third'))
  assert default.method_flag == 'methods' and default.label_key == 'sampling'
  assert experiment_config.run_name_flags(default, 'uniform') == []
  with pytest.raises(ValueError, match='--experiment_name is set per run'):
    experiment_config.load(
      write_config(tmp_path, CONFIG + '--experiment_name=mine\n', folder='fourth')
    )


def test_beyond_keeps_the_grids_ratio():
  assert evidence_spec.beyond(0.01, 0.03) == 0.0033
  assert evidence_spec.beyond(0.1, 0.03) == 0.33
  assert evidence_spec.beyond(0.0125, 0.025) == 0.0063  # 0.00625000…01 to two digits.


def test_tuning_extends_past_the_edge_until_the_best_rate_is_inside(tmp_path):
  spec = experiment_config.load(write_config(tmp_path, CONFIG + '--extend_grid=2\n'))
  assert spec.extend_grid == 2
  made = {}

  def add(method, rate, final):
    made[(method, rate)] = results.load_run(
      fault_harness.write_run(
        tmp_path / f'lr{rate:g}',
        f'{method}_seed50',
        {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
        run_csv([0.1, final, final]),
      )
    )

  # Grid 0.2, 0.1: optimal is best at the top edge, uniform at the bottom edge.
  add('optimal', 0.2, 0.6), add('optimal', 0.1, 0.5)
  add('uniform', 0.2, 0.3), add('uniform', 0.1, 0.4)
  tuning = evidence_spec.tune(spec, list(made.values()))
  assert tuning.pending == {'optimal': 0.4, 'uniform': 0.05}  # Past each edge, ratio 2.
  assert tuning.chosen == {'optimal': 0.2, 'uniform': 0.1}  # Provisional.
  # optimal is worse past the edge: 0.2 is inside now. uniform is better again at 0.05,
  # so it goes one further, to 0.025, and stops there: two extensions at most.
  add('optimal', 0.4, 0.55), add('uniform', 0.05, 0.45)
  tuning = evidence_spec.tune(spec, list(made.values()))
  assert tuning.pending == {'uniform': 0.025}
  add('uniform', 0.025, 0.47)
  tuning = evidence_spec.tune(spec, list(made.values()))
  assert tuning.pending == {}
  assert tuning.chosen == {'optimal': 0.2, 'uniform': 0.025}  # Still at the edge: limit reached.
  assert tuning.tried == {'optimal': (0.4, 0.2, 0.1), 'uniform': (0.2, 0.1, 0.05, 0.025)}
  # Without extension the same runs give the grid's choice; extra rates are ignored.
  plain = evidence_spec.tune(
    experiment_config.load(write_config(tmp_path, folder='plain')), list(made.values())
  )
  assert plain.chosen == {'optimal': 0.2, 'uniform': 0.1} and not plain.pending
  assert ('uniform', 0.05) not in plain.scores


def test_rates_borrowed_from_a_sibling_experiments_tuning(tmp_path):
  # The sibling tunes (grid 0.2, 0.1); this one runs every method at the sibling's choice.
  write_config(tmp_path, CONFIG, folder='ideal')
  text = CONFIG.replace('--learning_rates=0.2,0.1', '--learning_rates_from=ideal')
  borrowing = write_config(tmp_path, text, folder='skewed')
  spec = experiment_config.load(borrowing)
  assert spec.rates_from == 'ideal' and not spec.tuned
  with pytest.raises(ValueError, match='resolve them first'):
    evidence_spec.tune(spec, [])
  runs = [
    results.load_run(
      fault_harness.write_run(
        tmp_path / 'runs' / f'lr{rate:g}',
        f'{method}_seed50',
        {'sampling': method, 'seed': 50, 'client_learning_rate': rate, 'rounds': 2},
        run_csv([0.1, final, final]),
      )
    )
    for method, rate, final in (
      ('optimal', 0.2, 0.6),
      ('optimal', 0.1, 0.5),
      ('uniform', 0.2, 0.3),
      ('uniform', 0.1, 0.4),
    )
  ]
  seen = []

  def sibling_runs(source):
    seen.append(source.name)
    return runs

  resolved = experiment_config.borrow_rates(spec, borrowing, sibling_runs)
  assert seen == ['ideal']
  assert dict(resolved.fixed_rates) == {'optimal': 0.2, 'uniform': 0.1}
  assert evidence_spec.tune(resolved, []).chosen == {'optimal': 0.2, 'uniform': 0.1}
  one = experiment_config.borrow_rates(
    dataclasses.replace(spec, rates_from='ideal:uniform'), borrowing, sibling_runs
  )
  assert dict(one.fixed_rates) == {'optimal': 0.1, 'uniform': 0.1}  # uniform's rate for all.
  # Unfinished tuning, or both ways of giving rates, are refused in one line.
  with pytest.raises(ValueError, match='tuned no rate|no finished tuning run'):
    experiment_config.borrow_rates(spec, borrowing, lambda source: runs[:2])
  with pytest.raises(ValueError, match=r'tuning of ideal is not done \(optimal at 0.1'):
    experiment_config.borrow_rates(spec, borrowing, lambda source: [runs[0], *runs[2:]])
  with pytest.raises(ValueError, match='either --learning_rates or --learning_rates_from'):
    experiment_config.load(
      write_config(tmp_path, CONFIG + '--learning_rates_from=ideal\n', folder='both')
    )


def test_a_runs_availability_is_checked_as_mode_and_beta(tmp_path):
  run = results.load_run(
    fault_harness.write_run(
      tmp_path,
      'r',
      {'sampling': 'uniform', 'seed': 0, 'availability': 'LN', 'availability_beta': 0.5},
      run_csv([0.1, 0.2]),
    )
  )
  for given in ('LN-0.5', 'LN', 'ln-0.50'):
    spec = experiment_config.load(
      write_config(tmp_path, CONFIG + f'--availability={given}\n', folder=f'ok_{given}')
    )
    experiment_config.check_settings(spec, run)  # Same mode and β: accepted.
  for given in ('LN-0.3', 'YC-0.5', 'IDL'):
    spec = experiment_config.load(
      write_config(tmp_path, CONFIG + f'--availability={given}\n', folder=f'bad_{given}')
    )
    with pytest.raises(
      ValueError, match=f'trained with availability LN .* says --availability={given}'
    ):
      experiment_config.check_settings(spec, run)


def test_the_cache_dir_goes_only_to_tasks_that_read_it(tmp_path):
  offline = experiment_config.load(
    write_config(tmp_path, CONFIG.replace('--task=digits', '--task=synthetic'), folder='offline')
  )
  cached = experiment_config.load(
    write_config(tmp_path, CONFIG.replace('--task=digits', '--task=emnist_skewed'), folder='cached')
  )
  assert not experiment_config.takes_cache_dir(offline)
  assert experiment_config.takes_cache_dir(cached)


def test_a_grid_trains_task_by_task_tuning_cell_first(tmp_path):
  tunes = CONFIG.replace('--seeds=5', '--seeds=0').replace(
    '--claims=optimal>uniform:final,optimal=uniform:auc@0.02,optimal<uniform:bits_to_0.5\n', ''
  )
  borrows = CONFIG.replace('--learning_rates=0.2,0.1\n', '--learning_rates_from={}\n').replace(
    '--tuning_seed=50\n', ''
  )
  grid = tmp_path / 'grid'
  # Alphabetically a cell that borrows ("a_LDF") comes before the one it borrows from.
  for folder, text in (
    ('z_IDL', tunes),
    ('a_LDF', borrows.format('z_IDL')),
    ('b_IDL', tunes),
    ('b_YC', borrows.format('b_IDL:uniform')),
    ('b_LDF', borrows.format('b_IDL')),
  ):
    write_config(grid, text, folder=folder)

  def names(configs):
    return [re.search(r'/([^/]+)/experiment\.flags$', c).group(1) for c in configs]

  assert names(experiment_config.grid_configs(str(grid))) == [
    'b_IDL',
    'b_LDF',
    'b_YC',
    'z_IDL',
    'a_LDF',
  ]
  assert names(experiment_config.grid_configs(str(grid), ['a_LDF', 'b_IDL'])) == [
    'a_LDF',
    'b_IDL',
  ]  # As asked.
  with pytest.raises(ValueError, match=r'^No cell c_IDL in .*; its cells are a_LDF, b_IDL, '):
    experiment_config.grid_configs(str(grid), ['b_IDL', 'c_IDL'])
  with pytest.raises(ValueError, match='No cell configuration'):
    experiment_config.grid_configs(str(tmp_path / 'empty'))


def test_a_sequential_extension_trains_more_seeds_and_reports_both_looks(tmp_path):
  config = (
    CONFIG.replace('--learning_rates=0.2,0.1', '--learning_rates=0.1')
    .replace('--seeds=5', '--seeds=2\n--extended_seeds=4')
    .replace(',optimal=uniform:auc@0.02,optimal<uniform:bits_to_0.5', '')
    .replace('--targets=0.5\n', '')
  )
  spec = experiment_config.load(write_config(tmp_path, config))
  assert list(spec.reported_seeds) == [0, 1] and list(spec.trained_seeds) == [0, 1, 2, 3]
  # Final accuracy (mean of the last 2 evaluations): optimal ahead by 0.05, 0.15 on seeds 0-1
  # (t(0.975, 1) = 12.7: no difference detected), then by 0.1, 0.1 (n = 4: [+0.035, +0.165]).
  runs = [
    results.load_run(
      fault_harness.write_run(
        tmp_path / 'lr0.1',
        f'{method}_seed{seed}',
        {'sampling': method, 'seed': seed, 'client_learning_rate': 0.1, 'rounds': 2},
        run_csv([0.1, 0.4, 0.5 + (gain if method == 'optimal' else 0.0)], bits=True),
      )
    )
    for seed, gain in enumerate([0.1, 0.3, 0.2, 0.2])
    for method in ('optimal', 'uniform')
  ]
  assert evidence_spec.missing_runs(spec, runs[:4]) == [
    f'{m} at 0.1, seed {s}' for s in (2, 3) for m in ('optimal', 'uniform')
  ]
  assert evidence_spec.missing_runs(spec, runs) == []
  report = evidence_report.results_markdown(spec, runs, command='cmd')
  first, extended = report.split('## Verdicts with the sequential extension to 4 seeds')
  final = re.compile(r'`optimal>uniform:final` .*?\|\s+(\d) \|.*?\*\*(.+?)\*\*')
  assert final.search(first).groups() == ('2', 'no difference detected')
  assert final.search(extended).groups() == ('4', 'reproduced')
  # An extension only adds seeds, and never the tuning seed.
  with pytest.raises(ValueError, match='extended_seeds must be 0 .* above seeds=2, got 2'):
    experiment_config.load(write_config(tmp_path, config.replace('=4', '=2'), folder='not_more'))
  with pytest.raises(ValueError, match='The tuning seed 50 is a reported seed'):
    experiment_config.load(
      write_config(tmp_path, CONFIG + '--extended_seeds=60\n', folder='over_tuning')
    )


def test_the_horizon_run_is_the_cells_method_at_its_rate_on_the_tuning_seed():
  # natural_LDF borrows its rates from natural_IDL, which tuned on seed 100 and chose 0.03
  # for full participation (docs/benchmark.md); no reported seed is trained.
  cell = os.path.join(REPO, 'docs', 'benchmark', 'natural_LDF', experiment_config.CONFIG_FILENAME)
  args = experiment_config.horizon_command(cell, 'full', 500, '/tmp/somewhere', '/tmp/cache')
  assert args[1:3] == ['-m', 'bin.benchmark']
  assert args[-5:] == [
    '--sampling=full',
    '--seed=100',
    '--seeds=1',
    '--client_learning_rate=0.03',
    '--root_output_dir=/tmp/somewhere',
  ]
  assert [a for a in args if a.startswith('--rounds')] == ['--rounds=500']
  assert '--availability=LDF-0.7' in args and '--cache_dir=/tmp/cache' in args
  with pytest.raises(ValueError, match="'md\\+x' is not a method of"):
    experiment_config.horizon_command(cell, 'md+x', 500, '/tmp/somewhere')
