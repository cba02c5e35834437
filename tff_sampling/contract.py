"""The contract between the round loop, a learning process and a server-side sampler.

Three things cross the boundary between a TFF process and a sampler, and this
module names each once:

* **Client input.** A process built on `tff_sampling.learning.signals` takes,
  per cohort slot, the struct ``<data=dataset, meta=<slot, weight>*>``
  (`CLIENT_INPUT_FIELDS`): the client's dataset, its slot in the cohort and the
  aggregation weight the sampler chose. A plain TFF process takes the dataset.
* **Signals.** Per-slot arrays such a process emits under
  ``metrics['client_work'][SIGNALS]`` and the loop hands to
  ``sampler.observe`` instead of releasing them: `UPDATE_SKETCH`
  (``[cohort, d]`` count sketches of the updates) and `LOSS` (``[cohort]``
  losses of the global model). A sampler lists what it reads in
  ``needs_signals``.
* **Probes.** A measurement a sampler needs *before* it selects (power of
  choice: the global model's loss on some candidates). A sampler names it in
  ``probe_signal``; the loop then passes ``probe=`` (client indices → one value
  per client, a `Probe`) to ``select``.

`check_sampler_process` matches a sampler's needs against what a process
offers, once, before a run writes anything.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
import enum
from typing import Any

import numpy as np
import tensorflow_federated as tff

SIGNALS = 'signals'
UPDATE_SKETCH = 'update_sketch'
LOSS = 'loss'
# The slot's update fingerprint: which slots uploaded under optimal uploads (the round loop's).
UPDATE_FINGERPRINT = 'update_fingerprint'
# Not from the process: under a system model the round loop adds each kept client's seconds.
SECONDS = 'seconds'
CLIENT_INPUT_FIELDS = ('data', 'meta')

# Client indices -> one value per client (e.g. the global model's loss on each).
Probe = Callable[[np.ndarray], np.ndarray]
# The probes the round loop can compute (`tff_sampling.learning.signals.build_loss_probe`).
PROBES = frozenset({LOSS})

__all__ = [
  'CLIENT_INPUT_FIELDS',
  'LOSS',
  'PROBES',
  'Probe',
  'SECONDS',
  'SIGNALS',
  'UPDATE_FINGERPRINT',
  'UPDATE_SKETCH',
  'Uploads',
  'check_sampler_process',
  'emitted_signals',
  'split_signals',
  'takes_client_input',
  'uploads',
]


def _client_member(process: tff.templates.MeasuredProcess):
  return process.next.type_signature.parameter[1].member


def takes_client_input(process: tff.templates.MeasuredProcess) -> bool:
  """Whether `process.next` takes the client-input struct rather than plain datasets."""
  return is_client_input(_client_member(process))


def is_client_input(client_type: tff.Type) -> bool:
  """Whether `client_type` (one client's data) is the client-input struct ``<data, meta>``."""
  return (
    isinstance(client_type, tff.StructType)
    and tuple(name for name, _ in tff.structure.iter_elements(client_type)) == CLIENT_INPUT_FIELDS
  )


def emitted_signals(process: tff.templates.MeasuredProcess) -> frozenset[str]:
  """The names under ``metrics['client_work'][SIGNALS]`` in `process.next`'s result."""
  result = process.next.type_signature.result
  try:
    signals = getattr(result.metrics.member.client_work, SIGNALS)
  except (AttributeError, TypeError, ValueError):
    return frozenset()
  return frozenset(name for name, _ in tff.structure.iter_elements(signals))


class Uploads(enum.StrEnum):
  """What a process's round says of who uploaded (`uploads`)."""

  EVERY_CLIENT = 'every_client'  # Every trained client uploads (no ``aggregator/uploads``).
  PER_SLOT = 'per_slot'  # Some do, and the round says which (update and uploader fingerprints).
  COUNT_ONLY = 'count_only'  # Some do, and the round says how many only.


def uploads(process: tff.templates.MeasuredProcess) -> Uploads:
  """Whether `process`'s clients all upload, and if not, whether its round says which: the
  aggregator's ``uploads`` and ``uploader_fingerprints`` measurements, and the
  `UPDATE_FINGERPRINT` signal (``OptimalSamplingFactory(report_uploaders=True)`` in a process
  built with ``update_fingerprints=True``)."""
  try:
    aggregator = process.next.type_signature.result.metrics.member.aggregator
    names = {name for name, _ in tff.structure.iter_elements(aggregator)}
  except (AttributeError, TypeError, ValueError):
    return Uploads.EVERY_CLIENT
  if 'uploads' not in names:
    return Uploads.EVERY_CLIENT
  if 'uploader_fingerprints' in names and UPDATE_FINGERPRINT in emitted_signals(process):
    return Uploads.PER_SLOT
  return Uploads.COUNT_ONLY


def split_signals(metrics: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, np.ndarray]]:
  """``(metrics without the signals, {signal name: array})`` of one round's metrics."""
  client_work = metrics.get('client_work', {})
  if SIGNALS not in client_work:
    return metrics, {}
  released = collections.OrderedDict(metrics)
  released['client_work'] = collections.OrderedDict(
    (k, v) for k, v in client_work.items() if k != SIGNALS
  )
  return released, {k: np.asarray(v) for k, v in client_work[SIGNALS].items()}


def check_sampler_process(sampler: Any, process: tff.templates.MeasuredProcess) -> None:
  """Raises ValueError unless `process` emits every signal `sampler` reads and its probe exists."""
  name = type(sampler).__name__
  missing = sorted(set(getattr(sampler, 'needs_signals', ())) - emitted_signals(process))
  if missing:
    raise ValueError(
      f'{name} reads the per-client signal(s) {missing}, which the learning process does not '
      'emit: build it with tff_sampling.learning.signals.build_fed_avg_with_signals '
      f'(sketch_size for {UPDATE_SKETCH!r}, client_losses=True for {LOSS!r}).'
    )
  probe = getattr(sampler, 'probe_signal', None)
  if probe is not None and probe not in PROBES:
    raise ValueError(
      f'{name} asks for the probe {probe!r}; the round loop offers {sorted(PROBES)}.'
    )
