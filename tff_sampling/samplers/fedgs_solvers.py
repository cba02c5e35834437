"""Solving FedGS's selection problem: the greedy + swap heuristic, SCIP warm-started by it
(when installed and the instance is small enough), and brute force for tests; `select_clients`
and `select_clients_with_report` choose between them under a time limit."""

from __future__ import annotations

from collections.abc import Sequence
import gc
import itertools
import math
import time
from typing import Any, NamedTuple
import warnings

import numpy as np

from tff_sampling import validation
from tff_sampling.samplers import fedgs_problem

_MAX_BRUTE_FORCE_CLIENTS = 14


_METHODS = ('auto', 'heuristic', 'solver')


# Most available clients for which `method='auto'`/`'solver'` builds the MILP.
# Building its O(n²) variables in Python takes ~0.05 s for 150 clients and
# ~0.25 s for 300 on a 2-core machine; the limit is SCIP's root LP: with the
# default 1 s, SCIP reaches a useful dual bound (relative gap ≤ 1e-4) on most
# 3DG instances of 150 clients and on few of 200 (bench/fedgs.py), and at 300
# the root LP alone overruns the limit by ~0.5 s.
DEFAULT_MAX_SOLVER_CLIENTS = 150


_PYSCIPOPT_VERSION = '6.3.0'  # The version in requirements/lock.txt.


_SCIP_SEED_SHIFT = 0  # SCIP's randomization/randomseedshift: fixed for reproducibility.


class _Ordered(NamedTuple):
  """The programme's vectors permuted by the tie-breaking order.

  ``H`` itself is not permuted (an O(n²) copy): its rows and blocks are read
  through `order`.
  """

  order: np.ndarray  # int64[n] the permutation: position -> local index.
  diagonal: np.ndarray  # float64[n] H's diagonal in that order (zero for a 3DG).
  scores: np.ndarray  # float64[n] z in that order.
  tolerance: float  # Smallest swap gain counted as an improvement.


def _greedy_swap(
  problem: fedgs_problem.Problem, ordered: _Ordered, first: int | None, deadline: float
) -> tuple[np.ndarray, bool]:
  """Greedy construction + best-improvement 1-swap search.

  Positions in the tie-breaking order stand for clients: ties go to the earlier
  one. `first` (a position), if given, is forced into the greedy start.

  Returns:
    The picked positions (a boolean mask over the order) and whether the
    search converged (rather than stopping at `deadline`).
  """
  h, order = problem.distances, ordered.order
  diagonal, z = ordered.diagonal, ordered.scores
  n, m = z.size, problem.size
  picked = np.zeros(n, dtype=bool)
  reach = np.zeros(n)  # reach[x] = Σ_{l ∈ S} h[x, l].
  for step in range(m):
    gain = problem.quad * (2.0 * reach + diagonal) - problem.lin * z
    gain[picked] = -np.inf
    best = first if (step == 0 and first is not None) else int(np.argmax(gain))
    picked[best] = True
    reach += h[order[best]][order]  # A row: H is symmetric.
  while m < n:
    if time.monotonic() >= deadline:
      return picked, False
    inside, outside = np.flatnonzero(picked), np.flatnonzero(~picked)
    # Swapping i ∈ S for j ∉ S changes the objective by
    # quad·(2 (reach_j - reach_i - h_ij) + h_ii + h_jj) - lin·(z_j - z_i).
    delta = problem.quad * (
      2.0
      * (
        reach[outside][None, :] - reach[inside][:, None] - h[np.ix_(order[inside], order[outside])]
      )
      + diagonal[inside][:, None]
      + diagonal[outside][None, :]
    ) - problem.lin * (z[outside][None, :] - z[inside][:, None])
    flat = int(np.argmax(delta))
    if delta.flat[flat] <= ordered.tolerance:
      break
    i, j = inside[flat // outside.size], outside[flat % outside.size]
    picked[i], picked[j] = False, True
    reach += (h[order[j]] - h[order[i]])[order]
  return picked, True


def _heuristic(
  problem: fedgs_problem.Problem, order: np.ndarray, num_starts: int, deadline: float
) -> tuple[np.ndarray, bool]:
  """Best of greedy + 1-swap from the plain greedy start and `num_starts - 1`
  starts that force one client first (clients taken in `order`).

  Later starts run only while time remains; the first always runs.

  Returns:
    The local indices (ascending) of the best solution, and whether every
    start ran and converged before `deadline` (then the result does not depend
    on timing).
  """
  h = problem.distances
  z = problem.scores[order]
  scale = problem.quad * (max(h.max(), -h.min()) if z.size else 0.0) + problem.lin * (
    np.abs(z).max() if z.size else 0.0
  )
  ordered = _Ordered(order, np.diagonal(h)[order], z, 1e-12 * max(scale, 1e-300))
  picked, complete = _greedy_swap(problem, ordered, None, deadline)
  best = np.sort(order[picked])
  best_value = fedgs_problem.local_value(problem, best)
  if problem.size <= 1 or problem.size >= order.size - 1:
    return best, complete  # 1-swap search is already exact.
  for first in range(min(num_starts - 1, order.size)):
    if time.monotonic() >= deadline:
      return best, False
    picked, converged = _greedy_swap(problem, ordered, first, deadline)
    complete = complete and converged
    local = np.sort(order[picked])
    value = fedgs_problem.local_value(problem, local)
    if value > best_value:
      best, best_value = local, value
  return best, complete


class SelectionReport(NamedTuple):
  """The result of one round's optimisation (`select_clients_with_report`).

  Attributes:
    indices: ``int64[M]`` the picked clients (global indices, ascending).
    value: Their objective value, recomputed exactly from `indices`.
    method_used: ``'heuristic'`` or ``'solver'`` (SCIP ran on the instance).
    status: ``'optimal'`` (proven optimal: by SCIP, or the heuristic on an
      instance where it is exact, see the module docstring), ``'time_limit'``
      (SCIP, or the heuristic before SCIP could start, ran out of time: the
      best solution found), ``'heuristic'`` (``method='heuristic'``: a local
      optimum, not proven), ``'solver_not_installed'`` (PySCIPOpt cannot be
      imported: the heuristic's solution), ``'too_large'`` (more than
      ``max_solver_clients`` available clients: the heuristic's solution), or
      any other SCIP status name (e.g. ``'memlimit'``): the best solution found.
    bound: An upper bound on the optimum in the objective's scale: SCIP's dual
      bound (``inf`` when SCIP stopped before it had one), `value` when the
      status is ``'optimal'`` without SCIP, else ``nan``.
    timed_out: Whether ``time_limit_s`` cut the heuristic (a local search or
      its later starts) or SCIP: the result then depends on the machine's
      speed and load and may not be reproducible.
  """

  indices: np.ndarray
  value: float
  method_used: str
  status: str
  bound: float
  timed_out: bool


class _SolverResult(NamedTuple):
  local: np.ndarray  # int64[M] local indices of the better of SCIP's best and the warm start.
  status: str  # See SelectionReport.status.
  bound: float  # SCIP's dual bound in the objective's scale (inf when it has none).
  incumbent_value: float  # SCIP's own best solution's value (nan if it has none).


def _import_pyscipopt():
  """Returns the `pyscipopt` module; raises ImportError when it is missing.

  A function of its own so that tests can simulate a missing package.
  """
  import pyscipopt  # pylint: disable=g-import-not-at-top

  return pyscipopt


_solver_missing_warned = False


def _solver_installed() -> bool:
  """Whether PySCIPOpt imports; warns once per process when it does not."""
  global _solver_missing_warned
  try:
    _import_pyscipopt()
  except ImportError as e:
    if not _solver_missing_warned:
      _solver_missing_warned = True
      warnings.warn(
        f'FedGS: the MILP solver package pyscipopt cannot be imported ({e}); selecting '
        'clients with the greedy + 1-swap heuristic instead (SelectionReport.status '
        f"'solver_not_installed'). Install it with `pip install pyscipopt=={_PYSCIPOPT_VERSION}` "
        "or pass method='heuristic' to silence this warning.",
        RuntimeWarning,
        stacklevel=3,
      )
    return False
  return True


def _heuristic_is_exact(problem: fedgs_problem.Problem) -> bool:
  """Whether greedy + 1-swap (run to convergence) is provably optimal here.

  True for ``M ≤ 1`` or ``M ≥ n - 1`` (every two feasible sets differ by one
  swap) and for a linear objective (``α = 0``, or no off-diagonal ``H`` entry:
  the diagonal is a linear term), which greedy maximises.
  """
  h = problem.distances
  return (
    problem.size <= 1
    or problem.size >= problem.candidates.size - 1
    or problem.quad == 0
    or np.count_nonzero(h) == np.count_nonzero(np.diagonal(h))
  )


def _solve_with_solver(
  problem: fedgs_problem.Problem, warm_start: np.ndarray, time_limit_s: float
) -> _SolverResult:
  """Solves the programme's exact MILP linearisation with SCIP (PySCIPOpt).

  Binary ``s_k`` per candidate; for each pair ``k < l`` with
  ``h_kl + h_lk ≠ 0`` a continuous ``y_kl ∈ [0, 1]`` standing for ``s_k s_l``,
  linked by ``Σ_l y_kl = (M-1) s_k`` (the product of ``Σ s = M`` with ``s_k``;
  ``≤`` when some pairs of ``k`` have no ``y``) and, for negative
  ``h_kl + h_lk``, ``y_kl ≥ s_k + s_l - 1``; ``Σ s = M``. With binary ``s``
  these force ``y_kl = s_k s_l`` wherever it matters, so the MILP is exact.
  The objective is ``N (N-1)`` times `local_value` (for conditioning):
  ``Σ_{k<l} α (h_kl + h_lk) y_kl + Σ_k (α h_kk - N z_k) s_k``.

  Args:
    problem: The round's programme.
    warm_start: ``int64[M]`` local indices of a feasible solution (the
      heuristic's), given to SCIP as its first incumbent.
    time_limit_s: Wall-clock budget for building the model and solving it.

  Returns:
    The better of SCIP's best solution and `warm_start` (the latter on ties),
    SCIP's status and its dual bound converted back to the objective's scale.
  """
  deadline = time.monotonic() + time_limit_s
  # The model's O(n²) Python objects are no garbage, yet creating them triggers
  # the cyclic collector, whose full passes over a process that imported
  # TensorFlow take ~0.25 s each: pause it while building and solving.
  collecting = gc.isenabled()
  gc.disable()
  try:
    return _solve_scip(problem, warm_start, deadline)
  finally:
    if collecting:
      gc.enable()


def _solve_scip(
  problem: fedgs_problem.Problem, warm_start: np.ndarray, deadline: float
) -> _SolverResult:
  """`_solve_with_solver` with a `time.monotonic()` deadline."""
  pyscipopt = _import_pyscipopt()
  n, size = problem.candidates.size, problem.size
  h = problem.distances
  n_all = problem.num_clients
  scale = float(n_all * (n_all - 1)) if n_all > 1 else 1.0
  linear = scale * (problem.quad * np.diagonal(h) - problem.lin * problem.scores)

  model = pyscipopt.Model('fedgs')
  model.hideOutput()
  model.setParam('parallel/maxnthreads', 1)
  model.setParam('lp/threads', 1)
  model.setParam('randomization/randomseedshift', _SCIP_SEED_SHIFT)
  model.setParam('misc/catchctrlc', False)  # Ctrl-C reaches Python once SCIP returns.
  model.setMaximize()
  s = [model.addVar(vtype='B', obj=float(c)) for c in linear.tolist()]
  first, second = np.triu_indices(n, 1)
  pair = scale * problem.quad * (h[first, second] + h[second, first])
  if size < 2 or problem.quad == 0:
    pair = pair[:0]
  keep = np.flatnonzero(pair != 0)
  first, second, pair = first[keep], second[keep], pair[keep]
  y = [model.addVar(lb=0.0, ub=1.0, obj=c) for c in pair.tolist()]
  partners: list[list[Any]] = [[] for _ in range(n)]  # SCIP variables.
  for var, i, j in zip(y, first.tolist(), second.tolist()):
    partners[i].append(var)
    partners[j].append(var)
  for k in range(n):
    if partners[k]:
      row = pyscipopt.quicksum(partners[k]) - (size - 1) * s[k]
      model.addCons(row == 0 if len(partners[k]) == n - 1 else row <= 0)
  for index in np.flatnonzero(pair < 0).tolist():
    model.addCons(y[index] - s[first[index]] - s[second[index]] >= -1)
  model.addCons(pyscipopt.quicksum(s) == size)

  picked = np.zeros(n, dtype=bool)
  picked[warm_start] = True
  solution = model.createSol()
  for k in np.flatnonzero(picked).tolist():
    model.setSolVal(solution, s[k], 1.0)
  for index in np.flatnonzero(picked[first] & picked[second]).tolist():
    model.setSolVal(solution, y[index], 1.0)
  model.addSol(solution, free=True)

  model.setParam('limits/time', max(deadline - time.monotonic(), 0.0))
  model.optimize()
  status = model.getStatus()
  status = {'optimal': 'optimal', 'timelimit': 'time_limit'}.get(status, status)
  dual = model.getDualbound()
  bound = math.copysign(math.inf, dual) if abs(dual) >= model.infinity() else dual / scale

  best, best_value = (
    np.sort(np.asarray(warm_start, np.int64)),
    fedgs_problem.local_value(problem, warm_start),
  )
  incumbent_value = math.nan
  if model.getNSols() > 0:
    incumbent = model.getBestSol()
    values = np.array([model.getSolVal(incumbent, var) for var in s])
    local = np.flatnonzero(values > 0.5).astype(np.int64)
    if local.size == size:
      incumbent_value = fedgs_problem.local_value(problem, local)
      if incumbent_value > best_value:
        best, best_value = local, incumbent_value
  return _SolverResult(best, status, bound, incumbent_value)


def validate_method(method: str, max_solver_clients: int) -> None:
  if method not in _METHODS:
    raise ValueError(f'method must be one of {", ".join(map(repr, _METHODS))}, got {method!r}.')
  if (
    isinstance(max_solver_clients, (bool, np.bool_))
    or not isinstance(max_solver_clients, (int, np.integer))
    or max_solver_clients < 0
  ):
    raise ValueError(
      'max_solver_clients must be a non-negative integer (0 never runs the '
      f'solver), got {max_solver_clients!r}.'
    )


def _heuristic_report(
  problem: fedgs_problem.Problem, local: np.ndarray, complete: bool, exact: bool, status: str
) -> SelectionReport:
  """The report of the heuristic's solution `local` when SCIP does not run (for `status`).

  `complete`: every start converged before the deadline; `exact`: that and
  `_heuristic_is_exact` (the status is then ``'optimal'``).
  """
  value = fedgs_problem.local_value(problem, local)
  if exact:
    return SelectionReport(problem.candidates[local], value, 'heuristic', 'optimal', value, False)
  timed_out = not complete or status == 'time_limit'
  return SelectionReport(problem.candidates[local], value, 'heuristic', status, math.nan, timed_out)


def select_clients_with_report(
  distances: np.ndarray,
  counts: np.ndarray,
  available: np.ndarray,
  budget: int,
  *,
  alpha: float,
  time_limit_s: float = 1.0,
  seed: int | Sequence[int] = 0,
  num_starts: int = 16,
  method: str = 'auto',
  max_solver_clients: int = DEFAULT_MAX_SOLVER_CLIENTS,
) -> SelectionReport:
  """Maximises the FedGS objective over ``min(budget, |A|)`` available clients.

  The heuristic (greedy + 1-swap, see the module docstring) always runs first;
  the solver, where it runs, is warm-started with its solution and never
  returns a worse one.

  Args:
    distances: ``float[N, N]`` 3DG distances ``H``.
    counts: ``int[N]`` sampling counts before the round.
    available: ``bool[N]`` availability mask.
    budget: ``K`` clients per round.
    alpha: The paper's ``α ≥ 0``.
    time_limit_s: Wall-clock limit of the whole optimisation (the paper's
      ``τ_max``): the heuristic, then building and solving the MILP in the time
      left. A run cut by it may not be reproducible.
    seed: Seed of the tie-breaking order (``np.random.default_rng(seed)``).
    num_starts: The heuristic's greedy starts: the plain greedy one, then ones
      forcing each of the first ``num_starts - 1`` clients of the tie-breaking
      order first.
    method: ``'auto'`` (the solver if PySCIPOpt is installed, at most
      `max_solver_clients` clients are available and the heuristic is not
      already provably exact; else the heuristic), ``'solver'`` (SCIP whenever
      it can run; it falls back to the heuristic, with status
      ``'solver_not_installed'`` and a once-per-process warning, or
      ``'too_large'``, as ``'auto'`` does) or ``'heuristic'``.
    max_solver_clients: Most available clients for which the solver runs
      (default 150, `DEFAULT_MAX_SOLVER_CLIENTS`, whose comment says why).

  Returns:
    A `SelectionReport`.

  Raises:
    ValueError: On bad shapes, budget, time limit, starts, method or
      `max_solver_clients`.
    TypeError: If `alpha` is not a real number.
  """
  validate_method(method, max_solver_clients)
  validation.positive_number('time_limit_s', time_limit_s)
  deadline = time.monotonic() + float(time_limit_s)
  problem = fedgs_problem.build_problem(distances, counts, available, budget, alpha, None)
  order = np.random.default_rng(seed).permutation(problem.candidates.size)
  validation.positive_int('num_starts', num_starts)
  local, complete = _heuristic(problem, order, int(num_starts), deadline)
  exact = complete and _heuristic_is_exact(problem)
  if method == 'heuristic' or (method == 'auto' and exact):
    return _heuristic_report(problem, local, complete, exact, 'heuristic')
  if problem.candidates.size > max_solver_clients:
    return _heuristic_report(problem, local, complete, exact, 'too_large')
  if not _solver_installed():
    return _heuristic_report(problem, local, complete, exact, 'solver_not_installed')
  remaining = deadline - time.monotonic()
  if remaining <= 0:
    return _heuristic_report(problem, local, complete, exact, 'time_limit')
  result = _solve_with_solver(problem, local, remaining)
  return SelectionReport(
    problem.candidates[result.local],
    fedgs_problem.local_value(problem, result.local),
    'solver',
    result.status,
    result.bound,
    not complete or result.status == 'time_limit',
  )


def select_clients(
  distances: np.ndarray,
  counts: np.ndarray,
  available: np.ndarray,
  budget: int,
  *,
  alpha: float,
  time_limit_s: float = 1.0,
  seed: int | Sequence[int] = 0,
  num_starts: int = 16,
  method: str = 'auto',
  max_solver_clients: int = DEFAULT_MAX_SOLVER_CLIENTS,
) -> tuple[np.ndarray, float]:
  """`select_clients_with_report` without the report's diagnostics.

  Takes the same arguments as `select_clients_with_report` (``method='auto'``
  by default: SCIP where it is installed and the instance small enough).

  Returns:
    ``(indices, value)``: the picked clients (``int64``, ascending) and their
    objective value.

  Raises:
    ValueError: On bad shapes, budget, time limit, starts, method or
      `max_solver_clients`.
    TypeError: If `alpha` is not a real number.
  """
  report = select_clients_with_report(
    distances,
    counts,
    available,
    budget,
    alpha=alpha,
    time_limit_s=time_limit_s,
    seed=seed,
    num_starts=num_starts,
    method=method,
    max_solver_clients=max_solver_clients,
  )
  return report.indices, report.value


def brute_force_select(
  distances: np.ndarray, counts: np.ndarray, available: np.ndarray, budget: int, *, alpha: float
) -> tuple[np.ndarray, float]:
  """Exact optimum by enumeration (the tests' oracle); at most 14 available clients.

  Returns:
    ``(indices, value)`` as `select_clients`; ties go to the lexicographically
    first subset.

  Raises:
    ValueError: If more than 14 clients are available, or as `select_clients`.
  """
  problem = fedgs_problem.build_problem(distances, counts, available, budget, alpha, None)
  if problem.candidates.size > _MAX_BRUTE_FORCE_CLIENTS:
    raise ValueError(
      f'brute_force_select handles at most {_MAX_BRUTE_FORCE_CLIENTS} '
      f'available clients, got {problem.candidates.size}.'
    )
  best, best_value = None, -np.inf
  for subset in itertools.combinations(range(problem.candidates.size), problem.size):
    value = fedgs_problem.local_value(problem, np.asarray(subset, np.int64))
    if value > best_value:
      best, best_value = np.asarray(subset, np.int64), value
  return problem.candidates[best], best_value
