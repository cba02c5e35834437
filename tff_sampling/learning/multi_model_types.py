"""What the multi-model (MMFL) process is given and how it samples: the methods (`Sampling`,
`SAMPLINGS`), each client's per-model data (`client_data`, `data_shares`) and its type."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class Sampling:
  """What a sampling name means: the clients' signal and how models are assigned."""

  signal: str  # 'update_norm' (every client trains every model first), 'loss' or 'none'.
  assignment: str  # 'exact', 'approximate', 'random' or 'round_robin'.

  @property
  def from_signal(self) -> bool:
    """Whether the probabilities come from the clients' signals."""
    return self.assignment in ('exact', 'approximate')

  @property
  def secure(self) -> bool:
    """Whether every client value reaches the server through secure sums."""
    return self.assignment == 'approximate'


SAMPLINGS = collections.OrderedDict(
  optimal=Sampling('update_norm', 'exact'),
  optimal_loss=Sampling('loss', 'exact'),
  optimal_secure=Sampling('update_norm', 'approximate'),
  optimal_loss_secure=Sampling('loss', 'approximate'),
  random=Sampling('none', 'random'),
  round_robin=Sampling('none', 'round_robin'),
  # The same draws as random / round_robin after every client trained every model, as the
  # update-norm samplings do: optimal's compute, the baselines' selection and uploads.
  random_train_all=Sampling('update_norm', 'random'),
  round_robin_train_all=Sampling('update_norm', 'round_robin'),
)


FLOAT = np.float32


COUNT = np.int32


def meta_type(num_models: int) -> tff.StructWithPythonType:
  """The type of the one element of a client's ``meta`` dataset."""
  return tff.StructWithPythonType(
    [('client', tff.TensorType(np.int32)), ('shares', tff.TensorType(np.float32, [num_models]))],
    collections.OrderedDict,
  )


def client_data(
  datasets: Sequence[tf.data.Dataset], client: int, shares: Sequence[float]
) -> collections.OrderedDict:
  """One client's input to the multi-model process.

  Args:
    datasets: The client's preprocessed training dataset for each model (empty
      where it has no data for that model).
    client: The client's index, the source of its random draws.
    shares: ``d_{i,s}``, the client's share of each model's training examples.
  """
  if len(datasets) != len(shares):
    raise ValueError(f'{len(datasets)} datasets but {len(shares)} shares: give one per model.')
  meta = tf.data.Dataset.from_tensors(
    collections.OrderedDict(client=np.int32(client), shares=np.asarray(shares, np.float32))
  )
  return collections.OrderedDict(data=tuple(datasets), meta=meta)


def data_shares(num_examples: np.ndarray) -> np.ndarray:
  """``d_{i,s} = n_{i,s} / Σ_j n_{j,s}`` from ``int[N, S]`` example counts.

  Raises:
    ValueError: If some model has no examples at all, or a count is negative.
  """
  counts = np.asarray(num_examples, np.float64)
  if counts.ndim != 2 or np.any(counts < 0) or not np.all(np.isfinite(counts)):
    raise ValueError(
      f'num_examples must be a non-negative [clients, models] array, got shape {counts.shape}.'
    )
  totals = counts.sum(axis=0)
  if np.any(totals == 0):
    raise ValueError(
      f'Model(s) {np.flatnonzero(totals == 0).tolist()} have no training '
      'examples on any client; every model needs data on at least one client.'
    )
  return counts / totals
