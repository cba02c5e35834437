"""What a run of the round loop is given: `RunConfig`, and what it returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any, NamedTuple, Protocol

import numpy as np

from tff_sampling import communication
from tff_sampling import validation
from tff_sampling.runtime import run_dir
from tff_sampling.runtime import workers as workers_lib

RESUMABLE_HPARAMS = run_dir.RESUMABLE_HPARAMS

UplinkFn = Callable[[Mapping[str, Any], int], communication.Uplink]


class Availability(Protocol):
  """Which clients can take part in a round (e.g. `tff_sampling.availability`)."""

  def active(self, round_num: int) -> tuple[np.ndarray, int]:
    """``(bool[N] mask, redraws)``, deterministic in the round; never all-false."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything the round loop needs for one run.

  Attributes:
    output_dir: Directory of this run's results and checkpoints.
    rounds: Total number of training rounds (> 0).
    seed: Root of every random choice of the program and its sampler.
    eval_every: Evaluate every this many rounds (and always at the last round).
    checkpoint_every: Save program state every this many rounds (and at the
      last round).
    keep_checkpoints: Number of saved versions kept (the first is kept too).
    client_steps: If set, every client takes exactly this many local batches
      per round (its stream cycled and cut: `Task.client_dataset`'s
      ``steps``); ``None`` keeps the task's epochs.
    hparams: Flat JSON-serialisable hyper-parameters, written to
      ``hparams.json``; resuming with different values (other than
      `RESUMABLE_HPARAMS`) is an error.
    workers: ``host:port`` addresses of running TFF workers; each round's
      clients are split over them (`tff_sampling.runtime.workers.WorkerPool`).
    local_workers: Start this many TFF workers on this machine for the run
      instead (0: one process, TFF's default). Neither changes the results
      beyond floating-point summation order, so neither is a hyper-parameter
      and a run may resume with other workers.
    clients_per_call: With workers, cut each round into slices of at most
      this many clients run in turn, which bounds a worker's memory for large
      cohorts (`WorkerPool`'s ``clients_per_call``).
    client_learning_rate_decay: If set, ``γ`` in (0, 1]: round ``t`` trains
      with the client learning rate ``η₀ · γ^(t−1)`` (FedGS's schedule, γ =
      0.998), set through the process's ``set_hparams`` (TFF's own
      hyper-parameter API: ``hparams['client_work']['learning_rate']``), so
      any `tff.learning` process that exposes it works.
  """

  output_dir: str
  rounds: int
  seed: int = 0
  eval_every: int = 1
  checkpoint_every: int = 1
  keep_checkpoints: int = 3
  client_steps: int | None = None
  hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  workers: tuple[str, ...] = ()
  local_workers: int = 0
  clients_per_call: int | None = None
  client_learning_rate_decay: float | None = None

  def __post_init__(self):
    names = ('rounds', 'eval_every', 'checkpoint_every', 'keep_checkpoints')
    for name in names + (('client_steps',) if self.client_steps is not None else ()):
      validation.positive_int(name, getattr(self, name))
    if not self.output_dir:
      raise ValueError('output_dir must be a non-empty path.')
    if (
      not isinstance(self.local_workers, (int, np.integer))
      or isinstance(self.local_workers, bool)
      or self.local_workers < 0
    ):
      raise ValueError(f'local_workers must be a non-negative integer, got {self.local_workers!r}.')
    if self.workers and self.local_workers:
      raise ValueError(
        f'Give either worker addresses ({list(self.workers)}) or a number of local '
        f'workers ({self.local_workers}), not both.'
      )
    for address in self.workers:
      workers_lib.check_address(address)
    decay = self.client_learning_rate_decay
    if decay is not None and not (
      isinstance(decay, (int, float, np.floating))
      and not isinstance(decay, bool)
      and 0 < decay <= 1
    ):
      raise ValueError(f'client_learning_rate_decay must be in (0, 1] (e.g. 0.998), got {decay!r}.')
    if self.clients_per_call is not None:
      if not self.workers and not self.local_workers:
        raise ValueError(
          f'clients_per_call={self.clients_per_call} needs workers to run the '
          f'slices: give worker addresses or local_workers (e.g. 1).'
        )
      validation.positive_int('clients_per_call', self.clients_per_call)

  def worker_pool(self) -> workers_lib.WorkerPool | None:
    """The pool of TFF workers this config asks for (``None``: one process)."""
    if self.workers:
      return workers_lib.WorkerPool(self.workers, clients_per_call=self.clients_per_call)
    if self.local_workers:
      return workers_lib.WorkerPool.start_local(
        self.local_workers, clients_per_call=self.clients_per_call
      )
    return None


class RunResult(NamedTuple):
  """What `train_model` returns.

  Attributes:
    final_round: The last round completed.
    resumed_from: The checkpointed round this invocation resumed from, or
      ``None`` for a fresh start.
    eval_metrics: The last evaluation (``loss``, ``accuracy``, …).
    cumulative_bits: Total uploaded bits up to `final_round`.
    seconds: Wall-clock time of this invocation's rounds.
    model_weights: The final global `tff.learning.models.ModelWeights`.
  """

  final_round: int
  resumed_from: int | None
  eval_metrics: Mapping[str, float]
  cumulative_bits: int
  seconds: float
  model_weights: Any
