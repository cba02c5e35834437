r"""Benchmark: LEFL's server work (Abebe et al.; ``docs/algorithms.md`` §4).

For each ``N`` in ``--lf_sizes`` (default 100 and 1,000), the medians over
``--lf_repeats`` (default 3) of:

1. **The KL matrix** (`lefl.kl_matrix`): the ``N × N`` mean KL divergences of
   the clients' soft labels on ``--lf_public_examples`` = 200 public examples
   (``bin/lefl.py``'s default ``P``) over ``--lf_labels`` = 10 classes.
2. **The clustering** (`lefl.cluster_clients`): scikit-learn's k-means
   (``n_init=10``) on the rows of that matrix, ``k = ⌈log2 N⌉``.
3. **One round's selection** (`LeflSampler.select` after `initialize`, the
   sampler built from the KL matrix): all clients available,
   ``clients_per_round = --lf_clients_per_round`` = 10, the paper's
   ``'per_cluster'`` allocation (one warm-up call first, untimed).

Steps 1 and 2 run once per experiment (the pre-processing); the table also
shows their total, the sum of the two medians. Step 3 runs every round.

Workload (seeded by ``--lf_seed``): client ``i``'s label distribution is
``π_i ~ Dirichlet(--lf_dirichlet = 0.5)`` over the classes (as
``bench/fedgs.py``'s features), each public example ``x`` has class
likelihoods ``ℓ(x) ~ Dirichlet(1)``, shared by all clients, and client ``i``'s
soft label is the posterior under its label prior, ``p_i(x) ∝ π_i ⊙ ℓ(x)``: a
model trained on skewed local labels leans towards its frequent classes.

Usage (from the repository root):

  .venv/bin/python -m bench.lefl
  .venv/bin/python -m bench.lefl --lf_sizes=100,1000,3000 --lf_repeats=5
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import statistics

from absl import app
from absl import flags
import numpy as np

from bench import stats
from tff_sampling.runtime import tff_context
from tff_sampling.samplers import base
from tff_sampling.samplers import lefl

# Flag names carry the `lf_` prefix: other binaries define flags in the same
# process when the tests import them all.
_SIZES = flags.DEFINE_list('lf_sizes', ['100', '1000'], 'Numbers of clients N to time.')
_REPEATS = flags.DEFINE_integer('lf_repeats', 3, 'Timed repetitions.', lower_bound=1)
_SEED = flags.DEFINE_integer('lf_seed', 0, 'Seed of the workload.', lower_bound=0)
_PUBLIC_EXAMPLES = flags.DEFINE_integer(
  'lf_public_examples', 200, 'Public examples P of the soft labels.', lower_bound=1
)
_LABELS = flags.DEFINE_integer('lf_labels', 10, 'Classes C of the soft labels.', lower_bound=2)
_DIRICHLET = flags.DEFINE_float(
  'lf_dirichlet',
  0.5,
  "Concentration of the clients' Dirichlet label distributions.",
  lower_bound=0.0,
)
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
  'lf_clients_per_round', 10, 'clients_per_round K of the selection.', lower_bound=1
)


@dataclasses.dataclass(frozen=True)
class Row:
  """LEFL's server time for one N (median seconds over the repetitions).

  Attributes:
    num_clients: ``N``.
    kl_seconds: `lefl.kl_matrix` on the ``[N, P, C]`` soft labels.
    cluster_seconds: `lefl.cluster_clients` on the KL matrix.
    setup_seconds: The one-time pre-processing, ``kl_seconds +
      cluster_seconds``.
    select_seconds: One round's `LeflSampler.select`.
    num_clusters: The clusters k-means found.
    cohort_size: Clients in the timed round's selection.
  """

  num_clients: int
  kl_seconds: float
  cluster_seconds: float
  setup_seconds: float
  select_seconds: float
  num_clusters: int
  cohort_size: int


def soft_labels(
  num_clients: int, *, public_examples: int, labels: int, concentration: float, seed: int
) -> np.ndarray:
  """``float64[N, P, C]`` soft labels ``p_i(x) ∝ π_i ⊙ ℓ(x)`` (module docstring)."""
  rng = np.random.default_rng([seed, 0, num_clients])
  priors = rng.dirichlet(np.full(labels, concentration), size=num_clients)
  likelihoods = rng.dirichlet(np.ones(labels), size=public_examples)
  posterior = priors[:, None, :] * likelihoods[None, :, :]
  posterior /= posterior.sum(axis=2, keepdims=True)
  return posterior


def client_sizes(num_clients: int, seed: int) -> np.ndarray:
  """``int64[N]`` example counts (aggregation weights), uniform in 1..100."""
  return np.random.default_rng([seed, 1, num_clients]).integers(1, 101, num_clients)


def _time(function: Callable[[], object], repeats: int) -> tuple[float, object]:
  """Median seconds of `repeats` calls, and the last call's result."""
  seconds, result = stats.repeat_last(function, repeats)
  return statistics.median(seconds), result


def time_size(
  num_clients: int,
  *,
  repeats: int,
  seed: int,
  public_examples: int = 200,
  labels: int = 10,
  concentration: float = 0.5,
  clients_per_round: int = 10,
) -> Row:
  """Times the KL matrix, the clustering and one selection for one N."""
  outputs = soft_labels(
    num_clients,
    public_examples=public_examples,
    labels=labels,
    concentration=concentration,
    seed=seed,
  )
  kl_seconds, kl = _time(lambda: lefl.kl_matrix(outputs), repeats)
  cluster_seconds, _ = _time(lambda: lefl.cluster_clients(kl, seed=seed), repeats)
  sampler = lefl.LeflSampler(min(clients_per_round, num_clients), seed=seed, kl=kl)
  state = sampler.initialize(base.Population(client_sizes(num_clients, seed)))
  available = np.ones(num_clients, bool)
  sampler.select(state, 0, available)  # Warm-up.
  select_seconds, selection = _time(lambda: sampler.select(state, 1, available), repeats)
  return Row(
    num_clients=num_clients,
    kl_seconds=kl_seconds,
    cluster_seconds=cluster_seconds,
    setup_seconds=kl_seconds + cluster_seconds,
    select_seconds=select_seconds,
    num_clusters=sampler.num_clusters,
    cohort_size=int(selection.clients.shape[0]),
  )


def run(
  sizes: Sequence[int],
  repeats: int,
  seed: int,
  *,
  public_examples: int = 200,
  labels: int = 10,
  concentration: float = 0.5,
  clients_per_round: int = 10,
) -> list[Row]:
  """One `Row` per N in `sizes` (see `time_size`; the defaults are the flags')."""
  return [
    time_size(
      int(n),
      repeats=repeats,
      seed=seed,
      public_examples=public_examples,
      labels=labels,
      concentration=concentration,
      clients_per_round=clients_per_round,
    )
    for n in sizes
  ]


def format_table(rows: Sequence[Row]) -> str:
  lines = [
    'LEFL server time (median seconds): KL matrix and k-means once (setup = their sum), '
    "then one round's selection",
    f'{"N":>6} {"kl_s":>8} {"cluster_s":>9} {"setup_s":>8} {"select_s":>9} '
    f'{"clusters":>8} {"cohort":>6}',
  ]
  for row in rows:
    lines.append(
      f'{row.num_clients:>6} {row.kl_seconds:>8.4f} {row.cluster_seconds:>9.4f} '
      f'{row.setup_seconds:>8.4f} {row.select_seconds:>9.6f} {row.num_clusters:>8} '
      f'{row.cohort_size:>6}'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  rows = run(
    stats.parse_sizes(_SIZES.value, 'lf_sizes'),
    _REPEATS.value,
    _SEED.value,
    public_examples=_PUBLIC_EXAMPLES.value,
    labels=_LABELS.value,
    concentration=_DIRICHLET.value,
    clients_per_round=_CLIENTS_PER_ROUND.value,
  )
  print(
    format_table(rows)
    + '\n'
    + f'(P={_PUBLIC_EXAMPLES.value} public examples, C={_LABELS.value} classes, '
    f'Dirichlet({_DIRICHLET.value:g}) label distributions, '
    f'clients_per_round={_CLIENTS_PER_ROUND.value}, all clients available, '
    f'{_REPEATS.value} repetitions, seed {_SEED.value})'
  )


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
