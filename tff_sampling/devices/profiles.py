"""Each client's device: seconds to train on one example, and download and upload bandwidths;
drawn once per run from log-normal distributions (`LogNormalDevices`) or read from a file of
per-client values (`read_profiles`)."""

from __future__ import annotations

import csv
import dataclasses
import math
from typing import NamedTuple

import numpy as np

from tff_sampling import randomness
from tff_sampling import validation

# `randomness.round_rng(seed, 0, _PROFILE_STREAM)`: round 0 is never a training round.
_PROFILE_STREAM = 2001
COLUMNS = ('seconds_per_example', 'download_bits_per_second', 'upload_bits_per_second')


class DeviceProfiles(NamedTuple):
  """Per-client device values, ``float64[N]`` each, all positive and finite.

  Attributes:
    seconds_per_example: Seconds of local training per example (forward and
      backward pass), so a client's training time is its examples trained ×
      this.
    download_bits_per_second: Its downlink bandwidth (the model it receives).
    upload_bits_per_second: Its uplink bandwidth (what it uploads).
  """

  seconds_per_example: np.ndarray
  download_bits_per_second: np.ndarray
  upload_bits_per_second: np.ndarray

  @property
  def size(self) -> int:
    return int(self.seconds_per_example.shape[0])


def _checked(values, num_clients: int, source: str) -> DeviceProfiles:
  arrays = [np.asarray(v, dtype=np.float64) for v in values]
  for name, array in zip(COLUMNS, arrays):
    if array.shape != (num_clients,):
      raise ValueError(f'{source}: {name} has shape {array.shape}, expected ({num_clients},).')
    bad = np.flatnonzero(~(np.isfinite(array) & (array > 0)))
    if bad.size:
      raise ValueError(
        f'{source}: {name} of client {bad[0]} is {array[bad[0]]!r}; every value must be a '
        'positive finite number.'
      )
  return DeviceProfiles(*arrays)


@dataclasses.dataclass(frozen=True)
class LogNormalDevices:
  """Log-normal device values: each is ``median × exp(σ Z)``, ``Z ~ N(0, 1)``, independent
  across clients and across the three values. ``docs/devices.md`` says where the defaults
  come from."""

  median_seconds_per_example: float = 0.01
  compute_sigma: float = 0.8
  median_download_bits_per_second: float = 20e6
  download_sigma: float = 1.0
  median_upload_bits_per_second: float = 5e6
  upload_sigma: float = 1.0

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not field.name.endswith('sigma'):
        validation.positive_number(field.name, value)
      elif not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f'{field.name} must be a non-negative number, got {value!r}.')

  def draw(self, num_clients: int, seed: int) -> DeviceProfiles:
    """The `num_clients` devices of a run with seed `seed` (the same for every method)."""
    validation.positive_int('num_clients', num_clients)
    z = randomness.round_rng(seed, 0, _PROFILE_STREAM).standard_normal((3, num_clients))
    medians = (
      self.median_seconds_per_example,
      self.median_download_bits_per_second,
      self.median_upload_bits_per_second,
    )
    sigmas = (self.compute_sigma, self.download_sigma, self.upload_sigma)
    values = [m * np.exp(s * row) for m, s, row in zip(medians, sigmas, z)]
    return _checked(values, num_clients, 'LogNormalDevices')


def read_profiles(path: str, num_clients: int) -> DeviceProfiles:
  """Per-client values from a CSV file: a header naming `COLUMNS` (any order, other columns
  ignored), then one row per client, in client order.

  Raises:
    ValueError: If a column is missing, the file has not `num_clients` rows, or a value is
      not a positive finite number (each message names the file, the value and the fix).
  """
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
      raise ValueError(
        f'{path}: no column {", ".join(missing)}; the header must name {", ".join(COLUMNS)}.'
      )
    rows = list(reader)
  if len(rows) != num_clients:
    raise ValueError(f'{path}: {len(rows)} rows of clients for a population of {num_clients}.')
  values = []
  for column in COLUMNS:
    parsed = []
    for i, row in enumerate(rows):
      try:
        parsed.append(float(row[column]))
      except (TypeError, ValueError):
        raise ValueError(
          f'{path}: {column} of client {i} is {row[column]!r}, not a number.'
        ) from None
    values.append(parsed)
  return _checked(values, num_clients, path)
