"""The `emnist_skewed` task: the real FEMNIST writers' training examples pooled and dealt by
label to equal clients (Dirichlet proportions, one label or two labels per client), as
Fraboni et al., LEFL and FedGS split their datasets; evaluation on the writers' test split."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools
from typing import Any

import numpy as np

from tasks import _common
from tasks import cifar10
from tasks import digits
from tasks import emnist
from tasks import models
from tff_sampling.task import Task

SKEWED_PARTITIONS = ('dirichlet', 'shards', 'two_labels')
SKEWED_MODELS = (*emnist.MODELS, 'ffnn')
SKEWED_MIN_SIZE = 10  # Smallest client of a log-normal size draw (`size_sigma`).


def _check_partition(
  model: Any, num_clients: Any, partition: Any, dirichlet_alpha: Any
) -> dict[str, Any]:
  """The model and partition options, checked (alpha 0.1 by default for ``'dirichlet'``)."""
  model = _common.check_choice('model', model, SKEWED_MODELS)
  partition = _common.check_choice('partition', partition, SKEWED_PARTITIONS)
  if partition != 'dirichlet' and dirichlet_alpha is not None:
    raise ValueError(
      f'dirichlet_alpha applies to partition=dirichlet only, got {dirichlet_alpha!r} with '
      f'partition={partition!r}; leave it unset.'
    )
  return collections.OrderedDict(
    model=model,
    num_clients=_common.check_int('num_clients', num_clients),
    partition=partition,
    dirichlet_alpha=None
    if partition != 'dirichlet'
    else _common.check_float(
      'dirichlet_alpha', 0.1 if dirichlet_alpha is None else dirichlet_alpha
    ),
  )


def _check_sizes(
  options: dict[str, Any], group_clients: Any, group_examples: Any, size_sigma: Any
) -> np.ndarray | None:
  """Records the client-size options; returns the size profile's sizes, or None."""
  profile = _check_size_profile(options, group_clients, group_examples)
  if size_sigma is not None and (options['partition'] != 'dirichlet' or profile is not None):
    raise ValueError(
      f'size_sigma={size_sigma!r} applies to partition=dirichlet without size groups; '
      'leave it unset.'
    )
  options['size_sigma'] = (
    None if size_sigma is None else _common.check_float('size_sigma', size_sigma)
  )
  return profile


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
  return cifar10.profile_sizes(clients, examples)


def _deal_to_clients(
  pixels: np.ndarray,
  labels: np.ndarray,
  options: dict[str, Any],
  profile: np.ndarray | None,
  num_classes: int,
) -> tuple[collections.OrderedDict, np.ndarray]:
  """``(train, sizes)``: the clients' ``{x, y}`` examples in client order, dealt from the pool
  (with a size `profile`, from a seeded random subset of its total) by the partition."""
  num_clients = options['num_clients']
  if num_clients > labels.size:
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
  if options['partition'] != 'dirichlet':
    shards = options['partition'] == 'shards'
    split_fn = digits.shard_partition if shards else digits.label_pair_partition
    members = split_fn(labels, num_clients, rng, num_classes)
    sizes = np.array([len(m) for m in members], np.int64)
  else:
    if profile is not None:
      sizes = profile
    elif options['size_sigma'] is not None:
      sizes = digits.lognormal_sizes(
        labels.size, num_clients, options['size_sigma'], SKEWED_MIN_SIZE, rng
      )
    else:
      sizes = np.full(num_clients, labels.size // num_clients, np.int64)
      sizes[: labels.size % num_clients] += 1
    members = digits.dirichlet_partition(
      labels, sizes, options['dirichlet_alpha'], rng, num_classes
    )
  order = np.concatenate(members)
  return collections.OrderedDict(x=pixels[order], y=labels[order]), sizes


def _model_fn(model: str, num_classes: int):
  """The task's `keras_model_fn`: LEFL's 784-128-classes FFNN or an ``emnist`` model."""
  if model == 'ffnn':
    return functools.partial(models.image_ffnn, num_classes, hidden=(128,))
  return functools.partial(emnist.MODEL_FNS[model], num_classes)


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
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  # ``emnist``'s checks, its CNN standing in for the FFNN only this task has.
  emnist_model = model if model != 'ffnn' else 'cnn'
  options.update(emnist.check_options(cache_dir, only_digits, max_eval_examples, emnist_model))
  options.update(_check_partition(model, num_clients, partition, dirichlet_alpha))
  profile = _check_sizes(options, size_group_clients, size_group_examples, size_sigma)
  database, train_data, test_data, num_classes, split = emnist.load_splits(options)
  client_ids = tuple(train_data.client_ids)
  _, pixels, labels = emnist.read_split_examples(database, split, client_ids, num_classes)
  train, sizes = _deal_to_clients(pixels[..., np.newaxis], labels, options, profile, num_classes)
  return _common.in_memory_task(
    'emnist_skewed',
    options,
    train=train,
    sizes=sizes,
    eval_data=_common.centralized_eval_data(test_data, options),
    keras_model_fn=_model_fn(options['model'], num_classes),
    num_classes=num_classes,
    preprocess_eval=emnist.tff_batch_and_reshape(options['eval_batch_size']),
  )
