"""Clients' data built inside TFF's worker: a round passes each client as a reference.

Handing a round `tf.data.Dataset`s from Python costs, per client and per round, one
build of the client's stream in Python (the task's preprocessing maps traced anew)
and its serialisation into the call. A `ClientFeed` traces the stream once per run
as a TFF computation, ``(client id, shuffle seed) -> stream`` (the client's raw
examples, then the task's ``preprocess_client``: the same elements in the same
order as `Task.client_dataset`), and composes it in front of the round's
computation, so a round passes only ``<client, seed>`` per client (with ``slot``
and ``weight`` for processes that take the signals' client input,
`tff_sampling.learning.signals.client_data`).

Where the raw examples come from (`ClientFeed.build`):

* the task's own ``ClientData.serializable_dataset_fn``, when its trace is small (at
  most `MAX_EMBEDDED_BYTES`): a database the worker queries (TFF's SQLite files),
  or a small in-memory population embedded in the computation;
* otherwise (a larger in-memory population, which would travel with every call)
  files of each client's raw values, one per feature, written once into a folder
  of the run's directory (`ClientFiles`); a client reads its own;
* neither, when the examples have features of varying shape or of strings or hold
  more than `MAX_FILE_BYTES`, or when the round runs on remote workers, which cannot
  see this machine's files: the round loop then sends datasets from Python, as
  before (`build` returns None).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import os

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import contract
from tff_sampling.learning import signals as signals_lib
from tff_sampling.task import Task

# Above this size of a traced feed, each call would carry the data: files instead.
MAX_EMBEDDED_BYTES = 2**20
# At most this much of the clients' examples is written into a run's directory.
MAX_FILE_BYTES = 512 * 2**20
# Feeds and composed computations kept for reuse: TFF compiles a computation once per
# object, so runs of one process on one task (seeds, resumes) share one compilation.
_KEPT = 8


class ClientFiles:
  """A population's raw examples in files: one per client and feature, holding the
  client's values of that feature, in the order of its ``create_tf_dataset_for_client``,
  as little-endian bytes."""

  def __init__(self, task: Task, folder: str):
    """Writes `task`'s clients' raw examples into `folder` (created).

    Raises:
      ValueError: If a feature has strings or a shape not fully known, or the
        examples hold more than `MAX_FILE_BYTES`.
    """
    self._structure = task.train_data.element_type_structure
    self._specs = tf.nest.flatten(self._structure)
    for s in self._specs:
      if s.dtype == tf.string or not s.shape.is_fully_defined():
        raise ValueError(
          f'A feature of shape {s.shape} and type {s.dtype.name} cannot be written as raw values.'
        )
    example_bytes = sum(s.dtype.size * s.shape.num_elements() for s in self._specs)
    total = int(np.sum(task.client_num_examples)) * example_bytes
    if total > MAX_FILE_BYTES:
      raise ValueError(
        f'The clients hold {total / 2**20:.0f} MiB, more than the {MAX_FILE_BYTES / 2**20:.0f} '
        'MiB a run writes of them.'
      )
    os.makedirs(folder, exist_ok=True)
    self._folder = folder
    for position, client_id in enumerate(task.client_ids):
      raw = task.train_data.create_tf_dataset_for_client(client_id)
      examples = [tf.nest.flatten(e) for e in raw.as_numpy_iterator()]
      for k, spec in enumerate(self._specs):
        little_endian = np.dtype(spec.dtype.as_numpy_dtype).newbyteorder('<')
        values = np.asarray([e[k] for e in examples], little_endian)
        with open(os.path.join(folder, f'{position}_{k}.bin'), 'wb') as f:
          f.write(values.tobytes())
    self._ids = tuple(task.client_ids)

  def dataset(self, client) -> tf.data.Dataset:
    """Client `client`'s (a string tensor) raw examples, read from its files (in TF)."""
    matches = tf.equal(client, tf.constant(self._ids))
    with tf.control_dependencies(
      [tf.debugging.Assert(tf.reduce_any(matches), ['Unknown client id:', client])]
    ):
      position = tf.strings.as_string(tf.argmax(tf.cast(matches, tf.int32)))
    prefix = tf.strings.join([self._folder + os.sep, position])
    features = []
    for k, spec in enumerate(self._specs):
      values = tf.io.decode_raw(tf.io.read_file(prefix + f'_{k}.bin'), spec.dtype)
      features.append(tf.reshape(values, [-1, *spec.shape.as_list()]))
    return tf.data.Dataset.from_tensor_slices(tf.nest.pack_sequence_as(self._structure, features))


class ClientFeed:
  """The task's client streams as TFF computations of a reference (module docstring)."""

  def __init__(
    self,
    task: Task,
    steps: int | None,
    raw_dataset: Callable[[tf.Tensor], tf.data.Dataset] | None = None,
  ):
    """Traces the feed.

    Args:
      task: Whose clients' data is read.
      steps: As `Task.client_dataset`'s ``steps``: each stream cycled and cut
        to this many batches (None: the stream as preprocessed).
      raw_dataset: A client's raw examples from its id, in TF (default: the task's
        ``serializable_dataset_fn``).

    Raises:
      TypeError, ValueError: If the task's data cannot be traced.
    """
    self.task = task
    raw_dataset = raw_dataset or task.train_data.serializable_dataset_fn

    def stream(client, seed):
      dataset = task.preprocess_client(raw_dataset(client), seed)
      dataset = dataset if steps is None else dataset.repeat().take(steps)
      # The task's options: `Task.client_dataset` gives the same stream from Python.
      return dataset.with_options(task.stream_options)

    self.stream = tff.tensorflow.computation(stream, np.str_, np.int64)

    @tff.tensorflow.computation(np.str_, np.int64, np.int32, np.float32)
    def client_input(client, seed, slot, weight):
      return signals_lib.client_data(stream(client, seed), slot, weight)

    self.client_input = client_input
    self._composed: collections.OrderedDict[int, tuple] = collections.OrderedDict()

  @property
  def size(self) -> int:
    """Bytes of the traced stream (the constants it embeds among them)."""
    return tff.framework.ConcreteComputation.get_proto(self.stream).ByteSize()

  @classmethod
  def build(cls, task: Task, steps: int | None, folder: str) -> ClientFeed | None:
    """The feed (module docstring), or None (logged) where datasets from Python remain
    the way; files, if needed, go into `folder`.

    A feed on the task's own dataset function is the same object for the same task
    object and steps while it is among the last kept.
    """
    try:
      feed = _kept(_FEEDS, (id(task), steps), task, lambda: cls(task, steps))
    except (TypeError, ValueError, AttributeError, NotImplementedError) as e:
      logging.info('Clients get datasets from Python: their data cannot be traced (%s).', e)
      return None
    if feed.size <= MAX_EMBEDDED_BYTES:
      return feed
    _FEEDS.pop((id(task), steps))
    try:
      return cls(task, steps, ClientFiles(task, folder).dataset)
    except ValueError as e:
      logging.info('Clients get datasets from Python: %s', e)
      return None

  def compose(self, computation: tff.Computation) -> tff.Computation:
    """`computation` (``(X@SERVER, data@CLIENTS) -> …``) taking references for its data.

    The data is plain datasets (references ``<client, seed>``, `references`) or
    the signals' client input (``<client, seed, slot, weight>``). The same object
    for the same `computation` object while it is among the last kept.
    """
    return _kept(self._composed, id(computation), computation, lambda: self._compose(computation))

  def _compose(self, computation: tff.Computation) -> tff.Computation:
    first, data = computation.type_signature.parameter
    feed = self.client_input if contract.is_client_input(data.member) else self.stream

    @tff.federated_computation(first, tff.FederatedType(feed.type_signature.parameter, tff.CLIENTS))
    def composed(value, references):
      return computation(value, tff.federated_map(feed, references))

    return composed

  def references(
    self,
    clients: Sequence[int] | np.ndarray,
    seeds: Sequence[int],
    weights: Sequence[float] | None = None,
  ) -> list[collections.OrderedDict]:
    """One reference per cohort slot: client ``clients[k]``'s stream with ``seeds[k]``;
    with `weights`, the client input of slot ``k`` with weight ``weights[k]``."""
    ids = self.task.client_ids
    if weights is None:
      return [
        collections.OrderedDict(client=ids[int(c)], seed=np.int64(s))
        for c, s in zip(clients, seeds, strict=True)
      ]
    return [
      collections.OrderedDict(
        client=ids[int(c)], seed=np.int64(s), slot=np.int32(k), weight=np.float32(w)
      )
      for k, (c, s, w) in enumerate(zip(clients, seeds, weights, strict=True))
    ]


_FEEDS: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()


def _kept(cache: collections.OrderedDict, key, owner, make):
  """``make()``, kept in `cache` under `key` (an ``id``) beside `owner`, the object the
  id belongs to, which the entry keeps alive so the id cannot be reused."""
  if key in cache and cache[key][0] is owner:
    cache.move_to_end(key)
    return cache[key][1]
  value = make()
  cache[key] = (owner, value)
  while len(cache) > _KEPT:
    cache.popitem(last=False)
  return value
