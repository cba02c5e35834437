r"""Benchmark: computing optimal client sampling probabilities for a large cohort.

Times, on `--num_norms` (default 10^6) seeded lognormal weighted norms with
`--norms_expected_clients` expected uploads:

* `optimal_probabilities` (Algorithm 1 of Chen, Horváth, Richtárik, TMLR 2022,
  by sorting; target: the median under `--norms_target_seconds`, 1 s);
* its TensorFlow twin `optimal_probabilities_tf`, traced once in a
  ``tf.function`` (the first call, which traces, is not timed);
* `approximate_optimal_probabilities` (Algorithm 2) with
  `--norms_rescaling_steps` (default 4) steps, and its TF twin.

Each is run `--repetitions` times; the table shows the median, min and max
seconds, and for the approximations the rescaling steps used, the largest
relative deviation from the exact probabilities and the improvement factor
``α`` (the exact one is the optimum).

Usage (from the repository root):

  .venv/bin/python -m bench.probabilities
  .venv/bin/python -m bench.probabilities --num_norms=100000 --repetitions=11
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import statistics

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from bench import stats
from tff_sampling import probabilities
from tff_sampling.runtime import tff_context

# Flag names carry a prefix: other binaries define `seed`, `rounds`, ... in the
# same process when the tests import them all.
_NUM_NORMS = flags.DEFINE_integer(
  'num_norms', 1_000_000, 'Number of clients (weighted norms).', lower_bound=1
)
_REPETITIONS = flags.DEFINE_integer(
  'repetitions', 7, 'Timed repetitions per implementation.', lower_bound=1
)
_NORMS_SEED = flags.DEFINE_integer('norms_seed', 0, 'Seed of the lognormal norms.', lower_bound=0)
_NORMS_SIGMA = flags.DEFINE_float(
  'norms_sigma',
  2.0,
  'Sigma of the lognormal norms (larger: heavier tail, more clients with p = 1).',
  lower_bound=0.0,
)
_NORMS_EXPECTED_CLIENTS = flags.DEFINE_float(
  'norms_expected_clients', 100_000.0, 'Expected uploads m (any positive real).'
)
_NORMS_RESCALING_STEPS = flags.DEFINE_integer(
  'norms_rescaling_steps', 4, 'Rescaling steps j_max of Algorithm 2.', lower_bound=0
)
_NORMS_TARGET_SECONDS = flags.DEFINE_float(
  'norms_target_seconds', 1.0, 'Target for the median time of the exact NumPy version.'
)


@dataclasses.dataclass(frozen=True)
class Row:
  """One implementation's timings and, for approximations, its accuracy."""

  label: str
  seconds: tuple[float, ...]
  steps_used: int | None
  max_relative_deviation: float
  alpha: float

  @property
  def median(self) -> float:
    return statistics.median(self.seconds)


def lognormal_norms(num_norms: int, sigma: float, seed: int) -> np.ndarray:
  return np.random.default_rng([seed, 0]).lognormal(mean=0.0, sigma=sigma, size=num_norms)


def run_benchmark(
  norms: np.ndarray, expected_clients: float, rescaling_steps: int, repetitions: int
) -> list[Row]:
  """Times the four implementations on `norms`; returns one row each."""
  norms_tensor = tf.constant(norms, tf.float64)
  exact_tf = tf.function(lambda a: probabilities.optimal_probabilities_tf(a, expected_clients))
  approximate_tf = tf.function(
    lambda a: probabilities.approximate_optimal_probabilities_with_info_tf(
      a, expected_clients, rescaling_steps
    )
  )
  exact_tf(norms_tensor)  # Traces outside the timed calls.
  approximate_tf(norms_tensor)

  exact_seconds, exact = stats.repeat_last(
    lambda: probabilities.optimal_probabilities(norms, expected_clients), repetitions
  )
  runs = {'exact_numpy': (exact_seconds, exact, None)}
  seconds, result = stats.repeat_last(lambda: exact_tf(norms_tensor).numpy(), repetitions)
  runs['exact_tf'] = (seconds, result, None)
  seconds, info = stats.repeat_last(
    lambda: probabilities.approximate_optimal_probabilities_with_info(
      norms, expected_clients, rescaling_steps
    ),
    repetitions,
  )
  runs[f'approximate_numpy_{rescaling_steps}_steps'] = (
    seconds,
    info.probabilities,
    info.rescaling_steps_used,
  )
  seconds, info = stats.repeat_last(lambda: approximate_tf(norms_tensor), repetitions)
  runs[f'approximate_tf_{rescaling_steps}_steps'] = (
    seconds,
    info.probabilities.numpy(),
    int(info.rescaling_steps_used),
  )

  rows = []
  for label, (seconds, probs, steps_used) in runs.items():
    deviation = float(np.max(np.abs(probs - exact) / np.where(exact > 0, exact, 1.0)))
    alpha = probabilities.improvement_factor(norms, probs, expected_clients)
    rows.append(Row(label, seconds, steps_used, deviation, alpha))
  return rows


def format_table(
  rows: Sequence[Row], *, num_norms: int, expected_clients: float, target_seconds: float
) -> str:
  lines = [
    f'{num_norms} lognormal norms, expected_clients={expected_clients:g}',
    f'{"implementation":<28} {"median_s":>9} {"min_s":>9} {"max_s":>9} '
    f'{"steps":>5} {"max_rel_dev":>11} {"alpha":>8}',
  ]
  for row in rows:
    steps = '-' if row.steps_used is None else str(row.steps_used)
    lines.append(
      f'{row.label:<28} {row.median:>9.4f} {min(row.seconds):>9.4f} '
      f'{max(row.seconds):>9.4f} {steps:>5} {row.max_relative_deviation:>11.2e} '
      f'{row.alpha:>8.4f}'
    )
  exact = rows[0]
  verdict = 'met' if exact.median < target_seconds else 'NOT met'
  lines.append(
    f'target: {exact.label} median {exact.median:.4f} s < {target_seconds:g} s: {verdict}'
  )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not _NORMS_EXPECTED_CLIENTS.value > 0:
    raise app.UsageError(
      f'--norms_expected_clients must be positive, got {_NORMS_EXPECTED_CLIENTS.value}.'
    )
  norms = lognormal_norms(_NUM_NORMS.value, _NORMS_SIGMA.value, _NORMS_SEED.value)
  rows = run_benchmark(
    norms, _NORMS_EXPECTED_CLIENTS.value, _NORMS_RESCALING_STEPS.value, _REPETITIONS.value
  )
  print(
    format_table(
      rows,
      num_norms=_NUM_NORMS.value,
      expected_clients=_NORMS_EXPECTED_CLIENTS.value,
      target_seconds=_NORMS_TARGET_SECONDS.value,
    )
  )


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
