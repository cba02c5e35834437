"""What clustered sampling changes against MD sampling, in closed form: each client's inclusion
probability, its aggregation-weight variance, and the expected number of distinct clients."""

from __future__ import annotations

import numpy as np

from tff_sampling.samplers import base
from tff_sampling.samplers import md


def _validate_probabilities(values: np.ndarray, name: str) -> np.ndarray:
  values = np.asarray(values, np.float64)
  if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1):
    raise ValueError(f'{name} must be probabilities in [0, 1].')
  return values


def md_inclusion_probability(p: np.ndarray, num_draws: int) -> np.ndarray:
  """``P(i sampled) = 1 - (1 - p_i)^m`` under MD sampling.

  Args:
    p: ``[N]`` importances ``p_i = n_i / M``.
    num_draws: ``m``.

  Returns:
    ``float64[N]``.
  """
  num_draws = md.validate_num_draws(num_draws)
  return 1.0 - (1.0 - _validate_probabilities(p, 'p')) ** num_draws


def clustered_inclusion_probability(r: np.ndarray) -> np.ndarray:
  """``P(i sampled) = 1 - Π_k (1 - r_{k,i})`` under clustered sampling.

  Args:
    r: ``[m, N]`` distributions.

  Returns:
    ``float64[N]``.
  """
  return 1.0 - np.prod(1.0 - _validate_probabilities(r, 'r'), axis=0)


def md_weight_variance(p: np.ndarray, num_draws: int) -> np.ndarray:
  """Variance of client i's aggregation weight ``#draws(i) / m`` under MD sampling.

  ``#draws(i) ~ Binomial(m, p_i)``, so the variance is ``m p_i (1 - p_i) / m²``.

  Args:
    p: ``[N]`` importances ``p_i = n_i / M``.
    num_draws: ``m``.

  Returns:
    ``float64[N]``.
  """
  num_draws = md.validate_num_draws(num_draws)
  p = _validate_probabilities(p, 'p')
  return num_draws * p * (1.0 - p) / num_draws**2


def clustered_weight_variance(r: np.ndarray) -> np.ndarray:
  """Variance of client i's aggregation weight under clustered sampling.

  ``#draws(i)`` is a sum of independent Bernoulli(``r_{k,i}``), so the variance
  of ``#draws(i) / m`` is ``Σ_k r_{k,i} (1 - r_{k,i}) / m²``.

  Args:
    r: ``[m, N]`` distributions.

  Returns:
    ``float64[N]``.
  """
  r = _validate_probabilities(r, 'r')
  return np.sum(r * (1.0 - r), axis=0) / r.shape[0] ** 2


def expected_distinct_clients(r: np.ndarray) -> float:
  """Expected number of distinct clients per round, ``Σ_i P(i sampled)``.

  MD sampling is the special case ``r[k] = p`` for every ``k``.
  """
  return float(np.sum(clustered_inclusion_probability(r)))


def distinct_clients(selection: base.Selection | np.ndarray) -> int:
  """Number of distinct clients in a selection (or an array of client ids)."""
  clients = selection.clients if isinstance(selection, base.Selection) else selection
  return int(np.unique(np.asarray(clients)).shape[0])
