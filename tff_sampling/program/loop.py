"""The round loop: `run_experiment` (see the package docstring for a round's steps)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import randomness
from tff_sampling import run_dir
from tff_sampling import runtime
from tff_sampling import selection_stats
from tff_sampling import workers as workers_lib
from tff_sampling.learning import signals as signals_lib
from tff_sampling.program import checks
from tff_sampling.program import evaluation
from tff_sampling.program import progress
from tff_sampling.program.config import Availability
from tff_sampling.program.config import ExperimentResult
from tff_sampling.program.config import ProgramConfig
from tff_sampling.program.config import UplinkFn
from tff_sampling.samplers import base as samplers_base
from tff_sampling.task import Task


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


def _train_metrics(process_metrics: Mapping[str, Any]) -> dict[str, float]:
  train = process_metrics.get('client_work', {}).get('train', {})
  return collections.OrderedDict(
      (k, float(train[k])) for k in ('loss', 'accuracy') if k in train)


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
    checks.check_plain_process_weighting(sampler, client_weighting, config)
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

  release_manager = directory.release_manager(progress.ProgressReleaseManager(config.rounds))
  loss_probe = None
  if getattr(sampler, 'uses_loss_probe', False):
    loss_probe = signals_lib.build_loss_probe(
        task.model_fn, process.get_model_weights.type_signature.result, task.element_spec)
  # Built last: Keras flips the class of every functional model to its graph-mode
  # (v1) engine whenever a model is built inside a TFF computation, and back when
  # one is built eagerly, so the evaluator's model must come after the process's
  # and the probe's.
  evaluate = evaluation.CentralEvaluator(task)
  model_parameters = communication.count_parameters(
      checks.model_weights_of(process, program_state['process']))
  logging.info('Devices: %s; model parameters: %d; clients: %d.',
               [d.name for d in tf.config.list_logical_devices()],
               model_parameters, population.size)

  slot_data = _takes_slot_client_data(process)

  def datasets(round_num: int, clients: np.ndarray) -> list[tf.data.Dataset]:
    return [task.client_dataset(
        int(c), randomness.client_shuffle_seed(config.seed, round_num, int(c)),
        steps=config.client_steps) for c in clients]

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
    eval_metrics = evaluate(checks.model_weights_of(process, program_state['process']))
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
      current = checks.model_weights_of(process, process_state)
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
    model_weights = checks.model_weights_of(process, process_state)

    uplink = uplink_fn(process_metrics, len(selection.clients))
    round_bits = communication.upload_bits(uplink, model_parameters)
    cumulative_bits += round_bits
    released = collections.OrderedDict(
        round_seconds=time.monotonic() - round_start,
        cohort_size=len(selection.clients),
        availability=collections.OrderedDict(
            active_clients=int(available.sum()), redraws=redraws),
        selection=collections.OrderedDict(
            **selection_stats.selection_metrics(selection, population.num_examples,
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
    checks.check_diverged(round_num, model_weights, released)

    if round_num % config.checkpoint_every == 0 or round_num == config.rounds:
      directory.save(collections.OrderedDict(
          round=np.int64(round_num),
          cumulative_bits=np.int64(cumulative_bits),
          selection_counts=selection_counts.copy(),
          process=process_state,
          sampler=sampler_state), round_num)
      run_dir.write_selection_counts(config.output_dir, task.client_ids,
                                     task.client_num_examples, selection_counts)

  final_round = max(first_round - 1, config.rounds)
  if not eval_metrics:  # Resumed at the very end: report the saved model.
    eval_metrics = evaluate(checks.model_weights_of(process, process_state))
  return ExperimentResult(
      final_round=final_round,
      resumed_from=resumed_from,
      eval_metrics=eval_metrics,
      cumulative_bits=cumulative_bits,
      seconds=time.monotonic() - start,
      model_weights=checks.model_weights_of(process, process_state))
