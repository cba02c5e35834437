"""An experiment's results.md built around its verdicts, from its spec and raw metrics.

`write` takes an `ExperimentSpec` (`tff_sampling.analysis.evidence_spec`)
and the experiment's runs (usually read from its committed raw metrics file,
`tff_sampling.analysis.raw_metrics`) and writes, into the spec's report folder:

* ``results.md``: the verdict of every claim (paired difference over the
  reported seeds, its 95% t-interval and n; `tff_sampling.analysis.evidence`), each
  method's summaries over seeds, the per-seed values, the tuning table (the
  tuning seed's final accuracy for every method and rate, the chosen rate in
  bold), and the training binary's flags;
* ``accuracy_rounds.png`` and ``accuracy_bits.png`` of the reported runs,
  drawn at evaluated rounds only.

The text depends only on the spec and the runs' metrics, so regenerating it
from the same raw metrics gives the same bytes (tested for every committed
report).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import math
import os
import shlex

import numpy as np

from tff_sampling.analysis import curves
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import report
from tff_sampling.analysis import run_groups
from tff_sampling.analysis import tables
from tff_sampling.runtime import results

MISSING = '—'


@dataclasses.dataclass(frozen=True)
class MethodRuns:
  """The reported runs of one method (one per reported seed found), at its chosen rate."""

  method: str
  rate: float
  runs: dict[int, results.Run]

  @property
  def label(self) -> str:
    return f'{self.method} (lr {self.rate:g})'


def reported_runs(
  spec: evidence_spec.ExperimentSpec,
  runs: Sequence[results.Run],
  tuning: evidence_spec.TuningResult,
  seeds: range | None = None,
) -> dict[str, MethodRuns]:
  """Method -> its runs on `seeds` (default: the reported seeds) at its chosen rate."""
  seeds = spec.reported_seeds if seeds is None else seeds
  chosen: dict[str, MethodRuns] = {m: MethodRuns(m, tuning.chosen[m], {}) for m in spec.methods}
  for run in runs:
    method = evidence_spec.run_method(run, spec)
    seed = run.hparams.get('seed')
    if (
      method in chosen
      and isinstance(seed, int)
      and seed in seeds
      and evidence_spec.run_rate(run) == chosen[method].rate
    ):
      chosen[method].runs[int(seed)] = run
  return chosen


def metric_values(
  spec: evidence_spec.ExperimentSpec, runs: Mapping[int, results.Run], metric: str
) -> dict[int, float]:
  """Seed -> the run's value of a claim metric (NaN where a target is never reached); a
  diverged run scores as failed (`evidence_spec.failed_run`)."""
  values = {}
  for seed, run in runs.items():
    run = evidence_spec.failed_run(run)
    if metric == evidence_spec.FINAL:
      values[seed] = evidence.final_mean(run, spec.final_k)
    elif metric == evidence_spec.CURVE:
      values[seed] = evidence.curve_mean(run)
    elif metric == evidence_spec.BEST_LOSS:
      values[seed] = evidence.lowest(run)
    elif metric.startswith(evidence_spec.ROUNDS_TO):
      values[seed] = evidence.rounds_to_target(run, float(metric[len(evidence_spec.ROUNDS_TO) :]))
    elif metric.startswith(evidence_spec.BITS_TO):
      values[seed] = evidence.bits_to_target(run, float(metric[len(evidence_spec.BITS_TO) :]))
    elif metric.startswith(evidence_spec.SECONDS_TO):
      target = float(metric[len(evidence_spec.SECONDS_TO) :])
      values[seed] = evidence.seconds_to_target(run, target)
    else:
      raise ValueError(f'Unknown metric {metric!r}.')
  return values


def metric_name(spec: evidence_spec.ExperimentSpec, metric: str) -> str:
  if metric == evidence_spec.FINAL:
    return f'final accuracy (mean of last {spec.final_k} evaluations)'
  if metric == evidence_spec.CURVE:
    return 'mean accuracy over the rounds (area under the curve / rounds)'
  if metric == evidence_spec.BEST_LOSS:
    return 'lowest evaluation loss'
  if metric.startswith(evidence_spec.ROUNDS_TO):
    return f'rounds to {tables.target_text(float(metric[len(evidence_spec.ROUNDS_TO) :]))}'
  if metric.startswith(evidence_spec.SECONDS_TO):
    target = tables.target_text(float(metric[len(evidence_spec.SECONDS_TO) :]))
    return f'simulated seconds to {target}'
  return f'uploaded Gbit to {tables.target_text(float(metric[len(evidence_spec.BITS_TO) :]))}'


def _scale(metric: str) -> float:
  return 1e9 if metric.startswith(evidence_spec.BITS_TO) else 1.0


def format_value(value: float, metric: str) -> str:
  if not math.isfinite(value):
    return 'never' if metric.startswith(evidence_spec.TO_TARGET) else MISSING
  value /= _scale(metric)
  if metric.startswith(evidence_spec.ROUNDS_TO):
    return f'{value:.1f}'
  if metric.startswith((evidence_spec.BITS_TO, evidence_spec.SECONDS_TO)):
    return f'{value:.4g}'
  return f'{value:.4f}'


def censored_values(
  spec: evidence_spec.ExperimentSpec, runs: Mapping[int, results.Run], metric: str
) -> tuple[dict[int, float], set[int]]:
  """Seed -> value of a claim metric, with a never-reached target censored at the run's
  end (`evidence.to_target`); and the censored seeds."""
  if not metric.startswith(evidence_spec.TO_TARGET):
    return metric_values(spec, runs, metric), set()
  prefix = next(p for p in evidence_spec.TO_TARGET if metric.startswith(p))
  bits, seconds = prefix == evidence_spec.BITS_TO, prefix == evidence_spec.SECONDS_TO
  values, censored = {}, set()
  for seed, run in runs.items():
    values[seed], was_censored = evidence.to_target(
      evidence_spec.failed_run(run), float(metric[len(prefix) :]), bits=bits, seconds=seconds
    )
    if was_censored:
      censored.add(seed)
  return values, censored


def _claim_mean(values: Mapping[int, float], censored: set[int], metric: str) -> str:
  if not values:
    return MISSING
  text = format_value(float(np.mean(list(values.values()))), metric)
  if censored:
    text = f'≥ {text} ({len(values) - len(censored)}/{len(values)} reach)'
  return text


VERDICT_HEADERS = [
  'claim',
  'metric',
  'method',
  'baseline',
  'seeds',
  'difference [95% CI]',
  'CI width',
  'verdict',
  'Holm-adjusted',
  'seeds to decide',
]


def verdict_rows(
  spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]
) -> list[list[str]]:
  """One row per claim (`VERDICT_HEADERS`): means, the paired difference with its 95%
  interval, the verdict, and the verdict with the experiment's claims as one family (Holm)."""
  measured = []
  for claim in spec.claims:
    method, method_censored = censored_values(spec, chosen[claim.method].runs, claim.metric)
    baseline, baseline_censored = censored_values(spec, chosen[claim.baseline].runs, claim.metric)
    measured.append((method, method_censored, baseline, baseline_censored))
  differences = [evidence.paired_difference(m[0], m[2]) for m in measured]
  censored = [
    (bool(m[1] & set(d.seeds)), bool(m[3] & set(d.seeds))) for m, d in zip(measured, differences)
  ]
  in_family = evidence.holm_verdicts(
    differences, [c.direction for c in spec.claims], [c.margin for c in spec.claims], censored
  )
  rows = []
  for claim, values, diff, in_family_outcome, (by_method, by_baseline) in zip(
    spec.claims, measured, differences, in_family, censored
  ):
    method, method_censored, baseline, baseline_censored = values
    censoring = dict(method_censored=by_method, baseline_censored=by_baseline)
    outcome = evidence.censored_verdict(
      evidence.verdict(diff, claim.direction, claim.margin), claim.direction, **censoring
    )
    plan = MISSING
    if outcome in (evidence.Verdict.NO_DIFFERENCE, evidence.Verdict.UNDECIDED) and not any(
      censoring.values()
    ):
      needed = evidence.seeds_to_decide(diff, claim.direction, claim.margin)
      plan = str(needed) if needed is not None else '> 100'
    scale = _scale(claim.metric)
    if diff.n >= 2:
      interval = f'{diff.mean / scale:+.4g} [{diff.low / scale:+.4g}, {diff.high / scale:+.4g}]'
      width = f'{diff.width / scale:.4g}'
    elif diff.n == 1:
      interval, width = f'{diff.mean / scale:+.4g}', MISSING
    else:
      interval, width = MISSING, MISSING
    rows.append(
      [
        f'`{claim.text}`',
        metric_name(spec, claim.metric),
        _claim_mean(method, method_censored, claim.metric),
        _claim_mean(baseline, baseline_censored, claim.metric),
        str(diff.n),
        interval,
        width,
        f'**{outcome}**',
        in_family_outcome,
        plan,
      ]
    )
  return rows


def verdict_table(spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]) -> str:
  """One row per claim: means, the paired difference with its 95% interval, the verdict."""
  rows = verdict_rows(spec, chosen)
  return tables.pipe_table(VERDICT_HEADERS, [list(c) for c in zip(*rows)])


def summary_metrics(spec: evidence_spec.ExperimentSpec) -> list[str]:
  """Final accuracy, the curve mean, and the lowest loss where a claim is about it."""
  metrics = [evidence_spec.FINAL, evidence_spec.CURVE]
  if any(claim.metric == evidence_spec.BEST_LOSS for claim in spec.claims):
    metrics.append(evidence_spec.BEST_LOSS)
  return metrics


def summary_table(spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]) -> str:
  """Per method: mean ± sample std over seeds of every summary."""
  metrics = summary_metrics(spec)
  timed = any(
    evidence.SECONDS_COLUMN in r.metrics for m in chosen.values() for r in m.runs.values()
  )
  for target in spec.targets:
    metrics += [f'{evidence_spec.ROUNDS_TO}{target:g}', f'{evidence_spec.BITS_TO}{target:g}']
    metrics += [f'{evidence_spec.SECONDS_TO}{target:g}'] if timed else []
  rows = []
  for m in chosen.values():
    row = [m.label, str(len(m.runs))]
    for metric in metrics:
      values = metric_values(spec, m.runs, metric)
      finite = np.array([v for v in values.values() if math.isfinite(v)])
      if not finite.size:
        row.append(f'never (0/{len(values)})' if values else MISSING)
        continue
      text = format_value(float(finite.mean()), metric)
      if finite.size > 1:
        text += f' ± {format_value(float(finite.std(ddof=1)), metric)}'
      if finite.size < len(values):
        text += f' ({finite.size}/{len(values)})'
      row.append(text)
    for column in spec.extra_columns:
      per_run = [_mean_over_rounds(r, column) for r in m.runs.values()]
      finite = np.array([v for v in per_run if math.isfinite(v)])
      if not finite.size:
        row.append(MISSING)
      else:
        std = f' ± {finite.std(ddof=1):.3f}' if finite.size > 1 else ''
        row.append(f'{finite.mean():.3f}{std}')
    bits = [r.last_finite(results.BITS_COLUMN) for r in m.runs.values()]
    row.append(f'{np.mean(bits) / 1e9:.4g}' if bits else MISSING)
    seconds = median_round_seconds(m.runs.values())
    row.append(f'{seconds:.2f}' if math.isfinite(seconds) else MISSING)
    rows.append(row)
  headers = ['method', 'seeds'] + [metric_name(spec, m) for m in metrics]
  headers += [f'{column} (mean/round)' for column in spec.extra_columns]
  headers += ['total Gbit (mean)', 's/round (median)']
  return tables.pipe_table(headers, [list(c) for c in zip(*rows)])


def median_round_seconds(runs: Iterable[results.Run]) -> float:
  """The median of the runs' seconds per round (NaN if none recorded)."""
  seconds = np.concatenate(
    [r.column(run_groups.SECONDS_COLUMN) for r in runs if run_groups.SECONDS_COLUMN in r.metrics]
    or [np.zeros(0)]
  )
  seconds = seconds[np.isfinite(seconds)]
  return float(np.median(seconds)) if seconds.size else math.nan


def _mean_over_rounds(run: results.Run, column: str) -> float:
  values = run.metrics.get(column)
  if values is None:
    return math.nan
  finite = values[np.isfinite(values)]
  return float(finite.mean()) if finite.size else math.nan


def per_seed_table(spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]) -> str:
  """Final accuracy and the curve mean (and lowest loss, `summary_metrics`) of every reported run,
  and each extra column's mean per round."""
  seeds = list(spec.reported_seeds)
  rows = []
  for m in chosen.values():
    for metric in summary_metrics(spec):
      values = metric_values(spec, m.runs, metric)
      rows.append(
        [m.label, metric]
        + [format_value(values[s], metric) if s in values else MISSING for s in seeds]
      )
    for column in spec.extra_columns:
      means = {s: _mean_over_rounds(run, column) for s, run in m.runs.items()}
      rows.append(
        [m.label, f'{column} (mean/round)']
        + [f'{means[s]:.3f}' if math.isfinite(means.get(s, math.nan)) else MISSING for s in seeds]
      )
  headers = ['method', 'summary'] + [f'seed {s}' for s in seeds]
  return tables.pipe_table(headers, [list(c) for c in zip(*rows)])


def tuning_table(spec: evidence_spec.ExperimentSpec, tuning: evidence_spec.TuningResult) -> str:
  """The tuning seed's scores (`TuningResult.scores`) per method and rate; the chosen rate in
  bold."""
  rates = sorted({r for tried in tuning.tried.values() for r in tried}, reverse=True)
  rows = []
  for method in spec.methods:
    row = [method]
    for rate in rates:
      key = (method, rate)
      if key in tuning.diverged_at:
        cell = f'diverged (round {tuning.diverged_at[key]})'
      elif key in tuning.scores:
        cell = f'{tuning.scores[key]:.4f}'
      else:
        cell = MISSING
      if tuning.chosen.get(method) == rate:
        cell = f'**{cell}**'
      elif rate not in tuning.tried.get(method, ()):
        cell = ''  # Past the grid's edge for another method only.
      row.append(cell)
    rows.append(row)
  headers = ['method'] + [f'lr {r:g}' for r in rates]
  return tables.pipe_table(headers, [list(c) for c in zip(*rows)])


def regenerate_command(config: str | os.PathLike[str]) -> str:
  """The ``bin.report`` command results.md shows: from ``docs/`` for a committed
  experiment (so the text does not depend on where the command ran), else as given."""
  parts = os.path.abspath(os.fspath(config)).split(os.sep)
  shown = '/'.join(parts[-4:]) if parts[-4:-2] == ['docs', 'experiments'] else os.fspath(config)
  return f'python -m bin.report --experiment={shlex.quote(shown)}'


def _tuning_section(
  spec: evidence_spec.ExperimentSpec, tuning: evidence_spec.TuningResult
) -> list[str]:
  return [
    f'## Tuning (seed {spec.tuning_seed})',
    '',
    (
      'Lowest evaluation loss of the tuning runs (the measure of the claims); the chosen rate '
      'is in bold (the lowest'
      if spec.tune_on == evidence_spec.BEST_LOSS
      else f'Final accuracy (mean of the last {spec.final_k} evaluations) of the tuning runs; the '
      'chosen rate is in bold (the highest'
    )
    + '; a diverged run is out; ties go to the larger rate).'
    + (
      f' The grid is {", ".join(f"{r:g}" for r in spec.learning_rates)}; a method whose best '
      'rate was at its edge was also run past it at the same ratio, up to '
      f'{spec.extend_grid} more rate(s), until its best rate was inside.'
      if spec.extend_grid
      else ''
    ),
    '',
    tuning_table(spec, tuning),
    '',
  ]


def _settings_section(spec: evidence_spec.ExperimentSpec) -> list[str]:
  return [
    '## Settings',
    '',
    f'Training binary `bin.{spec.binary}`, with these flags in every run (the driver adds the '
    'method, seed, client learning rate and output directory):',
    '',
    '```',
    *spec.binary_flags,
    '```',
    '',
  ]


def _incomplete(
  spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns], seeds: range | None = None
) -> list[str]:
  """The line that names the runs of `seeds` (default: the reported seeds) missing or
  unfinished, if there are any."""
  seeds = spec.reported_seeds if seeds is None else seeds
  missing = [f'{m.method} seed {s}' for m in chosen.values() for s in seeds if s not in m.runs]
  unfinished = [
    f'{r.name} ({m.method}, seed {s}: round {int(r.rounds[-1])} of {r.hparams.get("rounds")})'
    for m in chosen.values()
    for s, r in sorted(m.runs.items())
    if int(r.rounds[-1]) < int(r.hparams.get('rounds', 0))
  ]
  if not (missing or unfinished):
    return []
  said = ([f'missing runs: {", ".join(missing)}'] if missing else []) + (
    [f'unfinished: {", ".join(unfinished)}'] if unfinished else []
  )
  return [
    '**Incomplete:** ' + '; '.join(said) + '. The numbers are those of the rounds written so far.',
    '',
  ]


def _rates_text(spec: evidence_spec.ExperimentSpec) -> str:
  """How each method's client learning rate was set, as the report's first paragraph says."""
  if spec.tuned:
    return f'at its own client learning rate, chosen on the tuning seed {spec.tuning_seed} (below)'
  if spec.rates_from:
    name, _, one = spec.rates_from.partition(':')
    return (
      f'at the client learning rate the tuning of [{name}](../{name}/results.md) chose for '
      + (f'its method {one}' if one else 'it')
      + ' (beside its name)'
    )
  if spec.fixed_rates:
    return 'at the client learning rate the configuration fixes for it (beside its name)'
  return f'at client learning rate {spec.learning_rates[0]:g}'


_VERDICT_RULES = (
  'Paired over the seeds both methods have: the mean of the per-seed differences '
  '`method − baseline` and its two-sided 95% t-interval. A run that never reaches a target '
  'counts with its last round (or its total bits), a lower bound marked ≥; a verdict that such '
  'a bound could have produced is *undecided*. A run that diverged scores as failed: accuracy '
  '0 from the round it diverged in to its last round, so a target it had not reached is never '
  'reached (its lowest loss stays the lowest it reached). *reproduced*: the interval excludes 0 on '
  'the side the claim states (for `=`: '
  'it lies within ± the margin); *contradicted*: it lies wholly on the other side (for `=`: '
  'wholly outside the margin); *no difference detected*: it covers 0; *undecided*: (`=`) '
  'it straddles the margin, or a censored value decides it or could hide a difference. '
  '*Holm-adjusted*: the same verdict with all the claims of this experiment as one family: '
  "each interval's test (the paired t-test; for `=`, the tests against the margins) gives a "
  "p-value, Holm's step-down adjustment multiplies the smallest by the number of claims, the "
  'next by one fewer, and so on, and a verdict stays decisive only if its adjusted p-value is '
  'below 0.05, so that the chance of any wrong decisive verdict in the family stays at 5%. '
  '*seeds to decide* (claims not decided, no censored value): the fewest seeds whose interval '
  'would decide the claim if the observed mean and spread of the differences held; a plan for '
  'extending the experiment, not a verdict.'
)


def _reported_sections(
  spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]
) -> list[str]:
  """The verdicts, summaries, per-seed values and plots of the reported seeds."""
  return [
    f'Seeds {spec.reported_seeds.start}-{spec.reported_seeds.stop - 1} are reported; each method '
    f'runs {_rates_text(spec)}. Within a seed, every method starts from the same initial model '
    'and client data order, and draws the same cohorts unless it chooses them itself (a '
    'server-side sampler). *final accuracy* is the mean of the last '
    f'{spec.final_k} evaluations of each run; *mean accuracy over the rounds* is the area under '
    'the accuracy-vs-rounds curve (trapezoids between evaluations) divided by the rounds.',
    '',
    '## Verdicts',
    '',
    _VERDICT_RULES,
    '',
    verdict_table(spec, chosen) if spec.claims else '(no claims)',
    '',
    *_incomplete(spec, chosen),
    '## Summaries over seeds',
    '',
    'Mean ± sample standard deviation over the reported seeds; a to-target cell averages the '
    'seeds that reach the target (reached/seeds). *total Gbit*: cumulative uploaded bits at '
    'the last round.',
    '',
    summary_table(spec, chosen),
    '',
    '## Per seed',
    '',
    per_seed_table(spec, chosen),
    '',
    f'![accuracy vs round]({curves.ROUNDS_PLOT_FILENAME})',
    '',
    f'![accuracy vs cumulative uploaded bits]({curves.BITS_PLOT_FILENAME})',
    '',
    *curves.seconds_plot_markdown({m.label: list(m.runs.values()) for m in chosen.values()}),
    'The curves join the evaluated rounds only (mean over seeds, ± one standard deviation); '
    "on the bits axis each point is a round's mean accuracy at that round's mean cumulative "
    'uploaded bits, so every curve ends at its last evaluation.',
    '',
  ]


def _extension_section(
  spec: evidence_spec.ExperimentSpec, chosen: Mapping[str, MethodRuns]
) -> list[str]:
  """The verdicts again over every trained seed, a sequential extension fixed beforehand."""
  return [
    f'## Verdicts with the sequential extension to {spec.extended_seeds} seeds',
    '',
    f'The configuration fixed, before these runs, an extension from {spec.seeds} to '
    f'{spec.extended_seeds} seeds (`--extended_seeds`), planned from the first {spec.seeds} '
    "seeds' spread (the *seeds to decide* above). The verdicts above stay those of the first "
    f'{spec.seeds} seeds; these are over all {spec.extended_seeds}, a second look at the same '
    'claims, decided by the same rules.',
    '',
    verdict_table(spec, chosen) if spec.claims else '(no claims)',
    '',
    *_incomplete(spec, chosen, spec.trained_seeds),
  ]


def results_markdown(
  spec: evidence_spec.ExperimentSpec, runs: Sequence[results.Run], *, command: str
) -> str:
  """The text of results.md."""
  tuning = evidence_spec.tune(spec, runs)
  parts = [
    report.MARKER,
    '',
    f'# {spec.title}',
    '',
    f'Regenerate this file{"" if spec.tuning_only else " and its plots"} with:',
    '',
    '```sh',
    command,
    '```',
    '',
  ]
  if spec.tuning_only:
    parts += [
      f'This experiment only tunes: no seed is reported. Each method ran at every rate of the '
      f'grid on the tuning seed {spec.tuning_seed}; the experiments configured with '
      f'`--learning_rates_from={spec.name}` run each method at the rate chosen here.',
      '',
    ]
  else:
    parts += _reported_sections(spec, reported_runs(spec, runs, tuning))
    if spec.extended_seeds:
      parts += _extension_section(spec, reported_runs(spec, runs, tuning, spec.trained_seeds))
  if spec.tuned:
    parts += _tuning_section(spec, tuning)
  return '\n'.join(parts + _settings_section(spec))


def report_files(
  spec: evidence_spec.ExperimentSpec,
  runs: Sequence[results.Run],
  output_dir: str | os.PathLike[str],
  *,
  command: str,
) -> dict[str, str | bytes]:
  """The experiment's report for `output_dir`, path -> content: the plots (none for a
  tuning-only experiment), then results.md. Nothing is written.

  Raises:
    ValueError: As `evidence_spec.tune`.
  """
  text = results_markdown(spec, runs, command=command)
  output_dir = os.path.abspath(os.fspath(output_dir))
  results_path = os.path.join(output_dir, report.RESULTS_FILENAME)
  if spec.tuning_only:  # Nothing reported, nothing to draw.
    return {results_path: text}
  tuning = evidence_spec.tune(spec, runs)
  groups = {
    m.label: [m.runs[s] for s in sorted(m.runs)]
    for m in reported_runs(spec, runs, tuning).values()
    if m.runs
  }
  return {**curves.plot_files(groups, output_dir, title=spec.title), results_path: text}


def write(
  spec: evidence_spec.ExperimentSpec,
  runs: Sequence[results.Run],
  output_dir: str | os.PathLike[str],
  *,
  command: str,
) -> tuple[str, ...]:
  """Writes the `report_files` into `output_dir`; returns their paths.

  Raises:
    ValueError: As `evidence_spec.tune`, or if a path holds a file this
      project did not write.
  """
  return report.write_files(report_files(spec, runs, output_dir, command=command))
