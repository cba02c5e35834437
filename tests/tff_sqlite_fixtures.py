"""Tiny databases in TFF's own SQLite format, where TFF's loaders look for them.

Each split is written by ``tff.simulation.datasets.save_to_sql_client_data``
(which gives a client one split per file) and the splits are merged into the
single file TFF's loaders read, so the same writer can appear in the train and
the test split as in the real data.
"""

from __future__ import annotations

import collections
import os
import shutil
import sqlite3
from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

Clients = Mapping[str, Mapping[str, np.ndarray]]


def write_tff_database(path: str, splits: Mapping[str, Clients]) -> None:
  """Writes ``{split_name: {client_id: {feature: array}}}`` to `path`."""
  parts = []
  for split_name, clients in splits.items():
    part = f'{path}.{split_name}'
    tff.simulation.datasets.save_to_sql_client_data(
        list(clients),
        lambda client_id, clients=clients: tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(clients[client_id])),
        part,
        split_names_by_client_id={client_id: split_name for client_id in clients})
    parts.append(part)
  shutil.copyfile(parts[0], path)
  with sqlite3.connect(path) as connection:
    for part in parts[1:]:
      connection.execute('ATTACH DATABASE ? AS part;', (part,))
      connection.execute('INSERT INTO examples SELECT * FROM part.examples;')
      connection.execute('INSERT INTO client_metadata SELECT * FROM part.client_metadata;')
      connection.commit()
      connection.execute('DETACH DATABASE part;')
  for part in parts:
    os.remove(part)


def emnist_clients(rng: np.random.Generator, sizes: Mapping[str, int], num_classes: int) -> Clients:
  return {
      client_id: collections.OrderedDict(
          label=rng.integers(0, num_classes, size).astype(np.int32),
          pixels=rng.random((size, 28, 28)).astype(np.float32))
      for client_id, size in sizes.items()}


def cifar_clients(rng: np.random.Generator, sizes: Mapping[str, int]) -> Clients:
  clients = {}
  for client_id, size in sizes.items():
    label = rng.integers(0, 100, size).astype(np.int64)
    clients[client_id] = collections.OrderedDict(
        coarse_label=label // 5,
        image=rng.integers(0, 256, (size, 32, 32, 3)).astype(np.uint8),
        label=label)
  return clients


# Snippets with out-of-vocabulary bytes (UTF-8 'é', '~', tab), an empty one,
# and lengths that do and do not divide into sequences.
SHAKESPEARE_TRAIN = {
    'KING_LEAR_LEAR': [b'Hark!', b'When shall we three meet again?', b'', b'Caf\xc3\xa9~\t ok'],
    'MACBETH_WITCH': [b'Fair is foul, and foul is fair:', b'Hover through the fog'],
    'TEMPEST_ARIEL': [b'Full fathom five thy father lies;\nOf his bones are coral made.'],
}
SHAKESPEARE_TEST = {
    'KING_LEAR_LEAR': [b'Nothing will come of nothing.'],
    'MACBETH_WITCH': [b'Double, double toil and trouble;'],
}


def shakespeare_clients(snippets: Mapping[str, list[bytes]]) -> Clients:
  return {client_id: collections.OrderedDict(snippets=np.array(texts, dtype=object))
          for client_id, texts in snippets.items()}
