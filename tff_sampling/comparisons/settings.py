"""Typed settings of a comparison: client availability, devices, shared run settings, a sweep.

Frozen dataclasses that the binaries fill from their flags and the rest of
`tff_sampling.comparisons` reads; nothing here reads a flag.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
import dataclasses
import os
from typing import Any

from absl import logging
import numpy as np

from tff_sampling import availability as availability_lib
from tff_sampling import communication
from tff_sampling import devices as devices_lib
from tff_sampling import program
from tff_sampling.runtime import run_dir
from tff_sampling.task import Task

# The FedGS paper's β per availability mode (docs/algorithms.md §3c).
PAPER_AVAILABILITY_BETA = {
  'IDL': 0.0,
  'LN': 0.5,
  'SLN': 0.5,
  'LDF': 0.7,
  'MDF': 0.7,
  'YMF': 0.9,
  'YC': 0.9,
  'HOMO': 0.5,
}


@dataclasses.dataclass(frozen=True)
class AvailabilitySpec:
  """One availability setting (FedGS §3c): mode, β and period."""

  mode: str = 'IDL'
  beta: float = 0.0
  period: int = availability_lib.DEFAULT_PERIOD

  @property
  def label(self) -> str:
    """``'IDL'`` or ``'MODE-β'``, e.g. ``'LN-0.5'`` (names runs and table rows)."""
    return 'IDL' if self.mode == 'IDL' else f'{self.mode}-{self.beta:g}'

  def hparams(self) -> dict[str, Any]:
    return dict(
      availability=self.mode, availability_beta=self.beta, availability_period=self.period
    )

  def build(self, task: Task, seed: int) -> availability_lib.Availability | None:
    """The availability model for `task` and `seed`; ``None`` (everyone) for IDL."""
    if self.mode == 'IDL':
      return None
    return availability_lib.build_availability(
      self.mode,
      self.beta,
      client_sizes=task.client_num_examples,
      client_labels=task.client_label_histograms,
      seed=seed,
      period=self.period,
    )


def parse_availability(
  spec: str, *, beta: float | None = None, period: int = availability_lib.DEFAULT_PERIOD
) -> AvailabilitySpec:
  """Parses ``MODE`` or ``MODE-β``; β defaults to `beta` (``--availability_beta``) or the paper's.

  Raises:
    ValueError: For an unknown mode, an unparsable β, or β given twice.
  """
  mode, _, beta_text = spec.strip().partition('-')
  mode = mode.upper()
  if mode not in availability_lib.AVAILABILITY_MODES:
    raise ValueError(
      f'Unknown --availability mode {mode!r} in {spec!r}; choose from '
      f'{", ".join(availability_lib.AVAILABILITY_MODES)} (optionally MODE-β).'
    )
  if not beta_text:
    return AvailabilitySpec(mode, PAPER_AVAILABILITY_BETA[mode] if beta is None else beta, period)
  try:
    value = float(beta_text)
  except ValueError:
    raise ValueError(
      f'--availability {spec!r}: β {beta_text!r} is not a number; write e.g. LN-0.5.'
    ) from None
  if beta is not None:
    raise ValueError(
      f'--availability {spec!r} sets β and so does --availability_beta={beta}; give it once.'
    )
  return AvailabilitySpec(mode, value, period)


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
  """The clients' devices in every run (`tff_sampling.devices`).

  Attributes:
    profiles: ``'none'`` (no system model: rounds take no simulated time),
      ``'lognormal'`` (`devices.LogNormalDevices`, drawn per seed), or the path
      of a CSV file of per-client values (`devices.read_profiles`).
    target: Updates the server waits for each round (``None``: every selected
      client); select more clients than this to over-commit.
    deadline_seconds: The longest a round waits (``None``: no deadline).
    dropout: Probability that a selected client drops out mid-round.
  """

  profiles: str = 'none'
  target: int | None = None
  deadline_seconds: float | None = None
  dropout: float = 0.0

  def build(
    self, task: Task, seed: int, client_steps: int | None
  ) -> devices_lib.SystemModel | None:
    """The system model of `task`'s run with seed `seed` (``None`` without one). A client
    trains on its examples × the task's epochs, or `client_steps` × its batch size; it
    downloads and uploads the model's float32 parameters."""
    if self.profiles == 'none':
      return None
    n = task.num_clients
    if self.profiles == 'lognormal':
      profiles = devices_lib.LogNormalDevices().draw(n, seed)
    elif os.path.isfile(self.profiles):
      profiles = devices_lib.read_profiles(self.profiles, n)
    else:
      raise ValueError(
        f'--devices={self.profiles}: give none, lognormal, or an existing CSV file of '
        'per-client values.'
      )
    options = task.options
    if client_steps is not None:
      work = np.full(n, float(client_steps * options.get('client_batch_size', 1)))
    else:
      examples = np.asarray(task.client_num_examples, np.float64)
      cap = options.get('max_client_examples')
      if cap:
        examples = np.minimum(examples, cap)
      work = examples * options.get('client_epochs', 1)
    parameters = communication.count_parameters(task.initial_model_weights(seed))
    return devices_lib.SystemModel(
      profiles,
      work,
      model_bits=float(communication.BITS_PER_FLOAT32 * parameters),
      target=self.target,
      deadline_seconds=self.deadline_seconds,
      dropout=self.dropout,
    )


@dataclasses.dataclass(frozen=True)
class ComparisonSettings:
  """What every run of a comparison shares.

  Attributes:
    root_output_dir: Directory of the run directories.
    rounds, eval_every, checkpoint_every, client_steps, client_learning_rate_decay: As
      `program.RunConfig`'s.
    reset: Delete a run's earlier output first (only a directory this project
      created for a run); otherwise an existing run resumes.
    workers, local_workers, clients_per_call: As `program.RunConfig`'s.
    devices: The clients' devices (`DeviceSpec`).
    hparams: Hyper-parameters every run records (e.g. each flag that changes results).
    defaults: The defaults of those of `hparams` that are flags: a run written
      before one was recorded resumes only with it at its default (`run_dir.HParams`).
  """

  root_output_dir: str
  rounds: int
  eval_every: int = 1
  checkpoint_every: int = 1
  client_steps: int | None = None
  client_learning_rate_decay: float | None = None
  reset: bool = False
  workers: tuple[str, ...] = ()
  local_workers: int = 0
  clients_per_call: int | None = None
  devices: DeviceSpec = DeviceSpec()
  hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def run_directory(self, name: str) -> str:
    """``root_output_dir/name`` for a valid run name; emptied first under `reset`.

    Raises:
      ValueError: For a name that is not a plain directory name, or a
        directory to reset that this project did not create.
    """
    path = run_dir.run_path(self.root_output_dir, name)
    if self.reset and run_dir.remove_run(path):
      logging.info('--reset: deleted the earlier run in %s.', path)
    return path

  def run_config(self, name: str, seed: int, hparams: Mapping[str, Any]) -> program.RunConfig:
    """The `RunConfig` of run `name` (its directory reset first under `reset`)."""
    return program.RunConfig(
      output_dir=self.run_directory(name),
      rounds=self.rounds,
      seed=seed,
      client_steps=self.client_steps,
      client_learning_rate_decay=self.client_learning_rate_decay,
      eval_every=self.eval_every,
      checkpoint_every=self.checkpoint_every,
      hparams=hparams,
      workers=self.workers,
      local_workers=self.local_workers,
      clients_per_call=self.clients_per_call,
    )


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A sweep: every method for seeds ``first_seed … first_seed + num_seeds − 1``.

  Run ``(method, seed)`` lives in ``<root_output_dir>/<prefix>_<method>_seed<seed>``.
  """

  prefix: str
  methods: Sequence[str]
  first_seed: int = 0
  num_seeds: int = 1

  @property
  def seeds(self) -> range:
    return range(self.first_seed, self.first_seed + self.num_seeds)

  def run_name(self, method: str, seed: int) -> str:
    return f'{self.prefix}_{method}_seed{seed}'

  def runs(self) -> Iterator[tuple[str, int]]:
    """``(method, seed)`` of every run, method by method."""
    for method in self.methods:
      for seed in self.seeds:
        yield method, seed
