"""The `emnist_skewed` task: the real FEMNIST writers' training examples pooled and dealt by
label to equal clients (Dirichlet proportions, one label or two labels per client), as
Fraboni et al., LEFL and FedGS split their datasets; evaluation on the writers' test split."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools
from typing import Any

import numpy as np
import tensorflow as tf

from tasks import _common
from tasks import digits
from tasks import emnist
from tasks import models
from tasks import tff_cache
from tff_sampling.task import Task

SKEWED_PARTITIONS = ('dirichlet', 'shards', 'two_labels')


SKEWED_MODELS = (*emnist.MODELS, 'ffnn')


SKEWED_MIN_SIZE = 10  # Smallest client of a log-normal size draw (`size_sigma`).


def _pooled_examples(
  database: str, split: str, client_ids: Sequence[str], num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
  """Every example of a split, ``(pixels float32[M, 28, 28, 1], labels int32[M])``,
  in storage order (read straight from the SQLite rows: one parse per chunk)."""
  pixels, labels = [], []
  for _, protos in tff_cache.sql_split_chunks(database, split, client_ids, rowid_order=True):
    parsed = tf.io.parse_example(
      tf.constant(protos, tf.string),
      {
        'pixels': tf.io.FixedLenFeature([28, 28], tf.float32),
        'label': tf.io.FixedLenFeature([], tf.int64),
      },
    )
    pixels.append(parsed['pixels'].numpy()[..., np.newaxis])
    labels.append(parsed['label'].numpy().astype(np.int32))
  labels_array = np.concatenate(labels) if labels else np.zeros(0, np.int32)
  _common.check_label_range(labels_array, 'label', num_classes)
  return np.concatenate(pixels), labels_array


def create_emnist_skewed_task(
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  cache_dir: str | None = None,
  only_digits: bool = False,
  max_eval_examples: int | None = 10_000,
  model: str = 'cnn',
  num_clients: int = 100,
  partition: str = 'dirichlet',
  dirichlet_alpha: float | None = None,
  size_group_clients: Sequence[int] | None = None,
  size_group_examples: Sequence[int] | None = None,
  size_sigma: float | None = None,
) -> Task:
  """Builds ``emnist_skewed``: real FEMNIST examples re-split into label-skewed clients.

  The training examples of every writer in the cache are pooled and dealt to
  `num_clients` clients of equal size (``M // num_clients``, the remainder to
  the first clients) by label, as Fraboni et al., LEFL and FedGS split their
  datasets: ``'dirichlet'`` (each client's label proportions drawn from
  ``Dirichlet(dirichlet_alpha · 1)``, `tasks.digits.dirichlet_partition`),
  ``'shards'`` (one label per client) or ``'two_labels'`` (two). The images
  and labels are real; only the client boundaries are made. Evaluation is the
  writers' test split, as in ``emnist``. The whole pool is held in memory
  (3 KB per example: 45 MB for the 105-writer slice, 2 GB for TFF's 3,400).

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size,
      cache_dir, only_digits, max_eval_examples: As ``emnist``'s.
    seed: Seed of the partition and of the evaluation writers' order.
    model: ``'cnn'``, ``'2nn'`` or ``'ffnn'`` (784-128-classes, LEFL's).
    num_clients: Number of clients.
    partition: ``'dirichlet'``, ``'shards'`` or ``'two_labels'``.
    dirichlet_alpha: The concentration, for ``'dirichlet'`` only (default 0.1).
    size_group_clients, size_group_examples: For ``'dirichlet'``: unequal client
      sizes as groups (``size_group_clients[g]`` clients of
      ``size_group_examples[g]`` examples, as ``cifar10``'s size profile), drawn
      from a seeded random subset of the pool of that total. E.g. Fraboni et
      al.'s 10/30/30/20/10 clients with sizes in ratio 1 : 2.5 : 5 : 7.5 : 10 is
      ``(10, 30, 30, 20, 10)`` × ``(25, 62, 125, 187, 250)`` on the 105-writer
      slice (12,100 of its 14,708 examples). Both or neither; `num_clients`
      must then equal their clients.
    size_sigma: For ``'dirichlet'``: client sizes ``~ LogNormal(0, size_sigma)``
      over the whole pool (`tasks.digits.lognormal_sizes`, at least
      `SKEWED_MIN_SIZE` examples each) instead of equal sizes; not with a size
      profile.

  Returns:
    The `Task`; training batches ``OrderedDict(x=float32[B, 28, 28, 1], y=int32[B])``.

  Raises:
    FileNotFoundError: If the database is not in `cache_dir`.
    ValueError: For an invalid option, or a partition the data cannot give.
  """
  options = emnist.check_options(
    client_batch_size=client_batch_size,
    client_epochs=client_epochs,
    max_client_examples=max_client_examples,
    seed=seed,
    eval_batch_size=eval_batch_size,
    cache_dir=cache_dir,
    only_digits=only_digits,
    max_eval_examples=max_eval_examples,
    model=model if model != 'ffnn' else 'cnn',
  )
  options['model'] = _common.check_choice('model', model, SKEWED_MODELS)
  partition = _common.check_choice('partition', partition, SKEWED_PARTITIONS)
  if partition != 'dirichlet' and dirichlet_alpha is not None:
    raise ValueError(
      f'dirichlet_alpha applies to partition=dirichlet only, got {dirichlet_alpha!r} with '
      f'partition={partition!r}; leave it unset.'
    )
  options.update(
    num_clients=_common.check_int('num_clients', num_clients),
    partition=partition,
    dirichlet_alpha=None
    if partition != 'dirichlet'
    else _common.check_float(
      'dirichlet_alpha', 0.1 if dirichlet_alpha is None else dirichlet_alpha
    ),
  )
  profile = _check_size_profile(options, size_group_clients, size_group_examples)
  if size_sigma is not None and (partition != 'dirichlet' or profile is not None):
    raise ValueError(
      f'size_sigma={size_sigma!r} applies to partition=dirichlet without size groups; '
      'leave it unset.'
    )
  options['size_sigma'] = (
    None if size_sigma is None else _common.check_float('size_sigma', size_sigma)
  )
  database, train_data, test_data, num_classes, split = emnist.load_splits(options)
  pixels, labels = _pooled_examples(database, split, tuple(train_data.client_ids), num_classes)
  if options['num_clients'] > labels.size:
    raise ValueError(
      f'num_clients={num_clients} exceeds the {labels.size} pooled examples; use fewer clients.'
    )
  rng = np.random.default_rng([options['seed'], 2])
  if profile is not None:
    if profile.sum() > labels.size:
      raise ValueError(
        f'The size profile needs {profile.sum()} training examples, the pool has '
        f'{labels.size}; reduce size_group_clients or size_group_examples.'
      )
    subset = np.sort(rng.choice(labels.size, int(profile.sum()), replace=False))
    pixels, labels = pixels[subset], labels[subset]
  if partition == 'dirichlet':
    if profile is not None:
      sizes = profile
    elif options['size_sigma'] is not None:
      sizes = digits.lognormal_sizes(
        labels.size, options['num_clients'], options['size_sigma'], SKEWED_MIN_SIZE, rng
      )
    else:
      sizes = np.full(options['num_clients'], labels.size // options['num_clients'], np.int64)
      sizes[: labels.size % options['num_clients']] += 1
    members = digits.dirichlet_partition(
      labels, sizes, options['dirichlet_alpha'], rng, num_classes
    )
  else:
    split_fn = digits.shard_partition if partition == 'shards' else digits.label_pair_partition
    members = split_fn(labels, options['num_clients'], rng, num_classes)
    sizes = np.array([len(m) for m in members], np.int64)
  order = np.concatenate(members)
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  width = len(str(len(sizes) - 1))
  client_ids = tuple(f'client_{i:0{width}d}' for i in range(len(sizes)))
  train = collections.OrderedDict(x=pixels[order], y=labels[order])
  model_fn = (
    functools.partial(models.image_ffnn, num_classes, hidden=(128,))
    if options['model'] == 'ffnn'
    else functools.partial(emnist.MODEL_FNS[options['model']], num_classes)
  )
  return _common.make_task(
    'emnist_skewed',
    options,
    _common.in_memory_client_data(client_ids, train, offsets),
    _common.centralized_eval_data(test_data, options),
    preprocess_client=_common.client_preprocess(
      options,
      shuffle_buffer_size=int(sizes.max()),
      batches=functools.partial(_common.batch, batch_size=options['client_batch_size']),
    ),
    preprocess_eval=emnist.tff_batch_and_reshape(options['eval_batch_size']),
    keras_model_fn=model_fn,
    statistics=(sizes, _common.label_histograms(train['y'], offsets, num_classes)),
    num_classes=num_classes,
  )


def _check_size_profile(
  options: dict[str, Any], group_clients: Any, group_examples: Any
) -> np.ndarray | None:
  """Records the size-profile options; returns the client sizes, or None for equal sizes."""
  options.update(size_group_clients=None, size_group_examples=None)
  if group_clients is None and group_examples is None:
    return None
  if group_clients is None or group_examples is None:
    raise ValueError('Give both size_group_clients and size_group_examples, or neither.')
  if options['partition'] != 'dirichlet':
    raise ValueError(
      f"A size profile applies to partition='dirichlet' only, got {options['partition']!r}."
    )
  clients = _common.check_int_tuple('size_group_clients', group_clients)
  examples = _common.check_int_tuple('size_group_examples', group_examples)
  if len(clients) != len(examples):
    raise ValueError(
      f'size_group_clients {clients} and size_group_examples {examples} must have the same length.'
    )
  if sum(clients) != options['num_clients']:
    raise ValueError(
      f'size_group_clients {clients} give {sum(clients)} clients, '
      f'num_clients is {options["num_clients"]}; make them agree.'
    )
  options.update(size_group_clients=clients, size_group_examples=examples)
  return np.repeat(np.asarray(examples, np.int64), np.asarray(clients, np.int64))
