"""Multi-model FL (MMFL): the summary table of a comparison of assignment methods."""

from __future__ import annotations

import numpy as np

from tff_sampling.runtime import results


def _column_mean(run: results.Run, column: str) -> float:
  values = run.metrics.get(column)
  if values is None:
    return float('nan')
  values = values[1:]
  return float(np.nanmean(values)) if np.any(np.isfinite(values)) else float('nan')


def _accuracy_at(run: results.Run, round_num: int) -> float:
  index = np.flatnonzero(run.rounds == round_num)
  return float(run.metrics['eval/mean_accuracy'][index[0]]) if index.size else float('nan')


def summary_table(
  groups: dict[str, list[results.Run]], rounds: int, eval_every: int, num_models: int
) -> str:
  """Average accuracy at four points, per-model final accuracy, uplink and variance."""
  points = sorted(
    {max(eval_every, int(round(rounds * f / eval_every)) * eval_every) for f in (0.25, 0.5, 0.75)}
    | {rounds}
  )
  header = (
    f'{"method":<22}'
    + ''.join(f'{f"acc@{r}":>16}' for r in points)
    + (
      f'{"final per model":>{8 * num_models + 2}}{"uploads/rd":>12}{"Mbit/rd":>9}'
      f'{"α vs random":>13}{"secure/exact var":>30}{"s/round":>9}'
    )
  )
  lines = [header, '-' * len(header)]
  for method, runs in groups.items():
    cells = []
    for r in points:
      values = np.array([_accuracy_at(run, r) for run in runs])
      cells.append(f'{np.mean(values):>9.4f} ± {results.seed_spread(values):.3f}')
    final = [
      np.mean([run.metrics[f'eval/model_{s}/accuracy'][-1] for run in runs])
      for s in range(num_models)
    ]
    uploads = np.mean([_column_mean(run, 'uplink/model_uploads') for run in runs])
    bits = np.mean([_column_mean(run, 'uplink/round_bits') for run in runs]) / 1e6
    alpha = np.mean([_column_mean(run, 'process/improvement_factor') for run in runs])
    ratio_columns = sorted(
      c for c in runs[0].metrics if c.startswith('process/secure_variance_ratio/steps_')
    )
    ratio = (
      ' / '.join(f'{np.mean([_column_mean(run, c) for run in runs]):.4f}' for c in ratio_columns)
      if ratio_columns
      else '—'
    )
    seconds = np.mean([np.nanmedian(run.metrics['round_seconds'][1:]) for run in runs])
    lines.append(
      f'{method:<22}'
      + ''.join(f'{c:>16}' for c in cells)
      + f'{" ".join(f"{a:.3f}" for a in final):>{8 * num_models + 2}}'
      + f'{uploads:>12.2f}{bits:>9.3f}'
      + (f'{alpha:>13.3f}' if np.isfinite(alpha) else f'{"—":>13}')
      + f'  {ratio:>28}{seconds:>9.2f}'
    )
  return '\n'.join(lines)
