"""FedGS as the authors' published code builds it: the squared 3DG kernel and the
dispersion term over the cohort's pairs (`fedgs_problem.KERNELS`, `DISPERSION_SCALES`)."""

import itertools
import math

import numpy as np
import pytest

from tff_sampling import samplers
from tff_sampling.samplers import fedgs
from tff_sampling.samplers import fedgs_problem

E = math.exp


def test_squared_kernel_hand_computed():
  """Four clients, V off-diagonal min 0 and max 1 (no rescaling), ε = 0.1, σ² = 1,
  edges R_ij = exp(-V_ij²):
    0-1: V=1   → e^-1,      1-2: V=0.5 → e^-0.25,   0-2: V=0.2 → e^-0.04
    2-3: V=0.3 → e^-0.09,   0-3: V=0.05 (< ε: no edge),  1-3: V=0 (no edge).
  0→2 direct e^-0.04 ≈ 0.96079 is shorter than 0→1→2 = e^-1 + e^-0.25 ≈ 1.14668;
  1→2 direct e^-0.25 ≈ 0.77880 is shorter than 1→0→2 ≈ 1.32867. So d01 = e^-1,
  d12 = e^-0.25, d02 = e^-0.04, d23 = e^-0.09, d03 = e^-0.04 + e^-0.09 (via 2),
  d13 = min(e^-0.25 + e^-0.09, e^-1 + d03) = e^-0.25 + e^-0.09 ≈ 1.69273, and
  d03 ≈ 1.87474 is the largest.
  With the linear kernel the same V give d01 = e^-1, d12 = e^-0.5, d02 = e^-0.2 ...
  (checked below only to differ)."""
  v = np.eye(4)
  for (i, j), value in {
    (0, 1): 1.0,
    (1, 2): 0.5,
    (0, 2): 0.2,
    (2, 3): 0.3,
    (0, 3): 0.05,
    (1, 3): 0.0,
  }.items():
    v[i, j] = v[j, i] = value
  d01, d12, d02, d23 = E(-1), E(-0.25), E(-0.04), E(-0.09)
  d03, d13 = d02 + d23, d12 + d23
  expected = (
    np.array([[0, d01, d02, d03], [d01, 0, d12, d13], [d02, d12, 0, d23], [d03, d13, d23, 0]]) / d03
  )
  h = fedgs_problem.graph_distances(v, epsilon=0.1, sigma2=1.0, kernel='squared')
  np.testing.assert_allclose(h, expected, rtol=1e-12, atol=1e-15)
  assert h[0, 3] == 1.0
  linear = fedgs_problem.graph_distances(v, epsilon=0.1, sigma2=1.0)
  assert abs(linear[0, 1] - h[0, 1]) > 0.01
  with pytest.raises(ValueError, match="kernel='cubic' is unknown; choose from linear, squared"):
    fedgs_problem.graph_distances(v, kernel='cubic')


def _cohort_objective(subset, h, counts, alpha, num_clients):
  """The authors' objective written out independently: α × the mean distance over
  the cohort's unordered pairs, minus Σ z_k / (N - 1), z_k = 2 (v_k - v̄ - M/N) + 1."""
  subset = list(subset)
  m = len(subset)
  pairs = list(itertools.combinations(subset, 2))
  mean_distance = sum(h[i, j] for i, j in pairs) / len(pairs) if pairs else 0.0
  z = 2.0 * (counts - counts.mean() - m / num_clients) + 1.0
  return alpha * mean_distance - z[subset].sum() / (num_clients - 1)


def test_cohort_scale_maximises_the_authors_objective():
  """12 clients, budget 4, α = 1 (the experiments' α), over 12 rounds of which some have only 3 or 2
  clients available (M < K): each cohort the solver picks maximises the cohort
  objective (enumerated over every feasible cohort), and at this α the paper's
  scale picks differently in some round (the option changes the selection)."""
  rng = np.random.default_rng(3)
  n, k, alpha = 12, 4, 1.0
  features = rng.dirichlet(np.full(6, 0.3), size=n)
  population = samplers.Population(np.full(n, 10, np.int64))

  def make(scale):
    return fedgs.FedGSSampler(
      k, seed=1, features=features, alpha=alpha, method='solver', dispersion_scale=scale
    )

  cohort, paper = make('cohort'), make('clients')
  state = cohort.initialize(population)
  differs = False
  for round_num in range(1, 13):
    available = np.ones(n, bool)
    if round_num % 4 == 0:
      available[:] = False
      available[rng.choice(n, size=3 if round_num == 4 else 2, replace=False)] = True
    selection = cohort.select(state, round_num, available)
    size = min(k, int(available.sum()))
    values = {
      s: _cohort_objective(s, state.distances, state.counts, alpha, n)
      for s in itertools.combinations(np.flatnonzero(available), size)
    }
    best = max(values.values())
    assert _cohort_objective(
      sorted(selection.clients), state.distances, state.counts, alpha, n
    ) == pytest.approx(best, abs=1e-9), round_num
    other = paper.select(state, round_num, available)
    differs |= set(other.clients) != set(selection.clients)
    state = cohort.observe(state, selection, {})
  assert differs
  with pytest.raises(ValueError, match="dispersion_scale='pairs' is unknown"):
    fedgs.FedGSSampler(k, seed=1, features=features, dispersion_scale='pairs')


def test_scaled_alpha():
  assert fedgs_problem.scaled_alpha(2.0, 'clients', 100, 10) == 2.0
  assert fedgs_problem.scaled_alpha(2.0, 'cohort', 100, 10) == pytest.approx(2.0 * 9900 / 90)
  assert fedgs_problem.scaled_alpha(2.0, 'cohort', 100, 1) == 2.0
