"""A run's system model (`SystemModel`): its devices, what each client trains and transfers in a
round, over-commitment, the deadline and drop-outs; `SystemModel.round` times one round."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tff_sampling import validation
from tff_sampling.devices import timing
from tff_sampling.devices.profiles import DeviceProfiles


@dataclasses.dataclass(frozen=True)
class SystemModel:
  """The devices of a run and how a round treats them.

  Attributes:
    profiles: Each client's device.
    examples_trained: ``float[N]``: examples each client trains on in a round
      (its examples × epochs, or steps × batch size).
    model_bits: The model's size: what a client downloads, and uploads when it
      uploads a model-sized update.
    target: Updates the server waits for each round (the first to arrive are
      kept, the others dropped): select more than this to over-commit.
      ``None``: every selected client.
    deadline_seconds: The longest the server waits; later clients are dropped.
    dropout: Probability that a selected client drops out mid-round (drawn per
      (seed, round, client)).
  """

  profiles: DeviceProfiles
  examples_trained: np.ndarray
  model_bits: float
  target: int | None = None
  deadline_seconds: float | None = None
  dropout: float = 0.0

  def __post_init__(self):
    work = np.asarray(self.examples_trained, dtype=np.float64)
    if work.shape != (self.profiles.size,) or not np.all(np.isfinite(work) & (work >= 0)):
      raise ValueError(
        f'examples_trained must hold {self.profiles.size} non-negative numbers, one a client; '
        f'got shape {work.shape}.'
      )
    validation.positive_number('model_bits', self.model_bits)
    if self.target is not None:
      validation.positive_int('target', self.target)
    if self.deadline_seconds is not None:
      validation.positive_number('deadline_seconds', self.deadline_seconds)
    if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
      raise ValueError(f'dropout must be a probability in [0, 1), got {self.dropout!r}.')

  @property
  def num_clients(self) -> int:
    return self.profiles.size

  def expected_seconds(self) -> np.ndarray:
    """``float64[N]``: each client's round without drop-outs or a deadline (download,
    training, upload): what profiling the clients would measure (TiFL's tiers)."""
    seconds = timing.client_seconds(
      self.profiles,
      np.arange(self.num_clients),
      np.asarray(self.examples_trained, dtype=np.float64),
      download_bits=self.model_bits,
      upload_bits=self.model_bits,
    )
    return seconds.until_trained + seconds.upload

  def round(
    self, seed: int, round_num: int, clients: np.ndarray, *, uploads_after_training: bool = False
  ) -> timing.RoundTime:
    """Times round `round_num` for the selected `clients`, each of which downloads the model,
    trains and uploads a model-sized update: who is kept, and how long the round lasts.

    With `uploads_after_training` (optimal uploads) the server keeps the first clients to
    have their update, and the times are those of the training phase: `upload_seconds` and
    `timing.round_seconds` add the uploads once the round says who uploaded.
    """
    clients = np.asarray(clients, dtype=np.int64)
    if clients.size == 0:
      return timing.RoundTime(np.zeros(0, bool), 0.0, np.zeros(0))
    seconds = timing.client_seconds(
      self.profiles,
      clients,
      np.asarray(self.examples_trained, dtype=np.float64)[clients],
      download_bits=self.model_bits,
      upload_bits=self.model_bits,
    )
    target = clients.size if self.target is None else min(self.target, clients.size)
    return timing.keep_first(
      seconds.until_trained if uploads_after_training else seconds.until_trained + seconds.upload,
      target,
      deadline=self.deadline_seconds,
      dropped=timing.dropped_out(seed, round_num, clients, self.dropout),
    )

  def upload_seconds(self, clients: np.ndarray) -> np.ndarray:
    """``float64[K]``: each client's upload of a model-sized update."""
    return self.model_bits / self.profiles.upload_bits_per_second[np.asarray(clients, np.int64)]


def overcommitted(target: int, overcommit: float) -> int:
  """Clients to select so that `target` are kept with over-commitment ``ε`` (select
  ``⌈target (1 + ε)⌉``, e.g. 130% of the target with ε = 0.3)."""
  validation.positive_int('target', target)
  if not (math.isfinite(overcommit) and overcommit >= 0):
    raise ValueError(f'overcommit must be a non-negative number, got {overcommit!r}.')
  return math.ceil(target * (1 + overcommit) - 1e-9)
