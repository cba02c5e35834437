"""What the devices make of a round: each selected client's download, training and upload
seconds (`client_seconds`), drop-outs (`dropped_out`), the clients kept, the first to finish
within a deadline (`keep_first`), and the round's length (`round_seconds`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tff_sampling import randomness
from tff_sampling.devices.profiles import DeviceProfiles

# `randomness.round_rng(seed, round, _DROPOUT_STREAM)`: each round's drop-outs.
_DROPOUT_STREAM = 2002


class ClientSeconds(NamedTuple):
  """Seconds of each phase for each selected client (``float64[K]``, in cohort order)."""

  download: np.ndarray
  train: np.ndarray
  upload: np.ndarray

  @property
  def until_trained(self) -> np.ndarray:
    """When each client has its update: download and training."""
    return self.download + self.train


def client_seconds(
  profiles: DeviceProfiles,
  clients: np.ndarray,
  examples_trained: np.ndarray,
  *,
  download_bits: float,
  upload_bits: np.ndarray | float,
) -> ClientSeconds:
  """Each client's download of `download_bits`, training on `examples_trained` examples (its
  examples × epochs, or steps × batch size), and upload of its `upload_bits` (0 for a client
  that uploads nothing)."""
  clients = np.asarray(clients, dtype=np.int64)
  upload = np.broadcast_to(np.asarray(upload_bits, dtype=np.float64), clients.shape)
  return ClientSeconds(
    download=download_bits / profiles.download_bits_per_second[clients],
    train=np.asarray(examples_trained, dtype=np.float64) * profiles.seconds_per_example[clients],
    upload=upload / profiles.upload_bits_per_second[clients],
  )


def dropped_out(seed: int, round_num: int, clients: np.ndarray, probability: float) -> np.ndarray:
  """``bool[K]``: which selected clients drop out mid-round (each with `probability`, drawn
  from (seed, round, client), so a client's fate does not depend on who else was selected)."""
  if not 0.0 <= probability < 1.0:
    raise ValueError(f'dropout probability must be in [0, 1), got {probability!r}.')
  clients = np.asarray(clients, dtype=np.int64)
  if probability == 0.0 or clients.size == 0:
    return np.zeros(clients.shape, dtype=bool)
  draws = randomness.round_rng(seed, round_num, _DROPOUT_STREAM).random(int(clients.max()) + 1)
  return draws[clients] < probability


class RoundTime(NamedTuple):
  """Which selected clients reach the server, and when the round ends.

  Attributes:
    kept: ``bool[K]``: finished, not dropped out, within the deadline, and among the first
      `target` to finish (ties by cohort order).
    seconds: The round's length: when the last kept client finished, or the deadline when
      fewer than `target` finished by then.
    finish: ``float64[K]``: when each selected client finishes or would have finished
      (``inf`` for a client that dropped out: it never does).
  """

  kept: np.ndarray
  seconds: float
  finish: np.ndarray


def keep_first(
  finish: np.ndarray,
  target: int,
  *,
  deadline: float | None = None,
  dropped: np.ndarray | None = None,
) -> RoundTime:
  """The first `target` clients to finish (``finish[k]`` seconds after the round starts),
  leaving out drop-outs and those after `deadline`; the server stops waiting when it has
  `target` updates or at the deadline.

  Raises:
    ValueError: If `target` is not positive or the deadline not a positive number.
  """
  finish = np.asarray(finish, dtype=np.float64)
  if not (isinstance(target, (int, np.integer)) and target > 0):
    raise ValueError(f'target must be a positive integer, got {target!r}.')
  if deadline is not None and not (np.isfinite(deadline) and deadline > 0):
    raise ValueError(f'deadline must be a positive number of seconds, got {deadline!r}.')
  eligible = np.ones(finish.shape, dtype=bool) if dropped is None else ~np.asarray(dropped, bool)
  if deadline is not None:
    eligible &= finish <= deadline
  order = np.flatnonzero(eligible)[np.argsort(finish[eligible], kind='stable')]
  kept = np.zeros(finish.shape, dtype=bool)
  kept[order[:target]] = True
  if order.size >= target:
    seconds = float(finish[order[target - 1]])
  elif deadline is not None:
    seconds = float(deadline)
  else:  # Everyone who did not drop out, or nobody: the server waited for the last one.
    seconds = float(finish[order[-1]]) if order.size else 0.0
  if dropped is not None:
    finish = np.where(np.asarray(dropped, bool), np.inf, finish)
  return RoundTime(kept, seconds, finish)


def round_seconds(training_phase: float, upload: np.ndarray, uploaded: np.ndarray) -> float:
  """A two-phase round's length (optimal sampling). The server has the kept clients' norms at
  `training_phase` seconds (when the last kept client has its update, or the deadline); then
  the clients that `uploaded` upload at once, ``upload[k]`` seconds each, and the round ends
  with the longest of those uploads (at `training_phase` if nobody uploads)."""
  upload, uploaded = np.asarray(upload, np.float64), np.asarray(uploaded, bool)
  if upload.shape != uploaded.shape:
    raise ValueError(f'{upload.shape[0]} upload times for {uploaded.shape[0]} upload flags.')
  return float(training_phase) + (float(upload[uploaded].max()) if uploaded.any() else 0.0)
