"""Timing loops, the statistics of a ratio and a sizes flag's parser, shared by the benchmarks.

A ratio ``A / B`` is measured in blocks: every block calls each side once, in
an order that rotates from block to block (``A B``, ``B A``, ``A B``, ...), so
that both sides share the machine's load and neither always runs first. Each
block gives one per-pair ratio ``a_i / b_i``; the estimate is their median with
a percentile-bootstrap confidence interval (resampling the pairs, seeded), and
a target on the ratio is **met** when the interval lies entirely at or below
it, **missed** when entirely above, and **unresolved** when it straddles it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import math
import time
from typing import Any, TypeVar

from absl import app
from absl import logging
import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0

MET, MISSED, UNRESOLVED = 'met', 'missed', 'unresolved'

_T = TypeVar('_T')


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The median of a sample (of per-pair ratios) and its bootstrap confidence interval."""

  median: float
  low: float
  high: float
  pairs: int

  @property
  def interval(self) -> str:
    return f'[{self.low:.4g}, {self.high:.4g}]'


def block_order(labels: Sequence[_T], block: int) -> list[_T]:
  """The order of `labels` in block number `block`: rotated by `block` places."""
  shift = block % len(labels)
  return list(labels[shift:]) + list(labels[:shift])


def interleave(
  measures: Mapping[str, Callable[[], Any]], pairs: int, *, warmup: int = 1
) -> dict[str, np.ndarray]:
  """Calls every measure once per block, in `block_order`; returns each one's values.

  Args:
    measures: Label -> a call returning one measurement (a number or a tuple).
    pairs: Blocks kept; values of block ``i`` of every label form pair ``i``.
    warmup: Blocks run first and discarded.

  Returns:
    Label -> ``float64[pairs, ...]``: the measurements in block order.
  """
  labels = list(measures)
  values = {label: [] for label in labels}
  for block in range(warmup + pairs):
    for label in block_order(labels, block):
      values[label].append(measures[label]())
    logging.info(
      'Block %d/%d%s: %s',
      block + 1,
      warmup + pairs,
      ' (warm-up)' * (block < warmup),
      ', '.join(f'{label} {np.round(values[label][-1], 4)}' for label in labels),
    )
  return {label: np.asarray(v[warmup:], np.float64) for label, v in values.items()}


def timed(function: Callable[[], object]) -> Callable[[], float]:
  """A measure for `interleave`: the wall-clock seconds of one call of `function`."""

  def measure() -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start

  return measure


def repeat(function: Callable[[], _T], repeats: int) -> tuple[tuple[float, ...], list[_T]]:
  """Seconds of `repeats` calls of `function`, and their results."""
  seconds, results = [], []
  for _ in range(repeats):
    start = time.perf_counter()
    results.append(function())
    seconds.append(time.perf_counter() - start)
  return tuple(seconds), results


def repeat_last(function: Callable[[], _T], repeats: int) -> tuple[tuple[float, ...], _T]:
  """`repeat`, keeping only the last call's result."""
  seconds, results = repeat(function, repeats)
  return seconds, results[-1]


def parse_sizes(values: Sequence[str], name: str, *, allow_empty: bool = False) -> list[int]:
  """The numbers of clients in the list flag ``--{name}``: integers ≥ 2, else `app.UsageError`."""
  try:
    parsed = [int(value) for value in values]
  except ValueError as e:
    raise app.UsageError(f'--{name} must be integers, got {values}.') from e
  if (not parsed and not allow_empty) or (parsed and min(parsed) < 2):
    raise app.UsageError(f'--{name} must be integers ≥ 2, got {values}.')
  return parsed


def median_ci(
  samples: Sequence[float],
  *,
  confidence: float = CONFIDENCE,
  resamples: int = RESAMPLES,
  seed: int = SEED,
) -> Estimate:
  """The median of `samples` and its percentile-bootstrap confidence interval.

  One sample has no interval: it is ``[-inf, inf]``, so no target is decided.
  """
  samples = np.asarray(samples, np.float64)
  if samples.ndim != 1 or not samples.size:
    raise ValueError(f'Need a non-empty 1-D sample, got shape {samples.shape}.')
  median = float(np.median(samples))
  if samples.size == 1:
    return Estimate(median, -math.inf, math.inf, 1)
  interval = stats.bootstrap(
    (samples,),
    np.median,
    n_resamples=resamples,
    confidence_level=confidence,
    method='percentile',
    random_state=np.random.default_rng(seed),
  ).confidence_interval
  return Estimate(median, float(interval.low), float(interval.high), samples.size)


def ratio_estimate(values: Sequence[float], references: Sequence[float], **kwargs) -> Estimate:
  """`median_ci` of the per-pair ratios ``values[i] / references[i]``."""
  values, references = np.asarray(values, np.float64), np.asarray(references, np.float64)
  if values.shape != references.shape:
    raise ValueError(f'Unpaired: {values.shape} values, {references.shape} references.')
  return median_ci(values / references, **kwargs)


def verdict(estimate: Estimate, target: float) -> str:
  """`MET` if the interval is at or below `target`, `MISSED` if above, else `UNRESOLVED`."""
  if estimate.high <= target:
    return MET
  if estimate.low > target:
    return MISSED
  return UNRESOLVED
