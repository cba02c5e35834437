"""Tiny databases in TFF's own SQLite format, where TFF's loaders look for them.

`write_tff_database` (from `tasks.tff_sqlite`) writes several splits into the single
file TFF's loaders read, in the layout of
``tff.simulation.datasets.save_to_sql_client_data``, so the same writer can
appear in the train and the test split as in the real data.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import numpy as np

from tasks import tff_sqlite

Clients = Mapping[str, Mapping[str, np.ndarray]]
write_tff_database = tff_sqlite.write_tff_database


def emnist_clients(rng: np.random.Generator, sizes: Mapping[str, int], num_classes: int) -> Clients:
  return {
    client_id: collections.OrderedDict(
      label=rng.integers(0, num_classes, size).astype(np.int32),
      pixels=rng.random((size, 28, 28)).astype(np.float32),
    )
    for client_id, size in sizes.items()
  }


def cifar_clients(rng: np.random.Generator, sizes: Mapping[str, int]) -> Clients:
  clients = {}
  for client_id, size in sizes.items():
    label = rng.integers(0, 100, size).astype(np.int64)
    clients[client_id] = collections.OrderedDict(
      coarse_label=label // 5,
      image=rng.integers(0, 256, (size, 32, 32, 3)).astype(np.uint8),
      label=label,
    )
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
  return {
    client_id: collections.OrderedDict(snippets=np.array(texts, dtype=object))
    for client_id, texts in snippets.items()
  }
