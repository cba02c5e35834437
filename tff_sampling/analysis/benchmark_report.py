"""The benchmark's page: every sampler ranked against uniform in each cell of the grid.

A cell is one configured experiment (`tff_sampling.analysis.evidence_spec`)
of ``bin.benchmark``: one task (regime) under one availability mode, every
method trained on the same seeds. For each cell the page ranks the methods by
final accuracy and gives, against the cell's baseline (uniform sampling), the
paired difference over seeds with its 95% interval:

* at a fixed number of rounds: final accuracy (mean of the last ``final_k``
  evaluations);
* at a fixed uplink budget: the accuracy when the run had uploaded as many bits
  as the baseline uploads in its whole run (`evidence.accuracy_at_bits`);
* at a fixed client work: the accuracy when its clients had trained on as many
  examples as the baseline's do in its whole run (`evidence.accuracy_at_work`), so
  that a method training three times the clients cannot win by compute alone;
* in a cell a system model timed (``--devices``), at a fixed simulated time: the
  accuracy reached within the baseline's simulated seconds (`evidence.accuracy_at_seconds`);

then rounds and uploaded bits to the first target, total bits and server
seconds per round. A difference whose interval covers 0 is marked *no
difference detected*. The accuracy-vs-bits plot of each cell shows the three
best methods and the baseline. Above the cells, `overview` puts every method's
rank and verdicts in every complete cell side by side, ordered by mean rank;
`optimal_overview` does the same for what optimal uploads change, each sampler
``+optimal`` against the same sampler alone (`optimal_effects`, detailed below
each cell's ranking by `optimal_table`). A tuning-only cell (``--seeds=0``, the ideal-availability
cell whose rates the other modes of its task borrow) shows its tuning table instead.

The grid trains over several sessions, and its raw metrics are committed as runs
finish, so the page is rendered at any stage: a cell whose runs are not all in
says how far it is (`progress`) and is ranked only once complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import math
import os

import numpy as np

from tff_sampling.analysis import curves
from tff_sampling.analysis import evidence
from tff_sampling.analysis import evidence_report
from tff_sampling.analysis import evidence_spec
from tff_sampling.analysis import tables
from tff_sampling.comparisons import benchmark
from tff_sampling.runtime import results

AHEAD = 'ahead'
BEHIND = 'behind'
_WORDS = {
  evidence.Verdict.REPRODUCED: AHEAD,
  evidence.Verdict.CONTRADICTED: BEHIND,
  evidence.Verdict.NO_DIFFERENCE: evidence.Verdict.NO_DIFFERENCE,
  evidence.Verdict.TOO_FEW: evidence.Verdict.TOO_FEW,
}
_MARKS = {
  AHEAD: '+',
  BEHIND: '−',
  evidence.Verdict.NO_DIFFERENCE: '=',
  evidence.Verdict.TOO_FEW: '?',
}
PLOTTED = 3  # The best methods drawn beside the baseline.
ACTIVE_COLUMN = 'availability/active_clients'
ROUND_SECONDS_COLUMN = 'round_seconds'  # Wall-clock seconds of a round on the machine that ran it.


@dataclasses.dataclass(frozen=True)
class Cell:
  """One cell of the grid: its spec (rates resolved), its runs and its folder."""

  spec: evidence_spec.ExperimentSpec
  runs: Sequence[results.Run]
  folder: str
  pending: str = ''  # Why the cell is not shown yet (`progress`); empty once complete.


def progress(
  spec: evidence_spec.ExperimentSpec,
  runs: Sequence[results.Run],
  *,
  rates_from_pending: bool = False,
) -> str:
  """Empty when every run of the cell is in; otherwise how far the cell is, in words.

  Args:
    spec: The cell, its borrowed rates resolved unless `rates_from_pending`.
    runs: Its runs so far.
    rates_from_pending: The sibling whose rates it borrows has not finished tuning.
  """
  done = sum(evidence_spec.finished(run) for run in runs)
  if rates_from_pending:
    return f'{done} runs in; it waits for the tuning of {spec.rates_from}'
  missing = evidence_spec.missing_runs(spec, runs)
  return f'{done} runs in, at least {len(missing)} to go' if missing else ''


@dataclasses.dataclass(frozen=True)
class Row:
  """One method of a cell, compared with the baseline on the same seeds."""

  method: str
  label: str
  seeds: int
  final_by_seed: Mapping[int, float]
  final_difference: evidence.PairedDifference
  budget_by_seed: Mapping[int, float]
  budget_difference: evidence.PairedDifference
  work_by_seed: Mapping[int, float]
  work_difference: evidence.PairedDifference
  time_by_seed: Mapping[int, float]
  time_difference: evidence.PairedDifference
  rounds_to_target: np.ndarray
  bits_to_target: np.ndarray
  seconds_to_target: np.ndarray  # Simulated; NaN in a cell no system model timed.
  total_bits: float
  seconds: float

  @property
  def final(self) -> np.ndarray:
    return np.array(list(self.final_by_seed.values()))

  @property
  def at_budget(self) -> np.ndarray:
    return np.array(list(self.budget_by_seed.values()))

  @property
  def at_work(self) -> np.ndarray:
    return np.array(list(self.work_by_seed.values()))

  @property
  def at_time(self) -> np.ndarray:
    return np.array(list(self.time_by_seed.values()))

  def by_seed(self, measure: str) -> Mapping[int, float]:
    """The per-seed values of one of the `measures`."""
    return getattr(self, f'{measure}_by_seed')

  def difference(self, measure: str) -> evidence.PairedDifference:
    """Its difference against the baseline at one of the `measures`."""
    return getattr(self, f'{measure}_difference')


@dataclasses.dataclass(frozen=True)
class Budgets:
  """What the baseline spends in its whole run, averaged over its reported seeds: uploaded
  bits, examples its clients trained on, and simulated seconds under a system model (each NaN
  if its runs do not record it)."""

  bits: float
  examples: float
  seconds: float = math.nan


def _last_second(run: results.Run) -> float:
  elapsed = evidence.simulated_seconds(run)
  finite = elapsed[np.isfinite(elapsed)]
  return float(finite[-1]) if finite.size else math.nan


MEASURES = ('final', 'budget', 'work')  # Row's differences against the baseline in every cell.
TIME = 'time'  # And at the baseline's simulated seconds, in a cell a system model timed.


def measures(budget: Budgets) -> tuple[str, ...]:
  """The measures a cell compares its methods at: `MEASURES`, and `TIME` when its baseline's
  runs were timed by a system model."""
  return (*MEASURES, TIME) if math.isfinite(budget.seconds) else MEASURES


def _by_seed(runs: Mapping[int, results.Run], summary) -> dict[int, float]:
  return {seed: summary(run) for seed, run in runs.items()}


def rows(cell: Cell) -> tuple[list[Row], Budgets]:
  """The cell's methods, best final accuracy first, and the baseline's `Budgets`."""
  spec = cell.spec
  chosen = evidence_report.reported_runs(spec, cell.runs, evidence_spec.tune(spec, cell.runs))
  baseline = chosen[spec.baseline].runs
  if not baseline:
    raise ValueError(f'{spec.name}: the baseline {spec.baseline!r} has no reported run.')
  budget = Budgets(
    bits=float(np.mean([r.last_finite(results.BITS_COLUMN) for r in baseline.values()])),
    examples=float(np.mean([evidence.examples_trained(r)[-1] for r in baseline.values()])),
    seconds=float(np.mean([_last_second(r) for r in baseline.values()])),
  )
  target = spec.targets[0] if spec.targets else None
  timed = TIME in measures(budget)

  def final(run):
    return evidence.final_mean(run, spec.final_k)

  def at_budget(run):
    return evidence.accuracy_at_bits(run, budget.bits)

  def at_work(run):
    return evidence.accuracy_at_work(run, budget.examples)

  def at_time(run):
    return evidence.accuracy_at_seconds(run, budget.seconds)

  base_final, base_budget = _by_seed(baseline, final), _by_seed(baseline, at_budget)
  base_work, base_time = _by_seed(baseline, at_work), _by_seed(baseline, at_time)
  out = []
  for method in chosen.values():
    if not method.runs:
      continue
    finals, budgets = _by_seed(method.runs, final), _by_seed(method.runs, at_budget)
    work, time = _by_seed(method.runs, at_work), _by_seed(method.runs, at_time)
    out.append(
      Row(
        method=method.method,
        label=method.label,
        seeds=len(method.runs),
        final_by_seed=finals,
        final_difference=evidence.paired_difference(finals, base_final),
        budget_by_seed=budgets,
        budget_difference=evidence.paired_difference(budgets, base_budget),
        work_by_seed=work,
        work_difference=evidence.paired_difference(work, base_work),
        time_by_seed=time,
        time_difference=evidence.paired_difference(time, base_time),
        rounds_to_target=np.array(
          [
            evidence.rounds_to_target(r, target) if target else math.nan
            for r in method.runs.values()
          ]
        ),
        bits_to_target=np.array(
          [evidence.bits_to_target(r, target) if target else math.nan for r in method.runs.values()]
        ),
        seconds_to_target=np.array(
          [
            evidence.seconds_to_target(r, target) if target and timed else math.nan
            for r in method.runs.values()
          ]
        ),
        total_bits=float(
          np.mean([r.last_finite(results.BITS_COLUMN) for r in method.runs.values()])
        ),
        seconds=evidence_report.median_round_seconds(method.runs.values()),
      )
    )
  out.sort(key=lambda row: -float(np.mean(row.final)))
  return out, budget


def active_clients(cell: Cell) -> float | None:
  """Clients active a round, averaged over the rounds of the baseline's reported runs.

  Every method of a seed sees the same active clients, so the baseline's runs
  stand for the cell. ``None`` if those runs do not record availability.
  """
  spec = cell.spec
  chosen = evidence_report.reported_runs(spec, cell.runs, evidence_spec.tune(spec, cell.runs))
  runs = chosen[spec.baseline].runs.values()
  counts = [run.column(ACTIVE_COLUMN) for run in runs if ACTIVE_COLUMN in run.metrics]
  values = np.concatenate(counts) if counts else np.empty(0)
  values = values[np.isfinite(values)]
  return float(values.mean()) if values.size else None


def machine_hours(cell: Cell) -> float:
  """Hours the cell's runs trained: the sum of every round's wall-clock seconds
  (``round_seconds``), over all its runs, tuning included. Evaluation between rounds and
  each call's start are not in it, and runs that trained side by side both count."""
  seconds = [
    run.column(ROUND_SECONDS_COLUMN) for run in cell.runs if ROUND_SECONDS_COLUMN in run.metrics
  ]
  values = np.concatenate(seconds) if seconds else np.empty(0)
  return float(values[np.isfinite(values)].sum()) / 3600.0


def _mean_sd(values: np.ndarray) -> str:
  return (
    f'{values.mean():.4f} ± {values.std(ddof=1):.4f}'
    if values.size > 1
    else (f'{values.mean():.4f}')
  )


def _word(difference: evidence.PairedDifference) -> str:
  """The verdict on a higher-is-better difference: ahead, behind, no difference, too few."""
  return _WORDS[evidence.verdict(difference, evidence.Direction.HIGHER)]


def _difference(difference: evidence.PairedDifference, baseline: bool = False) -> str:
  if baseline:
    return '(baseline)'
  if difference.n < 2:
    return _word(difference)
  return (
    f'{difference.mean:+.4f} [{difference.low:+.4f}, {difference.high:+.4f}] {_word(difference)}'
  )


def _marks(*differences: evidence.PairedDifference) -> str:
  return '/'.join(_MARKS[_word(d)] for d in differences)


def _reached(values: np.ndarray, scale: float = 1.0, digits: str = '.1f') -> str:
  finite = values[np.isfinite(values)]
  if not finite.size:
    return f'never (0/{values.size})'
  text = f'{finite.mean() / scale:{digits}}'
  return text if finite.size == values.size else f'{text} ({finite.size}/{values.size})'


def _holm_words(ranked: Sequence[Row], baseline_label: str, kinds: Sequence[str]) -> dict[str, str]:
  """``'<label> <measure>'`` -> the Holm-adjusted mark of each difference against the
  baseline at the `kinds` of `measures`, the cell's len(kinds) (n − 1) comparisons as one
  family."""
  keyed = [
    (f'{row.label} {kind}', row.difference(kind))
    for row in ranked
    if row.label != baseline_label
    for kind in kinds
  ]
  higher = evidence.Direction.HIGHER
  verdicts = evidence.holm_verdicts(
    [d for _, d in keyed], [higher] * len(keyed), [0.0] * len(keyed)
  )
  return {key: _MARKS[_WORDS[v]] for (key, _), v in zip(keyed, verdicts)}


_SHORT = {'final': 'final', 'budget': 'bits', 'work': 'work', TIME: 'time'}


def measure_header(kind: str, budget: Budgets, final_k: int) -> str:
  """What a column of one of the `measures` holds."""
  return {
    'final': f'final accuracy (last {final_k} evals)',
    'budget': f'accuracy at {budget.bits / 1e9:.4g} Gbit',
    'work': f'accuracy at {budget.examples / 1e6:.3g}M examples trained',
    TIME: f'accuracy at {budget.seconds:.4g} simulated s',
  }[kind]


def cell_table(cell: Cell) -> str:
  """The ranking of one cell as a pipe table."""
  ranked, budget = rows(cell)
  target = cell.spec.targets[0] if cell.spec.targets else None
  baseline_label = evidence_report.reported_runs(
    cell.spec, cell.runs, evidence_spec.tune(cell.spec, cell.runs)
  )[cell.spec.baseline].label
  kinds = measures(budget)
  holm = _holm_words(ranked, baseline_label, kinds)
  table = []
  for rank, row in enumerate(ranked, 1):
    is_baseline = row.label == baseline_label
    measured = []
    for kind in kinds:
      measured += [
        _mean_sd(np.array(list(row.by_seed(kind).values()))),
        _difference(row.difference(kind), is_baseline),
      ]
    table.append(
      [
        f'{rank}. {row.label}',
        str(row.seeds),
        *measured,
        '—' if is_baseline else '/'.join(holm[f'{row.label} {kind}'] for kind in kinds),
        _reached(row.rounds_to_target),
        _reached(row.bits_to_target, 1e9, '.4g'),
        *([_reached(row.seconds_to_target, 1.0, '.4g')] if TIME in kinds else []),
        f'{row.total_bits / 1e9:.4g}',
        f'{row.seconds:.2f}',
      ]
    )
  to = tables.target_text(target) if target else '—'
  versus = f'vs {cell.spec.baseline} [95% CI]'
  headers = [
    'method (lr)',
    'seeds',
    *(text for kind in kinds for text in (measure_header(kind, budget, cell.spec.final_k), versus)),
    f'Holm ({"/".join(_SHORT[kind] for kind in kinds)})',
    f'rounds to {to}',
    f'Gbit to {to}',
    *([f'simulated s to {to}'] if TIME in kinds else []),
    'total Gbit',
    's/round',
  ]
  return tables.pipe_table(headers, [list(c) for c in zip(*table)])


def overview(cells: Sequence[Cell]) -> list[str]:
  """Every method's place in every complete reported cell, the best mean place first.

  One row per method, one column per cell: its rank in the cell's table, then
  its verdict against the baseline at fixed rounds and at the fixed uplink budget
  (``+`` ahead, ``−`` behind, ``=`` no difference detected). Empty while no
  reported cell is complete.
  """
  ready = [cell for cell in cells if not (cell.pending or cell.spec.tuning_only)]
  if not ready:
    return []
  places: dict[str, dict[str, str]] = {}
  ranks: dict[str, list[int]] = {}
  names = []
  timed = False
  for cell in ready:
    name = os.path.basename(cell.folder)
    names.append(name)
    ranked, budget = rows(cell)
    timed = timed or TIME in measures(budget)
    for rank, row in enumerate(ranked, 1):
      if row.method == cell.spec.baseline:
        mark = f'{rank} (baseline)'
      else:
        differences = (row.difference(kind) for kind in measures(budget))
        mark = f'{rank} ({_marks(*differences)})'
      places.setdefault(row.method, {})[name] = mark
      ranks.setdefault(row.method, []).append(rank)
  order = sorted(places, key=lambda m: (float(np.mean(ranks[m])), m))
  columns = [[f'{i}. {m}' for i, m in enumerate(order, 1)]]
  columns += [[places[m].get(name, '—') for m in order] for name in names]
  columns.append([f'{np.mean(ranks[m]):.1f}' for m in order])
  return [
    '## At a glance',
    '',
    f'Every method in the {len(ready)} complete cell{"s" if len(ready) > 1 else ""} below: '
    'its rank by final accuracy in the cell, then against the baseline at fixed rounds / at '
    'the fixed uplink budget / at the fixed client work'
    + (' / at the fixed simulated time (in the cells a system model timed)' if timed else '')
    + ' (`+` ahead, `−` behind, `=` no difference detected: paired 95% intervals over seeds, '
    'uncorrected). Rows by mean rank.',
    '',
    tables.pipe_table(['method', *names, 'mean rank'], columns),
    '',
  ]


@dataclasses.dataclass(frozen=True)
class OptimalEffect:
  """What optimal uploads change for one sampler of a cell.

  Attributes:
    sampler: The sampler, run alone and as ``<sampler>+optimal``.
    final: ``+optimal − alone`` in final accuracy, paired over seeds.
    budget: The same at the cell's uplink budget (the bits its baseline uploads).
    work: The same at the cell's client work (the examples its baseline's clients train on).
    time: The same at the cell's simulated time (its baseline's; no pairs if untimed).
  """

  sampler: str
  final: evidence.PairedDifference
  budget: evidence.PairedDifference
  work: evidence.PairedDifference
  time: evidence.PairedDifference

  def difference(self, measure: str) -> evidence.PairedDifference:
    """The difference at one of the `measures`."""
    return getattr(self, measure)


def optimal_effects(cell: Cell, ranked: Sequence[Row] | None = None) -> list[OptimalEffect]:
  """Every sampler the cell runs both alone and with optimal uploads, in configured order.

  Args:
    cell: A complete reported cell.
    ranked: Its `rows`, if already computed.
  """
  by_method = {row.method: row for row in (rows(cell)[0] if ranked is None else ranked)}
  effects = []
  for method in cell.spec.methods:
    alone, paired = by_method.get(method), by_method.get(method + benchmark.OPTIMAL_UPLOADS)
    if alone and paired:
      effects.append(
        OptimalEffect(
          sampler=method,
          final=evidence.paired_difference(paired.final_by_seed, alone.final_by_seed),
          budget=evidence.paired_difference(paired.budget_by_seed, alone.budget_by_seed),
          work=evidence.paired_difference(paired.work_by_seed, alone.work_by_seed),
          time=evidence.paired_difference(paired.time_by_seed, alone.time_by_seed),
        )
      )
  return effects


def optimal_table(cell: Cell) -> str:
  """`optimal_effects` of one cell as a pipe table (empty if the cell pairs no sampler)."""
  ranked, budget = rows(cell)
  effects = optimal_effects(cell, ranked)
  if not effects:
    return ''
  kinds = measures(budget)
  columns = [[effect.sampler for effect in effects]]
  columns += [[_difference(effect.difference(kind)) for effect in effects] for kind in kinds]
  headers = [
    'sampler',
    *(
      f'+optimal − alone, {measure_header(kind, budget, cell.spec.final_k)} [95% CI]'
      for kind in kinds
    ),
  ]
  return tables.pipe_table(headers, columns)


def optimal_overview(cells: Sequence[Cell]) -> list[str]:
  """For each sampler and complete reported cell: do optimal uploads help it?

  One row per sampler run both alone and with optimal uploads, one column per
  cell: the verdict on ``+optimal − alone`` at fixed rounds / at the fixed uplink
  budget. Empty while no complete reported cell pairs a sampler.
  """
  ready = [cell for cell in cells if not (cell.pending or cell.spec.tuning_only)]
  marks: dict[str, dict[str, str]] = {}
  names = []
  for cell in ready:
    ranked, budget = rows(cell)
    effects = optimal_effects(cell, ranked)
    if not effects:
      continue
    name = os.path.basename(cell.folder)
    names.append(name)
    kinds = measures(budget)
    for effect in effects:
      marks.setdefault(effect.sampler, {})[name] = _marks(*map(effect.difference, kinds))
  if not names:
    return []
  order = list(marks)
  columns = [order, *([marks[m].get(name, '—') for m in order] for name in names)]
  return [
    '## What optimal uploads change',
    '',
    'Each sampler with optimal uploads (`+optimal`) against the same sampler alone, each at '
    'its own tuned rate, paired over seeds: at fixed rounds / at the fixed uplink budget / at '
    'the fixed client work (`+` higher with optimal uploads, `−` lower, `=` no difference '
    "detected: 95% intervals, uncorrected). Each cell's table of these differences follows "
    'its ranking.',
    '',
    tables.pipe_table(['sampler', *names], columns),
    '',
  ]


def cell_plot_files(cell: Cell) -> dict[str, bytes]:
  """Accuracy vs rounds and vs uploaded bits of the best `PLOTTED` methods and the baseline,
  as the PNGs to write into the cell's folder."""
  spec = cell.spec
  chosen = evidence_report.reported_runs(spec, cell.runs, evidence_spec.tune(spec, cell.runs))
  ranked, _ = rows(cell)
  keep = [row.label for row in ranked[:PLOTTED]]
  base = chosen[spec.baseline].label
  keep += [base] if base not in keep else []
  groups = {
    m.label: [m.runs[s] for s in sorted(m.runs)]
    for m in chosen.values()
    if m.label in keep and m.runs
  }
  return curves.plot_files(groups, cell.folder, title=spec.title)


def tuning_section(cell: Cell) -> list[str]:
  """A tuning-only cell: each method's final accuracy at each rate, the chosen rate in bold."""
  spec = cell.spec
  return [
    f'Tuning only (seed {spec.tuning_seed}, no seed reported): the cells configured with '
    f'`--learning_rates_from={spec.name}` run each method at the rate in bold, the highest '
    f'final accuracy (mean of the last {spec.final_k} evaluations; ties go to the larger rate).',
    '',
    evidence_report.tuning_table(spec, evidence_spec.tune(spec, cell.runs)),
    '',
  ]
