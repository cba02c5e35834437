"""Uploaded-bits accounting (client → server traffic).

The papers compare methods per uploaded bit: a round costs

    model_uploads × model_parameters × bits_per_value  +  extra_scalars × bits_per_value

where ``model_uploads`` counts the clients that sent a model-sized update this round
and ``extra_scalars`` counts every other value clients sent (e.g. the norm and the
rescaling sums of the optimal-sampling protocol, with the cohort count and the
diagnostic flags: ``10 + 2·max_rescaling_steps`` per cohort client, 18 at the default 4
steps; ``OptimalSamplingFactory.extra_scalars_per_client`` counts them). Downloads are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

BITS_PER_FLOAT32 = 32


class Uplink(NamedTuple):
  """What clients uploaded in one round.

  Attributes:
    model_uploads: Clients that uploaded a model-sized update.
    extra_scalars: Total number of other scalars uploaded by all clients.
  """

  model_uploads: int
  extra_scalars: int = 0


class PreprocessingBits(NamedTuple):
  """What a one-time pre-processing round (before round 1) transferred.

  Attributes:
    upload_bits: Bits all clients uploaded (e.g. LEFL's soft labels).
    download_bits: Bits sent to clients beyond the usual model broadcast
      (e.g. LEFL's public dataset); downloads are not in the cumulative
      uploaded bits.
  """

  upload_bits: int
  download_bits: int = 0


def count_parameters(model_weights: Any) -> int:
  """Number of scalars in the trainable part of `model_weights`.

  Args:
    model_weights: A `tff.learning.models.ModelWeights`, or any nest of arrays
      (all of it is counted).
  """
  trainable = getattr(model_weights, 'trainable', model_weights)
  return int(sum(np.size(t) for t in tf.nest.flatten(trainable)))


def upload_bits(
  uplink: Uplink, model_parameters: int, *, bits_per_value: int = BITS_PER_FLOAT32
) -> int:
  """Bits uploaded in one round (see the module docstring)."""
  if uplink.model_uploads < 0 or uplink.extra_scalars < 0:
    raise ValueError(f'Uplink counts must be non-negative, got {uplink}.')
  if model_parameters <= 0:
    raise ValueError(f'model_parameters must be positive, got {model_parameters}.')
  return int(bits_per_value) * (
    int(uplink.model_uploads) * int(model_parameters) + int(uplink.extra_scalars)
  )


def full_cohort_uplink(process_metrics: Mapping[str, Any], cohort_size: int) -> Uplink:
  """Uplink of a plain FedAvg/FedSGD round: every cohort client uploads its update.

  This is the default ``uplink_fn`` of the program loop; processes whose clients
  upload selectively (optimal sampling) provide their own, reading their
  measurements.
  """
  del process_metrics  # Plain FedAvg sends nothing else.
  return Uplink(model_uploads=int(cohort_size), extra_scalars=0)


def uplink_from_measurements(process_metrics: Mapping[str, Any], cohort_size: int) -> Uplink:
  """The ``uplink_fn`` of processes that aggregate with optimal sampling
  (`tff_sampling.aggregators.OptimalSamplingFactory`): what the aggregator measured,
  ``aggregator/uploads`` and ``aggregator/extra_scalars_per_client``."""
  aggregator = process_metrics['aggregator']
  return Uplink(
    model_uploads=int(aggregator['uploads']),
    extra_scalars=int(aggregator['extra_scalars_per_client']) * int(cohort_size),
  )


def uploaded_slots(slot_fingerprints: np.ndarray, uploader_fingerprints: np.ndarray) -> np.ndarray:
  """``bool[K]``: which cohort slots uploaded, from each slot's update fingerprint and the
  uploaders' (a multiset, in any order; `tff_sampling.aggregators.protocol.update_fingerprint`).

  Slots with identical updates (e.g. clients that trained on nothing) share a fingerprint;
  as many of them as uploaded are marked, in slot order.

  Raises:
    ValueError: If an uploader's fingerprint matches no slot not already marked.
  """
  slots = np.asarray(slot_fingerprints, np.int64).reshape(-1)
  uploaded = np.zeros(slots.shape, dtype=bool)
  values, counts = np.unique(np.asarray(uploader_fingerprints, np.int64), return_counts=True)
  for value, count in zip(values, counts):
    matches = np.flatnonzero(slots == value)
    if matches.size < count:
      raise ValueError(
        f'{count} upload(s) with fingerprint {value} but {matches.size} cohort slot(s) with it.'
      )
    uploaded[matches[:count]] = True
  return uploaded
