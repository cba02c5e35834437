r"""Benchmark: clustered sampling by model similarity (Algorithm 2 of Fraboni et al.).

Two measurements (Fraboni, Vidal, Kameni, Lorenzi, ICML 2021; contract in
``docs/algorithms.md`` §2b):

1. **Server time per round.** Algorithm 2 runs on the server before every
   round: the similarity matrix of the ``N`` representative updates (sketches
   of ``--cl_sketch_size`` = 1,024 floats), Ward's tree of its rows, the cut
   into groups of weight ``≤ M`` and the allocation into ``--cl_num_draws``
   distributions. For each ``N`` in ``--cl_sizes`` (default 100, 1,000, 3,400)
   the table shows the median over ``--cl_repetitions`` of the end-to-end call
   (`similarity_based_units`) and of its two heavy phases alone, the number of
   groups, and the expected distinct clients per round against MD sampling's.
   Target: the median end-to-end time under ``--cl_target_seconds`` (5 s) at
   the largest ``N``.
2. **Sketched vs exact clustering.** For each ``N`` in ``--cl_ari_sizes``,
   exact updates of ``--cl_exact_dim`` = 20,000 floats and their count sketches
   (`sketches.count_sketch`) to ``--cl_sketch_size`` floats are clustered the
   same way; the adjusted Rand index (scikit-learn) compares the step-4 groups
   ``B_k`` of the two, and the top of the tree (cut into as many clusters as
   mixture directions), for ``--cl_ari_sketch_seeds`` sketch seeds. What the
   sampling cares about is also shown: the expected number of mixture
   directions with a client in the round, with ``r`` from exact updates, from
   sketches, and under MD sampling.

Workload (seeded by ``--cl_seed``): client sizes ``⌈LogNormal(log 100,
--cl_size_sigma)⌉``; each update is one of ``--cl_directions`` random unit
directions (mixture weights uniform) plus Gaussian noise of norm about
``--cl_noise``; for the timing, a fraction ``--cl_zero_fraction`` of clients
have never been sampled (zero updates). The agreement workload has no zero
rows (they would agree trivially).

Usage (from the repository root):

  .venv/bin/python -m bench.clustered
  .venv/bin/python -m bench.clustered --cl_sizes=100,1000 --cl_repetitions=5
  .venv/bin/python -m bench.clustered --cl_sizes=3400 --cl_ari_sizes=  # Timing only.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import statistics

from absl import app
from absl import flags
import numpy as np
from scipy.cluster import hierarchy
from sklearn import metrics

from bench import stats
from tff_sampling.runtime import tff_context
from tff_sampling.samplers import clustered_similarity
from tff_sampling.samplers import clustered_variance
from tff_sampling.samplers import sketches

# Flag names carry the `cl_` prefix: other binaries define flags in the same
# process when the tests import them all.
_SIZES = flags.DEFINE_list('cl_sizes', ['100', '1000', '3400'], 'Numbers of clients N to time.')
_SKETCH_SIZE = flags.DEFINE_integer(
  'cl_sketch_size', 1024, 'Length d of the representative update sketches.', lower_bound=1
)
_NUM_DRAWS = flags.DEFINE_integer(
  'cl_num_draws', 10, 'Distributions (clients per round) m.', lower_bound=1
)
_REPETITIONS = flags.DEFINE_integer(
  'cl_repetitions', 5, 'Timed repetitions per configuration.', lower_bound=1
)
_SIMILARITY = flags.DEFINE_enum(
  'cl_similarity', 'arccos', list(clustered_similarity.SIMILARITIES), 'Similarity of Algorithm 2.'
)
_DIRECTIONS = flags.DEFINE_integer(
  'cl_directions', 5, 'Mixture directions of the synthetic updates.', lower_bound=1
)
_NOISE = flags.DEFINE_float(
  'cl_noise', 1.0, 'Norm of the Gaussian noise added to each unit direction.', lower_bound=0.0
)
_ZERO_FRACTION = flags.DEFINE_float(
  'cl_zero_fraction',
  0.2,
  'Fraction of never-sampled clients (zero updates) in the timing workload.',
  lower_bound=0.0,
  upper_bound=1.0,
)
_SIZE_SIGMA = flags.DEFINE_float(
  'cl_size_sigma', 1.0, 'Sigma of the lognormal client sizes.', lower_bound=0.0
)
_SEED = flags.DEFINE_integer('cl_seed', 0, 'Seed of the workload.', lower_bound=0)
_TARGET_SECONDS = flags.DEFINE_float(
  'cl_target_seconds', 5.0, 'Target for the median end-to-end time at the largest N.'
)
_ARI_SIZES = flags.DEFINE_list(
  'cl_ari_sizes', ['100', '1000'], 'Numbers of clients for the sketch agreement (empty: time only).'
)
_EXACT_DIM = flags.DEFINE_integer(
  'cl_exact_dim', 20_000, 'Length of the exact updates for the sketch agreement.', lower_bound=1
)
_ARI_SKETCH_SEEDS = flags.DEFINE_integer(
  'cl_ari_sketch_seeds', 3, 'Sketch seeds per N for the agreement.', lower_bound=1
)


@dataclasses.dataclass(frozen=True)
class TimingRow:
  """Algorithm 2's server time for one N."""

  num_clients: int
  total_seconds: tuple[float, ...]
  similarity_seconds: tuple[float, ...]
  linkage_seconds: tuple[float, ...]
  num_groups: int
  expected_distinct: float
  md_expected_distinct: float


@dataclasses.dataclass(frozen=True)
class AgreementRow:
  """Agreement of the clusterings of exact and sketched updates for one N."""

  num_clients: int
  group_ari: tuple[float, ...]
  top_ari: tuple[float, ...]
  exact_top_vs_truth_ari: float
  num_groups_exact: int
  covered_exact: float
  covered_sketch: tuple[float, ...]
  covered_md: float


def client_sizes(num_clients: int, sigma: float, seed: int) -> np.ndarray:
  rng = np.random.default_rng([seed, 0, num_clients])
  return np.ceil(rng.lognormal(np.log(100.0), sigma, num_clients)).astype(np.int64)


def mixture_updates(
  num_clients: int, dim: int, directions: int, noise: float, zero_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """``float32[N, dim]`` updates and their mixture labels (-1 for zero rows)."""
  rng = np.random.default_rng([seed, 1, num_clients, dim])
  centers = rng.normal(size=(directions, dim))
  centers /= np.linalg.norm(centers, axis=1, keepdims=True)
  labels = rng.integers(0, directions, num_clients)
  updates = centers[labels] + noise / np.sqrt(dim) * rng.normal(size=(num_clients, dim))
  zero = rng.random(num_clients) < zero_fraction
  updates[zero] = 0.0
  labels[zero] = -1
  return updates.astype(np.float32), labels


def time_algorithm2(
  num_clients: int,
  *,
  sketch_size: int,
  num_draws: int,
  similarity: str,
  repetitions: int,
  directions: int,
  noise: float,
  zero_fraction: float,
  size_sigma: float,
  seed: int,
) -> TimingRow:
  """Times Algorithm 2 end to end and its similarity and linkage phases."""
  sizes = client_sizes(num_clients, size_sigma, seed)
  updates, _ = mixture_updates(num_clients, sketch_size, directions, noise, zero_fraction, seed)
  total, units = stats.repeat_last(
    lambda: clustered_similarity.similarity_based_units(
      sizes, updates, num_draws, similarity=similarity
    ),
    repetitions,
  )
  similarity_seconds, matrix = stats.repeat_last(
    lambda: clustered_similarity.similarity_matrix(updates, similarity), repetitions
  )
  linkage_seconds, _ = stats.repeat_last(
    lambda: clustered_similarity.ward_linkage_of_rows(matrix), repetitions
  )
  labels = clustered_similarity.similarity_groups(sizes, updates, num_draws, similarity=similarity)
  r = units / sizes.sum()
  p = sizes / sizes.sum()
  return TimingRow(
    num_clients=num_clients,
    total_seconds=total,
    similarity_seconds=similarity_seconds,
    linkage_seconds=linkage_seconds,
    num_groups=int(labels.max()) + 1,
    expected_distinct=clustered_variance.expected_distinct_clients(r),
    md_expected_distinct=float(np.sum(clustered_variance.md_inclusion_probability(p, num_draws))),
  )


def expected_directions_covered(r: np.ndarray, labels: np.ndarray) -> float:
  """Expected number of mixture directions with a client in the round.

  Direction ``c`` is missed iff every distribution draws outside it:
  ``P(c covered) = 1 - Π_k (1 - Σ_{i ∈ c} r_{k,i})``.
  """
  covered = 0.0
  for label in np.unique(labels[labels >= 0]):
    mass = r[:, labels == label].sum(axis=1)
    covered += 1.0 - float(np.prod(np.clip(1.0 - mass, 0.0, 1.0)))
  return covered


def _top_labels(updates: np.ndarray, num_clusters: int, similarity: str) -> np.ndarray:
  linkage = clustered_similarity.ward_linkage_of_rows(
    clustered_similarity.similarity_matrix(updates, similarity)
  )
  return hierarchy.fcluster(linkage, num_clusters, criterion='maxclust')


def sketch_agreement(
  num_clients: int,
  *,
  exact_dim: int,
  sketch_size: int,
  num_draws: int,
  similarity: str,
  directions: int,
  noise: float,
  size_sigma: float,
  seed: int,
  sketch_seeds: int,
) -> AgreementRow:
  """ARI between the clusterings of exact updates and of their count sketches."""
  sizes = client_sizes(num_clients, size_sigma, seed)
  exact, truth = mixture_updates(num_clients, exact_dim, directions, noise, 0.0, seed)
  exact_groups = clustered_similarity.similarity_groups(
    sizes, exact, num_draws, similarity=similarity
  )
  exact_top = _top_labels(exact, directions, similarity)
  total = sizes.sum()
  covered_exact = expected_directions_covered(
    clustered_similarity.similarity_based_units(sizes, exact, num_draws, similarity=similarity)
    / total,
    truth,
  )
  covered_md = expected_directions_covered(np.tile(sizes / total, (num_draws, 1)), truth)
  group_ari, top_ari, covered_sketch = [], [], []
  for sketch_seed in range(sketch_seeds):
    sketch = sketches.count_sketch(exact, sketch_size, seed=sketch_seed)
    groups = clustered_similarity.similarity_groups(sizes, sketch, num_draws, similarity=similarity)
    covered_sketch.append(
      expected_directions_covered(
        clustered_similarity.similarity_based_units(sizes, sketch, num_draws, similarity=similarity)
        / total,
        truth,
      )
    )
    group_ari.append(metrics.adjusted_rand_score(exact_groups, groups))
    top_ari.append(
      metrics.adjusted_rand_score(exact_top, _top_labels(sketch, directions, similarity))
    )
  return AgreementRow(
    num_clients=num_clients,
    group_ari=tuple(group_ari),
    top_ari=tuple(top_ari),
    exact_top_vs_truth_ari=metrics.adjusted_rand_score(truth, exact_top),
    num_groups_exact=int(exact_groups.max()) + 1,
    covered_exact=covered_exact,
    covered_sketch=tuple(covered_sketch),
    covered_md=covered_md,
  )


def format_timing(
  rows: Sequence[TimingRow],
  *,
  sketch_size: int,
  num_draws: int,
  similarity: str,
  target_seconds: float,
) -> str:
  lines = [
    f'Algorithm 2 server time per round: sketch_size={sketch_size}, m={num_draws}, '
    f'similarity={similarity} (median [min, max] seconds)',
    f'{"N":>6} {"total_s [min, max]":>24} {"similarity_s":>12} {"linkage_s":>10} '
    f'{"groups":>7} {"E[distinct]":>11} {"MD":>6}',
  ]
  for row in rows:
    lines.append(
      f'{row.num_clients:>6} {statistics.median(row.total_seconds):>8.3f} '
      f'[{min(row.total_seconds):>6.3f}, {max(row.total_seconds):>6.3f}] '
      f'{statistics.median(row.similarity_seconds):>12.3f} '
      f'{statistics.median(row.linkage_seconds):>10.3f} {row.num_groups:>7} '
      f'{row.expected_distinct:>11.2f} {row.md_expected_distinct:>6.2f}'
    )
  largest = max(rows, key=lambda row: row.num_clients)
  median = statistics.median(largest.total_seconds)
  verdict = 'met' if median < target_seconds else 'NOT met'
  lines.append(
    f'target: N={largest.num_clients} median {median:.3f} s < {target_seconds:g} s: {verdict}'
  )
  return '\n'.join(lines)


def format_agreement(
  rows: Sequence[AgreementRow], *, exact_dim: int, sketch_size: int, directions: int
) -> str:
  lines = [
    f'Clustering of exact ({exact_dim}-dim) vs count-sketched ({sketch_size}-dim) updates: '
    'adjusted Rand index, mean [min, max] over sketch seeds; expected directions (of '
    f'{directions}) covered per round',
    f'{"N":>6} {"groups":>7} {"ARI_groups":>24} {"ARI_top":>24} {"top_vs_truth":>12} '
    f'{"cover_exact":>11} {"cover_sketch":>12} {"cover_MD":>8}',
  ]
  for row in rows:
    lines.append(
      f'{row.num_clients:>6} {row.num_groups_exact:>7} '
      f'{np.mean(row.group_ari):>8.3f} [{min(row.group_ari):.3f}, {max(row.group_ari):.3f}] '
      f'{np.mean(row.top_ari):>8.3f} [{min(row.top_ari):.3f}, {max(row.top_ari):.3f}] '
      f'{row.exact_top_vs_truth_ari:>12.3f} {row.covered_exact:>11.3f} '
      f'{np.mean(row.covered_sketch):>12.3f} {row.covered_md:>8.3f}'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  sizes = stats.parse_sizes(_SIZES.value, 'cl_sizes')
  ari_sizes = stats.parse_sizes(_ARI_SIZES.value, 'cl_ari_sizes', allow_empty=True)
  # Both measurements' workload and clustering.
  common = dict(
    sketch_size=_SKETCH_SIZE.value,
    num_draws=_NUM_DRAWS.value,
    similarity=_SIMILARITY.value,
    directions=_DIRECTIONS.value,
    noise=_NOISE.value,
    size_sigma=_SIZE_SIGMA.value,
    seed=_SEED.value,
  )
  timing = [
    time_algorithm2(n, repetitions=_REPETITIONS.value, zero_fraction=_ZERO_FRACTION.value, **common)
    for n in sizes
  ]
  print(
    format_timing(
      timing,
      sketch_size=_SKETCH_SIZE.value,
      num_draws=_NUM_DRAWS.value,
      similarity=_SIMILARITY.value,
      target_seconds=_TARGET_SECONDS.value,
    )
  )
  agreement = [
    sketch_agreement(n, exact_dim=_EXACT_DIM.value, sketch_seeds=_ARI_SKETCH_SEEDS.value, **common)
    for n in ari_sizes
  ]
  if agreement:
    print(
      format_agreement(
        agreement,
        exact_dim=_EXACT_DIM.value,
        sketch_size=_SKETCH_SIZE.value,
        directions=_DIRECTIONS.value,
      )
    )


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
