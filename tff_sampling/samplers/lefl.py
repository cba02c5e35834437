r"""LEFL (Abebe, Munoz, Jannesari): low-entropy stratified client sampling. Once, clients
upload their soft labels on a public set; the server clusters them by pairwise KL divergence
(k-means). Every round `LeflSampler` draws from each cluster's available clients
(``'per_cluster'``, the paper's rule, or ``'proportional'``). The formulas and every choice
made here are ``docs/algorithms.md`` §4."""

from __future__ import annotations

from collections.abc import Mapping
import fractions
import math
import numbers
from typing import NamedTuple, cast
import warnings

import numpy as np

from tff_sampling import contract
from tff_sampling import validation
from tff_sampling.samplers import base
from tff_sampling.samplers import md

ALLOCATIONS = ('per_cluster', 'proportional')
DEFAULT_FLOOR = 1e-12
_ROW_SUM_TOLERANCE = 1e-3
_KMEANS_N_INIT = 10
# Streams of the round generators: the cohort draw (then the cluster index) and,
# in "round 0", the k-means seed.
_COHORT_STREAM = 0
_KMEANS_STREAM = 1
# Most bytes of one float64 block of soft labels (and one of their logarithms)
# that `kl_matrix` holds at a time besides the [N, N] result.
_BLOCK_BYTES = 32 << 20


# ------------------------------------------------------------------------------
# Pre-processing.


def kl_matrix(soft_labels: np.ndarray, *, floor: float = DEFAULT_FLOOR) -> np.ndarray:
  """The mean KL divergences ``S_ij = (1/P) Σ_x KL(p_i(x) ‖ p_j(x))``.

  Computed as ``S_ij = a_i - (1/P) <p_i, log p_j>`` with ``a_i = (1/P) <p_i,
  log p_i>``, the inner products over the flattened ``[P·C]`` outputs: one
  matrix product, accumulated over blocks of public examples so that besides
  the result only two float64 blocks of at most 32 MB are held (the input is
  never copied whole).

  Args:
    soft_labels: ``float[N, P, C]``: client ``i``'s softmax outputs on ``P``
      public examples over ``C`` classes; finite, non-negative, each
      ``soft_labels[i, x]`` summing to 1 within ``1e-3``.
    floor: Probabilities are clipped from below at `floor` inside the
      logarithm only (``0 · log 0 = 0``); in ``(0, 1)``.

  Returns:
    ``float64[N, N]``, non-negative, zero diagonal, asymmetric in general.

  Raises:
    ValueError: If `soft_labels` is not a non-empty 3-D array of finite,
      non-negative values whose rows sum to 1, or `floor` is not in ``(0, 1)``.
  """
  if (
    isinstance(floor, (bool, np.bool_))
    or not isinstance(floor, numbers.Real)
    or not 0.0 < float(floor) < 1.0
  ):
    raise ValueError(f'floor must be a number in (0, 1), got {floor!r}; e.g. 1e-12.')
  floor = float(floor)
  labels = np.asarray(soft_labels)
  if labels.ndim != 3 or 0 in labels.shape:
    raise ValueError(
      'soft_labels must be a non-empty 3-D array [clients N, public examples P, '
      f'classes C], got shape {labels.shape}.'
    )
  if not (np.issubdtype(labels.dtype, np.floating) or np.issubdtype(labels.dtype, np.integer)):
    raise ValueError(f'soft_labels must be numeric, got dtype {labels.dtype}.')
  num_clients, num_examples, num_classes = labels.shape
  block = max(1, _BLOCK_BYTES // (8 * num_clients * num_classes))
  cross = np.zeros((num_clients, num_clients), np.float64)
  self_term = np.zeros(num_clients, np.float64)
  for start in range(0, num_examples, block):
    p = np.array(labels[:, start : start + block], dtype=np.float64)
    _check_probability_block(p, start)
    p /= p.sum(axis=2, keepdims=True)
    p = p.reshape(num_clients, -1)
    log_p = np.log(np.maximum(p, floor))
    cross += p @ log_p.T
    self_term += np.einsum('ij,ij->i', p, log_p)
  result = (self_term[:, None] - cross) / num_examples
  np.fill_diagonal(result, 0.0)
  np.maximum(result, 0.0, out=result)
  return result


def _check_probability_block(p: np.ndarray, start: int) -> None:
  """Checks a ``[N, b, C]`` block of soft labels (examples from `start`)."""
  bad = ~np.isfinite(p) | (p < 0)
  if np.any(bad):
    client, example, _ = np.argwhere(bad)[0]
    raise ValueError(
      f'soft_labels must be finite and non-negative; client {client} has '
      f'{p[client, example].tolist()} on public example {start + example}. '
      'Pass softmax outputs (probabilities).'
    )
  sums = p.sum(axis=2)
  off = np.abs(sums - 1.0) > _ROW_SUM_TOLERANCE
  if np.any(off):
    client, example = np.argwhere(off)[0]
    raise ValueError(
      f'soft_labels[{client}, {start + example}] sums to {sums[client, example]:.6g}, '
      f'not 1 (tolerance {_ROW_SUM_TOLERANCE}); pass softmax outputs '
      '(probabilities over the classes), not logits or counts.'
    )


def default_num_clusters(num_clients: int) -> int:
  """``⌈log2 N⌉``, at least 1 (exact integer arithmetic)."""
  return max(1, (int(num_clients) - 1).bit_length())


def _validate_num_clusters(num_clusters, num_clients: int) -> int:
  if num_clusters is None:
    return default_num_clusters(num_clients)
  if (
    isinstance(num_clusters, (bool, np.bool_))
    or not isinstance(num_clusters, (int, np.integer))
    or num_clusters < 1
  ):
    raise ValueError(
      f'num_clusters must be a positive integer, got {num_clusters!r}; pass None for '
      f'the default ceil(log2 N) = {default_num_clusters(num_clients)}.'
    )
  if num_clusters > num_clients:
    raise ValueError(
      f'num_clusters={num_clusters} exceeds the number of clients N={num_clients}; '
      f'pass num_clusters <= {num_clients}.'
    )
  return int(num_clusters)


def _validate_kl(kl: np.ndarray) -> np.ndarray:
  matrix = np.asarray(kl)
  if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
    raise ValueError(f'kl must be a non-empty square [N, N] matrix, got shape {matrix.shape}.')
  if not (np.issubdtype(matrix.dtype, np.floating) or np.issubdtype(matrix.dtype, np.integer)):
    raise ValueError(f'kl must be numeric, got dtype {matrix.dtype}.')
  matrix = matrix.astype(np.float64)
  if not np.all(np.isfinite(matrix)):
    row = int(np.flatnonzero(~np.all(np.isfinite(matrix), axis=1))[0])
    raise ValueError(f'kl must be finite; row {row} is not.')
  return matrix


def canonical_labels(labels: np.ndarray) -> np.ndarray:
  """Renumbers cluster labels by smallest member index: ``int64[N]`` in ``0..k-1``.

  Raises:
    ValueError: If `labels` is not a non-empty 1-D array of integers.
  """
  values = np.asarray(labels)
  if values.ndim != 1 or values.shape[0] == 0:
    raise ValueError(f'cluster labels must be a non-empty 1-D array [N], got shape {values.shape}.')
  if not (
    np.issubdtype(values.dtype, np.integer)
    or (
      np.issubdtype(values.dtype, np.floating)
      and np.all(np.isfinite(values))
      and np.all(values == np.round(values))
    )
  ):
    raise ValueError(f'cluster labels must be integers, got {values!r}.')
  _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
  rank = np.empty(first.shape[0], np.int64)
  rank[np.argsort(first, kind='stable')] = np.arange(first.shape[0])
  return rank[inverse.reshape(-1)]


def cluster_clients(kl: np.ndarray, *, num_clusters: int | None = None, seed: int) -> np.ndarray:
  """k-means on the rows of the KL matrix; canonical labels.

  Args:
    kl: ``float[N, N]`` finite dissimilarities (`kl_matrix`); row ``i`` is
      client ``i``'s feature vector.
    num_clusters: ``k``; default ``⌈log2 N⌉`` (at least 1). k-means runs with
      ``min(k, #distinct rows of S)`` clusters; if fewer than ``k`` clusters
      end up non-empty (too few distinct rows, or rows that differ only by
      rounding, as identical clients' rows can), a `RuntimeWarning` gives the
      realised number.
    seed: Root of k-means' randomness (``random_state`` is drawn from
      ``round_rng(seed, 0, 1)``); ``n_init=10`` starts.

  Returns:
    ``int64[N]`` labels in ``0..k'-1`` (``k' ≤ k``, equal except in the
    degenerate cases above), numbered by smallest member index.

  Raises:
    ValueError: If `kl` is not a finite square matrix or `num_clusters` is not
      an integer in ``[1, N]``.
  """
  # Imported here: scikit-learn is slow to import and only LEFL needs it.
  from sklearn import cluster  # pylint: disable=g-import-not-at-top
  from sklearn import exceptions  # pylint: disable=g-import-not-at-top

  matrix = _validate_kl(kl)
  num_clients = matrix.shape[0]
  requested = _validate_num_clusters(num_clusters, num_clients)
  distinct = np.unique(matrix, axis=0).shape[0]
  k = min(requested, distinct)
  if k == 1:
    labels = np.zeros(num_clients, np.int64)
  else:
    random_state = int(base.round_rng(seed, 0, _KMEANS_STREAM).integers(2**31 - 1))
    kmeans = cluster.KMeans(n_clusters=k, n_init=_KMEANS_N_INIT, random_state=random_state)
    with warnings.catch_warnings():
      # Rows equal up to rounding: reported below, with the realised number.
      warnings.simplefilter('ignore', exceptions.ConvergenceWarning)
      labels = canonical_labels(kmeans.fit_predict(matrix))
  realised = int(labels.max()) + 1
  if realised < requested:
    warnings.warn(
      f'k-means found only {realised} non-empty clusters of the {requested} asked '
      f'for: the KL matrix has {distinct} distinct rows, and clients with equal rows '
      f'(up to rounding) share a cluster. The labels are 0..{realised - 1}; pass '
      f'num_clusters <= {realised} to silence this.',
      RuntimeWarning,
      stacklevel=2,
    )
  return labels


# ------------------------------------------------------------------------------
# Allocations.


def largest_remainder_allocation(counts: np.ndarray, budget: int) -> np.ndarray:
  """Splits `budget` over groups in proportion to `counts`, exactly.

  Group ``c`` gets ``⌊budget · counts[c] / Σ counts⌋`` plus one for the
  ``budget - Σ ⌊…⌋`` groups with the largest remainders (ties: lower index),
  all in integer arithmetic. No group gets more than ``counts[c]``.

  Args:
    counts: ``[k]`` non-negative integers, not all zero.
    budget: Integer in ``[0, Σ counts]``.

  Returns:
    ``int64[k]`` summing to `budget`.

  Raises:
    ValueError: On negative or all-zero counts or a budget out of range.
  """
  counts = np.asarray(counts, np.int64)
  total = int(counts.sum())
  if counts.ndim != 1 or np.any(counts < 0) or total == 0:
    raise ValueError(f'counts must be non-negative integers, not all 0; got {counts!r}.')
  if not 0 <= budget <= total:
    raise ValueError(f'budget must be in [0, {total}] (the total count), got {budget!r}.')
  product = int(budget) * counts
  quota, remainder = product // total, product % total
  extra = int(budget) - int(quota.sum())
  order = np.lexsort((np.arange(counts.shape[0]), -remainder))  # Largest first, then index.
  quota[order[:extra]] += 1
  return quota


def _parse_rate(sample_rate) -> fractions.Fraction:
  if (
    isinstance(sample_rate, (bool, np.bool_))
    or not isinstance(sample_rate, numbers.Real)
    or not math.isfinite(float(sample_rate))
  ):
    raise ValueError(f'sample_rate must be a number in (0, 1], got {sample_rate!r}.')
  if isinstance(sample_rate, (fractions.Fraction, int, np.integer)):
    # NumPy registers its integers as `numbers.Integral`, which Fraction takes.
    rate = fractions.Fraction(cast(numbers.Rational, sample_rate))
  else:
    rate = fractions.Fraction(repr(float(sample_rate)))
  if not 0 < rate <= 1:
    raise ValueError(
      f'sample_rate must be in (0, 1] (the fraction of each cluster drawn per round), '
      f'got {sample_rate!r}.'
    )
  return rate


def per_cluster_counts(
  cluster_sizes: np.ndarray, available_counts: np.ndarray, sample_rate
) -> np.ndarray:
  """``min(a_c, max(1, round(rate · |c|)))`` for clusters with ``a_c > 0``, else 0.

  Args:
    cluster_sizes: ``[k]`` members per cluster ``|c|``.
    available_counts: ``[k]`` available members ``a_c``.
    sample_rate: The rate, in ``(0, 1]``; a float is read as its shortest
      decimal (see the module docstring); rounding is half up, exact.

  Returns:
    ``int64[k]``.
  """
  rate = _parse_rate(sample_rate)
  sizes = np.asarray(cluster_sizes, np.int64)
  active = np.asarray(available_counts, np.int64)
  # round half up of rate·|c| = ⌊(2 num |c| + den) / (2 den)⌋.
  wanted = (2 * rate.numerator * sizes + rate.denominator) // (2 * rate.denominator)
  return np.where(active > 0, np.minimum(active, np.maximum(wanted, 1)), 0).astype(np.int64)


# ------------------------------------------------------------------------------
# The sampler.


def _check_inputs(soft_labels, kl, clusters, num_clusters, sample_rate, allocation: str) -> None:
  """Checks `LeflSampler`'s input (exactly one of three) and that its options apply to it."""
  given = [
    name
    for name, value in (('soft_labels', soft_labels), ('kl', kl), ('clusters', clusters))
    if value is not None
  ]
  if len(given) != 1:
    raise ValueError(f'Give exactly one of soft_labels, kl and clusters, got {given or "none"}.')
  if allocation not in ALLOCATIONS:
    raise ValueError(f'Unknown allocation {allocation!r}; expected one of {ALLOCATIONS}.')
  if allocation == 'proportional' and sample_rate is not None:
    raise ValueError(
      f"sample_rate={sample_rate!r} applies to allocation='per_cluster' only; "
      "'proportional' draws exactly min(clients_per_round, #available)."
    )
  if clusters is not None and num_clusters is not None:
    raise ValueError(
      f'num_clusters={num_clusters!r} applies to clustering soft_labels or kl; '
      'the given clusters fix the number of clusters.'
    )


def _labels_and_kl(
  soft_labels, kl, clusters, num_clusters, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """The canonical cluster labels and the float32 KL matrix (``[0, 0]`` from `clusters`)."""
  if clusters is not None:
    return canonical_labels(clusters), np.zeros((0, 0), np.float32)
  if soft_labels is not None:
    matrix = kl_matrix(soft_labels)
  else:
    assert kl is not None  # Exactly one of soft_labels, kl and clusters is given.
    matrix = _validate_kl(kl)
  labels = cluster_clients(matrix, num_clusters=num_clusters, seed=seed)
  return labels, matrix.astype(np.float32)


class LeflState(NamedTuple):
  """The state of a `LeflSampler` (a nest of arrays, checkpointable).

  Attributes:
    cluster_labels: ``int64[N]`` canonical cluster of each client.
    kl: ``float32[N, N]`` the KL matrix (analysis only), or ``float32[0, 0]``
      when the sampler was built from given cluster labels.
    num_examples: ``int64[N]`` examples per client (aggregation weights).
  """

  cluster_labels: np.ndarray
  kl: np.ndarray
  num_examples: np.ndarray


class LeflSampler(base.Sampler):
  """LEFL's stratified sampling over KL clusters; see the module docstring.

  Built from exactly one of: `soft_labels` (computes `kl_matrix`, then
  `cluster_clients`), `kl` (clusters it) or `clusters` (given labels). The
  clustering runs once, in the constructor.

  Attributes:
    clients_per_round: ``K``, the budget of ``'proportional'`` and the default
      rate ``K / N`` of ``'per_cluster'``.
    allocation: ``'per_cluster'`` or ``'proportional'``.
    sample_rate: ``'per_cluster'``'s rate as an exact fraction (``None`` for
      ``'proportional'``).
    cluster_labels: ``int64[N]`` the canonical labels.
    num_clusters: The number of (non-empty) clusters.
    num_clients: ``N``.
  """

  weighting = 'num_examples'

  def __init__(
    self,
    clients_per_round: int,
    *,
    seed: int,
    soft_labels: np.ndarray | None = None,
    kl: np.ndarray | None = None,
    clusters: np.ndarray | None = None,
    num_clusters: int | None = None,
    sample_rate: float | None = None,
    allocation: str = 'per_cluster',
  ):
    """Initializes the sampler and clusters the clients.

    Args:
      clients_per_round: ``K`` (positive, at most ``N``).
      seed: Root of the k-means seed and of every round's draws.
      soft_labels: ``float[N, P, C]`` softmax outputs on the public set.
      kl: ``float[N, N]`` a precomputed KL matrix instead.
      clusters: ``int[N]`` given cluster labels instead (renumbered
        canonically).
      num_clusters: k-means' ``k`` (default ``⌈log2 N⌉``); not with `clusters`.
      sample_rate: ``'per_cluster'``'s fraction of each cluster per round, in
        ``(0, 1]``; default ``clients_per_round / N``. Not with
        ``'proportional'``.
      allocation: ``'per_cluster'`` (default) or ``'proportional'``.

    Raises:
      ValueError: If not exactly one of `soft_labels`, `kl`, `clusters` is
        given, or an argument is invalid or inapplicable (see the messages).
    """
    self.clients_per_round = validation.positive_int('clients_per_round', clients_per_round)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
      raise ValueError(f'seed must be an integer, got {seed!r}.')
    self.seed = int(seed)
    _check_inputs(soft_labels, kl, clusters, num_clusters, sample_rate, allocation)
    self.allocation = allocation
    labels, self._kl = _labels_and_kl(soft_labels, kl, clusters, num_clusters, self.seed)
    self.num_clients = int(labels.shape[0])
    if self.clients_per_round > self.num_clients:
      raise ValueError(
        f'clients_per_round={self.clients_per_round} exceeds the N={self.num_clients} '
        f'clients; pass clients_per_round <= {self.num_clients}.'
      )
    self.cluster_labels = labels
    self.num_clusters = int(labels.max()) + 1
    if allocation == 'per_cluster':
      self.sample_rate: fractions.Fraction | None = (
        fractions.Fraction(self.clients_per_round, self.num_clients)
        if sample_rate is None
        else _parse_rate(sample_rate)
      )
    else:
      self.sample_rate = None

  def initialize(self, population: base.Population) -> LeflState:
    """Returns the labels, the float32 KL matrix and the client sizes.

    Raises:
      ValueError: If the population does not have ``N`` clients or a size is
        not a non-negative integer.
    """
    sizes = np.asarray(population.num_examples)
    if sizes.shape != (self.num_clients,):
      raise ValueError(
        f'population has num_examples of shape {sizes.shape} but the sampler was '
        f'built for N={self.num_clients} clients; pass the same clients, in the same order.'
      )
    if (
      not np.all(np.isfinite(sizes.astype(np.float64)))
      or np.any(sizes < 0)
      or np.any(sizes != np.round(sizes))
    ):
      raise ValueError('population.num_examples must be non-negative integers.')
    return LeflState(self.cluster_labels.copy(), self._kl.copy(), sizes.astype(np.int64))

  def _check_state(self, state: LeflState) -> LeflState:
    labels = np.asarray(state.cluster_labels)
    sizes = np.asarray(state.num_examples)
    kl = np.asarray(state.kl)
    n = labels.shape[0] if labels.ndim == 1 else -1
    if n <= 0 or sizes.shape != (n,) or kl.shape not in ((n, n), (0, 0)):
      raise ValueError(
        'state does not match a LeflState: expected cluster_labels [N], '
        f'num_examples [N] and kl [N, N] or [0, 0], got shapes {labels.shape}, '
        f'{sizes.shape}, {kl.shape}.'
      )
    labels = labels.astype(np.int64)
    if labels.min() < 0:
      raise ValueError('state.cluster_labels must be non-negative.')
    return LeflState(labels, kl, sizes.astype(np.int64))

  def cluster_counts(
    self, state: LeflState, available: np.ndarray, round_num: int = 0
  ) -> np.ndarray:
    """The number of clients each cluster contributes this round, ``int64[k]``.

    Deterministic (no draw); the sum is the realised cohort size. `round_num`
    only names the round in the error for an empty mask.

    Raises:
      ValueError: If `available` has the wrong shape or is all False.
    """
    state = self._check_state(state)
    labels = state.cluster_labels
    mask = md.validate_available(available, labels.shape[0], round_num)
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k)
    active = np.bincount(labels[mask], minlength=k)
    if self.allocation == 'per_cluster':
      return per_cluster_counts(sizes, active, self.sample_rate)
    budget = min(self.clients_per_round, int(active.sum()))
    return largest_remainder_allocation(active, budget)

  def select(
    self,
    state: LeflState,
    round_num: int,
    available: np.ndarray,
    *,
    probe: contract.Probe | None = None,
  ) -> base.Selection:
    """Draws each cluster's count uniformly among its available members; pure.

    Returns:
      The clients in ascending order, weighted ``n_k / Σ_{j∈S} n_j``.

    Raises:
      ValueError: If `available` has the wrong shape or is all False, or the
        state is malformed.
    """
    del probe  # Selects without one.
    state = self._check_state(state)
    counts = self.cluster_counts(state, available, round_num)
    mask = np.asarray(available).astype(bool)
    labels = state.cluster_labels
    chosen = []
    for c in np.flatnonzero(counts):
      members = np.flatnonzero(mask & (labels == c))
      rng = base.round_rng(self.seed, round_num, _COHORT_STREAM, int(c))
      chosen.append(rng.choice(members, size=int(counts[c]), replace=False))
    clients = np.sort(np.concatenate(chosen)).astype(np.int64)
    sizes = state.num_examples[clients].astype(np.float64)
    total = sizes.sum()
    weights = sizes / total if total > 0 else np.full(clients.size, 1.0 / clients.size)
    return base.Selection(clients=clients, weights=weights.astype(np.float32))

  def observe(
    self, state: LeflState, selection: base.Selection, signals: Mapping[str, np.ndarray]
  ) -> LeflState:
    """Returns `state` unchanged: LEFL is static after pre-processing."""
    del selection, signals
    return state
