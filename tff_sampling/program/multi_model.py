"""Multi-model experiments (`tff_sampling.learning.multi_model`) in the program's round loop.

``S`` tasks share one population of ``N`` clients: client ``i`` of the
population is client ``i`` (in ``client_ids`` order) of every task, so all tasks
must have the same number of clients (`align_clients` cuts larger ones).
Per round ``r``::

    data   = [client_data([task_s.client_dataset(i, shuffle(seed, r, i, s)) for s],
                          i, d_{i,·}) for i in 0..N-1]
    output = process.next(state, data)                 # one TFF call, all N clients
    every `eval_every` rounds: each model on its task's evaluation data

The output directory has the layout of `tff_sampling.program` (hparams.json,
metrics.csv, tensorboard/, checkpoints/), so `tff_sampling.runtime.results` and
`tff_sampling.analysis.plotting` read it; metrics are ``eval/model_<s>/{accuracy,loss}``,
``eval/mean_accuracy`` (the average over models), ``process/…`` (the process's
measurements, per-model vectors as ``…/model_<s>``) and ``uplink/…``. The
program state (round, cumulative uploaded bits, process state: round counter
and models) is checkpointed with `tff.program.FileProgramStateManager`; every
random choice derives from (seed, round, client[, model]), so a resumed run
reproduces the rounds an uninterrupted one would have made.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any, NamedTuple

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import contract
from tff_sampling import program
from tff_sampling import randomness
from tff_sampling import validation
from tff_sampling.learning import multi_model_types
from tff_sampling.task import Task


def align_clients(tasks: Sequence[Task], num_clients: int | None = None) -> list[Task]:
  """The tasks restricted to their first `num_clients` clients (one population).

  Args:
    tasks: The tasks, one per model.
    num_clients: ``N``; ``None`` takes the smallest task's client count.

  Raises:
    ValueError: If a task has fewer than `num_clients` clients (naming it and
      its count), or `num_clients` is not positive.
  """
  if not tasks:
    raise ValueError('No tasks given: a multi-model run needs at least one.')
  smallest = min(task.num_clients for task in tasks)
  if num_clients is None:
    num_clients = smallest
  validation.positive_int('num_clients', num_clients)
  short = [f'{task.name} ({task.num_clients})' for task in tasks if task.num_clients < num_clients]
  if short:
    raise ValueError(
      f'{num_clients} clients requested, but task(s) {", ".join(short)} have fewer; '
      f'lower --clients to at most {smallest}.'
    )
  return [
    dataclasses.replace(
      task,
      client_ids=task.client_ids[:num_clients],
      client_num_examples=np.asarray(task.client_num_examples)[:num_clients],
      client_label_histograms=np.asarray(task.client_label_histograms)[:num_clients],
    )
    for task in tasks
  ]


def check_population(tasks: Sequence[Task]) -> np.ndarray:
  """``int64[N, S]`` example counts of the tasks' shared population.

  Raises:
    ValueError: If the tasks have different client counts (use `align_clients`)
      or some task has no examples on any client.
  """
  counts = [task.num_clients for task in tasks]
  if len(set(counts)) != 1:
    raise ValueError(
      'The tasks must share one population, but their client counts differ: '
      + ', '.join(f'{t.name}: {n}' for t, n in zip(tasks, counts))
      + '; restrict them to a common N with align_clients (--clients).'
    )
  examples = np.stack([np.asarray(t.client_num_examples, np.int64) for t in tasks], axis=1)
  multi_model_types.data_shares(examples)  # Raises for a model without data.
  return examples


class MultiModelResult(NamedTuple):
  """What `train_multi_model` returns.

  Attributes:
    final_round: The last round completed.
    resumed_from: The checkpointed round resumed from, or ``None``.
    eval_metrics: The last evaluation: ``model_<s>`` → {accuracy, loss, …} and
      ``mean_accuracy``.
    cumulative_bits: Total uploaded bits up to `final_round`.
    seconds: Wall-clock time of this invocation's rounds.
    models: The final `tff.learning.models.ModelWeights`, one per task.
  """

  final_round: int
  resumed_from: int | None
  eval_metrics: Mapping[str, Any]
  cumulative_bits: int
  seconds: float
  models: tuple


def _flatten_vectors(measurements: Mapping[str, Any]) -> collections.OrderedDict:
  """Per-model vectors become ``name/model_<s>`` scalars (CSV and TensorBoard want scalars)."""
  flat = collections.OrderedDict()
  for name, value in measurements.items():
    array = np.asarray(value)
    if array.ndim == 1:
      flat[name] = collections.OrderedDict(
        (f'{"model" if name != "secure_variance_ratio" else "steps"}_{k}', array[k].item())
        for k in range(array.shape[0])
      )
    else:
      flat[name] = array.item()
  return flat


def train_multi_model(
  tasks: Sequence[Task], process: tff.templates.MeasuredProcess, config: program.RunConfig
) -> MultiModelResult:
  """Trains (or resumes) a multi-model run through the program's round loop.

  Every client takes part in every round (the process assigns models to
  clients itself), so the run has no sampler: `tff_sampling.program.run_rounds`
  with a `MultiModel` trainer. Workers, resume, checkpoints and metric release
  are the loop's.

  Args:
    tasks: One task per model, sharing one population (`align_clients`).
    process: From `tff_sampling.learning.multi_model.build_multi_model_process`
      over the tasks' ``model_fn`` in the same order.
    config: What the run needs (``client_steps`` cuts every client's
      stream of every task to that many batches).

  Returns:
    A `MultiModelResult`.

  Raises:
    ValueError: For tasks that do not share a population, an unwritable output
      directory, checkpoints from a different configuration, or workers asked
      for a process that cannot be split over them.
    FloatingPointError: If a global model becomes non-finite.
  """
  result = program.run_rounds(MultiModel(tasks, process, config), None, config)
  return MultiModelResult(
    final_round=result.final_round,
    resumed_from=result.resumed_from,
    eval_metrics=result.eval_metrics,
    cumulative_bits=result.cumulative_bits,
    seconds=result.seconds,
    models=tuple(result.model_weights),
  )


class MultiModel:
  """The `tff_sampling.program.trainer.Trainer` of a multi-model process."""

  def __init__(
    self, tasks: Sequence[Task], process: tff.templates.MeasuredProcess, config: program.RunConfig
  ):
    self.tasks, self.process, self.config = list(tasks), process, config
    self.round_computation = process.next  # Clients get datasets from Python.
    self.examples = check_population(tasks)
    self.shares = multi_model_types.data_shares(self.examples)
    self._parameters: list[int] = []
    self._evaluators: list[program.CentralEvaluator] = []

  @property
  def clients(self) -> program.Clients:
    task = self.tasks[0]
    return program.Clients(task.client_ids, self.examples.sum(axis=1), task.client_label_histograms)

  # The process samples its uploads itself and counts them (it runs without devices).
  uploads = contract.Uploads.COUNT_ONLY

  def check(self, sampler) -> None:
    del sampler  # None: run_rounds gives every client every round.

  def initial_state(self) -> Any:
    state = self.process.initialize()
    state['models'] = tuple(
      task.initial_model_weights(self.config.seed + s) for s, task in enumerate(self.tasks)
    )
    return state

  def with_client_learning_rate(self, state: Any, learning_rate: float) -> Any:
    raise ValueError(
      'A client learning-rate decay is not available for multi-model runs (each model has its '
      'own process state); leave client_learning_rate_decay unset.'
    )

  def model_weights(self, state: Any) -> list[tff.learning.models.ModelWeights]:
    return list(state['models'])

  def start(self, state: Any, probe_signal: str | None) -> None:
    if probe_signal is not None:
      raise ValueError(f'A multi-model process offers no {probe_signal!r} probe.')
    # Built after the process: see `SingleModel.start` on Keras engines.
    self._evaluators = [program.CentralEvaluator(task) for task in self.tasks]
    self._parameters = [communication.count_parameters(w) for w in state['models']]
    logging.info(
      'Multi-model run: %d clients, %d models of %s parameters; devices %s.',
      *self.examples.shape,
      self._parameters,
      [d.name for d in tf.config.list_logical_devices()],
    )

  def stop(self) -> None:
    pass  # `start` wrote nothing.

  def probe(self, round_num: int, state: Any):
    raise NotImplementedError('A multi-model process offers no probe (refused in start).')

  def evaluate(self, models) -> collections.OrderedDict:
    metrics: collections.OrderedDict[str, Any] = collections.OrderedDict(
      (f'model_{s}', self._evaluators[s](weights)) for s, weights in enumerate(models)
    )
    metrics['mean_accuracy'] = float(np.mean([m['accuracy'] for m in metrics.values()]))
    metrics['loss'] = float(
      np.mean([metrics[f'model_{s}']['loss'] for s in range(len(self.tasks))])
    )
    metrics['accuracy'] = metrics['mean_accuracy']  # The progress line shows these two.
    return metrics

  def client_data(self, round_num: int, selection) -> list[collections.OrderedDict]:
    """Every client's datasets of every task (the selection is every client)."""
    data = []
    for client in map(int, selection.clients):
      datasets = []
      for s, task in enumerate(self.tasks):
        rng = randomness.round_rng(
          self.config.seed, round_num, randomness.MODEL_SHUFFLE_STREAM, client, s
        )
        datasets.append(
          task.client_dataset(
            client,
            int(rng.integers(2**31 - 1)),
            steps=self.config.client_steps if self.examples[client, s] else None,
          )
        )
      data.append(multi_model_types.client_data(datasets, client, self.shares[client]))
    return data

  def round_output(
    self, output: tff.templates.MeasuredProcessOutput, cohort_size: int
  ) -> program.RoundOutput:
    del cohort_size  # Every client; the process reports its own cohort.
    measurements = output.measurements
    uploads = np.asarray(measurements['uploads'], np.int64)
    extra = int(measurements['extra_scalars_per_client']) * int(measurements['cohort_size'])
    return program.RoundOutput(
      uplink=communication.Uplink(model_uploads=int(uploads.sum()), extra_scalars=extra),
      round_bits=communication.BITS_PER_FLOAT32 * (int(np.dot(uploads, self._parameters)) + extra),
      released=collections.OrderedDict(process=_flatten_vectors(measurements)),
      signals={},
    )
