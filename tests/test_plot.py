"""Tests for tff_sampling/analysis/plotting.py and bin/plot.py (the figure, `plot_runs`,
the absl main)."""

import os

from absl import app
from absl.testing import flagsaver
import fault_harness
import numpy as np
import pytest

from bin import plot
from tff_sampling.analysis import plotting
from tff_sampling.runtime import results

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
ROUNDS = 10
EVAL_EVERY = 2


def metrics_csv(seed, bits_per_round, accuracy_gain):
  """A metrics.csv as the round loop writes it, every cell quoted.

  Round 0 evaluates the initial model and uploads nothing; evaluation every
  `EVAL_EVERY` rounds; `process/aggregator/clipped` appears from round 3 on (so
  earlier rows have it empty); the uploads vary from round to round and seed.
  """
  header = [
    'key',
    'eval/accuracy',
    'eval/loss',
    'round_seconds',
    'train/accuracy',
    'train/loss',
    'uplink/cumulative_bits',
    'uplink/round_bits',
    'process/aggregator/mean_value',
    'process/aggregator/clipped',
  ]
  rows = []
  cumulative_bits = 0
  for key in range(ROUNDS + 1):
    round_bits = 0 if key == 0 else bits_per_round * (1 + (key + seed) % 3)
    cumulative_bits += round_bits
    accuracy = min(0.95, 0.1 + accuracy_gain * key + 0.01 * seed)
    evaluated = key % EVAL_EVERY == 0
    trained = key > 0
    rows.append(
      [
        key,
        accuracy if evaluated else '',
        2.3 * (1 - accuracy) if evaluated else '',
        0.1 if trained else '',
        accuracy - 0.02 if trained else '',
        2.3 * (1 - accuracy) + 0.1 if trained else '',
        cumulative_bits,
        round_bits,
        0.5 if trained else '',
        key % 2 if key >= 3 else '',
      ]
    )
  return '\n'.join(','.join(f'"{cell}"' for cell in row) for row in [header] + rows) + '\n'


write_run = fault_harness.write_run


@pytest.fixture
def run_dirs(tmp_path):
  """Two sampling schemes x three seeds; optimal sampling uploads fewer bits."""
  dirs = []
  for sampling, bits_per_round, gain in (('uniform', 4000, 0.06), ('optimal', 1500, 0.05)):
    for seed in range(3):
      hparams = dict(
        task='digits',
        algorithm='fedavg',
        sampling=sampling,
        seed=seed,
        rounds=ROUNDS,
        clients_per_round=10,
        client_learning_rate=0.1,
      )
      dirs.append(
        write_run(
          tmp_path / 'results',
          f'digits_{sampling}_seed{seed}',
          hparams,
          metrics_csv(seed, bits_per_round, gain),
        )
      )
  return dirs


def assert_png(path):
  with open(path, 'rb') as f:
    content = f.read()
  assert content[:8] == PNG_MAGIC
  assert len(content) > 10_000  # Two panels of lines, not a blank canvas.


def test_plot_runs_writes_png(run_dirs, tmp_path):
  output = tmp_path / 'plots' / 'nested' / 'digits.png'
  path = plotting.plot_runs(run_dirs, output, title='digits')
  assert path == str(output)
  assert_png(path)


def test_plot_runs_accepts_globs_and_loss(run_dirs, tmp_path):
  root = tmp_path / 'results'
  path = plotting.plot_runs(str(root / 'digits_*'), str(tmp_path / 'loss.png'), metric='loss')
  assert_png(path)


def test_figure_has_one_line_per_group_with_seed_bands(run_dirs):
  runs = [results.load_run(d) for d in run_dirs]
  fig = plotting.make_figure(runs, title='Digits')
  rounds_axes, bits_axes = fig.axes
  labels = [text.get_text() for text in rounds_axes.get_legend().get_texts()]
  assert labels == ['sampling=uniform (n=3 seeds)', 'sampling=optimal (n=3 seeds)']
  assert fig._suptitle.get_text() == 'Digits'
  assert rounds_axes.get_xlabel() == 'round'
  assert bits_axes.get_xlabel() == 'cumulative uploaded bits'
  assert rounds_axes.get_ylabel() == bits_axes.get_ylabel() == 'eval/accuracy'
  assert rounds_axes.get_xscale() == 'linear' and bits_axes.get_xscale() == 'log'
  assert len(rounds_axes.lines) == len(bits_axes.lines) == 2
  assert len(rounds_axes.collections) == len(bits_axes.collections) == 2  # std bands

  uniform = runs[:3]
  x, mean, _ = results.aggregate(uniform, 'key', 'eval/accuracy')
  np.testing.assert_array_equal(x, np.arange(0, ROUNDS + 1, EVAL_EVERY))
  np.testing.assert_allclose(rounds_axes.lines[0].get_xdata(), x)
  np.testing.assert_allclose(rounds_axes.lines[0].get_ydata(), mean)
  # The same line colour in both panels; round 0 (0 bits) is left off the log axis.
  assert rounds_axes.lines[1].get_color() == bits_axes.lines[1].get_color()
  # Evaluated rounds only: each round's mean accuracy at the seeds' mean cumulative bits of
  # that round (no interpolation), so the curve ends at the final evaluation's mean.
  bits = np.mean(
    [
      [run.column('uplink/cumulative_bits')[list(run.rounds).index(r)] for r in x]
      for run in uniform
    ],
    axis=0,
  )
  assert bits[0] == 0
  np.testing.assert_allclose(bits_axes.lines[0].get_xdata(), bits[1:])
  np.testing.assert_allclose(bits_axes.lines[0].get_ydata(), mean[1:])
  assert bits_axes.lines[0].get_ydata()[-1] == pytest.approx(mean[-1])


def test_single_seed_groups_have_no_band(run_dirs):
  runs = [results.load_run(d) for d in (run_dirs[0], run_dirs[3])]
  fig = plotting.make_figure(runs, metric='train/loss')
  rounds_axes, _ = fig.axes
  labels = [text.get_text() for text in rounds_axes.get_legend().get_texts()]
  assert labels == ['sampling=uniform', 'sampling=optimal']
  assert not rounds_axes.collections
  assert rounds_axes.get_ylabel() == 'train/loss'
  assert fig._suptitle is None
  np.testing.assert_allclose(rounds_axes.lines[0].get_xdata(), np.arange(1, ROUNDS + 1))


def test_plot_runs_errors(run_dirs, tmp_path):
  output = tmp_path / 'out.png'
  with pytest.raises(ValueError, match="Unknown metric 'top5'; use one of accuracy, loss"):
    plotting.plot_runs(run_dirs, output, metric='top5')
  with pytest.raises(KeyError, match="no column 'eval/top5'"):
    plotting.plot_runs(run_dirs, output, metric='eval/top5')
  with pytest.raises(ValueError, match='No run directories given'):
    plotting.plot_runs([], output)
  with pytest.raises(ValueError, match='matches no directory'):
    plotting.plot_runs([str(tmp_path / 'results' / 'cifar_*')], output)
  with pytest.raises(FileNotFoundError, match='does not exist'):
    plotting.plot_runs(run_dirs + [str(tmp_path / 'missing')], output)
  assert not output.exists()


def test_main_writes_and_prints_path(run_dirs, tmp_path, capsys):
  output = str(tmp_path / 'main.png')
  with flagsaver.as_parsed(
    run_dirs=','.join(run_dirs), output=output, metric='accuracy', title='from main'
  ):
    plot.main(['plot'])
  assert_png(output)
  # A plain line, as the other binaries print theirs (no absl log prefix).
  assert capsys.readouterr().out == f'Wrote {output}\n'


def test_main_rejects_extra_arguments_and_missing_flags(run_dirs, tmp_path):
  output = str(tmp_path / 'main.png')
  with flagsaver.as_parsed(run_dirs=','.join(run_dirs), output=output, metric='accuracy', title=''):
    with pytest.raises(app.UsageError, match='Unexpected arguments: extra'):
      plot.main(['plot', 'extra'])
  with flagsaver.as_parsed(run_dirs=[], output=output, metric='accuracy', title=''):
    with pytest.raises(app.UsageError, match='--run_dirs is required'):
      plot.main(['plot'])
  assert not os.path.exists(output)


def test_binary_end_to_end(run_dirs, tmp_path, capsys):
  # (Extra arguments are refused in test_main_rejects_extra_arguments_and_missing_flags.)
  root = tmp_path / 'results'
  output = str(tmp_path / 'binary.png')
  outcome = fault_harness.run_main(
    plot.main,
    run_dirs=f'{root}/digits_uniform_*,{root}/digits_optimal_*',
    output=output,
    metric='loss',
    title='Digits',
  )
  assert outcome.exit_code == 0, outcome
  assert_png(output)
  assert f'Wrote {output}' in capsys.readouterr().out
