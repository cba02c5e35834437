"""The experiment program: the round loop every binary shares.

Per round ``r = 1, 2, …``::

    selection  = sampler.select(sampler_state, r, available)     # server side
    datasets   = [task.client_dataset(c, shuffle_seed(seed, r, c)) for c in selection]
    output     = process.next(process_state, datasets)           # one TFF call
    sampler_state = sampler.observe(sampler_state, selection, signals)

(a power-of-choice sampler first asks a *loss probe* computation for its
candidates' losses; processes built on `tff_sampling.learning.signals` get
each dataset together with its slot and the sampler's weight, and return the
per-client ``signals`` that `observe` receives.)
    release metrics (CSV keyed by round, TensorBoard, a progress line)
    every `checkpoint_every` rounds: save the program state

Round 0 is the evaluation of the initial model (nothing uploaded). Metrics go
through `tff.program` release managers and the program state (process state,
sampler state, round, cumulative uploaded bits, how often each client was
selected) through
`tff.program.FileProgramStateManager`, which writes each version to a temporary
directory first, so a run killed at any point resumes from its last complete
checkpoint. Every random choice derives from (seed, round[, client]), so the
resumed run reproduces the rounds an uninterrupted run would have made. When a
run resumes, the CSV manager drops rows written after the checkpoint (they are
recomputed identically), so no round appears twice and none is lost.

Output directory layout::

    <output_dir>/hparams.json     hyper-parameters (compared on resume)
    <output_dir>/metrics.csv      one row per round, '/'-joined column names
    <output_dir>/tensorboard/     the same metrics for TensorBoard
    <output_dir>/checkpoints/     program_state_<round>/ (SavedModel format)
    <output_dir>/selection_counts.csv  client_id, num_examples, selection_count
                                  (as of the last checkpoint)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling.task import Task
from tff_sampling import communication
from tff_sampling import randomness
from tff_sampling import results
from tff_sampling import run_dir
from tff_sampling import runtime
from tff_sampling import workers as workers_lib
from tff_sampling.learning import signals as signals_lib
from tff_sampling.samplers import base as samplers_base
from tff_sampling.samplers import weighting
from tff_sampling.samplers import lefl

RESUMABLE_HPARAMS = run_dir.RESUMABLE_HPARAMS

UplinkFn = Callable[[Mapping[str, Any], int], communication.Uplink]


class Availability(Protocol):
  """Which clients can take part in a round (e.g. `tff_sampling.availability`)."""

  def active(self, round_num: int) -> tuple[np.ndarray, int]:
    """``(bool[N] mask, redraws)``, deterministic in the round; never all-false."""


@dataclasses.dataclass(frozen=True)
class ProgramConfig:
  """How to run an experiment.

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
      clients are split over them (`tff_sampling.workers.WorkerPool`).
    local_workers: Start this many TFF workers on this machine for the run
      instead (0: one process, TFF's default). Neither changes the results
      beyond floating-point summation order, so neither is a hyper-parameter
      and a run may resume with other workers.
    clients_per_call: With workers, cut each round into slices of at most
      this many clients run in turn, which bounds a worker's memory for large
      cohorts (`WorkerPool`'s ``clients_per_call``).
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

  def __post_init__(self):
    names = ('rounds', 'eval_every', 'checkpoint_every', 'keep_checkpoints')
    for name in names + (('client_steps',) if self.client_steps is not None else ()):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f'{name} must be a positive integer, got {value!r}.')
    if not self.output_dir:
      raise ValueError('output_dir must be a non-empty path.')
    if (not isinstance(self.local_workers, (int, np.integer)) or isinstance(self.local_workers, bool)
        or self.local_workers < 0):
      raise ValueError(f'local_workers must be a non-negative integer, got {self.local_workers!r}.')
    if self.workers and self.local_workers:
      raise ValueError(f'Give either worker addresses ({list(self.workers)}) or a number of local '
                       f'workers ({self.local_workers}), not both.')
    for address in self.workers:
      workers_lib.check_address(address)
    if self.clients_per_call is not None:
      if not self.workers and not self.local_workers:
        raise ValueError(f'clients_per_call={self.clients_per_call} needs workers to run the '
                         f'slices: give worker addresses or local_workers (e.g. 1).')
      if (not isinstance(self.clients_per_call, (int, np.integer))
          or isinstance(self.clients_per_call, bool) or self.clients_per_call < 1):
        raise ValueError(f'clients_per_call must be a positive integer, got '
                         f'{self.clients_per_call!r}.')

  def worker_pool(self) -> workers_lib.WorkerPool | None:
    """The pool of TFF workers this config asks for (``None``: one process)."""
    if self.workers:
      return workers_lib.WorkerPool(self.workers, clients_per_call=self.clients_per_call)
    if self.local_workers:
      return workers_lib.WorkerPool.start_local(self.local_workers,
                                                clients_per_call=self.clients_per_call)
    return None


class ExperimentResult(NamedTuple):
  """What `run_experiment` returns.

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


class CentralEvaluator:
  """Evaluates global model weights on the task's centralised evaluation data.

  The Keras model and a compiled evaluation step are built once and the batched
  evaluation data is cached after the first pass, so repeated evaluations only
  pay for the forward passes. The loop is our own rather than
  ``Model.evaluate``: Keras swaps the training engine of *all* functional
  models to its v1 (graph) class once any model is built in a graph, which TFF
  computations do, and that engine's ``evaluate`` differs.
  """

  def __init__(self, task: Task):
    self._model = task.keras_model_fn(0)
    self._loss = task.loss_fn()
    self._metrics = list(task.metrics_fn())
    self._data = task.preprocess_eval(task.eval_data).cache()

    @tf.function(reduce_retracing=True)  # The last batch is usually smaller.
    def step(batch):
      predictions = self._model(batch['x'], training=False)
      for metric in self._metrics:
        metric.update_state(batch['y'], predictions)
      count = tf.cast(tf.shape(batch['y'])[0], tf.float32)
      return tf.cast(self._loss(batch['y'], predictions), tf.float32) * count, count

    self._step = step

  def __call__(self, model_weights: tff.learning.models.ModelWeights) -> dict[str, float]:
    model_weights.assign_weights_to(self._model)
    for metric in self._metrics:
      metric.reset_state()
    loss_sum, count = 0.0, 0.0
    for batch in self._data:
      batch_loss, batch_count = self._step(batch)
      loss_sum += float(batch_loss)
      count += float(batch_count)
    results = {metric.name: float(metric.result()) for metric in self._metrics}
    results['loss'] = loss_sum / max(count, 1.0)
    return collections.OrderedDict(sorted(results.items()))


class ProgressReleaseManager(tff.program.ReleaseManager):
  """Logs one line per round: round, seconds, ETA, loss, accuracy, bits."""

  def __init__(self, total_rounds: int):
    self._total_rounds = total_rounds
    self._round_seconds: list[float] = []

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    parts = [f'round {key:>{len(str(self._total_rounds))}}/{self._total_rounds}']
    if 'round_seconds' in value:
      seconds = float(value['round_seconds'])
      self._round_seconds.append(seconds)
      eta = float(np.median(self._round_seconds)) * (self._total_rounds - key)
      parts.append(f'{seconds:6.2f}s  ETA {_format_duration(eta)}')
    train = value.get('train', {})
    if 'loss' in train:
      parts.append(f'train loss {train["loss"]:.4f} acc {train.get("accuracy", math.nan):.4f}')
    evaluation = value.get('eval', {})
    if 'accuracy' in evaluation:
      parts.append(f'eval loss {evaluation["loss"]:.4f} acc {evaluation["accuracy"]:.4f}')
    uplink = value.get('uplink', {})
    if 'cumulative_bits' in uplink:
      parts.append(f'uploaded {float(uplink["cumulative_bits"]):.3g} bits')
    logging.info(' | '.join(parts))


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


client_shuffle_seed = randomness.client_shuffle_seed


def _takes_slot_client_data(process: tff.learning.templates.LearningProcess) -> bool:
  """Whether clients get ``signals.client_data`` structs (slot, weight) or plain datasets."""
  member = process.next.type_signature.parameter[1].member
  return isinstance(member, tff.StructType) and 'meta' in dir(member)


def _split_signals(process_metrics: Mapping[str, Any]):
  """Separates the per-client signals (for the sampler) from the released metrics."""
  client_work = process_metrics.get('client_work', {})
  if 'signals' not in client_work:
    return process_metrics, {}
  released = collections.OrderedDict(process_metrics)
  released['client_work'] = collections.OrderedDict(
      (k, v) for k, v in client_work.items() if k != 'signals')
  return released, {k: np.asarray(v) for k, v in client_work['signals'].items()}


def selection_metrics(selection: samplers_base.Selection, num_examples: np.ndarray,
                      label_histograms: np.ndarray) -> dict[str, float]:
  """Analysis metrics of one round's selection.

  * ``distinct_clients``.
  * ``distinct_labels`` represented in the selected clients' data (from the
    task's label histograms: analysis only, no sampler sees them).
  * ``weight_variance``: ``Σ_i (ω_i − p_i)²`` over all clients, where ``ω_i`` is
    client i's total aggregation weight this round (the sampler's weights summed
    over its slots, or FedAvg's ``n_k / Σ_S n`` when the sampler leaves weighting
    to the process; 0 when not selected) and ``p_i = n_i / M`` its importance.
    For unbiased schemes its expectation is ``Σ_i Var(ω_i)``, the quantity
    clustered sampling reduces (Fraboni et al., MD: ``Σ p_i (1 − p_i) / m``).
  * ``label_kl``: the relative entropy ``KL(q ‖ p)`` (nats) of the label
    distribution ``q`` of the selected clients' pooled data (each client once)
    to the population's ``p`` (LEFL's analysis metric,
    `samplers.lefl.label_distribution_kl`).
  """
  clients = np.asarray(selection.clients)
  sizes = np.asarray(num_examples, np.float64)
  slot_weights = (np.asarray(selection.weights, np.float64) if selection.weights is not None
                  else sizes[clients] / max(sizes[clients].sum(), 1.0))
  realised = np.zeros(sizes.size)
  np.add.at(realised, clients, slot_weights)
  histograms = np.asarray(label_histograms, np.float64)
  selected = histograms[np.unique(clients)].sum(axis=0)
  return collections.OrderedDict(
      distinct_clients=int(np.unique(clients).size),
      distinct_labels=int(np.count_nonzero(selected)),
      weight_variance=float(np.sum((realised - sizes / sizes.sum()) ** 2)),
      label_kl=lefl.label_distribution_kl(selected, histograms.sum(axis=0)))


def _write_selection_counts(output_dir: str, task: Task, counts: np.ndarray) -> None:
  """Writes how often each client was selected so far (duplicates counted).

  Rewritten at every checkpoint from the checkpointed counts, so after a
  resume it continues from the same values.
  """
  path = os.path.join(output_dir, results.SELECTION_COUNTS_FILENAME)
  with open(path + '.tmp', 'w') as f:
    f.write('client_id,num_examples,selection_count\n')
    for client_id, size, count in zip(task.client_ids, task.client_num_examples, counts):
      f.write(f'{client_id},{int(size)},{int(count)}\n')
  os.replace(path + '.tmp', path)


def _train_metrics(process_metrics: Mapping[str, Any]) -> dict[str, float]:
  train = process_metrics.get('client_work', {}).get('train', {})
  return collections.OrderedDict(
      (k, float(train[k])) for k in ('loss', 'accuracy') if k in train)


def model_weights_of(process: tff.learning.templates.LearningProcess, state: Any):
  """``process.get_model_weights(state)``, read from the state where it holds them.

  States of processes composed by TFF (`tff.learning.templates.LearningAlgorithmState`,
  e.g. every FedAvg variant here) carry ``global_model_weights``, which is what
  their ``get_model_weights`` computation returns. Reading the field saves a TFF
  call per round (3-4 ms on ``digits``, where a round takes ~50 ms; about 1 s
  for the first call after `runtime.use_secure_sum_simulation` switches TFF's
  context). Other states go through the computation.
  """
  weights = getattr(state, 'global_model_weights', None)
  if isinstance(weights, tff.learning.models.ModelWeights):
    return weights
  return process.get_model_weights(state)


def _leaves(value: Any, path: str = ''):
  """``(path, value)`` of every leaf of a nested mapping of metrics."""
  if isinstance(value, Mapping):
    for key, child in value.items():
      yield from _leaves(child, f'{path}/{key}' if path else str(key))
  else:
    yield path, value


def check_diverged(round_num: int, model_weights: Any = None,
                   released: Mapping[str, Any] | None = None) -> None:
  """Stops a diverging run: raises FloatingPointError naming the round and the sign.

  Signs of divergence: a global model (one `ModelWeights` or a sequence of
  them) with a non-finite weight; a released ``loss`` (training or evaluation)
  that is not finite; or a ``…non_finite…`` measurement above 0, as TFF's
  optimizer finalizer reports (``update_non_finite``) when it refuses a
  non-finite aggregate and keeps the old model, which would otherwise let the
  run go on without learning.
  """
  models = (list(model_weights) if isinstance(model_weights, list) else [model_weights])
  signs = []
  for s, weights in enumerate(m for m in models if m is not None):
    if not all(np.all(np.isfinite(t)) for t in tf.nest.flatten(weights.trainable)):
      signs.append('the global model has non-finite weights' if len(models) == 1
                   else f'global model {s} has non-finite weights')
  for path, value in _leaves(released or {}):
    name = path.rsplit('/', 1)[-1]
    try:
      number = float(np.asarray(value))
    except (TypeError, ValueError):
      continue
    if name == 'loss' and not math.isfinite(number):
      signs.append(f'{path} = {number}')
    elif 'non_finite' in name and number > 0:
      signs.append(f'{path} = {number:g} (the aggregated update was not finite)')
  if signs:
    raise FloatingPointError(
        f'The run diverged in round {round_num}: {"; ".join(signs)}. The run stops here (the '
        'rows so far are in metrics.csv). The learning rate is the likely cause: lower the '
        'client or server learning rate (or check the data for non-finite values).')


def _check_plain_process_weighting(sampler: samplers_base.Sampler, client_weighting,
                                   config: ProgramConfig) -> None:
  """Raises unless a plain TFF process applies the sampler's aggregation weights."""
  if not weighting.sampler_sets_weights(sampler):
    return
  if client_weighting is None:
    raise ValueError(
        f'{type(sampler).__name__} sets aggregation weights, which a plain TFF process (one not '
        'built on tff_sampling.learning.signals) cannot receive: build it with client_weighting='
        f'{weighting.required_client_weighting(sampler)} and pass the same client_weighting to '
        'run_experiment, or build it with signals.build_fedavg_with_signals.')
  weighting.check_fed_avg_weighting(sampler, client_weighting,
                                    fixed_local_steps=config.client_steps is not None)


def run_experiment(
    task: Task,
    process: tff.learning.templates.LearningProcess,
    sampler: samplers_base.Sampler,
    config: ProgramConfig,
    *,
    uplink_fn: UplinkFn = communication.full_cohort_uplink,
    availability: Availability | None = None,
    preprocessing_bits: communication.PreprocessingBits | None = None,
    client_weighting: tff.learning.ClientWeighting | None = None,
) -> ExperimentResult:
  """Runs (or resumes) the experiment described by `config`.

  Args:
    task: The task (data, model, evaluation data).
    process: A learning process whose ``next`` takes one entry per cohort slot:
      the client's dataset, or, for processes built on
      `tff_sampling.learning.signals` (detected from the type signature), the
      dataset with the slot and the sampler's weight (``n_k`` when the sampler
      leaves weighting to the process). Such processes' per-client signals
      are handed to ``sampler.observe`` and not released as metrics.
    sampler: Chooses each round's clients.
    config: The run's configuration.
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

  Returns:
    An `ExperimentResult`.

  Raises:
    ValueError: For an unwritable output directory, checkpoints written by a
      different configuration, a sampler that cannot serve the population, a
      sampler whose weights the process would drop, or workers asked for a
      process that cannot be split over them.
    FloatingPointError: If the global model becomes non-finite.
  """
  preprocessing = preprocessing_bits or communication.PreprocessingBits(0, 0)
  if not _takes_slot_client_data(process):  # Before anything is written.
    _check_plain_process_weighting(sampler, client_weighting, config)
  # Before any worker starts: switching TFF's context stops the workers it ran.
  runtime.use_secure_sum_simulation()  # Secure-sum aggregators need it; harmless otherwise.
  pool = None
  if config.workers or config.local_workers:
    workers_lib.check_splittable(process.next, f'The learning process of {config.output_dir}')
    pool = config.worker_pool()  # Reachable workers, or an error before anything is written.
    logging.info('Each round\'s clients are split over %d TFF workers: %s.', pool.size,
                 ', '.join(pool.addresses))
  with pool or contextlib.nullcontext(), run_dir.RunDirectory(
      config.output_dir, config.keep_checkpoints) as directory:
    return _run(directory, task, process, sampler, config, uplink_fn, availability,
                preprocessing_bits, preprocessing, client_weighting, pool)


def _run(directory, task, process, sampler, config, uplink_fn, availability,
         preprocessing_bits, preprocessing, client_weighting, pool) -> ExperimentResult:
  """`run_experiment`'s loop, inside the claimed and locked run directory."""
  population = samplers_base.Population(num_examples=np.asarray(task.client_num_examples))
  process_state = process.initialize()
  process_state = process.set_model_weights(
      process_state, task.initial_model_weights(config.seed))
  program_state, resumed_from = directory.resume(config.hparams, collections.OrderedDict(
      round=np.int64(0),
      cumulative_bits=np.int64(preprocessing.upload_bits),
      selection_counts=np.zeros(population.size, np.int64),
      process=process_state,
      sampler=sampler.initialize(population)))

  release_manager = directory.release_manager(ProgressReleaseManager(config.rounds))
  loss_probe = None
  if getattr(sampler, 'uses_loss_probe', False):
    loss_probe = signals_lib.build_loss_probe(
        task.model_fn, process.get_model_weights.type_signature.result, task.element_spec)
  # Built last: Keras flips the class of every functional model to its graph-mode
  # (v1) engine whenever a model is built inside a TFF computation, and back when
  # one is built eagerly, so the evaluator's model must come after the process's
  # and the probe's.
  evaluate = CentralEvaluator(task)
  model_parameters = communication.count_parameters(
      model_weights_of(process, program_state['process']))
  logging.info('Devices: %s; model parameters: %d; clients: %d.',
               [d.name for d in tf.config.list_logical_devices()],
               model_parameters, population.size)

  slot_data = _takes_slot_client_data(process)

  def datasets(round_num: int, clients: np.ndarray) -> list[tf.data.Dataset]:
    return [task.client_dataset(int(c), client_shuffle_seed(config.seed, round_num, int(c)),
                                steps=config.client_steps)
            for c in clients]

  def client_data(round_num: int, selection: samplers_base.Selection) -> list[Any]:
    if not slot_data:
      if selection.weights is not None and client_weighting is None:
        raise ValueError(f'{type(sampler).__name__} returned aggregation weights in round '
                         f'{round_num} that the plain TFF process would drop; declare its '
                         'weighting (samplers.weighting) or use a process built on '
                         'tff_sampling.learning.signals.')
      return datasets(round_num, selection.clients)
    weights = selection.weights
    if weights is None:  # The sampler leaves weighting to FedAvg: example counts.
      weights = population.num_examples[selection.clients]
    return signals_lib.selection_client_data(datasets(round_num, selection.clients),
                                             [float(w) for w in weights])

  def probe_losses(round_num: int, model_weights, clients: np.ndarray) -> np.ndarray:
    probe_data = signals_lib.selection_client_data(datasets(round_num, clients),
                                                   [1.0] * len(clients))
    return np.asarray(loss_probe(model_weights, probe_data))

  first_round = int(program_state['round']) + 1
  eval_metrics: Mapping[str, float] = {}
  if first_round == 1:
    eval_metrics = evaluate(model_weights_of(process, program_state['process']))
    round_zero = collections.OrderedDict(
        eval=eval_metrics,
        uplink=collections.OrderedDict(round_bits=preprocessing.upload_bits,
                                       cumulative_bits=preprocessing.upload_bits))
    if preprocessing_bits is not None:
      round_zero['downlink'] = collections.OrderedDict(
          preprocessing_bits=preprocessing.download_bits)
    asyncio.run(release_manager.release(round_zero, 0))

  process_state = program_state['process']
  sampler_state = program_state['sampler']
  cumulative_bits = int(program_state['cumulative_bits'])
  selection_counts = np.array(program_state['selection_counts'], np.int64)
  all_available = np.ones(population.size, dtype=bool)

  def active_clients(round_num: int) -> tuple[np.ndarray, int]:
    if availability is None:
      return all_available, 0
    mask, redraws = availability.active(round_num)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != all_available.shape or not mask.any():
      raise ValueError(f'Availability for round {round_num} must be a non-empty mask over '
                       f'{population.size} clients, got shape {mask.shape} with '
                       f'{int(mask.sum())} active.')
    return mask, int(redraws)

  def next_round(state, data):
    return process.next(state, data) if pool is None else pool.run(process.next, state, data)

  start = time.monotonic()
  for round_num in range(first_round, config.rounds + 1):
    round_start = time.monotonic()
    available, redraws = active_clients(round_num)
    if loss_probe is not None:
      current = model_weights_of(process, process_state)
      selection = sampler.select(
          sampler_state, round_num, available,
          loss_probe=lambda clients: probe_losses(round_num, current, clients))
    else:
      selection = sampler.select(sampler_state, round_num, available)
    if not np.all(available[selection.clients]):
      raise RuntimeError(f'{type(sampler).__name__} selected inactive clients in round '
                         f'{round_num}: {selection.clients[~available[selection.clients]]}.')
    output = next_round(process_state, client_data(round_num, selection))
    process_state = output.state
    np.add.at(selection_counts, np.asarray(selection.clients, np.int64), 1)
    process_metrics, round_signals = _split_signals(output.metrics)
    sampler_state = sampler.observe(sampler_state, selection, round_signals)
    model_weights = model_weights_of(process, process_state)

    uplink = uplink_fn(process_metrics, len(selection.clients))
    round_bits = communication.upload_bits(uplink, model_parameters)
    cumulative_bits += round_bits
    released = collections.OrderedDict(
        round_seconds=time.monotonic() - round_start,
        cohort_size=len(selection.clients),
        availability=collections.OrderedDict(
            active_clients=int(available.sum()), redraws=redraws),
        selection=collections.OrderedDict(
            **selection_metrics(selection, population.num_examples,
                                task.client_label_histograms),
            **(selection.diagnostics or {})),
        train=_train_metrics(process_metrics),
        uplink=collections.OrderedDict(
            model_uploads=uplink.model_uploads,
            extra_scalars=uplink.extra_scalars,
            round_bits=round_bits,
            cumulative_bits=cumulative_bits),
        process=process_metrics)
    if round_num % config.eval_every == 0 or round_num == config.rounds:
      eval_metrics = evaluate(model_weights)
      released['eval'] = eval_metrics
    asyncio.run(release_manager.release(released, round_num))
    check_diverged(round_num, model_weights, released)

    if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
      directory.save(collections.OrderedDict(
          round=np.int64(round_num),
          cumulative_bits=np.int64(cumulative_bits),
          selection_counts=selection_counts.copy(),
          process=process_state,
          sampler=sampler_state), round_num)
      _write_selection_counts(config.output_dir, task, selection_counts)

  final_round = max(first_round - 1, config.rounds)
  if not eval_metrics:  # Resumed at the very end: report the saved model.
    eval_metrics = evaluate(model_weights_of(process, process_state))
  return ExperimentResult(
      final_round=final_round,
      resumed_from=resumed_from,
      eval_metrics=eval_metrics,
      cumulative_bits=cumulative_bits,
      seconds=time.monotonic() - start,
      model_weights=model_weights_of(process, process_state))
