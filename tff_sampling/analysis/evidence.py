"""Statistics that decide: per-run summaries, paired differences and verdicts.

An experiment compares methods that share seeds: run ``(method, s)`` and run
``(baseline, s)`` draw the same cohorts, data order and initial model (common
random numbers), so the per-seed difference ``method − baseline`` removes the
seed's own luck. For every claim this module gives

* the per-seed values of a summary of each run (`final_mean`, `curve_mean`,
  `lowest` loss, `rounds_to_target`, `bits_to_target`);
* the paired difference over the seeds both runs have, with its t-based 95%
  confidence interval (`paired_difference`);
* a verdict (`verdict`) against the direction the paper claims:
  ``reproduced`` (the interval excludes 0 on the paper's side),
  ``contradicted`` (it excludes 0 on the other side), or ``no difference
  detected`` (it covers 0; the interval's width says what was ruled out). A
  claim of equivalence ("as good as") is reproduced only if the whole interval
  lies within ± a margin fixed beforehand, contradicted if it lies wholly
  outside, and ``undecided`` otherwise;
* the same verdicts for an experiment's claims taken together (`holm_verdicts`):
  each verdict is the outcome of a test (`decisive_test`), and Holm's step-down
  adjustment of the family's p-values keeps the chance of any wrong decisive
  verdict among them at 5%.

Summaries read only evaluated rounds: nothing is interpolated between two
evaluations.

Pure NumPy/SciPy; no I/O, no flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import enum
import math

import numpy as np
from scipy import stats

from tff_sampling.runtime import results

ACCURACY_COLUMN = 'eval/accuracy'
EXAMPLES_COLUMN = 'process/client_work/train/train/num_examples'
LOSS_COLUMN = 'eval/loss'
# Simulated seconds since round 1, under a system model (`tff_sampling.devices`).
SECONDS_COLUMN = 'system/cumulative_seconds'
CONFIDENCE = 0.95

# The paper's claimed direction of ``method − baseline``.


class Direction(enum.StrEnum):
  """What a claim states of ``method − baseline``."""

  HIGHER = 'higher'
  LOWER = 'lower'
  EQUAL = 'equal'  # Within ± a margin.


class Verdict(enum.StrEnum):
  """What the paired interval says of a claim (the words the reports print)."""

  REPRODUCED = 'reproduced'
  CONTRADICTED = 'contradicted'
  NO_DIFFERENCE = 'no difference detected'
  UNDECIDED = 'undecided'  # An equivalence claim whose interval straddles the margin.
  TOO_FEW = 'too few seeds'


def evaluated(run: results.Run, column: str = ACCURACY_COLUMN) -> tuple[np.ndarray, np.ndarray]:
  """The ``(rounds, values)`` of `column` at the rounds where it has a finite value."""
  values = run.column(column)
  keep = np.isfinite(values)
  return run.rounds[keep], values[keep]


def final_mean(run: results.Run, k: int, column: str = ACCURACY_COLUMN) -> float:
  """Mean of the last `k` evaluations of `column` (fewer if the run has fewer).

  Raises:
    ValueError: If `k` < 1 or the run has no evaluation.
  """
  if k < 1:
    raise ValueError(f'k must be >= 1, got {k}.')
  _, values = evaluated(run, column)
  if not values.size:
    raise ValueError(f'{run.name} has no evaluated {column!r}.')
  return float(values[-k:].mean())


def curve_mean(run: results.Run, column: str = ACCURACY_COLUMN) -> float:
  """Area under `column` against rounds, over the evaluated span, divided by its length.

  The trapezoid rule between consecutive evaluations, so it is the mean of
  the piecewise-linear curve through the evaluated points: a run that learns
  sooner scores higher even when the final values agree.

  Raises:
    ValueError: If the run has fewer than two evaluations.
  """
  rounds, values = evaluated(run, column)
  if rounds.size < 2:
    raise ValueError(f'{run.name} has fewer than two evaluations of {column!r}.')
  widths = np.diff(rounds).astype(np.float64)
  area = float(np.sum(widths * (values[1:] + values[:-1]) / 2.0))
  return area / float(rounds[-1] - rounds[0])


def lowest(run: results.Run, column: str = LOSS_COLUMN) -> float:
  """The lowest evaluated value of `column`: e.g. FedGS's "optimal test loss".

  Raises:
    ValueError: If the run has no evaluation.
  """
  _, values = evaluated(run, column)
  if not values.size:
    raise ValueError(f'{run.name} has no evaluated {column!r}.')
  return float(values.min())


def rounds_to_target(run: results.Run, target: float, column: str = ACCURACY_COLUMN) -> float:
  """First evaluated round with ``column >= target``; NaN if never."""
  found = results.rounds_to_target(run, target, column)
  return math.nan if found is None else float(found)


def bits_to_target(run: results.Run, target: float, column: str = ACCURACY_COLUMN) -> float:
  """Cumulative uploaded bits at `rounds_to_target`; NaN if never."""
  found = results.bits_to_target(run, target, column)
  return math.nan if found is None else float(found)


def seconds_to_target(run: results.Run, target: float, column: str = ACCURACY_COLUMN) -> float:
  """Simulated seconds (`SECONDS_COLUMN`, under a system model) at `rounds_to_target`; NaN if
  never."""
  found = results.bits_to_target(run, target, column, bits_column=SECONDS_COLUMN)
  return math.nan if found is None else float(found)


def accuracy_at_bits(run: results.Run, budget: float, column: str = ACCURACY_COLUMN) -> float:
  """`column` at the last evaluation whose cumulative uploaded bits are within `budget`.

  The accuracy a run had bought with `budget` uploaded bits (round 0, before any
  upload, if even its first evaluated round cost more).

  Raises:
    ValueError: If the run has no evaluation.
  """
  return _within(run, run.column(results.BITS_COLUMN), budget, column)


def simulated_seconds(run: results.Run) -> np.ndarray:
  """Simulated seconds since round 1 at the end of each round (`SECONDS_COLUMN`); all NaN if
  no system model timed the run."""
  if SECONDS_COLUMN not in run.metrics:
    return np.full(run.rounds.shape, np.nan)
  return run.column(SECONDS_COLUMN)


def accuracy_at_seconds(run: results.Run, seconds: float, column: str = ACCURACY_COLUMN) -> float:
  """`column` at the last evaluation by which at most `seconds` of simulated time had passed:
  the accuracy a run had reached by then; NaN if no system model timed it.

  Raises:
    ValueError: If the run has no evaluation.
  """
  return _within_recorded(run, simulated_seconds(run), seconds, column)


def examples_trained(run: results.Run) -> np.ndarray:
  """The examples the clients had trained on by the end of each round, summed over every
  client that trained (uploaded or not); all NaN if the run does not record them."""
  per_round = run.column(EXAMPLES_COLUMN)
  if np.isnan(per_round).all():
    return per_round
  return np.cumsum(np.nan_to_num(per_round, nan=0.0))


def accuracy_at_work(run: results.Run, examples: float, column: str = ACCURACY_COLUMN) -> float:
  """`column` at the last evaluation by which the clients had trained on at most `examples`
  examples in all (`examples_trained`): the accuracy bought with that much client work; NaN
  if the run does not record its examples.

  Raises:
    ValueError: If the run has no evaluation.
  """
  return _within_recorded(run, examples_trained(run), examples, column)


def _within_recorded(run: results.Run, spent: np.ndarray, budget: float, column: str) -> float:
  """`_within`, or NaN if the budget is NaN or the run does not record what it spends."""
  if math.isnan(budget) or np.isnan(spent).all():
    return math.nan
  return _within(run, spent, budget, column)


def _within(run: results.Run, spent: np.ndarray, budget: float, column: str) -> float:
  """`column` at the last evaluation whose `spent` (per round, cumulative) is within `budget`;
  its first evaluation if none is."""
  rounds, values = evaluated(run, column)
  if not values.size:
    raise ValueError(f'{run.name} has no evaluated {column!r}.')
  at = np.array([spent[np.flatnonzero(run.rounds == r)[0]] for r in rounds])
  within = np.flatnonzero(np.nan_to_num(at, nan=np.inf) <= budget)
  return float(values[within[-1]]) if within.size else float(values[0])


def block_means(run: results.Run, block: int, column: str = ACCURACY_COLUMN) -> np.ndarray:
  """Mean of the evaluations of `column` in rounds ``(b·block, (b+1)·block]`` for each whole
  block b of the run's rounds (NaN for a block without an evaluation)."""
  if block < 1:
    raise ValueError(f'block must be >= 1 round, got {block}.')
  rounds, values = evaluated(run, column)
  blocks = int(run.rounds.max()) // block
  means = np.full(blocks, np.nan)
  for b in range(blocks):
    inside = (rounds > b * block) & (rounds <= (b + 1) * block)
    if inside.any():
      means[b] = values[inside].mean()
  return means


def flattened_at(
  run: results.Run, block: int, gain: float, lookback: int = 1, column: str = ACCURACY_COLUMN
) -> int | None:
  """The first round R (a multiple of `block`, from ``(lookback + 1)·block``) at which the
  run's curve has flattened: the mean of its evaluations over the last `block` rounds,
  ``(R − block, R]``, exceeds the mean over the block `lookback` blocks earlier by less than
  `gain`. None if it never did within the run."""
  if lookback < 1:
    raise ValueError(f'lookback must be >= 1 block, got {lookback}.')
  means = block_means(run, block, column)
  for b in range(lookback, means.size):
    if means[b] - means[b - lookback] < gain:
      return (b + 1) * block
  return None


def to_target(
  run: results.Run,
  target: float,
  *,
  bits: bool = False,
  seconds: bool = False,
  column: str = ACCURACY_COLUMN,
) -> tuple[float, bool]:
  """Rounds (or uploaded bits, or simulated seconds) to `target`, censored at the run's end
  if never reached.

  Returns:
    ``(value, censored)``: the first evaluated round with ``column >= target``
    (or the cumulative bits or seconds then) and False; or, if the run never
    reaches it, its last round (or its total bits or seconds), a lower bound of
    the true value, and True.
  """
  if bits and seconds:
    raise ValueError('to_target counts bits or seconds, not both.')
  cost = results.BITS_COLUMN if bits else SECONDS_COLUMN if seconds else None
  if cost is None:
    found = rounds_to_target(run, target, column)
  else:
    reached = results.bits_to_target(run, target, column, bits_column=cost)
    found = math.nan if reached is None else float(reached)
  if math.isfinite(found):
    return found, False
  if cost is not None:
    return run.last_finite(cost), True
  return float(run.rounds[-1]), True


def censored_verdict(
  outcome: str, direction: str, *, method_censored: bool, baseline_censored: bool
) -> str:
  """`verdict`'s outcome on values some of which are censored (lower bounds).

  A censored value is below the truth. For a claim that the method is *lower*
  (fewer rounds or bits), censoring the baseline only shrinks the difference,
  so a verdict in the claim's favour stands, while censoring the method could
  make it: such a verdict becomes `Verdict.UNDECIDED`; symmetrically for *higher*.
  Equality claims are undecided under any censoring, and so is *no difference
  detected*: a censored value may hide a difference (two runs that never reach
  the target differ by 0 in their bounds, whatever their true values).
  """
  if outcome == Verdict.TOO_FEW:
    return outcome
  if outcome == Verdict.NO_DIFFERENCE:
    return Verdict.UNDECIDED if (method_censored or baseline_censored) else outcome
  if direction == Direction.EQUAL:
    return Verdict.UNDECIDED if (method_censored or baseline_censored) else outcome
  # Which side's censoring can only favour the claim.
  favouring = method_censored if direction == Direction.LOWER else baseline_censored
  opposing = baseline_censored if direction == Direction.LOWER else method_censored
  if outcome == Verdict.REPRODUCED and favouring:
    return Verdict.UNDECIDED
  if outcome == Verdict.CONTRADICTED and opposing:
    return Verdict.UNDECIDED
  return outcome


@dataclasses.dataclass(frozen=True)
class PairedDifference:
  """``method − baseline`` over the seeds both have a finite value for.

  Attributes:
    seeds: The paired seeds, increasing.
    differences: The per-seed differences, in `seeds` order.
    mean: Their mean (NaN if none).
    low, high: The t-based `CONFIDENCE` interval of the mean difference
      (NaN with fewer than two pairs).
  """

  seeds: tuple[int, ...]
  differences: tuple[float, ...]
  mean: float
  low: float
  high: float

  @property
  def n(self) -> int:
    return len(self.seeds)

  @property
  def width(self) -> float:
    return self.high - self.low


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
  """The two-sided t interval of the mean of `values`; NaNs for fewer than two."""
  x = np.asarray(values, dtype=np.float64)
  if x.size < 2:
    return math.nan, math.nan
  half = float(stats.t.ppf(0.5 + confidence / 2.0, x.size - 1)) * float(x.std(ddof=1))
  half /= math.sqrt(x.size)
  mean = float(x.mean())
  return mean - half, mean + half


def paired_difference(
  method: Mapping[int, float], baseline: Mapping[int, float]
) -> PairedDifference:
  """The paired difference of two ``seed -> value`` maps (finite values only)."""
  seeds = tuple(
    sorted(
      s for s in method if s in baseline and math.isfinite(method[s]) and math.isfinite(baseline[s])
    )
  )
  differences = tuple(float(method[s] - baseline[s]) for s in seeds)
  mean = float(np.mean(differences)) if differences else math.nan
  low, high = t_interval(differences)
  return PairedDifference(seeds, differences, mean, low, high)


def verdict(difference: PairedDifference, direction: str, margin: float = 0.0) -> Verdict:
  """The verdict on a claim that ``method − baseline`` is `direction`.

  Args:
    difference: The paired difference.
    direction: `Direction.HIGHER`, `Direction.LOWER` or `Direction.EQUAL`.
    margin: For `Direction.EQUAL` only: the largest difference counted as "equal" (> 0).

  Returns:
    `Verdict.REPRODUCED`, `Verdict.CONTRADICTED`, `Verdict.NO_DIFFERENCE`
    (`Verdict.UNDECIDED` for `Direction.EQUAL`) or `Verdict.TOO_FEW` (fewer than two pairs).
  """
  if direction not in tuple(Direction):
    raise ValueError(f'direction must be one of {", ".join(Direction)}, got {direction!r}.')
  if direction == Direction.EQUAL and not margin > 0:
    raise ValueError(f'An equivalence claim needs a margin > 0, got {margin!r}.')
  if difference.n < 2:
    return Verdict.TOO_FEW
  low, high = difference.low, difference.high
  if direction == Direction.EQUAL:
    if -margin <= low and high <= margin:
      return Verdict.REPRODUCED
    if low > margin or high < -margin:
      return Verdict.CONTRADICTED
    return Verdict.UNDECIDED
  if low > 0:
    return Verdict.REPRODUCED if direction == Direction.HIGHER else Verdict.CONTRADICTED
  if high < 0:
    return Verdict.REPRODUCED if direction == Direction.LOWER else Verdict.CONTRADICTED
  return Verdict.NO_DIFFERENCE


def decisive_test(
  difference: PairedDifference, direction: str, margin: float = 0.0
) -> tuple[float, Verdict | None]:
  """The test behind `verdict`'s decisive outcomes: its p-value and the outcome it decides.

  `verdict` decides with the two-sided `CONFIDENCE` t interval; as tests (level
  ``1 − CONFIDENCE``), ``higher`` and ``lower`` claims are the paired t-test of a zero mean
  difference, decided by the sign of the mean; an ``equal`` claim is two one-sided tests
  against ``−margin`` and ``+margin`` (the interval within the margin, *reproduced*), or a
  one-sided test beyond the nearer margin (the interval wholly outside, *contradicted*),
  each side at half the level, whichever has the smaller p-value. So ``p < 1 − CONFIDENCE``
  exactly when `verdict` is decisive (up to ties at an interval's end).

  Returns:
    ``(p, outcome)``; ``(nan, None)`` with fewer than two pairs.
  """
  if difference.n < 2:
    return math.nan, None
  x = np.asarray(difference.differences, np.float64)
  se = float(x.std(ddof=1)) / math.sqrt(x.size)

  def beyond(t_numerator: float) -> float:  # P(T >= t_numerator / se), one-sided.
    if se == 0.0:
      return 0.0 if t_numerator > 0 else 1.0
    return float(stats.t.sf(t_numerator / se, x.size - 1))

  mean = difference.mean
  if direction == Direction.EQUAL:
    within = min(1.0, 2.0 * max(beyond(mean + margin), beyond(margin - mean)))
    outside = min(1.0, 2.0 * min(beyond(mean - margin), beyond(-margin - mean)))
    if within <= outside:
      return within, Verdict.REPRODUCED
    return outside, Verdict.CONTRADICTED
  p = min(1.0, 2.0 * beyond(abs(mean))) if mean != 0.0 else 1.0
  claimed_side = mean > 0 if direction == Direction.HIGHER else mean < 0
  return p, Verdict.REPRODUCED if claimed_side else Verdict.CONTRADICTED


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values (NaN entries stay NaN and do not count)."""
  finite = [(p, i) for i, p in enumerate(p_values) if not math.isnan(p)]
  adjusted = [math.nan] * len(p_values)
  running = 0.0
  for rank, (p, i) in enumerate(sorted(finite)):
    running = max(running, min(1.0, (len(finite) - rank) * p))
    adjusted[i] = running
  return adjusted


def holm_verdicts(
  differences: Sequence[PairedDifference],
  directions: Sequence[str],
  margins: Sequence[float],
  censoring: Sequence[tuple[bool, bool]] | None = None,
) -> list[Verdict]:
  """`verdict` for each claim of a family, decided on Holm-adjusted p-values (`decisive_test`):
  a decisive outcome stands if its adjusted p-value is below ``1 − CONFIDENCE``; otherwise
  ``no difference detected`` (``undecided`` for an ``equal`` claim).

  With `censoring` (each claim's ``(method_censored, baseline_censored)``), each verdict then
  goes through `censored_verdict`, and a claim whose decisive outcome censoring could have
  caused enters the step-down with p = 1: it cannot be decided, so it does not lower the
  multiplier of the others.
  """
  tests = [decisive_test(d, r, m) for d, r, m in zip(differences, directions, margins)]
  censored = list(censoring) if censoring is not None else [(False, False)] * len(tests)
  p_values = [
    1.0
    if outcome is not None
    and censored_verdict(outcome, r, method_censored=c[0], baseline_censored=c[1])
    == Verdict.UNDECIDED
    else p
    for (p, outcome), r, c in zip(tests, directions, censored, strict=True)
  ]
  adjusted = holm_adjusted(p_values)
  out = []
  for (_, outcome), p, difference, direction, (by_method, by_baseline) in zip(
    tests, adjusted, differences, directions, censored, strict=True
  ):
    if difference.n < 2:
      decided: str = Verdict.TOO_FEW
    elif outcome is not None and p < 1.0 - CONFIDENCE:
      decided = outcome
    else:
      decided = Verdict.UNDECIDED if direction == Direction.EQUAL else Verdict.NO_DIFFERENCE
    out.append(
      Verdict(
        censored_verdict(
          decided, direction, method_censored=by_method, baseline_censored=by_baseline
        )
      )
    )
  return out


def seeds_to_decide(
  difference: PairedDifference, direction: str, margin: float = 0.0, most: int = 100
) -> int | None:
  """The fewest seeds whose interval would decide the claim if the observed mean and spread
  of the differences held: a plan for extending an experiment, not a verdict.

  Decided means the `CONFIDENCE` t interval (half-width ``t · sd / √n``) excludes 0 for a
  ``higher`` or ``lower`` claim; for an ``equal`` claim, lies within ± `margin` (if the mean
  is inside it) or wholly outside (if the mean is outside). None with fewer than two pairs,
  a mean exactly on the boundary, or more than `most` seeds needed.
  """
  if difference.n < 2:
    return None
  sd = float(np.std(difference.differences, ddof=1))
  mean = difference.mean
  room = abs(abs(mean) - margin) if direction == Direction.EQUAL else abs(mean)
  if room == 0.0:
    return None
  for n in range(2, most + 1):
    if float(stats.t.ppf(0.5 + CONFIDENCE / 2.0, n - 1)) * sd / math.sqrt(n) < room:
      return n
  return None
