"""The round loop: `run_rounds`, and `train_model` for one `tff.learning` process.

See the package docstring for a round's steps; `tff_sampling.program.trainer`
for what the loop leaves to the process's side.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import contextlib
import time
from typing import Any

from absl import logging
import numpy as np
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import contract
from tff_sampling import devices as devices_lib
from tff_sampling import selection_stats
from tff_sampling.program import checks
from tff_sampling.program import progress
from tff_sampling.program.config import Availability
from tff_sampling.program.config import RunConfig
from tff_sampling.program.config import RunResult
from tff_sampling.program.config import UplinkFn
from tff_sampling.program.trainer import RoundOutput
from tff_sampling.program.trainer import SingleModel
from tff_sampling.program.trainer import Trainer
from tff_sampling.runtime import results
from tff_sampling.runtime import run_dir
from tff_sampling.runtime import sync
from tff_sampling.runtime import tff_context
from tff_sampling.runtime import workers as workers_lib
from tff_sampling.samplers import base as samplers_base
from tff_sampling.task import Task


def train_model(
  task: Task,
  process: tff.learning.templates.LearningProcess,
  sampler: samplers_base.Sampler,
  config: RunConfig,
  *,
  uplink_fn: UplinkFn = communication.full_cohort_uplink,
  availability: Availability | None = None,
  preprocessing_bits: communication.PreprocessingBits | None = None,
  client_weighting: tff.learning.ClientWeighting | None = None,
  release_managers: Sequence[tff.program.ReleaseManager] = (),
  devices: devices_lib.SystemModel | None = None,
) -> RunResult:
  """Trains (or resumes) the run `config` describes.

  Args:
    task: The task (data, model, evaluation data).
    process: A learning process whose ``next`` takes one entry per cohort slot:
      the client's dataset, or, for processes built on
      `tff_sampling.learning.signals`, the client-input struct of
      `tff_sampling.contract` (dataset, slot, the sampler's weight: ``n_k``
      when the sampler leaves weighting to the process). Such processes'
      per-client signals are handed to ``sampler.observe`` and not released
      as metrics.
    sampler: Chooses each round's clients.
    config: What the run needs (`RunConfig`).
    uplink_fn: ``(process_metrics, cohort_size) -> Uplink`` counting what the
      round's clients uploaded; the default counts one model per cohort client.
    availability: Which clients are active each round; every sampler selects
      among them only (default: everyone, every round). The number of active
      clients and of redraws go to the metrics under ``availability/``.
    preprocessing_bits: What a one-time pre-processing round before round 1
      cost (e.g. LEFL's soft labels): its upload starts the cumulative
      uploaded bits (round 0's ``uplink/round_bits``), its download goes to
      round 0's ``downlink/preprocessing_bits``.
    client_weighting: For a plain TFF process (not built on
      `tff_sampling.learning.signals`), the ``client_weighting`` it was built
      with. Needed, and checked once before anything is written, when the
      sampler sets aggregation weights (`samplers.weighting`): a plain process
      cannot receive them, so they hold only if its own weighting reproduces
      them (e.g. ``UNIFORM`` for MD sampling's ``1/m``).
    release_managers: Where each round's metrics also go (keyed by round),
      beside the run directory's ``metrics.csv``, TensorBoard and the
      progress line (e.g. a `tff.program.MemoryReleaseManager`).
    devices: The clients' devices (`tff_sampling.devices.SystemModel`): each
      round keeps the selected clients that finish first (within its deadline,
      not dropped out) and releases the round's simulated seconds under
      ``system/`` (``round_seconds``, ``cumulative_seconds``, ``selected``,
      ``dropped``). A kept client's weight is rescaled so that the kept
      weights sum to what the selection's did. The sampler observes the kept
      clients, with the others in ``selection.missed``.

  Returns:
    An `RunResult`.

  Raises:
    ValueError: For an unwritable output directory, checkpoints written by a
      different configuration, a sampler that cannot serve the population, a
      sampler whose weights the process would drop or whose signals it does
      not emit, or workers asked for a process that cannot be split over them.
    FloatingPointError: If the global model becomes non-finite.
  """
  trainer = SingleModel(task, process, config, uplink_fn, client_weighting)
  return run_rounds(
    trainer,
    sampler,
    config,
    availability=availability,
    preprocessing_bits=preprocessing_bits,
    release_managers=release_managers,
    devices=devices,
  )


def run_rounds(
  trainer: Trainer,
  sampler: samplers_base.Sampler | None,
  config: RunConfig,
  *,
  availability: Availability | None = None,
  preprocessing_bits: communication.PreprocessingBits | None = None,
  release_managers: Sequence[tff.program.ReleaseManager] = (),
  devices: devices_lib.SystemModel | None = None,
) -> RunResult:
  """Runs (or resumes) the rounds of `trainer`'s process; see `train_model`.

  Args:
    trainer: The process and its task(s) (`tff_sampling.program.trainer`).
    sampler: Chooses each round's clients; ``None`` gives every client every
      round to a process that samples among them itself (e.g. MMFL), and
      releases no ``selection/``, ``availability/`` or ``cohort_size``.
    config: What the run needs (`RunConfig`).
    availability: Which clients are active each round (needs a sampler).
    preprocessing_bits: What a one-time pre-processing round cost.
    release_managers: Where each round's metrics also go.
    devices: The clients' devices (needs a sampler; see `train_model`).

  Returns:
    An `RunResult`.
  """
  if sampler is None and availability is not None:
    raise ValueError('availability needs a sampler to select among the active clients.')
  if sampler is None and devices is not None:
    raise ValueError('devices need a sampler: a process that samples by itself keeps every client.')
  trainer.check(sampler)  # Before anything is written.
  num_clients = len(trainer.clients.num_examples)
  if devices is not None and trainer.uploads == contract.Uploads.COUNT_ONLY:
    raise ValueError(
      'devices time each upload, but this process says only how many clients uploaded: build '
      'its OptimalSamplingFactory with report_uploaders=True and the process with '
      'tff_sampling.learning.signals.build_fed_avg_with_signals(update_fingerprints=True).'
    )
  if devices is not None and devices.num_clients != num_clients:
    raise ValueError(
      f'The system model has {devices.num_clients} devices for a population of {num_clients} '
      'clients; give one device a client.'
    )
  # Before any worker starts: switching TFF's context stops the workers it ran.
  tff_context.use_secure_sum_simulation()  # Secure-sum aggregators need it; harmless otherwise.
  pool = None
  if config.workers or config.local_workers:
    workers_lib.check_splittable(
      trainer.process.next, f'The learning process of {config.output_dir}'
    )
    pool = config.worker_pool()  # Reachable workers, or an error before anything is written.
    assert pool is not None  # The config asks for workers.
    logging.info(
      "Each round's clients are split over %d TFF workers: %s.",
      pool.size,
      ', '.join(pool.addresses),
    )
  with (
    pool or contextlib.nullcontext(),
    run_dir.RunDirectory(config.output_dir, config.keep_checkpoints) as directory,
  ):
    return _Rounds(
      directory,
      release_managers,
      trainer,
      sampler,
      config,
      availability,
      preprocessing_bits,
      pool,
      devices,
    ).run()


class _Rounds:
  """`run_rounds`'s loop, inside the claimed and locked run directory."""

  def __init__(
    self,
    directory: run_dir.RunDirectory,
    release_managers: Sequence[tff.program.ReleaseManager],
    trainer: Trainer,
    sampler: samplers_base.Sampler | None,
    config: RunConfig,
    availability: Availability | None,
    preprocessing_bits: communication.PreprocessingBits | None,
    pool,
    devices: devices_lib.SystemModel | None = None,
  ):
    self.directory, self.release_managers = directory, release_managers
    self.trainer, self.sampler, self.config = trainer, sampler, config
    self.availability, self.preprocessing_bits, self.pool = availability, preprocessing_bits, pool
    self.preprocessing = preprocessing_bits or communication.PreprocessingBits(0, 0)
    self.clients = trainer.clients
    self.population = samplers_base.Population(num_examples=np.asarray(self.clients.num_examples))
    self._initial_client_learning_rate = 0.0  # η₀ of a decaying rate, read by `run`.
    self.devices = devices

  def _initial_state(self) -> collections.OrderedDict:
    state: collections.OrderedDict[str, Any] = collections.OrderedDict(
      round=np.int64(0), cumulative_bits=np.int64(self.preprocessing.upload_bits)
    )
    if self.sampler is not None:
      state['selection_counts'] = np.zeros(self.population.size, np.int64)
    state['process'] = self.trainer.initial_state()
    if self.sampler is not None:
      state['sampler'] = self.sampler.initialize(self.population)
    if self.devices is not None:
      # Whole microseconds: a checkpoint keeps an int64 exactly (a float64 comes back float32).
      state['cumulative_microseconds'] = np.int64(0)
    return state

  def run(self) -> RunResult:
    """Resumes or starts, then trains the remaining rounds."""
    state, resumed_from = self.directory.resume(self.config.hparams, self._initial_state())
    self.release_manager = self.directory.release_manager(
      progress.ProgressReleaseManager(self.config.rounds), *self.release_managers
    )
    self.trainer.start(state['process'], getattr(self.sampler, 'probe_signal', None))
    try:
      return self._train(state, resumed_from)
    finally:
      self.trainer.stop()

  def _train(self, state, resumed_from: int | None) -> RunResult:
    """Trains the rounds after `state`'s (the trainer started)."""
    if self.config.client_learning_rate_decay is not None:
      # η₀, the process's own rate, read from a fresh state (a resumed state holds a decayed one).
      initial_hparams = self.trainer.process.get_hparams(self.trainer.process.initialize())
      self._initial_client_learning_rate = float(initial_hparams['client_work']['learning_rate'])
    first_round = int(state['round']) + 1
    eval_metrics: Mapping[str, Any] = {}
    if first_round == 1:
      eval_metrics = self._round_zero(state)
    monitor = checks.LearningMonitor(
      self.config.output_dir, self.trainer.clients.num_classes, self._initial_loss(eval_metrics)
    )
    start = time.monotonic()
    for round_num in range(first_round, self.config.rounds + 1):
      state, released = self._round(round_num, state)
      if 'eval' in released:
        eval_metrics = released['eval']
        monitor.after_evaluation(round_num, eval_metrics)
    model_weights = self.trainer.model_weights(state['process'])
    if not eval_metrics:  # Resumed at the very end: report the saved model.
      eval_metrics = self.trainer.evaluate(model_weights)
    elif first_round <= self.config.rounds:
      monitor.at_end(self.config.rounds, eval_metrics)
    return RunResult(
      final_round=max(first_round - 1, self.config.rounds),
      resumed_from=resumed_from,
      eval_metrics=eval_metrics,
      cumulative_bits=int(state['cumulative_bits']),
      seconds=time.monotonic() - start,
      model_weights=model_weights,
    )

  def _initial_loss(self, round_zero: Mapping[str, Any]) -> float | None:
    """The initial model's evaluation loss: this run's round 0, or a resumed run's."""
    if 'loss' in round_zero:
      return float(np.asarray(round_zero['loss']))
    try:
      loss = results.load_run(self.config.output_dir).column('eval/loss')
    except (FileNotFoundError, KeyError, ValueError):
      return None
    return float(loss[0]) if loss.size and np.isfinite(loss[0]) else None

  def _round_zero(self, state) -> Mapping[str, Any]:
    """Releases the initial model's evaluation (and the pre-processing's bits)."""
    eval_metrics = self.trainer.evaluate(self.trainer.model_weights(state['process']))
    bits = self.preprocessing.upload_bits
    released = collections.OrderedDict(
      eval=eval_metrics, uplink=collections.OrderedDict(round_bits=bits, cumulative_bits=bits)
    )
    if self.preprocessing_bits is not None:
      released['downlink'] = collections.OrderedDict(
        preprocessing_bits=self.preprocessing.download_bits
      )
    sync.run(self.release_manager.release(released, 0))
    return eval_metrics

  def _active_clients(self, round_num: int) -> tuple[np.ndarray, int]:
    everyone = np.ones(self.population.size, dtype=bool)
    if self.availability is None:
      return everyone, 0
    mask, redraws = self.availability.active(round_num)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != everyone.shape or not mask.any():
      raise ValueError(
        f'Availability for round {round_num} must be a non-empty mask over '
        f'{self.population.size} clients, got shape {mask.shape} with '
        f'{int(mask.sum())} active.'
      )
    return mask, int(redraws)

  def _select(self, round_num: int, state, available: np.ndarray) -> samplers_base.Selection:
    """The sampler's selection among the active clients (every client without a sampler)."""
    if self.sampler is None:
      return samplers_base.Selection(clients=np.arange(self.population.size))
    if self.sampler.probe_signal is not None:
      probe = self.trainer.probe(round_num, state['process'])
      selection = self.sampler.select(state['sampler'], round_num, available, probe=probe)
    else:
      selection = self.sampler.select(state['sampler'], round_num, available)
    if not np.all(available[selection.clients]):
      raise RuntimeError(
        f'{type(self.sampler).__name__} selected inactive clients in round '
        f'{round_num}: {selection.clients[~available[selection.clients]]}.'
      )
    return selection

  def _round(self, round_num: int, state) -> tuple[collections.OrderedDict, Mapping[str, Any]]:
    """Trains, releases and (when due) checkpoints round `round_num`."""
    round_start = time.monotonic()
    learning_rate = None
    if self.config.client_learning_rate_decay is not None:
      decay = self.config.client_learning_rate_decay
      learning_rate = self._initial_client_learning_rate * decay ** (round_num - 1)
      state = collections.OrderedDict(
        state, process=self.trainer.with_client_learning_rate(state['process'], learning_rate)
      )
    available, redraws = self._active_clients(round_num)
    selection = self._select(round_num, state, available)
    timed = None
    if self.devices is not None:
      selected = len(selection.clients)
      selection, timed = self._keep(round_num, selection)
    process_state, result = self._train_cohort(round_num, state['process'], selection)
    system = None
    if timed is not None:
      elapsed = int(state['cumulative_microseconds'])
      system, elapsed, kept_seconds = self._time(timed, selected, selection, result, elapsed)
      state = collections.OrderedDict(state, cumulative_microseconds=np.int64(elapsed))
      # Each kept client's seconds, for a sampler that reads them (Oort).
      result = result._replace(signals={**result.signals, contract.SECONDS: kept_seconds})
    state = collections.OrderedDict(state, round=np.int64(round_num), process=process_state)
    state['cumulative_bits'] = np.int64(int(state['cumulative_bits']) + result.round_bits)
    released: collections.OrderedDict[str, Any] = collections.OrderedDict(
      round_seconds=time.monotonic() - round_start
    )
    if learning_rate is not None:
      released['client_learning_rate'] = learning_rate
    if self.sampler is not None:
      state['selection_counts'] = state['selection_counts'] + np.bincount(
        np.asarray(selection.clients, np.int64), minlength=self.population.size
      )
      state['sampler'] = self.sampler.observe(state['sampler'], selection, result.signals)
      released.update(self._selection_metrics(selection, available, redraws))
    released['uplink'] = collections.OrderedDict(
      model_uploads=result.uplink.model_uploads,
      extra_scalars=result.uplink.extra_scalars,
      round_bits=result.round_bits,
      cumulative_bits=int(state['cumulative_bits']),
    )
    if system is not None:
      released['system'] = system
    released.update(result.released)
    model_weights = self.trainer.model_weights(state['process'])
    if round_num % self.config.eval_every == 0 or round_num == self.config.rounds:
      released['eval'] = self.trainer.evaluate(model_weights)
    sync.run(self.release_manager.release(released, round_num))
    checks.check_diverged(round_num, model_weights, released)
    if round_num % self.config.checkpoint_every == 0 or round_num == self.config.rounds:
      self.directory.save(state, round_num)
      if self.sampler is not None:
        run_dir.write_selection_counts(
          self.config.output_dir,
          self.clients.ids,
          self.clients.num_examples,
          state['selection_counts'],
        )
    return state, released

  def _train_cohort(self, round_num: int, process_state, selection: samplers_base.Selection):
    """The process state after round `round_num` on the `selection`'s clients, and what the
    loop needs of its output (a round whose every client was dropped trains nothing)."""
    if len(selection.clients) == 0:
      empty = RoundOutput(communication.Uplink(0), 0, collections.OrderedDict(), {})
      return process_state, empty
    data = self.trainer.client_data(round_num, selection)
    next_fn = self.trainer.round_computation
    output = (
      next_fn(process_state, data)
      if self.pool is None
      else self.pool.run(next_fn, process_state, data)
    )
    return output.state, self.trainer.round_output(output, len(selection.clients))

  def _keep(self, round_num: int, selection: samplers_base.Selection):
    """The selected clients that reach the server under the system model (weights rescaled
    to the selection's total; the others in ``missed``), and the round's times
    (`devices.RoundTime`)."""
    assert self.devices is not None
    timed = self.devices.round(
      self.config.seed,
      round_num,
      selection.clients,
      uploads_after_training=self.trainer.uploads == contract.Uploads.PER_SLOT,
    )
    weights = selection.weights
    if weights is not None:
      kept_total = float(np.sum(weights[timed.kept]))
      scale = float(np.sum(weights)) / kept_total if kept_total > 0 else 1.0
      weights = (np.asarray(weights[timed.kept], np.float64) * scale).astype(np.float32)
    missed = samplers_base.Missed(selection.clients[~timed.kept], timed.finish[~timed.kept])
    kept = selection._replace(clients=selection.clients[timed.kept], weights=weights, missed=missed)
    return kept, timed

  def _time(self, timed, selected: int, kept: samplers_base.Selection, result, elapsed: int):
    """The round's ``system/`` metrics, the simulated microseconds elapsed after it (`elapsed`
    before it), and each kept client's seconds; a two-phase round (`result.uploaded`) adds
    its uploads to the training phase's times."""
    assert self.devices is not None
    seconds, kept_seconds = timed.seconds, timed.finish[timed.kept]
    if result.uploaded is not None:
      upload = self.devices.upload_seconds(kept.clients)
      seconds = devices_lib.round_seconds(seconds, upload, result.uploaded)
      kept_seconds = kept_seconds + np.where(result.uploaded, upload, 0.0)
    elapsed += round(seconds * 1e6)
    metrics = collections.OrderedDict(
      round_seconds=seconds,
      cumulative_seconds=elapsed / 1e6,
      selected=selected,
      dropped=selected - len(kept.clients),
    )
    return metrics, elapsed, kept_seconds

  def _selection_metrics(
    self, selection: samplers_base.Selection, available: np.ndarray, redraws: int
  ) -> collections.OrderedDict:
    """The released ``cohort_size``, ``availability/…`` and ``selection/…`` of a round."""
    return collections.OrderedDict(
      cohort_size=len(selection.clients),
      availability=collections.OrderedDict(active_clients=int(available.sum()), redraws=redraws),
      selection=collections.OrderedDict(
        **selection_stats.selection_metrics(
          selection, self.population.num_examples, self.clients.label_histograms
        ),
        **(selection.diagnostics or {}),
      ),
    )
