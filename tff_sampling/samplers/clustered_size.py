"""Clustered sampling by client size (Fraboni et al., ICML 2021, Algorithm 1): ``m``
distributions that split every client's ``m p_i`` share in size order."""

from __future__ import annotations

import numpy as np

from tff_sampling.samplers import md


def size_based_units(client_sizes: np.ndarray, num_draws: int) -> np.ndarray:
  """Algorithm 1 in integer units: ``units[k, i]`` units of client ``i`` in bin ``k``.

  Client ``i`` owns ``m n_i`` units; the clients, by ``n_i`` descending (ties
  by index), are poured into ``m`` bins of capacity ``M = Σ n_i``. Viewing the
  bins end to end as the interval ``[0, m M)``, the client at sorted position
  ``j`` occupies ``[C_{j-1}, C_j)`` with ``C_j`` the cumulative units, and its
  units in bin ``k`` are the overlap with ``[k M, (k+1) M)``.

  Args:
    client_sizes: ``[N]`` positive integer sizes ``n_i``.
    num_draws: ``m``.

  Returns:
    ``int64[m, N]``; every row sums to ``M``, column ``i`` to ``m n_i``.

  Raises:
    ValueError: If `num_draws` is not a positive integer or a size is not a
      positive integer.
  """
  num_draws = md.validate_num_draws(num_draws)
  sizes = md.validate_client_sizes(client_sizes, num_draws)
  capacity = int(sizes.sum())
  order = np.argsort(-sizes, kind='stable')
  end = np.cumsum(num_draws * sizes[order])
  start = end - num_draws * sizes[order]
  bin_start = capacity * np.arange(num_draws, dtype=np.int64)[:, None]
  overlap = np.minimum(end[None, :], bin_start + capacity) - np.maximum(start[None, :], bin_start)
  units = np.zeros((num_draws, sizes.shape[0]), np.int64)
  units[:, order] = np.maximum(overlap, 0)
  return units


def size_based_distributions(client_sizes: np.ndarray, num_draws: int) -> np.ndarray:
  """Algorithm 1 of Fraboni et al.: the ``m`` distributions by sample size.

  Args:
    client_sizes: ``[N]`` positive integer sizes ``n_i``.
    num_draws: ``m``, the number of distributions (clients per round).

  Returns:
    ``float64[m, N]`` probabilities ``r``: ``Σ_i r[k, i] = 1`` and
    ``Σ_k r[k, i] = m n_i / M``.

  Raises:
    ValueError: As `size_based_units`.
  """
  units = size_based_units(client_sizes, num_draws)
  return units / units[0].sum()
