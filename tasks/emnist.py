"""The `emnist` task (FEMNIST writers through TFF's loader and cache) and the unbalanced sets
`emnist_unbalanced_1/2/3` (`tasks.unbalance` on its training clients, with calibrated
presets `UNBALANCED_PRESETS`). Data, preprocessing, evaluation split, in-memory clients and the
presets' calibration: ``docs/tasks.md``."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import functools
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines import client_spec
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing

from tasks import _common
from tasks import models
from tasks import tff_cache
from tasks import unbalance
from tff_sampling.task import Task

DATABASE_FILE = 'emnist_all.sqlite'
MODELS = ('cnn', '2nn')
MODEL_FNS = {'cnn': models.mcmahan_cnn, '2nn': models.mcmahan_2nn}
# TFF's default shuffle buffer for EMNIST clients (their largest size).
_SHUFFLE_BUFFER_SIZE = emnist_preprocessing.MAX_CLIENT_DATASET_SIZE

# Unbalanced set -> (top fraction of clients, share of the examples they hold).
UNBALANCED_TARGETS = collections.OrderedDict([(1, (0.1, 0.82)), (2, (0.2, 0.90)), (3, (0.5, 0.98))])
# (set, only_digits) -> parameters calibrated on `femnist_standin_client_sizes`.
UNBALANCED_PRESETS = {
  (1, True): unbalance.UnbalanceParams(1, 167, 0.5, 3),
  (2, True): unbalance.UnbalanceParams(1, 148, 0.5, 2),
  (3, True): unbalance.UnbalanceParams(1, 114, 0.5, 3),
  (1, False): unbalance.UnbalanceParams(1, 332, 0.5, 9),
  (2, False): unbalance.UnbalanceParams(1, 294, 0.5, 9),
  (3, False): unbalance.UnbalanceParams(1, 223, 0.5, 5),
}
# Calibration settings of the presets (see the module docstring).
CALIBRATION_REMOVAL_PROBABILITY = 0.5
CALIBRATION_LOWER = 1

# Known facts the stand-in size distribution is built from.
_TFF_CLIENTS = {True: 3_383, False: 3_400}
_TFF_TRAIN_EXAMPLES = {True: 341_873, False: 671_585}
# A training split up to this size (the LEAF slices) is held in memory (0.3 GB at most);
# TFF's whole FEMNIST stays in SQLite, read per client and round.
IN_MEMORY_MAX_EXAMPLES = 100_000
_LEAF_FEMNIST_CV = 88.94 / 226.83  # LEAF (Caldas et al., 2018), Table 1: std / mean.


def tff_batch_and_reshape(batch_size: int):
  """TFF's baseline EMNIST preprocessing, reduced to batch + reshape.

  Shuffling and repetition are ours (seeded). TFF's ``debug_seed`` is set only
  because it also makes TFF's parallel ``map`` keep element order
  (``deterministic=True``); with shuffling off it seeds nothing.
  """
  tff_fn = emnist_preprocessing.create_preprocess_fn(
    client_spec.ClientSpec(num_epochs=1, batch_size=batch_size, shuffle_buffer_size=1),
    emnist_task='character_recognition',
    debug_seed=0,
  )
  return lambda dataset: tff_fn(dataset).map(_common.as_xy)


def check_options(
  cache_dir: Any, only_digits: Any, max_eval_examples: Any, model: Any
) -> dict[str, Any]:
  """The options of ``emnist`` after the common ones, checked."""
  return collections.OrderedDict(
    cache_dir=_common.check_optional_path('cache_dir', cache_dir),
    only_digits=_common.check_bool('only_digits', only_digits),
    max_eval_examples=_common.check_optional_int('max_eval_examples', max_eval_examples),
    model=_common.check_choice('model', model, MODELS),
  )


def load_splits(options: dict[str, Any]):
  """``(database_path, train_data, test_data, num_classes, train_split)``."""
  database, train_data, test_data = tff_cache.load_tff_data(
    'emnist', DATABASE_FILE, options['cache_dir'], only_digits=options['only_digits']
  )
  num_classes = 10 if options['only_digits'] else 62
  split = 'digits_only_train' if options['only_digits'] else 'all_train'
  if tff_cache.count_split_rows(database, split) <= IN_MEMORY_MAX_EXAMPLES:
    train_data = _in_memory_training_clients(database, split, train_data, num_classes)
  return database, train_data, test_data, num_classes, split


def read_split_examples(
  database: str, split: str, client_ids: Sequence[str], num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Every example of a split in storage order, read straight from the SQLite rows.

  One parse per chunk of rows. Returns ``(owners, pixels float32[M, 28, 28],
  labels int32[M])``, ``owners`` the rows' positions in `client_ids`.
  """
  owners, pixels, labels = [], [], []
  for chunk_owners, protos in tff_cache.sql_split_chunks(
    database, split, client_ids, rowid_order=True
  ):
    parsed = tf.io.parse_example(
      tf.constant(protos, tf.string),
      {
        'pixels': tf.io.FixedLenFeature([28, 28], tf.float32),
        'label': tf.io.FixedLenFeature([], tf.int64),
      },
    )
    owners.append(chunk_owners)
    pixels.append(parsed['pixels'].numpy())
    labels.append(parsed['label'].numpy().astype(np.int32))
  owners = np.concatenate(owners)
  labels = np.concatenate(labels)
  _common.check_label_range(labels, 'label', num_classes)
  return owners, np.concatenate(pixels), labels


def _in_memory_training_clients(
  database: str, split: str, train_data: tff.simulation.datasets.ClientData, num_classes: int
) -> tff.simulation.datasets.ClientData:
  """`train_data` (TFF's SQL-backed clients) held in memory: the same clients, elements,
  element structure and order, without an SQLite query and a parse per client and round."""
  client_ids = tuple(train_data.client_ids)
  owner, pixels, labels = read_split_examples(database, split, client_ids, num_classes)
  by_client = np.argsort(owner, kind='stable')  # Each client's rows keep their storage order.
  offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=len(client_ids)))])
  return _common.in_memory_client_data(
    client_ids,
    collections.OrderedDict(label=labels[by_client], pixels=pixels[by_client]),
    offsets.astype(np.int64),
  )


def _build_task(
  name: str,
  options: dict[str, Any],
  train_data: tff.simulation.datasets.ClientData,
  test_data: tff.simulation.datasets.ClientData,
  num_classes: int,
  statistics: tuple[np.ndarray, np.ndarray],
) -> Task:
  return _common.make_task(
    name,
    options,
    train_data,
    _common.centralized_eval_data(test_data, options),
    preprocess_client=_common.client_preprocess(
      options,
      shuffle_buffer_size=_SHUFFLE_BUFFER_SIZE,
      batches=tff_batch_and_reshape(options['client_batch_size']),
    ),
    preprocess_eval=tff_batch_and_reshape(options['eval_batch_size']),
    keras_model_fn=functools.partial(MODEL_FNS[options['model']], num_classes),
    statistics=statistics,
    num_classes=num_classes,
  )


def create_emnist_task(
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  cache_dir: str | None = None,
  only_digits: bool = True,
  max_eval_examples: int | None = 10_000,
  model: str = 'cnn',
) -> Task:
  """Builds the ``emnist`` task.

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`).
    seed: Seed of the evaluation writers' order.
    cache_dir: Directory holding ``emnist_all.sqlite`` (``None``: ``~/.tff``).
    only_digits: ``True``: 10 digit classes; ``False``: all 62 classes.
    max_eval_examples: Cap on evaluation examples (``None``: the whole test
      split, 40,832 or 77,483 examples).
    model: ``'cnn'`` or ``'2nn'`` (module docstring).

  Returns:
    The `Task`. Raw elements are TFF's ``OrderedDict(label=int32[],
    pixels=float32[28, 28])``; training batches
    ``OrderedDict(x=float32[B, 28, 28, 1], y=int32[B])``.

  Raises:
    FileNotFoundError: If the database is not in `cache_dir`.
    ValueError: For an invalid option, or a database file that is not in TFF's
      format (empty, not SQLite, missing tables).
  """
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  options.update(check_options(cache_dir, only_digits, max_eval_examples, model))
  database, train_data, test_data, num_classes, split = load_splits(options)
  statistics = tff_cache.scan_sql_split(
    database,
    split,
    tuple(train_data.client_ids),
    _common.one_hot_label_statistics('label', num_classes),
    num_classes,
  )
  return _build_task('emnist', options, train_data, test_data, num_classes, statistics)


# --------------------------------------------------------------------------
# Unbalanced FEMNIST.


def femnist_standin_client_sizes(only_digits: bool) -> np.ndarray:
  """A stand-in for the training-client sizes of TFF's FEMNIST.

  ``N`` sizes (3,383 for digits, 3,400 for all classes): the mid-point
  quantiles ``F^-1((i + 0.5) / N)`` of a Gamma distribution with coefficient
  of variation 88.94 / 226.83 (LEAF's per-writer std / mean for FEMNIST)
  truncated to ``[0, largest]`` (``largest`` = 418, TFF's largest EMNIST
  client; 213 = 418 * 341,873 / 671,585 for digits, an assumption), its
  scale solved so that the quantiles' mean is TFF's mean, then rounded
  (largest remainder) to sum exactly to TFF's total (341,873 or 671,585)
  and clipped to ``[1, largest]``. Deterministic; ascending order.

  Args:
    only_digits: Which FEMNIST variant.

  Returns:
    ``int64[N]`` client sizes.
  """
  only_digits = _common.check_bool('only_digits', only_digits)
  num_clients = _TFF_CLIENTS[only_digits]
  total = _TFF_TRAIN_EXAMPLES[only_digits]
  largest = (
    emnist_preprocessing.MAX_CLIENT_DATASET_SIZE
    if not only_digits
    else round(emnist_preprocessing.MAX_CLIENT_DATASET_SIZE * total / _TFF_TRAIN_EXAMPLES[False])
  )
  shape = _LEAF_FEMNIST_CV**-2
  levels = (np.arange(num_clients) + 0.5) / num_clients

  def quantiles(scale: float) -> np.ndarray:
    mass = scipy.stats.gamma.cdf(largest, shape, scale=scale)
    return scipy.stats.gamma.ppf(levels * mass, shape, scale=scale)

  scale = scipy.optimize.brentq(
    lambda s: quantiles(s).mean() - total / num_clients, 1e-3, 1e4, xtol=1e-9
  )
  exact = quantiles(scale) * total / quantiles(scale).sum()
  sizes = np.floor(exact).astype(np.int64)
  order = np.argsort(-(exact - sizes), kind='stable')
  sizes[order[: total - sizes.sum()]] += 1
  return np.clip(sizes, 1, largest)


def _scan_client_labels(
  database_path: str,
  split_name: str,
  client_ids: Sequence[str],
  num_classes: int,
  *,
  chunk_size: int = 20_000,
) -> dict[str, np.ndarray]:
  """Client id -> its labels in the storage (rowid) order of its rows, for `client_ids` in order.

  One pass over the split, like `tff_cache.scan_sql_split`, but keeping each
  row's label so that the labels of any subset of a client's examples can be
  counted. TFF's ``SqlClientData`` query (``WHERE client_id = ... and
  split_name = ...``, no ``ORDER BY``) returns a client's rows in the same
  rowid order (a table scan, or an index whose ties are broken by rowid).
  """
  owners, labels = [], []
  for chunk_owners, protos in tff_cache.sql_split_chunks(
    database_path, split_name, client_ids, chunk_size=chunk_size, rowid_order=True
  ):
    owners.append(chunk_owners)
    labels.append(tff_cache.parse_int_feature(protos, 'label'))
  owners = np.concatenate(owners) if owners else np.zeros(0, np.int64)
  labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
  _common.check_label_range(labels, 'label', num_classes)
  order = np.argsort(owners, kind='stable')
  bounds = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=len(client_ids)))])
  grouped = labels[order]
  return collections.OrderedDict(
    (client_id, grouped[bounds[i] : bounds[i + 1]]) for i, client_id in enumerate(client_ids)
  )


def _check_unbalanced_set(unbalanced_set: Any) -> None:
  """Raises a ValueError unless `unbalanced_set` is one of `UNBALANCED_TARGETS`."""
  if unbalanced_set not in UNBALANCED_TARGETS:
    raise ValueError(
      f'unbalanced_set must be one of {list(UNBALANCED_TARGETS)}, got {unbalanced_set!r}.'
    )


def _check_unbalance_options(
  unbalanced_set: int,
  only_digits: bool,
  *,
  unbalance_seed: Any,
  unbalance_lower: Any,
  unbalance_upper: Any,
  unbalance_removal_probability: Any,
  unbalance_keep_examples: Any,
  unbalance_calibrate: Any,
) -> dict[str, Any]:
  """Resolved unbalancing options (preset values fill the ``None`` ones)."""
  explicit = collections.OrderedDict(
    lower=_common.check_optional_int('unbalance_lower', unbalance_lower, minimum=0),
    upper=_common.check_optional_int('unbalance_upper', unbalance_upper, minimum=0),
    removal_probability=None
    if unbalance_removal_probability is None
    else _common.check_float(
      'unbalance_removal_probability',
      unbalance_removal_probability,
      minimum=0.0,
      maximum=1.0,
      min_inclusive=True,
    ),
    keep_examples=_common.check_optional_int('unbalance_keep_examples', unbalance_keep_examples),
  )
  calibrate = _common.check_bool('unbalance_calibrate', unbalance_calibrate)
  given = [f'unbalance_{k}' for k, v in explicit.items() if v is not None]
  if calibrate and given:
    raise ValueError(
      f'unbalance_calibrate=True chooses the parameters itself; do not also set {", ".join(given)}.'
    )
  preset = UNBALANCED_PRESETS[(unbalanced_set, only_digits)].as_dict()
  params = collections.OrderedDict((k, preset[k] if v is None else v) for k, v in explicit.items())
  try:
    unbalance.UnbalanceParams(**params)
  except ValueError as error:
    raise ValueError(f'unbalance_{error}') from error
  return collections.OrderedDict(
    unbalance_seed=_common.check_int(
      'unbalance_seed', unbalance_seed, minimum=0, maximum=2**32 - 1
    ),
    **{f'unbalance_{k}': v for k, v in params.items()},
    unbalance_calibrate=calibrate,
  )


def _unbalance_params(
  unbalanced_set: int, options: dict[str, Any], sizes: np.ndarray
) -> unbalance.UnbalanceParams:
  """The parameters of the options, or calibrated on `sizes` (then recorded in `options`)."""
  if not options['unbalance_calibrate']:
    return unbalance.UnbalanceParams(
      options['unbalance_lower'],
      options['unbalance_upper'],
      options['unbalance_removal_probability'],
      options['unbalance_keep_examples'],
    )
  top_fraction, share = UNBALANCED_TARGETS[unbalanced_set]
  params = unbalance.calibrate_on_sizes(
    sizes,
    top_fraction,
    share,
    removal_probability=CALIBRATION_REMOVAL_PROBABILITY,
    lower=CALIBRATION_LOWER,
  ).params
  options.update((f'unbalance_{k}', v) for k, v in params.as_dict().items())
  return params


def _kept_statistics(
  client_labels: dict[str, np.ndarray],
  kept_examples: dict[str, np.ndarray | None],
  num_classes: int,
) -> tuple[np.ndarray, np.ndarray]:
  """``(num_examples, label_histograms)`` of the survivors' `kept_examples` (positions in
  their `client_labels`; ``None``: all), in `kept_examples`' order."""
  kept_labels = [
    client_labels[client_id] if kept is None else client_labels[client_id][kept]
    for client_id, kept in kept_examples.items()
  ]
  num_examples = np.array([len(labels) for labels in kept_labels], np.int64)
  histograms = np.stack([np.bincount(labels, minlength=num_classes) for labels in kept_labels])
  return num_examples, histograms.astype(np.int64)


def create_emnist_unbalanced_task(
  unbalanced_set: int,
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  cache_dir: str | None = None,
  only_digits: bool = True,
  max_eval_examples: int | None = 10_000,
  model: str = 'cnn',
  unbalance_seed: int = 0,
  unbalance_lower: int | None = None,
  unbalance_upper: int | None = None,
  unbalance_removal_probability: float | None = None,
  unbalance_keep_examples: int | None = None,
  unbalance_calibrate: bool = False,
) -> Task:
  """Builds ``emnist_unbalanced_<unbalanced_set>`` (see the module docstring).

  Args:
    unbalanced_set: 1, 2 or 3 (`UNBALANCED_TARGETS`).
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size,
      cache_dir, only_digits, max_eval_examples, model: As for ``emnist``;
      `only_digits` also selects the preset.
    unbalance_seed: Seed of the removals and of the kept examples.
    unbalance_lower: Smallest affected client size (``None``: the preset's).
    unbalance_upper: Largest affected client size (``None``: the preset's).
    unbalance_removal_probability: Probability that an affected client is
      removed (``None``: the preset's).
    unbalance_keep_examples: Examples an affected surviving client keeps
      (``None``: the preset's).
    unbalance_calibrate: Calibrate the parameters on the real training sizes
      for this set's target instead of using the preset (removal probability
      0.5, lower 1, seeds 0-4; `tasks.unbalance.calibrate_on_sizes`).

  Returns:
    The `Task`, whose ``client_ids``, ``client_num_examples`` and
    ``client_label_histograms`` describe the surviving clients and their kept
    examples, in TFF's client order; ``train_data`` yields only those. The
    options hold the parameters actually used.

  Raises:
    ValueError: For an invalid option (checked before any data is read), or a
      database file that is not in TFF's format (empty, not SQLite, missing tables).
    FileNotFoundError: If the database is not in `cache_dir`.
  """
  _check_unbalanced_set(unbalanced_set)
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  options.update(check_options(cache_dir, only_digits, max_eval_examples, model))
  options.update(
    _check_unbalance_options(
      unbalanced_set,
      options['only_digits'],
      unbalance_seed=unbalance_seed,
      unbalance_lower=unbalance_lower,
      unbalance_upper=unbalance_upper,
      unbalance_removal_probability=unbalance_removal_probability,
      unbalance_keep_examples=unbalance_keep_examples,
      unbalance_calibrate=unbalance_calibrate,
    )
  )
  database, train_data, test_data, num_classes, split = load_splits(options)
  client_labels = _scan_client_labels(database, split, list(train_data.client_ids), num_classes)
  sizes = np.array([len(labels) for labels in client_labels.values()], np.int64)
  params = _unbalance_params(unbalanced_set, options, sizes)
  unbalanced_data, _, kept_examples = unbalance.unbalance_client_data(
    train_data, sizes, params, options['unbalance_seed']
  )
  return _build_task(
    f'emnist_unbalanced_{unbalanced_set}',
    options,
    unbalanced_data,
    test_data,
    num_classes,
    _kept_statistics(client_labels, kept_examples, num_classes),
  )


def unbalanced_task_constructor(unbalanced_set: int) -> Callable[..., Task]:
  """The registry constructor of ``emnist_unbalanced_<unbalanced_set>``."""
  _check_unbalanced_set(unbalanced_set)
  return functools.partial(create_emnist_unbalanced_task, unbalanced_set)
