"""Unbalancing a federated dataset by shrinking and removing mid-sized clients.

The procedure of Chen, Horváth and Richtárik, "Optimal Client Sampling for
Federated Learning" (TMLR 2022, arXiv:2010.13723), used to make FEMNIST
unbalanced: given thresholds ``lower <= upper`` (the paper's ``a < b``) and a
probability ``removal_probability`` (``p``), a client with ``n_i`` examples

* is kept unchanged if ``n_i`` is outside ``[lower, upper]``;
* otherwise is removed with probability ``p``, or else keeps only
  ``min(n_i, keep_examples)`` of its examples, drawn uniformly without
  replacement.

Only the clients outside the range keep their (large) datasets, so a small
fraction of clients ends up holding most of the examples; `size_concentration`
measures that ("the largest 10% of the clients hold 82% of the examples").

Randomness (no global state): the removal decisions come from
``np.random.default_rng([seed, 0])``, one uniform per client in client order
(drawn for every client, so client ``i``'s decision does not depend on the
other clients' sizes or on the thresholds: the same seed gives nested removal
sets across parameter values); the examples client ``i`` keeps come from
``np.random.default_rng([seed, 1, i])``.

`calibrate_on_sizes` searches the parameters that reach a target
concentration on given client sizes; `subset_client_data` applies a per-client
selection of example indices to a `tff.simulation.datasets.ClientData`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
import dataclasses
import itertools
import numbers
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_DECISION_STREAM = 0
_SELECTION_STREAM = 1


@dataclasses.dataclass(frozen=True)
class UnbalanceParams:
  """Parameters of the unbalancing procedure.

  Attributes:
    lower: Smallest affected client size (the paper's ``a``), inclusive.
    upper: Largest affected client size (the paper's ``b``), inclusive.
    removal_probability: Probability that an affected client is removed (the
      paper's ``p``).
    keep_examples: Examples an affected, surviving client keeps (all of them
      if it has fewer).
  """

  lower: int
  upper: int
  removal_probability: float
  keep_examples: int

  def __post_init__(self):
    _check_params(self.lower, self.upper, self.removal_probability, self.keep_examples)

  def as_dict(self) -> collections.OrderedDict:
    return collections.OrderedDict(dataclasses.asdict(self))


class UnbalancedSizes(collections.namedtuple('UnbalancedSizes', ['kept_mask', 'new_sizes'])):
  """Result of `unbalance_client_sizes`.

  Attributes:
    kept_mask: ``bool[N]``, ``False`` for removed clients.
    new_sizes: ``int64[N]`` examples each client keeps (0 if removed).
  """


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_params(lower: Any, upper: Any, removal_probability: Any, keep_examples: Any) -> None:
  if not _is_int(lower) or lower < 0:
    raise ValueError(f'lower must be an integer >= 0, got {lower!r}.')
  if not _is_int(upper) or upper < lower:
    raise ValueError(f'upper must be an integer >= lower ({lower}), got {upper!r}.')
  if (
    isinstance(removal_probability, bool)
    or not isinstance(removal_probability, numbers.Real)
    or not 0.0 <= removal_probability <= 1.0
  ):
    raise ValueError(f'removal_probability must be in [0, 1], got {removal_probability!r}.')
  if not _is_int(keep_examples) or keep_examples < 1:
    raise ValueError(f'keep_examples must be an integer >= 1, got {keep_examples!r}.')


def _check_sizes(client_sizes: Any) -> np.ndarray:
  sizes = np.asarray(client_sizes)
  if sizes.ndim != 1 or not (np.issubdtype(sizes.dtype, np.integer) or sizes.size == 0):
    raise ValueError(
      f'client_sizes must be a 1-D integer array, got dtype {sizes.dtype} and shape {sizes.shape}.'
    )
  if sizes.size and sizes.min() < 0:
    raise ValueError(f'client_sizes must be >= 0, got a minimum of {sizes.min()}.')
  return sizes.astype(np.int64)


def unbalance_client_sizes(
  client_sizes: Sequence[int] | np.ndarray,
  *,
  lower: int,
  upper: int,
  removal_probability: float,
  keep_examples: int,
  seed: int,
) -> UnbalancedSizes:
  """Applies the unbalancing procedure to client sizes.

  Args:
    client_sizes: ``int[N]`` examples per client.
    lower: Smallest affected size (inclusive).
    upper: Largest affected size (inclusive).
    removal_probability: Probability that an affected client is removed.
    keep_examples: Examples an affected, surviving client keeps.
    seed: Seed of the removal decisions (``default_rng([seed, 0])``).

  Returns:
    `UnbalancedSizes` ``(kept_mask, new_sizes)``.

  Raises:
    ValueError: For sizes that are not a 1-D non-negative integer array, or
      invalid parameters.
  """
  sizes = _check_sizes(client_sizes)
  _check_params(lower, upper, removal_probability, keep_examples)
  uniforms = np.random.default_rng([seed, _DECISION_STREAM]).random(sizes.size)
  return _unbalance_with_uniforms(
    sizes,
    uniforms,
    lower=lower,
    upper=upper,
    removal_probability=removal_probability,
    keep_examples=keep_examples,
  )


def _unbalance_with_uniforms(
  sizes: np.ndarray,
  uniforms: np.ndarray,
  *,
  lower: int,
  upper: int,
  removal_probability: float,
  keep_examples: int,
) -> UnbalancedSizes:
  """The procedure given each client's uniform (removed iff ``u < p``)."""
  affected = (sizes >= lower) & (sizes <= upper)
  removed = affected & (uniforms < removal_probability)
  new_sizes = np.where(affected, np.minimum(sizes, keep_examples), sizes)
  new_sizes = np.where(removed, 0, new_sizes).astype(np.int64)
  return UnbalancedSizes(kept_mask=~removed, new_sizes=new_sizes)


def select_kept_examples(
  num_examples: int, num_kept: int, *, seed: int, client_index: int
) -> np.ndarray:
  """The sorted indices of the examples a client keeps.

  Args:
    num_examples: The client's original number of examples.
    num_kept: How many it keeps (``new_sizes[client_index]``).
    seed: The procedure's seed.
    client_index: The client's position in the original client order.

  Returns:
    ``int64[num_kept]`` sorted distinct indices in ``[0, num_examples)``,
    drawn without replacement by ``default_rng([seed, 1, client_index])``
    (all indices, without a draw, when ``num_kept == num_examples``).
  """
  if not 0 <= num_kept <= num_examples:
    raise ValueError(f'num_kept must be in [0, num_examples={num_examples}], got {num_kept!r}.')
  if num_kept == num_examples:
    return np.arange(num_examples, dtype=np.int64)
  rng = np.random.default_rng([seed, _SELECTION_STREAM, client_index])
  return np.sort(rng.choice(num_examples, size=num_kept, replace=False)).astype(np.int64)


def size_concentration(client_sizes: Sequence[int] | np.ndarray, top_fraction: float) -> float:
  """Share of all examples held by the largest ``top_fraction`` of clients.

  The top group has ``max(1, round(top_fraction * N))`` clients (the
  convention of `tasks.digits.size_concentration`); pass only the clients
  that exist (e.g. ``new_sizes[kept_mask]``), as clients of size 0 count.

  Args:
    client_sizes: Examples per client.
    top_fraction: In ``(0, 1]``.

  Returns:
    The share, in ``[0, 1]``.

  Raises:
    ValueError: For an empty array, no examples, or a bad `top_fraction`.
  """
  sizes = np.asarray(client_sizes, dtype=np.float64)
  if sizes.ndim != 1 or sizes.size == 0 or sizes.sum() <= 0:
    raise ValueError('client_sizes must be a non-empty 1-D array with a positive sum.')
  if not 0.0 < top_fraction <= 1.0:
    raise ValueError(f'top_fraction must be in (0, 1], got {top_fraction!r}.')
  top = max(1, int(round(top_fraction * sizes.size)))
  largest = np.partition(sizes, sizes.size - top)[sizes.size - top :]
  return float(largest.sum() / sizes.sum())


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
  """What `calibrate_on_sizes` found.

  Attributes:
    params: The chosen `UnbalanceParams`.
    mean_share: Concentration averaged over the calibration seeds.
    min_share: Smallest concentration over the seeds.
    max_share: Largest concentration over the seeds.
    mean_clients: Surviving clients, averaged over the seeds.
    unchanged_fraction: Share of the surviving clients that are unchanged
      (outside ``[lower, upper]``), averaged over the seeds.
  """

  params: UnbalanceParams
  mean_share: float
  min_share: float
  max_share: float
  mean_clients: float
  unchanged_fraction: float


def calibrate_on_sizes(
  client_sizes: Sequence[int] | np.ndarray,
  target_top_fraction: float,
  target_share: float,
  *,
  removal_probability: float = 0.5,
  lower: int | None = None,
  keep_candidates: Iterable[int] = range(1, 41),
  upper_candidates: Iterable[int] | None = None,
  seeds: Iterable[int] = range(5),
  share_tolerance: float = 0.005,
) -> CalibrationResult:
  """Parameters whose unbalanced sizes reach a target concentration.

  Fixes `removal_probability` and `lower` (default: the smallest size, so
  every client up to ``upper`` is affected), and grid-searches ``upper``
  (default candidates: the distinct client sizes) and ``keep_examples``. Each
  candidate is scored by its concentration
  ``size_concentration(new_sizes[kept_mask], target_top_fraction)`` averaged
  over `seeds` (common random numbers: the same decisions for every
  candidate). Among the candidates within `share_tolerance` of
  `target_share`, the one whose unchanged clients make up a share of the
  survivors closest to `target_top_fraction` wins (so that "the top 10%" are,
  as far as possible, exactly the untouched writers); ties go to the smaller
  error, then to the larger ``keep_examples``. If none is within tolerance, the
  smallest error wins.

  Args:
    client_sizes: ``int[N]`` examples per client.
    target_top_fraction: Fraction of the surviving clients in the top group.
    target_share: The share of the examples that group should hold.
    removal_probability: The fixed ``p``.
    lower: The fixed ``a`` (``None``: the smallest client size).
    keep_candidates: Values of ``keep_examples`` to try.
    upper_candidates: Values of ``upper`` to try (``None``: every distinct
      size ``>= lower``).
    seeds: Seeds of the procedure to average over.
    share_tolerance: Errors up to this are treated as reaching the target.

  Returns:
    A `CalibrationResult`.
  """
  sizes = _check_sizes(client_sizes)
  if sizes.size == 0:
    raise ValueError('client_sizes must not be empty.')
  if not 0.0 < target_share <= 1.0:
    raise ValueError(f'target_share must be in (0, 1], got {target_share!r}.')
  lower = int(sizes.min()) if lower is None else int(lower)
  uppers = (
    np.unique(sizes[sizes >= lower])
    if upper_candidates is None
    else np.asarray(sorted(set(upper_candidates)), np.int64)
  )
  keeps = sorted(set(keep_candidates))
  seeds = list(seeds)
  uniforms = [np.random.default_rng([s, _DECISION_STREAM]).random(sizes.size) for s in seeds]

  best_key, best = None, None
  for upper, keep in itertools.product(uppers, keeps):
    if upper < lower:
      continue
    params = UnbalanceParams(lower, int(upper), float(removal_probability), int(keep))
    result = _evaluate(sizes, uniforms, params, target_top_fraction)
    if result is None:
      continue
    error = abs(result.mean_share - target_share)
    structure = abs(result.unchanged_fraction - target_top_fraction)
    key = (
      (0, structure, error, -params.keep_examples)
      if error <= share_tolerance
      else (1, error, structure, -params.keep_examples)
    )
    if best_key is None or key < best_key:
      best_key, best = key, result
  if best is None:
    raise ValueError('No candidate parameters leave any example.')
  return best


def _evaluate(
  sizes: np.ndarray, uniforms: Sequence[np.ndarray], params: UnbalanceParams, top_fraction: float
) -> CalibrationResult | None:
  """Statistics of `params` over the seeds' uniforms; ``None`` if a seed
  leaves no example."""
  unchanged = int(np.sum((sizes < params.lower) | (sizes > params.upper)))
  shares, clients = [], []
  for u in uniforms:
    result = _unbalance_with_uniforms(sizes, u, **params.as_dict())
    survivors = result.new_sizes[result.kept_mask]
    if survivors.sum() == 0:
      return None
    shares.append(size_concentration(survivors, top_fraction))
    clients.append(survivors.size)
  return CalibrationResult(
    params=params,
    mean_share=float(np.mean(shares)),
    min_share=float(np.min(shares)),
    max_share=float(np.max(shares)),
    mean_clients=float(np.mean(clients)),
    unchanged_fraction=float(np.mean(unchanged / np.array(clients))),
  )


def unbalance_client_data(
  client_data: tff.simulation.datasets.ClientData,
  client_sizes: Sequence[int] | np.ndarray,
  params: UnbalanceParams,
  seed: int,
) -> tuple[tff.simulation.datasets.ClientData, UnbalancedSizes, dict[str, np.ndarray | None]]:
  """Applies the procedure to a `ClientData` whose client sizes are known.

  Args:
    client_data: The original data; `client_sizes` follows its
      ``client_ids`` order, which also defines the client indices seeding
      the example selection.
    client_sizes: ``int[N]`` examples per client.
    params: The procedure's parameters.
    seed: The procedure's seed.

  Returns:
    ``(unbalanced_client_data, sizes, kept_examples)``: the data of the
    surviving clients (`subset_client_data`), the `UnbalancedSizes` over all
    original clients, and client id -> sorted kept indices (``None`` for an
    unchanged client) for the surviving clients.
  """
  client_ids = list(client_data.client_ids)
  sizes = _check_sizes(client_sizes)
  if sizes.size != len(client_ids):
    raise ValueError(f'client_sizes has {sizes.size} entries for {len(client_ids)} clients.')
  result = unbalance_client_sizes(sizes, seed=seed, **params.as_dict())
  kept_examples = collections.OrderedDict()
  for index in np.flatnonzero(result.kept_mask):
    if result.new_sizes[index] == sizes[index]:
      kept_examples[client_ids[index]] = None
    else:
      kept_examples[client_ids[index]] = select_kept_examples(
        int(sizes[index]), int(result.new_sizes[index]), seed=seed, client_index=int(index)
      )
  if not kept_examples:
    raise ValueError(f'The unbalancing procedure removed every client (params={params}).')
  return subset_client_data(client_data, kept_examples), result, kept_examples


def subset_client_data(
  client_data: tff.simulation.datasets.ClientData, kept_examples: Mapping[str, np.ndarray | None]
) -> tff.simulation.datasets.ClientData:
  """A `ClientData` with some clients, each keeping some of its examples.

  Client ``c`` yields the elements of ``client_data``'s dataset for ``c``
  whose positions (0-based, in the dataset's own order) are in
  ``kept_examples[c]``, in their original order; ``None`` keeps them all.
  The selection is an ``enumerate`` + ``filter``: a shrunk client still reads
  (and, for TFF's SQLite data, parses) every original example once per pass,
  so it costs as much to iterate as the original client. It relies on the
  underlying dataset yielding the same order on every pass (true for TFF's
  ``SqlClientData``: SQLite returns a client's rows in storage order).

  Args:
    client_data: The original data.
    kept_examples: Client id -> sorted example positions, or ``None``; its
      keys (in order) are the new ``client_ids``.

  Returns:
    A `tff.simulation.datasets.ClientData` (eager and traceable).
  """
  client_ids = list(kept_examples)
  unknown = set(client_ids) - set(client_data.client_ids)
  if unknown:
    raise ValueError(f'Unknown client ids: {sorted(unknown)[:5]}.')
  index = {client_id: i for i, client_id in enumerate(client_ids)}
  keep_all = np.array([kept_examples[c] is None for c in client_ids])
  selections = [
    np.zeros(0, np.int64) if kept_examples[c] is None else np.asarray(kept_examples[c], np.int64)
    for c in client_ids
  ]
  offsets = np.concatenate([[0], np.cumsum([len(s) for s in selections])]).astype(np.int64)
  flat = np.concatenate(selections).astype(np.int64) if selections else np.zeros(0, np.int64)
  base_fn = client_data.serializable_dataset_fn

  def select(dataset: tf.data.Dataset, keep: tf.Tensor, kept: tf.Tensor) -> tf.data.Dataset:
    return (
      dataset.enumerate()
      .filter(lambda i, _: tf.logical_or(keep, tf.reduce_any(tf.equal(i, kept))))
      .map(lambda _, x: x)
    )

  def dataset_fn(client_id) -> tf.data.Dataset:
    if isinstance(client_id, str):
      # Eager use (create_tf_dataset_for_client).
      position = index[client_id]
      dataset = client_data.create_tf_dataset_for_client(client_id)
      if keep_all[position]:
        return dataset
      return select(
        dataset, tf.constant(False), tf.constant(flat[offsets[position] : offsets[position + 1]])
      )
    # Traced use: look the client up in constants created in the tracing graph.
    matches = tf.equal(client_id, tf.constant(client_ids))
    with tf.control_dependencies(
      [tf.debugging.Assert(tf.reduce_any(matches), ['Unknown client id:', client_id])]
    ):
      position = tf.argmax(tf.cast(matches, tf.int32))
    bounds = tf.constant(offsets)
    kept = tf.constant(flat)[bounds[position] : bounds[position + 1]]
    return select(base_fn(client_id), tf.constant(keep_all)[position], kept)

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(client_ids, dataset_fn)
