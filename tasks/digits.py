"""The offline `digits` task: scikit-learn's handwritten digits split into non-IID clients
(presets `default`, `unbalanced`, `shards`, `two_labels`); ``docs/tasks.md`` has the details."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools
from typing import Any

import numpy as np
import scipy.special
import sklearn.datasets

from tasks import _common
from tasks import models
from tff_sampling.task import Task

NUM_CLASSES = 10
NUM_FEATURES = 64
# Preset -> the values its ``None`` options resolve to; ``None`` here means the
# option does not apply to the preset (setting it is an error).
PRESETS = collections.OrderedDict(
  default=collections.OrderedDict(size_sigma=1.0, dirichlet_alpha=0.5),
  unbalanced=collections.OrderedDict(size_sigma=3.0, dirichlet_alpha=0.5),
  shards=collections.OrderedDict(size_sigma=None, dirichlet_alpha=None),
  two_labels=collections.OrderedDict(size_sigma=None, dirichlet_alpha=None),
)
MODELS = ('mlp', 'logistic')
_MIN_CLIENT_EXAMPLES = 2


def stratified_split(
  labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """Indices ``(rest, held_out)``: `fraction` of every class held out."""
  held_out = []
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    held_out.append(members[: int(round(fraction * len(members)))])
  held_out = np.sort(np.concatenate(held_out))
  rest = np.setdiff1d(np.arange(len(labels)), held_out)
  return rest, held_out


def lognormal_sizes(
  total: int, num_clients: int, sigma: float, min_size: int, rng: np.random.Generator
) -> np.ndarray:
  """``int64[num_clients]`` sizes >= `min_size` summing to `total`.

  Each client gets `min_size` examples plus a largest-remainder share of the
  remaining ``total - num_clients * min_size`` in proportion to a weight
  ``w_k ~ LogNormal(0, sigma)``. The weights are a Latin-hypercube sample:
  ``w_k = exp(sigma * Phi^-1(u_k))`` with ``u_k`` uniform in the stratum
  ``[pi_k / N, (pi_k + 1) / N)`` of a random permutation ``pi``. Each weight is
  still marginally LogNormal(0, sigma), but the empirical size distribution,
  hence the concentration, varies much less between seeds than with i.i.d.
  draws (top-10% share at sigma=3, 100 clients: 77-86% instead of 62-87%).
  """
  if total < num_clients * min_size:
    raise ValueError(
      f'{total} examples cannot give {num_clients} clients {min_size} examples each; '
      f'use num_clients <= {total // min_size}.'
    )
  quantiles = (rng.permutation(num_clients) + rng.random(num_clients)) / num_clients
  weights = np.exp(sigma * scipy.special.ndtri(quantiles))
  spare = total - num_clients * min_size
  quotas = spare * weights / weights.sum()
  extra = np.floor(quotas).astype(np.int64)
  remainder_order = np.argsort(-(quotas - extra), kind='stable')
  extra[remainder_order[: spare - extra.sum()]] += 1
  return extra + min_size


def dirichlet_partition(
  labels: np.ndarray, sizes: np.ndarray, alpha: float, rng: np.random.Generator, num_classes: int
) -> list[np.ndarray]:
  """Assigns every example to exactly one client, with Dirichlet label skew.

  Args:
    labels: ``int[M]`` labels of the examples to distribute.
    sizes: ``int[N]`` client sizes, summing to ``M``.
    alpha: Dirichlet concentration (smaller: more skewed clients).
    rng: The random generator.
    num_classes: Number of labels.

  Returns:
    ``N`` index arrays into `labels`, disjoint and covering ``range(M)``.
  """
  if int(np.sum(sizes)) != len(labels):
    raise ValueError(f'Client sizes sum to {np.sum(sizes)}, not {len(labels)}.')
  remaining = np.bincount(labels, minlength=num_classes).astype(np.int64)
  proportions = rng.dirichlet(np.full(num_classes, alpha), size=len(sizes))
  client_counts = np.zeros((len(sizes), num_classes), np.int64)
  for client in rng.permutation(len(sizes)):
    counts = client_counts[client]
    needed = int(sizes[client])
    while needed > 0:
      available = remaining - counts
      p = proportions[client] * (available > 0)
      if p.sum() <= 0:  # Its preferred labels are exhausted: any available label.
        p = (available > 0).astype(np.float64)
      draw = np.minimum(rng.multinomial(needed, p / p.sum()), available)
      counts += draw
      needed -= int(draw.sum())
    remaining -= counts
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  taken = np.zeros(num_classes, np.int64)
  assignment = []
  for counts in client_counts:
    members = []
    for c in np.flatnonzero(counts):
      members.append(pools[c][taken[c] : taken[c] + counts[c]])
      taken[c] += counts[c]
    assignment.append(rng.permutation(np.concatenate(members)))
  return assignment


def shard_partition(
  labels: np.ndarray,
  num_clients: int,
  rng: np.random.Generator,
  num_classes: int,
  min_size: int = 1,
) -> list[np.ndarray]:
  """Single-label shards: every client holds examples of one label only.

  Label ``c`` gets ``num_clients // num_classes`` clients, plus one for the
  ``num_clients % num_classes`` labels with the most examples (ties: smaller
  label first). Its examples, in seeded random order, are split into that
  many shards whose sizes differ by at most one (``np.array_split``). The
  shards are then put in seeded random client order.

  Args:
    labels: ``int[M]`` labels of the examples to distribute.
    num_clients: Number of clients, at least `num_classes`.
    rng: The random generator.
    num_classes: Number of labels; every label must occur.
    min_size: Smallest allowed shard.

  Returns:
    `num_clients` index arrays into `labels`, disjoint and covering
    ``range(M)``; all labels within an array are equal.

  Raises:
    ValueError: If a label is missing, or the shards would be smaller than
      `min_size` (the message gives the largest valid `num_clients`).
  """
  class_counts = np.bincount(labels, minlength=num_classes)
  if np.any(class_counts == 0):
    raise ValueError(
      f'Shards need every label; labels {np.flatnonzero(class_counts == 0).tolist()} '
      'have no examples.'
    )
  if num_clients < num_classes:
    raise ValueError(
      f'Shards need num_clients >= {num_classes} (one client per label at least), '
      f'got {num_clients}.'
    )
  clients_per_class = _shards_per_class(class_counts, num_clients)
  if np.any(class_counts // clients_per_class < min_size):
    feasible = [
      n
      for n in range(num_classes, num_clients)
      if np.all(class_counts // _shards_per_class(class_counts, n) >= min_size)
    ]
    hint = f'use num_clients <= {feasible[-1]}' if feasible else 'too few examples per label'
    raise ValueError(
      f'{len(labels)} examples cannot give {num_clients} single-label clients '
      f'{min_size} examples each; {hint}.'
    )
  shards = []
  for label in range(num_classes):
    members = rng.permutation(np.flatnonzero(labels == label))
    shards.extend(np.array_split(members, clients_per_class[label]))
  return [shards[i] for i in rng.permutation(num_clients)]


def label_pair_partition(
  labels: np.ndarray,
  num_clients: int,
  rng: np.random.Generator,
  num_classes: int,
  min_size: int = 1,
) -> list[np.ndarray]:
  """Two-label clients: every client holds two shards of two different labels.

  The examples are cut into ``2 · num_clients`` single-label shards as by
  `shard_partition`; the shards are shuffled and paired consecutively, and
  every pair that holds the same label twice is repaired by swapping one of
  its shards with a shard of another pair chosen at random among those where
  the swap leaves both pairs with two different labels.

  Args:
    labels: ``int[M]`` labels of the examples to distribute.
    num_clients: Number of clients, at least ``num_classes / 2``.
    rng: The random generator.
    num_classes: Number of labels (at least 2); every label must occur.
    min_size: Smallest allowed shard.

  Returns:
    `num_clients` index arrays into `labels`, disjoint and covering
    ``range(M)``; each holds exactly two distinct labels.

  Raises:
    ValueError: If a label is missing or shards would be smaller than
      `min_size`. (Labels get equal shard counts, at most ``num_clients`` each,
      so a valid pairing exists; the repair always finds a partner pair.)
  """
  if num_classes < 2:
    raise ValueError(f'Two-label clients need num_classes >= 2, got {num_classes}.')
  try:
    shards = shard_partition(labels, 2 * num_clients, rng, num_classes, min_size)
  except ValueError as e:
    raise ValueError(
      f'{num_clients} two-label clients need {2 * num_clients} single-label '
      f'shards: {e} (halve that bound for num_clients)'
    ) from e
  shard_label = np.array([labels[s[0]] for s in shards])
  pairs = rng.permutation(2 * num_clients).reshape(num_clients, 2)
  for bad in range(num_clients):
    a, b = pairs[bad]
    if shard_label[a] != shard_label[b]:
      continue
    # Swap b with a shard c of another pair (c, d) such that label(c) != label(a)
    # and label(b) != label(d): both pairs then hold two different labels. One
    # exists: a label has at most num_clients shards, two of them are here, so
    # one of the other num_clients - 1 pairs holds none of that label.
    pair_labels = shard_label[pairs]
    options = [
      (p, side)
      for p in range(num_clients)
      if p != bad
      for side in (0, 1)
      if pair_labels[p, side] != shard_label[a] and pair_labels[p, 1 - side] != shard_label[b]
    ]
    p, side = options[rng.integers(len(options))]
    pairs[bad, 1], pairs[p, side] = pairs[p, side], b
  return [rng.permutation(np.concatenate([shards[a], shards[b]])) for a, b in pairs]


def _shards_per_class(class_counts: np.ndarray, num_clients: int) -> np.ndarray:
  """Clients per label: an equal share, extras to the largest labels."""
  clients = np.full(len(class_counts), num_clients // len(class_counts), np.int64)
  clients[np.argsort(-class_counts, kind='stable')[: num_clients % len(class_counts)]] += 1
  return clients


def shard_labels(task: Task) -> np.ndarray:
  """``int64[N]``: the one label each client of a single-label task holds.

  For the ``'shards'`` preset of ``digits`` (or any task whose clients'
  label histograms are one-hot), e.g. for a reference "target" sampler that
  takes one client per label each round.

  Args:
    task: A task whose every client holds examples of a single label.

  Returns:
    ``int64[task.num_clients]`` labels, in `task.client_ids` order.

  Raises:
    ValueError: If some client holds more than one label (or none).
  """
  histograms = np.asarray(task.client_label_histograms)
  labels_held = np.count_nonzero(histograms, axis=1)
  mixed = np.flatnonzero(labels_held != 1)
  if mixed.size:
    raise ValueError(
      f'Task {task.name!r} is not single-label: {mixed.size} clients hold '
      f'{sorted(set(labels_held[mixed].tolist()))} labels (first: '
      f'{task.client_ids[mixed[0]]!r}); use the shards preset.'
    )
  return np.argmax(histograms, axis=1).astype(np.int64)


def size_concentration(num_examples: np.ndarray, top_fraction: float = 0.1) -> float:
  """Share of all examples held by the largest ``top_fraction`` of clients."""
  top = max(1, int(round(top_fraction * len(num_examples))))
  return float(np.sort(num_examples)[::-1][:top].sum() / np.sum(num_examples))


def _optional(check, name: str, value, **bounds):
  """``check(name, value, **bounds)``, or ``None`` for ``None``."""
  return None if value is None else check(name, value, **bounds)


def _preset_values(preset: str, dirichlet_alpha: Any, size_sigma: Any) -> tuple[Any, Any]:
  """``(dirichlet_alpha, size_sigma)``, the preset's values for ``None``; unchecked."""
  resolved = []
  for name, value in (('dirichlet_alpha', dirichlet_alpha), ('size_sigma', size_sigma)):
    if PRESETS[preset][name] is None and value is not None:
      raise ValueError(
        f'{name} does not apply to preset={preset!r} (fixed labels per client, '
        f'in equal shares), got {value!r}; leave it unset.'
      )
    resolved.append(PRESETS[preset][name] if value is None else value)
  return tuple(resolved)


def _split_into_clients(
  options: dict[str, Any],
) -> tuple[collections.OrderedDict, np.ndarray, collections.OrderedDict]:
  """``(train, sizes, evaluation)``: the clients' ``{x, y}`` examples in client order, `sizes`
  each, and the stratified held-out ones, split and dealt as `options` say."""
  data = sklearn.datasets.load_digits()
  features = (data.data / 16.0).astype(np.float32)
  labels = data.target.astype(np.int32)
  rng = np.random.default_rng(options['seed'])
  train_index, eval_index = stratified_split(labels, options['eval_fraction'], rng)
  if options['preset'] in ('shards', 'two_labels'):
    partition = shard_partition if options['preset'] == 'shards' else label_pair_partition
    min_size = 1 if options['preset'] == 'two_labels' else _MIN_CLIENT_EXAMPLES
    members = partition(labels[train_index], options['num_clients'], rng, NUM_CLASSES, min_size)
    sizes = np.array([len(m) for m in members], np.int64)
  else:
    sizes = lognormal_sizes(
      len(train_index), options['num_clients'], options['size_sigma'], _MIN_CLIENT_EXAMPLES, rng
    )
    members = dirichlet_partition(
      labels[train_index], sizes, options['dirichlet_alpha'], rng, NUM_CLASSES
    )
  order = train_index[np.concatenate(members)]
  return (
    collections.OrderedDict(x=features[order], y=labels[order]),
    sizes,
    collections.OrderedDict(x=features[eval_index], y=labels[eval_index]),
  )


def create_digits_task(
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  num_clients: int = 100,
  dirichlet_alpha: float | None = None,
  size_sigma: float | None = None,
  eval_fraction: float = 0.2,
  preset: str = 'default',
  model: str = 'mlp',
  mlp_hidden: Sequence[int] = (64,),
) -> Task:
  """Builds the ``digits`` task.

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`).
    seed: Seed of the evaluation split and the partition.
    num_clients: Number of clients (each gets at least 2 examples, so at most
      719 with the default evaluation split, 699 with ``'shards'``, which
      also needs at least 10, and 699 with ``'two_labels'``).
    dirichlet_alpha: Dirichlet concentration of the clients' label
      proportions; ``None`` takes the preset's value (0.5). Not for
      ``'shards'`` or ``'two_labels'``.
    size_sigma: Log-normal sigma of the client sizes; ``None`` takes the
      preset's value (an explicit value overrides the preset). Not for
      ``'shards'`` or ``'two_labels'``.
    eval_fraction: Stratified fraction held out for evaluation, in (0, 1).
    preset: ``'default'``, ``'unbalanced'``, ``'shards'`` or ``'two_labels'``
      (see the module docstring).
    model: ``'mlp'`` (64-unit hidden layer) or ``'logistic'``.
    mlp_hidden: Hidden widths of the ``'mlp'`` model: a non-empty sequence of
      integers >= 1 (``model='logistic'`` has no hidden layer).

  Returns:
    The `Task`. Raw elements are ``OrderedDict(x=float32[64], y=int32[])``;
    training batches ``OrderedDict(x=float32[B, 64], y=int32[B])``. Its
    ``options`` hold ``dirichlet_alpha=None, size_sigma=None`` for
    ``'shards'`` and ``'two_labels'``.

  Raises:
    ValueError: For an invalid option, ``dirichlet_alpha`` or ``size_sigma``
      set with ``preset='shards'`` or ``'two_labels'``, or too many clients
      for the data.
  """
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  preset = _common.check_choice('preset', preset, tuple(PRESETS))
  dirichlet_alpha, size_sigma = _preset_values(preset, dirichlet_alpha, size_sigma)
  options.update(
    num_clients=_common.check_int('num_clients', num_clients),
    dirichlet_alpha=_optional(_common.check_float, 'dirichlet_alpha', dirichlet_alpha),
    size_sigma=_optional(_common.check_float, 'size_sigma', size_sigma, min_inclusive=True),
    eval_fraction=_common.check_float(
      'eval_fraction', eval_fraction, maximum=1.0, max_inclusive=False
    ),
    preset=preset,
    model=_common.check_choice('model', model, MODELS),
    mlp_hidden=_common.check_int_tuple('mlp_hidden', mlp_hidden),
  )
  train, sizes, evaluation = _split_into_clients(options)
  if options['model'] == 'mlp':
    keras_model_fn = functools.partial(
      models.dense_mlp, NUM_FEATURES, NUM_CLASSES, hidden=options['mlp_hidden']
    )
  else:
    keras_model_fn = functools.partial(models.logistic_regression, NUM_FEATURES, NUM_CLASSES)
  return _common.in_memory_task(
    'digits',
    options,
    train=train,
    sizes=sizes,
    eval_data=_common.tf_dataset_from_arrays(evaluation),
    keras_model_fn=keras_model_fn,
    num_classes=NUM_CLASSES,
  )
