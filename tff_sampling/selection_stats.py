"""Analysis of each round's selection: who was picked, how weighted, which labels.

Analysis only: these numbers go to the metrics, and no sampler sees them.
"""

from __future__ import annotations

import collections
import math
from typing import Protocol

import numpy as np


class Selection(Protocol):
  """What the analysis reads of a round's selection (`tff_sampling.samplers.Selection`)."""

  @property
  def clients(self) -> np.ndarray: ...

  @property
  def weights(self) -> np.ndarray | None: ...


def selection_metrics(
  selection: Selection, num_examples: np.ndarray, label_histograms: np.ndarray
) -> dict[str, float]:
  """Analysis metrics of one round's selection.

  * ``distinct_clients``.
  * ``distinct_labels`` represented in the selected clients' data (from the
    task's label histograms: analysis only, no sampler sees them).
  * ``weight_variance``: ``Σ_i (ω_i − p_i)²`` over all clients, where ``ω_i`` is
    client i's total aggregation weight this round (the sampler's weights summed
    over its slots, or FedAvg's ``n_k / Σ_S n`` when the sampler leaves weighting
    to the process; 0 when not selected) and ``p_i = n_i / M`` its importance.
    For unbiased schemes its expectation is ``Σ_i Var(ω_i)``, the quantity
    clustered sampling reduces (Fraboni et al., MD: ``Σ p_i (1 − p_i) / m``).
  * ``label_kl``: the relative entropy ``KL(q ‖ p)`` (nats) of the label
    distribution ``q`` of the selected clients' pooled data (each client once)
    to the population's ``p`` (LEFL's analysis metric,
    `label_distribution_kl`); left out when the selection is empty, as when a round's
    deadline drops every selected client.
  """
  clients = np.asarray(selection.clients)
  sizes = np.asarray(num_examples, np.float64)
  slot_weights = (
    np.asarray(selection.weights, np.float64)
    if selection.weights is not None
    else sizes[clients] / max(sizes[clients].sum(), 1.0)
  )
  realised = np.zeros(sizes.size)
  np.add.at(realised, clients, slot_weights)
  histograms = np.asarray(label_histograms, np.float64)
  selected = histograms[np.unique(clients)].sum(axis=0)
  metrics = collections.OrderedDict(
    distinct_clients=int(np.unique(clients).size),
    distinct_labels=int(np.count_nonzero(selected)),
    weight_variance=float(np.sum((realised - sizes / sizes.sum()) ** 2)),
  )
  if clients.size:  # An empty cohort (a deadline dropped every client) has no label distribution.
    metrics['label_kl'] = label_distribution_kl(selected, histograms.sum(axis=0))
  return metrics


def label_distribution_kl(selected_histogram: np.ndarray, global_histogram: np.ndarray) -> float:
  """``KL(q ‖ g)`` in nats: sampled clients' pooled labels vs all clients'.

  Args:
    selected_histogram: Label counts of the sampled clients, ``[C]`` pooled
      or ``[K, C]`` per client (summed over clients).
    global_histogram: Label counts of all clients, ``[C]`` or ``[N, C]``.

  Returns:
    ``Σ_c q_c log(q_c / g_c)`` with ``q``, ``g`` the normalised histograms and
    ``0 · log(0 / g) = 0``. It is ``inf`` when ``g_c = 0 < q_c``, which cannot
    happen when the sampled clients are among the clients counted in
    `global_histogram` (their labels are part of the global counts).

  Raises:
    ValueError: If a histogram is not finite and non-negative, sums to 0, or
      the numbers of classes differ.
  """
  q = _pooled_histogram(selected_histogram, 'selected_histogram')
  g = _pooled_histogram(global_histogram, 'global_histogram')
  if q.shape != g.shape:
    raise ValueError(
      f'selected_histogram has {q.shape[0]} classes but global_histogram has '
      f'{g.shape[0]}; pass label counts over the same classes.'
    )
  q, g = q / q.sum(), g / g.sum()
  support = q > 0
  if np.any(g[support] == 0):
    return math.inf
  return float(max(0.0, np.sum(q[support] * np.log(q[support] / g[support]))))


def _pooled_histogram(histogram: np.ndarray, name: str) -> np.ndarray:
  counts = np.asarray(histogram, dtype=np.float64)
  if counts.ndim not in (1, 2) or counts.shape[-1] == 0:
    raise ValueError(f'{name} must be [C] or [clients, C] label counts, got shape {counts.shape}.')
  if not np.all(np.isfinite(counts)) or np.any(counts < 0):
    raise ValueError(f'{name} must hold finite non-negative label counts.')
  counts = counts.reshape(-1, counts.shape[-1]).sum(axis=0)
  if counts.sum() <= 0:
    raise ValueError(f'{name} has no examples (all counts are 0).')
  return counts
