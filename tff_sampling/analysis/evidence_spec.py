"""What an experiment that decides a paper's claims fixes before it runs.

An `ExperimentSpec` names the binary that trains, its flags, the methods and
their learning-rate grid, the seed that tunes and the seeds that are reported,
how a run is summarised (mean of the last ``final_k`` evaluations, targets)
and the paper's claims, each a `Claim` to be decided by a paired interval
(`tff_sampling.analysis.evidence`). The command-line form is an absl flagfile read by
``python -m bin.experiment`` and ``python -m bin.report``.

Run layout under a runs directory: ``lr<rate>/<prefix>_<method>_seed<seed>``,
one folder per learning rate holding every run trained at that rate (the
tuning seed's runs for every rate of the grid, the reported seeds' runs at
each method's chosen rate).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import math
import re

import numpy as np

from tff_sampling.analysis import evidence
from tff_sampling.runtime import results

# Claim metrics; ``rounds_to_<t>`` / ``bits_to_<t>`` take an accuracy target of the spec.
FINAL = 'final'
CURVE = 'auc'
BEST_LOSS = 'best_loss'
# What a tuning run is scored by (the higher the better): its final accuracy, or the negated
# lowest evaluation loss (for an experiment whose claims are on the loss).
TUNE_ON = ('final', BEST_LOSS)
ROUNDS_TO = 'rounds_to_'
BITS_TO = 'bits_to_'
SECONDS_TO = 'seconds_to_'  # Simulated seconds, under a system model (`tff_sampling.devices`).
TO_TARGET = (ROUNDS_TO, BITS_TO, SECONDS_TO)
_CLAIM = re.compile(
  r'^(?P<method>[A-Za-z0-9_.+-]+)(?P<op>[<>=])(?P<baseline>[A-Za-z0-9_.+-]+)'
  r':(?P<metric>[A-Za-z0-9_.]+)(@(?P<margin>[0-9.eE+-]+))?$'
)
_OPS = {
  '>': evidence.Direction.HIGHER,
  '<': evidence.Direction.LOWER,
  '=': evidence.Direction.EQUAL,
}
_SYMBOLS = {v: k for k, v in _OPS.items()}


@dataclasses.dataclass(frozen=True)
class Claim:
  """A paper's claim about ``method − baseline`` in one metric.

  Attributes:
    method, baseline: Method names of the spec.
    metric: `FINAL`, `CURVE`, `BEST_LOSS` (the lowest evaluation loss),
      ``rounds_to_<target>`` or ``bits_to_<target>``.
    direction: `evidence.Direction.HIGHER`, `LOWER` or `EQUAL`.
    margin: For `EQUAL`: the largest difference that counts as equal.
    text: The claim as written (``optimal>uniform:final``).
  """

  method: str
  baseline: str
  metric: str
  direction: evidence.Direction
  margin: float = 0.0

  @property
  def text(self) -> str:
    margin = f'@{self.margin:g}' if self.direction == evidence.Direction.EQUAL else ''
    return f'{self.method}{_SYMBOLS[self.direction]}{self.baseline}:{self.metric}{margin}'

  @property
  def target(self) -> float | None:
    for prefix in TO_TARGET:
      if self.metric.startswith(prefix):
        return float(self.metric[len(prefix) :])
    return None


def parse_claim(text: str) -> Claim:
  """``<method><op><baseline>:<metric>[@margin]``, op one of ``>``, ``<``, ``=``.

  Raises:
    ValueError: Naming the text and the form it should have.
  """
  match = _CLAIM.match(text.strip())
  if not match:
    raise ValueError(
      f'Claim {text!r} is not <method><op><baseline>:<metric>[@margin] with op one of >, <, = '
      "(e.g. 'optimal>uniform:final' or 'optimal=full:final@0.02')."
    )
  direction = _OPS[match['op']]
  margin = float(match['margin']) if match['margin'] else 0.0
  if direction == evidence.Direction.EQUAL and not margin > 0:
    raise ValueError(f'Claim {text!r} claims equality: give its margin, e.g. {text}@0.02.')
  if direction != evidence.Direction.EQUAL and match['margin']:
    raise ValueError(f'Claim {text!r}: a margin belongs to an equality claim (=) only.')
  metric = match['metric']
  if metric not in (FINAL, CURVE, BEST_LOSS) and not metric.startswith(TO_TARGET):
    raise ValueError(
      f'Claim {text!r}: metric {metric!r} is not {FINAL}, {CURVE}, {BEST_LOSS}, '
      f'{ROUNDS_TO}<target>, {BITS_TO}<target> or {SECONDS_TO}<target>.'
    )
  return Claim(match['method'], match['baseline'], metric, direction, margin)


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
  """Everything an experiment fixes before it runs.

  Attributes:
    name: The experiment's name (its report folder's).
    title: The report's heading.
    binary: The training binary, ``bin.<binary>``.
    binary_flags: Its flags (``--name=value``), shared by every run.
    methods: The methods compared (values of the binary's method flag).
    baseline: The method every other is compared with in the report.
    learning_rates: Client learning-rate grid; one value means no tuning.
      With `fixed_rates`, the distinct rates of those.
    tuning_seed: The seed the grid is run with (never a reported seed).
    seeds: Reported seeds ``0 … seeds − 1``; 0 for a tuning-only experiment
      (a tuned grid whose rates sibling experiments borrow, nothing reported).
    final_k: A run's final accuracy is the mean of its last ``final_k`` evaluations.
    targets: Accuracy targets of the rounds/bits-to-target summaries.
    claims: The paper's claims.
    label_key: The hyper-parameter naming a run's method.
    method_flag: The binary's flag set to each method (``sampling``; ``alpha``
      to compare values of FedGS's α).
    extra_columns: ``metrics.csv`` columns the report summarises too (mean over
      a run's rounds, then over seeds), e.g. the improvement factor α; never
      part of a verdict.
    fixed_rates: ``(method, rate)`` for every method: no tuning, each method
      trains at its own rate, fixed by the configuration (e.g. the rates
      another experiment's tuning chose, as FedGS tunes once under full
      availability and keeps the rates for every availability mode).
  """

  name: str
  title: str
  binary: str
  binary_flags: tuple[str, ...]
  methods: tuple[str, ...]
  baseline: str
  learning_rates: tuple[float, ...]
  tuning_seed: int
  seeds: int
  final_k: int
  targets: tuple[float, ...]
  claims: tuple[Claim, ...]
  label_key: str = 'sampling'
  method_flag: str = 'sampling'
  extra_columns: tuple[str, ...] = ()
  fixed_rates: tuple[tuple[str, float], ...] = ()
  extend_grid: int = 0
  rates_from: str = ''
  extended_seeds: int = 0
  tune_on: str = 'final'

  def __post_init__(self):
    if not self.methods:
      raise ValueError('An experiment needs at least one method.')
    if self.rates_from and not self.fixed_rates:
      return  # Resolved by `with_borrowed_rates` before anything runs or reports.
    if self.fixed_rates:
      named = [m for m, _ in self.fixed_rates]
      if sorted(named) != sorted(self.methods):
        raise ValueError(
          f'Fixed learning rates name {named}; give exactly one for each method {self.methods}.'
        )
      rates = tuple(sorted({r for _, r in self.fixed_rates}, reverse=True))
      if tuple(self.learning_rates) != rates:
        raise ValueError(
          f'With fixed rates the learning rates are {rates}, got {self.learning_rates}.'
        )
    if self.baseline not in self.methods:
      raise ValueError(f'The baseline {self.baseline!r} is not one of the methods {self.methods}.')
    if not self.learning_rates or any(
      not (math.isfinite(r) and r > 0) for r in self.learning_rates
    ):
      raise ValueError(f'Learning rates must be finite and > 0, got {self.learning_rates}.')
    if self.extend_grid < 0:
      raise ValueError(f'extend_grid must be >= 0, got {self.extend_grid}.')
    if self.final_k < 1:
      raise ValueError(f'final_k must be >= 1, got {self.final_k}.')
    if self.tune_on not in TUNE_ON:
      raise ValueError(f'tune_on must be one of {", ".join(TUNE_ON)}, got {self.tune_on!r}.')
    if self.seeds < (0 if self.tuned else 1):
      raise ValueError(
        f'seeds must be >= 1 (0 only for a tuning-only experiment, with a grid of rates), got '
        f'{self.seeds}.'
      )
    if self.extended_seeds and self.extended_seeds <= self.seeds:
      raise ValueError(
        f'extended_seeds must be 0 (no extension) or above seeds={self.seeds}, got '
        f'{self.extended_seeds}.'
      )
    if self.claims and self.tuning_only:
      raise ValueError('A tuning-only experiment (seeds=0) reports nothing: drop its claims.')
    if self.tuning_seed in self.trained_seeds and self.tuned:
      raise ValueError(
        f'The tuning seed {self.tuning_seed} is a reported seed '
        f'(0-{self.trained_seeds.stop - 1}); '
        'tune on another seed.'
      )
    for target in self.targets:
      if not 0 < target <= 1:
        raise ValueError(f'Targets are accuracies in (0, 1], got {target}.')
    for claim in self.claims:
      for name in (claim.method, claim.baseline):
        if name not in self.methods:
          raise ValueError(f'Claim {claim.text!r} names {name!r}, not one of {self.methods}.')
      if claim.target is not None and claim.target not in self.targets:
        raise ValueError(
          f'Claim {claim.text!r} uses target {claim.target:g}; add it to the targets first.'
        )

  @property
  def tuned(self) -> bool:
    """Whether the methods' rates are chosen by tuning runs (a grid, not fixed)."""
    return len(self.learning_rates) > 1 and not self.fixed_rates

  @property
  def tuning_only(self) -> bool:
    """Whether the experiment only tunes (no reported seed): its siblings borrow its rates."""
    return self.seeds == 0

  @property
  def reported_seeds(self) -> range:
    """The seeds the verdicts are first given on (``--seeds``)."""
    return range(self.seeds)

  @property
  def trained_seeds(self) -> range:
    """Every seed trained at the chosen rates: the reported ones, then those of a sequential
    extension fixed before its runs (``--extended_seeds``), whose verdicts are given again."""
    return range(max(self.seeds, self.extended_seeds))


def rate_directory(rate: float) -> str:
  """The runs directory's sub-folder of one learning rate."""
  return f'lr{rate:g}'


def run_rate(run: results.Run) -> float:
  return float(run.hparams['client_learning_rate'])


def _same_method(method: str, recorded) -> bool:
  """Whether a recorded hyper-parameter names `method` (``'1'`` names 1.0 too)."""
  if method == str(recorded):
    return True
  if isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
    try:
      return float(method) == float(recorded)
    except ValueError:
      return False
  return False


def run_method(run: results.Run, spec: ExperimentSpec) -> str:
  """The spec's method that `run` trained (its `label_key` value as text if none)."""
  recorded = run.hparams.get(spec.label_key)
  return next((m for m in spec.methods if _same_method(m, recorded)), str(recorded))


def diverged(run: results.Run) -> int | None:
  """The round a run diverged in, or None.

  The signs `tff_sampling.program.check_diverged` stops a run on, as far as
  ``metrics.csv`` keeps them: an infinite loss, a ``…non_finite…``
  measurement above 0, or a NaN loss in a row that measured it: a NaN cell
  reads like an empty one, so a NaN training loss counts in a row that
  released the round's training metrics, and another NaN loss (e.g.
  ``eval/loss``) in a row where a metric beside it (``eval/accuracy``) is
  finite.
  """
  released = np.isfinite(run.metrics.get('round_seconds', np.zeros(run.rounds.size)))
  bad = np.zeros(run.rounds.size, bool)
  for name, values in run.metrics.items():
    group, _, leaf = name.rpartition('/')
    if leaf == 'loss':
      bad |= np.isinf(values)
      if name.startswith('train/'):
        measured = released
      else:
        beside = [v for n, v in run.metrics.items() if n != name and n.rpartition('/')[0] == group]
        measured = np.zeros(run.rounds.size, bool)
        for values_beside in beside:
          measured |= np.isfinite(values_beside)
      bad |= measured & np.isnan(values)
    elif 'non_finite' in leaf:
      bad |= np.nan_to_num(values, nan=0.0) > 0
  rows = np.flatnonzero(bad)
  return int(run.rounds[rows[0]]) if rows.size else None


def failed_run(run: results.Run) -> results.Run:
  """`run`, or for a run that diverged, the run a failure scores as.

  From the round it diverged in to its configured last round (``hparams['rounds']``) the
  model is lost: accuracy 0 at that round and at the last, and no other evaluation. So its
  final accuracy is 0, its curve falls to 0 there and stays, and a target it had not reached
  is never reached (censored at the last round, uploads as they stood). Its lowest loss is
  the lowest it reached: a minimum reached is not undone.
  """
  at = diverged(run)
  if at is None:
    return run
  last = max(int(run.hparams.get('rounds', at)), at)
  keep = run.rounds < at
  rounds = np.concatenate([run.rounds[keep], np.unique([at, last])])
  added = rounds.size - int(keep.sum())
  metrics = {}
  for name, values in run.metrics.items():
    tail = np.full(added, np.nan)
    if name == evidence.ACCURACY_COLUMN:
      tail[:] = 0.0
    elif name in (results.BITS_COLUMN, evidence.SECONDS_COLUMN):
      tail[:] = run.last_finite(name)
    metrics[name] = np.concatenate([np.asarray(values, np.float64)[keep], tail])
  return dataclasses.replace(run, rounds=rounds, metrics=metrics)


def finished(run: results.Run) -> bool:
  """Whether `run` trained all its rounds or diverged (training it again would diverge again)."""
  return diverged(run) is not None or int(run.rounds[-1]) >= int(run.hparams.get('rounds', 0))


def beyond(edge: float, neighbour: float) -> float:
  """The next rate past `edge`, away from `neighbour`, at the same ratio (2 significant digits).

  E.g. past 0.01 from 0.03: 0.0033; past 0.1 from 0.03: 0.33.
  """
  return float(f'{edge * edge / neighbour:.2g}')


@dataclasses.dataclass(frozen=True)
class TuningResult:
  """The tuning seed's score of every (method, rate) and each method's chosen rate.

  Attributes:
    scores: (method, rate) -> mean of the last ``final_k`` evaluations of a
      finished run (with ``tune_on='best_loss'``: its lowest evaluation loss,
      the lower the better); NaN for a run that diverged (`diverged_at` says when);
      absent for a run that is missing or still training.
    diverged_at: (method, rate) -> round of divergence, for diverged runs.
    chosen: method -> the rate with the highest score (ties: the larger rate).
    tried: method -> the rates its choice was made from, largest first: the
      grid, and the extensions past its edges (`ExperimentSpec.extend_grid`).
    pending: method -> the rate to train next on the tuning seed before its
      choice is final (a rate of the grid not finished yet, or its best rate so
      far is at the edge of those tried and extensions are left); empty when
      tuning is done.
  """

  scores: Mapping[tuple[str, float], float]
  diverged_at: Mapping[tuple[str, float], int]
  chosen: Mapping[str, float]
  tried: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
  pending: Mapping[str, float] = dataclasses.field(default_factory=dict)


def _best(
  method: str, rates: Sequence[float], scores: Mapping[tuple[str, float], float], sign: float
):
  """The rate of the highest finite ``sign × score`` (ties: the larger rate), or None."""
  candidates = [
    (sign * scores[(method, rate)], rate)
    for rate in rates
    if math.isfinite(scores.get((method, rate), math.nan))
  ]
  return max(candidates)[1] if candidates else None


def tune(spec: ExperimentSpec, runs: Sequence[results.Run]) -> TuningResult:
  """Chooses each method's learning rate from the tuning seed's runs.

  Each method's best rate on the grid; if it is the grid's smallest or largest
  rate and ``spec.extend_grid`` allows, the rate past that edge (`beyond`) is
  tried too, and so on until the best rate is inside the rates tried (the
  paper's rule, Chen et al. App. F). A rate of the grid, or past its edge, whose
  run is not finished yet is `TuningResult.pending` (the grid's first), and the
  choice so far is provisional.
  Without a grid, every method gets its fixed rate (or the one rate).

  Raises:
    ValueError: If a method has no finished, non-diverged tuning run.
  """
  if spec.rates_from and not spec.fixed_rates:
    raise ValueError(
      f'{spec.name} takes its rates from {spec.rates_from}: resolve them first '
      '(bin.experiment_config.borrow_rates).'
    )
  if spec.fixed_rates:
    return TuningResult({}, {}, dict(spec.fixed_rates))
  if not spec.tuned:
    (rate,) = spec.learning_rates
    return TuningResult({}, {}, dict.fromkeys(spec.methods, rate))
  scores: dict[tuple[str, float], float] = {}
  diverged_at: dict[tuple[str, float], int] = {}
  for run in runs:
    if run.hparams.get('seed') != spec.tuning_seed:
      continue
    key = (run_method(run, spec), run_rate(run))
    if key[0] not in spec.methods:
      continue
    at = diverged(run)
    if at is not None:
      diverged_at[key] = at
      scores[key] = math.nan
    elif finished(run):
      scores[key] = (
        evidence.lowest(run)
        if spec.tune_on == BEST_LOSS
        else evidence.final_mean(run, spec.final_k)
      )
    # An unfinished tuning run (still training) does not score yet.
  chosen, tried, pending = {}, {}, {}
  sign = -1.0 if spec.tune_on == BEST_LOSS else 1.0
  for method in spec.methods:
    rates = sorted(spec.learning_rates, reverse=True)
    best = _best(method, rates, scores, sign)
    unscored = [rate for rate in rates if (method, rate) not in scores]
    if unscored and best is not None:  # The grid is not all in: the choice is provisional.
      pending[method] = unscored[0]
    for _ in range(spec.extend_grid if not unscored else 0):
      if best is None or len(rates) < 2 or best not in (rates[0], rates[-1]):
        break
      step = beyond(rates[0], rates[1]) if best == rates[0] else beyond(rates[-1], rates[-2])
      if (method, step) not in scores:
        pending[method] = step
        break
      rates = sorted([*rates, step], reverse=True)
      best = _best(method, rates, scores, sign)
    if best is None:
      raise ValueError(
        f'Method {method!r} has no finished tuning run that did not diverge; run '
        'python -m bin.experiment --stage=tune first, or widen the learning-rate grid.'
      )
    chosen[method], tried[method] = best, tuple(rates)
  return TuningResult(
    {k: v for k, v in scores.items() if k[1] in tried.get(k[0], ())},
    {k: v for k, v in diverged_at.items() if k[1] in tried.get(k[0], ())},
    chosen,
    tried,
    pending,
  )


def missing_runs(spec: ExperimentSpec, runs: Sequence[results.Run]) -> list[str]:
  """The runs `spec` still needs before its report is final, each as ``method at rate, seed s``
  (empty when the experiment is complete): the tuning grid, any rate past its edge, and every
  method on every reported seed at its chosen rate (listed once the tuning is done, so an
  experiment still tuning needs more runs than these). A borrowed rate must be resolved first.
  """
  done = {
    (run_method(r, spec), rate_directory(run_rate(r)), r.hparams.get('seed'))
    for r in runs
    if finished(r)
  }
  wanted = []
  if spec.tuned:
    wanted = [(m, r, spec.tuning_seed) for r in spec.learning_rates for m in spec.methods]
  grid_done = all((m, rate_directory(r), s) in done for m, r, s in wanted)
  try:
    tuning = tune(spec, [r for r in runs if finished(r)])
  except ValueError:
    tuning = None
  if tuning is not None and grid_done:  # Past the grid's edges: only the whole grid tells.
    wanted += [(m, r, spec.tuning_seed) for m, r in tuning.pending.items()]
    if not tuning.pending:
      wanted += [(m, tuning.chosen[m], s) for s in spec.trained_seeds for m in spec.methods]
  missing = [
    f'{m} at {r:g}, seed {s}' for m, r, s in wanted if (m, rate_directory(r), s) not in done
  ]
  if tuning is None and not missing:
    missing = ['a method with no tuning run that did not diverge: widen its grid']
  return missing


def with_borrowed_rates(spec: ExperimentSpec, source: TuningResult) -> ExperimentSpec:
  """`spec` with each method's rate fixed to the one `source` (its sibling's tuning) chose.

  Raises:
    ValueError: If the sibling's tuning is not done, or lacks one of the methods.
  """
  if source.pending:
    raise ValueError(
      f'The tuning of {spec.rates_from} is not done ('
      + ', '.join(f'{m} at {r:g}' for m, r in source.pending.items())
      + ' still to train); run its --stage=tune first.'
    )
  _, _, one = spec.rates_from.partition(':')  # 'name:method': that method's rate for all.
  wanted = {m: one or m for m in spec.methods}
  missing = sorted({w for w in wanted.values() if w not in source.chosen})
  if missing:
    raise ValueError(f'{spec.rates_from} tuned no rate for {", ".join(missing)}.')
  fixed = tuple((m, source.chosen[wanted[m]]) for m in spec.methods)
  return dataclasses.replace(
    spec, fixed_rates=fixed, learning_rates=tuple(sorted({r for _, r in fixed}, reverse=True))
  )
