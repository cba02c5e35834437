r"""Benchmark: FedGS's server work (Wang et al., AAAI 2023; ``docs/algorithms.md`` §3).

Three measurements, all in one run (medians over ``--fg_repeats``):

1. **The 3DG's shortest paths.** `fedgs_problem.graph_distances` (min-max
   normalisation, edge weights, all-pairs shortest paths) on the cosine
   similarities of ``--fg_graph_clients`` = 3,400 label-distribution-like
   features: Dirichlet(``--fg_dirichlet`` = 0.5) over ``--fg_labels`` = 10
   labels, ``ε = --fg_epsilon``, ``σ² = --fg_sigma2``. It runs once per
   experiment (the oracle graph) or whenever the features change.
2. **One round's selection** for each ``N`` in ``--fg_sizes`` (default 100,
   150, 1,000, 3,400; all clients available, ``K = --fg_budget`` = 10,
   ``α = --fg_alpha`` = 1, counts uniform in 0..9): the heuristic
   (``method='heuristic'``: greedy + 1-swap, 16 starts) against the solver
   (``method='solver'``: SCIP warm-started with the heuristic, under
   ``--fg_time_limit`` = 1 s for the whole call). For the solver the table
   shows its status, how much it improved on the heuristic and the gap to its
   dual bound; above ``--fg_max_solver_clients`` (the library's default) the
   solver does not run and the status is ``too_large``: the time shown is then
   the heuristic's.
3. **Small instances against brute force**: ``--fg_small_instances`` random
   instances of ``--fg_small_size`` ≤ 14 clients (random availability, budget
   ``--fg_small_budget``), the optimum by enumeration vs the heuristic with a
   single start and with 16, vs the solver.

Usage (from the repository root):

  .venv/bin/python -m bench.fedgs
  .venv/bin/python -m bench.fedgs --fg_sizes=100,1000 --fg_repeats=5 --fg_time_limit=5
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import statistics
import time

from absl import app
from absl import flags
import numpy as np

from bench import stats
from tff_sampling.runtime import tff_context
from tff_sampling.samplers import fedgs_problem
from tff_sampling.samplers import fedgs_solvers

# Flag names carry the `fg_` prefix: other binaries define flags in the same
# process when the tests import them all.
_GRAPH_CLIENTS = flags.DEFINE_integer(
  'fg_graph_clients', 3400, 'Clients N of the shortest-path timing.', lower_bound=2
)
_LABELS = flags.DEFINE_integer('fg_labels', 10, 'Labels of the features.', lower_bound=2)
_DIRICHLET = flags.DEFINE_float(
  'fg_dirichlet', 0.5, 'Concentration of the Dirichlet label distributions.', lower_bound=0.0
)
_EPSILON = flags.DEFINE_float('fg_epsilon', 0.1, 'The 3DG edge threshold ε.')
_SIGMA2 = flags.DEFINE_float('fg_sigma2', 0.01, 'The 3DG σ².', lower_bound=0.0)
_SIZES = flags.DEFINE_list(
  'fg_sizes', ['100', '150', '1000', '3400'], 'Available clients N of the selection timing.'
)
_BUDGET = flags.DEFINE_integer('fg_budget', 10, 'Clients per round K.', lower_bound=1)
_ALPHA = flags.DEFINE_float('fg_alpha', 1.0, 'FedGS α.', lower_bound=0.0)
_TIME_LIMIT = flags.DEFINE_float(
  'fg_time_limit', 1.0, 'time_limit_s of each selection (heuristic + solver).'
)
_MAX_SOLVER_CLIENTS = flags.DEFINE_integer(
  'fg_max_solver_clients',
  fedgs_solvers.DEFAULT_MAX_SOLVER_CLIENTS,
  'max_solver_clients: most available clients for which the solver runs.',
  lower_bound=0,
)
_REPEATS = flags.DEFINE_integer('fg_repeats', 3, 'Timed repetitions.', lower_bound=1)
_SMALL_SIZE = flags.DEFINE_integer(
  'fg_small_size',
  12,
  'Clients of the brute-force comparison (at most 14).',
  lower_bound=2,
  upper_bound=14,
)
_SMALL_BUDGET = flags.DEFINE_integer(
  'fg_small_budget', 5, 'K of the brute-force comparison.', lower_bound=1
)
_SMALL_INSTANCES = flags.DEFINE_integer(
  'fg_small_instances', 10, 'Instances of the brute-force comparison.', lower_bound=1
)
_SEED = flags.DEFINE_integer('fg_seed', 0, 'Seed of the workload.', lower_bound=0)


@dataclasses.dataclass(frozen=True)
class GraphRow:
  num_clients: int
  similarity_seconds: tuple[float, ...]
  distance_seconds: tuple[float, ...]
  edge_fraction: float


@dataclasses.dataclass(frozen=True)
class SelectionRow:
  """One N's heuristic and solver results (one report per repetition)."""

  num_clients: int
  heuristic_seconds: tuple[float, ...]
  heuristic: tuple[fedgs_solvers.SelectionReport, ...]
  solver_seconds: tuple[float, ...]
  solver: tuple[fedgs_solvers.SelectionReport, ...]


@dataclasses.dataclass(frozen=True)
class SmallRow:
  """One small instance: the optimum and what each method found."""

  num_available: int
  budget: int
  brute_force_value: float
  brute_force_seconds: float
  single_start: fedgs_solvers.SelectionReport
  heuristic: fedgs_solvers.SelectionReport
  solver: fedgs_solvers.SelectionReport
  solver_seconds: float


def label_features(num_clients: int, labels: int, concentration: float, seed: int) -> np.ndarray:
  """``float64[N, labels]`` Dirichlet label distributions."""
  rng = np.random.default_rng([seed, 0, num_clients])
  return rng.dirichlet(np.full(labels, concentration), size=num_clients)


def time_graph(
  features: np.ndarray, *, epsilon: float, sigma2: float, repeats: int
) -> tuple[GraphRow, np.ndarray]:
  """Times the similarities and `graph_distances`; returns the row and ``H``."""
  similarity_seconds, similarity = stats.repeat_last(
    lambda: fedgs_problem.similarity_from_features(features), repeats
  )
  distance_seconds, distances = stats.repeat_last(
    lambda: fedgs_problem.graph_distances(similarity, epsilon=epsilon, sigma2=sigma2), repeats
  )
  n = similarity.shape[0]
  off = ~np.eye(n, dtype=bool)
  lo, hi = similarity[off].min(), similarity[off].max()
  normalised = np.ones_like(similarity) if hi == lo else (similarity - lo) / (hi - lo)
  edges = np.count_nonzero((normalised >= epsilon) & off)
  row = GraphRow(
    num_clients=n,
    similarity_seconds=similarity_seconds,
    distance_seconds=distance_seconds,
    edge_fraction=edges / (n * (n - 1)),
  )
  return row, distances


def time_selection(
  distances: np.ndarray,
  counts: np.ndarray,
  *,
  budget: int,
  alpha: float,
  time_limit: float,
  max_solver_clients: int,
  repeats: int,
) -> SelectionRow:
  """Times the heuristic and the solver on one round, all clients available."""
  available = np.ones(distances.shape[0], bool)

  def run(method: str) -> Callable[[], fedgs_solvers.SelectionReport]:
    return lambda: fedgs_solvers.select_clients_with_report(
      distances,
      counts,
      available,
      budget,
      alpha=alpha,
      time_limit_s=time_limit,
      seed=0,
      method=method,
      max_solver_clients=max_solver_clients,
    )

  heuristic_seconds, heuristic = stats.repeat(run('heuristic'), repeats)
  solver_seconds, solver = stats.repeat(run('solver'), repeats)
  return SelectionRow(
    num_clients=distances.shape[0],
    heuristic_seconds=heuristic_seconds,
    heuristic=tuple(heuristic),
    solver_seconds=solver_seconds,
    solver=tuple(solver),
  )


def small_instances(
  *,
  num_clients: int,
  budget: int,
  alpha: float,
  instances: int,
  labels: int,
  concentration: float,
  epsilon: float,
  sigma2: float,
  time_limit: float,
  seed: int,
) -> list[SmallRow]:
  """Brute force vs heuristic (1 and 16 starts) vs solver on small 3DGs."""
  rows = []
  for instance in range(instances):
    rng = np.random.default_rng([seed, 1, instance])
    features = rng.dirichlet(np.full(labels, concentration), size=num_clients)
    h = fedgs_problem.graph_distances(
      fedgs_problem.similarity_from_features(features), epsilon=epsilon, sigma2=sigma2
    )
    counts = rng.integers(0, 10, num_clients)
    available = rng.random(num_clients) < 0.85
    available[rng.integers(num_clients)] = True
    kwargs = dict(alpha=alpha, time_limit_s=time_limit, seed=instance)
    start = time.perf_counter()
    _, best = fedgs_solvers.brute_force_select(h, counts, available, budget, alpha=alpha)
    brute_seconds = time.perf_counter() - start
    single = fedgs_solvers.select_clients_with_report(
      h, counts, available, budget, method='heuristic', num_starts=1, **kwargs
    )
    heuristic = fedgs_solvers.select_clients_with_report(
      h, counts, available, budget, method='heuristic', **kwargs
    )
    start = time.perf_counter()
    solver = fedgs_solvers.select_clients_with_report(
      h, counts, available, budget, method='solver', **kwargs
    )
    rows.append(
      SmallRow(
        num_available=int(available.sum()),
        budget=budget,
        brute_force_value=best,
        brute_force_seconds=brute_seconds,
        single_start=single,
        heuristic=heuristic,
        solver=solver,
        solver_seconds=time.perf_counter() - start,
      )
    )
  return rows


def _statuses(reports: Sequence[fedgs_solvers.SelectionReport]) -> str:
  return ','.join(sorted({report.status for report in reports}))


def format_graph(
  row: GraphRow, *, labels: int, concentration: float, epsilon: float, sigma2: float
) -> str:
  return '\n'.join(
    [
      f'3DG for N={row.num_clients} clients, Dirichlet({concentration:g}) over {labels} labels, '
      f'ε={epsilon:g}, σ²={sigma2:g} (median [min, max] seconds over '
      f'{len(row.distance_seconds)})',
      f'  similarity_from_features: {statistics.median(row.similarity_seconds):.3f} s',
      f'  graph_distances (shortest paths): {statistics.median(row.distance_seconds):.2f} s '
      f'[{min(row.distance_seconds):.2f}, {max(row.distance_seconds):.2f}]; edges on '
      f'{row.edge_fraction:.1%} of the pairs',
    ]
  )


def format_selection(
  rows: Sequence[SelectionRow],
  *,
  budget: int,
  alpha: float,
  time_limit: float,
  max_solver_clients: int,
) -> str:
  lines = [
    f'One round, all clients available, K={budget}, α={alpha:g}, time limit {time_limit:g} s, '
    f'max_solver_clients={max_solver_clients} (median seconds; values from the last '
    'repetition; gap = dual bound - value)',
    f'{"N":>6} {"heur_s":>7} {"heur_value":>11} {"solver_s":>8} {"solver_value":>12} '
    f'{"improvement":>11} {"status":>12} {"gap":>9} {"rel_gap":>8} {"timed_out":>9}',
  ]
  for row in rows:
    heuristic, solver = row.heuristic[-1], row.solver[-1]
    gap = solver.bound - solver.value
    relative = gap / abs(solver.value) if solver.value else float('inf')
    timed_out = sum(report.timed_out for report in row.solver)
    lines.append(
      f'{row.num_clients:>6} {statistics.median(row.heuristic_seconds):>7.3f} '
      f'{heuristic.value:>11.6f} {statistics.median(row.solver_seconds):>8.3f} '
      f'{solver.value:>12.6f} {solver.value - heuristic.value:>11.2e} '
      f'{_statuses(row.solver):>12} {gap:>9.2e} {relative:>8.1e} '
      f'{f"{timed_out}/{len(row.solver)}":>9}'
    )
  lines.append(
    "(status too_large: the solver did not run; its columns are the heuristic's. "
    'gap nan: no bound.)'
  )
  return '\n'.join(lines)


def format_small(rows: Sequence[SmallRow], *, num_clients: int, alpha: float) -> str:
  lines = [
    f'Small instances: {num_clients} clients (random availability), α={alpha:g}; '
    "objective values, and each method's gap to the brute-force optimum",
    f'{"|A|":>4} {"K":>3} {"brute_force":>12} {"heur_1start":>12} {"heur_16":>12} '
    f'{"solver":>12} {"status":>8} {"brute_s":>8} {"solver_s":>8}',
  ]
  for row in rows:
    lines.append(
      f'{row.num_available:>4} {row.budget:>3} {row.brute_force_value:>12.6f} '
      f'{row.single_start.value:>12.6f} {row.heuristic.value:>12.6f} '
      f'{row.solver.value:>12.6f} {row.solver.status:>8} {row.brute_force_seconds:>8.3f} '
      f'{row.solver_seconds:>8.3f}'
    )
  for name, pick in (
    ('heuristic, 1 start', lambda r: r.single_start),
    ('heuristic, 16 starts', lambda r: r.heuristic),
    ('solver', lambda r: r.solver),
  ):
    gaps = np.array([row.brute_force_value - pick(row).value for row in rows])
    optimal = int(np.sum(gaps <= 1e-9))
    lines.append(f'  {name}: optimal on {optimal}/{len(rows)}, max gap {gaps.max():.2e}')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  sizes = stats.parse_sizes(_SIZES.value, 'fg_sizes')
  if not _TIME_LIMIT.value > 0:
    raise app.UsageError(f'--fg_time_limit must be positive, got {_TIME_LIMIT.value}.')
  graph_kwargs = dict(epsilon=_EPSILON.value, sigma2=_SIGMA2.value)
  selection_kwargs = dict(
    budget=_BUDGET.value,
    alpha=_ALPHA.value,
    time_limit=_TIME_LIMIT.value,
    max_solver_clients=_MAX_SOLVER_CLIENTS.value,
  )
  seed = _SEED.value
  graph_row, graph_h = time_graph(
    label_features(_GRAPH_CLIENTS.value, _LABELS.value, _DIRICHLET.value, seed),
    repeats=_REPEATS.value,
    **graph_kwargs,
  )
  print(
    format_graph(graph_row, labels=_LABELS.value, concentration=_DIRICHLET.value, **graph_kwargs),
    flush=True,
  )

  rows = []
  for n in sizes:
    if n == _GRAPH_CLIENTS.value:
      h = graph_h
    else:
      h = fedgs_problem.graph_distances(
        fedgs_problem.similarity_from_features(
          label_features(n, _LABELS.value, _DIRICHLET.value, seed)
        ),
        **graph_kwargs,
      )
    counts = np.random.default_rng([seed, 2, n]).integers(0, 10, n)
    rows.append(time_selection(h, counts, repeats=_REPEATS.value, **selection_kwargs))
  print(format_selection(rows, **selection_kwargs), flush=True)

  small = small_instances(
    num_clients=_SMALL_SIZE.value,
    budget=_SMALL_BUDGET.value,
    alpha=_ALPHA.value,
    instances=_SMALL_INSTANCES.value,
    labels=_LABELS.value,
    concentration=_DIRICHLET.value,
    time_limit=_TIME_LIMIT.value,
    seed=seed,
    **graph_kwargs,
  )
  print(format_small(small, num_clients=_SMALL_SIZE.value, alpha=_ALPHA.value))


if __name__ == '__main__':
  app.run(tff_context.binary_main(main))
