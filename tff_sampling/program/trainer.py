"""What the round loop trains: a TFF process with its task(s), behind one interface.

The loop (`tff_sampling.program.loop.run_rounds`) owns everything a round has
in common: availability, the sampler, resume and checkpoints, metric release,
evaluation cadence, uploaded-bit totals, divergence checks and TFF workers. A
`Trainer` owns what depends on the process: its initial state, where the model
weights are, what each client receives, what a round uploaded and which of its
metrics are released. `SingleModel` trains one `tff.learning` process on one
task; `tff_sampling.program.multi_model.MultiModel` trains several models on
one population (MMFL).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import dataclasses
import os
import shutil
from typing import Any, NamedTuple, Protocol

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import communication
from tff_sampling import contract
from tff_sampling import randomness
from tff_sampling.learning import signals as signals_lib
from tff_sampling.program import checks
from tff_sampling.program import client_feed
from tff_sampling.program import evaluation
from tff_sampling.program.config import RunConfig
from tff_sampling.program.config import UplinkFn
from tff_sampling.samplers import base as samplers_base
from tff_sampling.task import Task

# The folder of a run's directory holding the clients' example files while the run lasts.
FEED_FOLDER = 'client_data'


class RoundOutput(NamedTuple):
  """What the loop needs of one round's process output.

  Attributes:
    uplink: What the clients uploaded.
    round_bits: The same in bits.
    released: The process's metrics to release, by section (e.g. ``train``,
      ``process``).
    signals: Per-client signals for ``sampler.observe`` (`tff_sampling.contract`).
    uploaded: ``bool[K]``, which cohort slots uploaded, when the process says
      (`contract.Uploads.PER_SLOT`); ``None`` otherwise.
  """

  uplink: communication.Uplink
  round_bits: int
  released: Mapping[str, Any]
  signals: Mapping[str, np.ndarray]
  uploaded: np.ndarray | None = None


class Clients(NamedTuple):
  """The population a trainer's process trains on.

  Attributes:
    ids: Client ids, in index order.
    num_examples: ``int64[N]`` examples per client (the sampler's `Population`).
    label_histograms: ``[N, C]`` label counts per client, for the selection
      metrics.
    num_classes: The task's classes, for the check that a run learns more than
      chance (None: no such check).
  """

  ids: Sequence[str]
  num_examples: np.ndarray
  label_histograms: np.ndarray
  num_classes: int | None = None


class Trainer(Protocol):
  """What `run_rounds` trains (see the module docstring)."""

  process: tff.templates.MeasuredProcess

  @property
  def round_computation(self) -> tff.Computation:
    """What runs once per round on ``(state, client_data(...))``: ``process.next``, or
    that composed with the task's client feed (after `start`)."""

  @property
  def clients(self) -> Clients:
    """The population."""

  @property
  def uploads(self) -> contract.Uploads:
    """Whether every trained client uploads, and if not, whether a round says which."""

  def check(self, sampler: samplers_base.Sampler | None) -> None:
    """Raises ValueError if `sampler` cannot drive this process (before anything is written)."""

  def initial_state(self) -> Any:
    """The process state holding the initial model(s)."""

  def model_weights(self, state: Any) -> Any:
    """The global model(s) in `state`: `check_diverged`'s and `evaluate`'s argument."""

  def with_client_learning_rate(self, state: Any, learning_rate: float) -> Any:
    """`state` with the clients' learning rate set (ValueError where it cannot be)."""

  def start(self, state: Any, probe_signal: str | None) -> None:
    """Builds the probe (if asked), the evaluators and what feeds the clients' data
    (in the run's directory, if anything); logs what is trained."""

  def stop(self) -> None:
    """Removes what `start` wrote for the run's duration (when the run ends, however)."""

  def probe(self, round_num: int, state: Any) -> contract.Probe:
    """The round's pre-selection probe of the current model (after `start` built it)."""

  def evaluate(self, model_weights: Any) -> Mapping[str, Any]:
    """Central evaluation metrics (``loss`` and ``accuracy`` among them)."""

  def client_data(self, round_num: int, selection: samplers_base.Selection) -> list[Any]:
    """What each selected client receives in round `round_num`."""

  def round_output(self, output: Any, cohort_size: int) -> RoundOutput:
    """Uploads, released metrics and signals of one round's process output."""


def _train_metrics(process_metrics: Mapping[str, Any]) -> dict[str, float]:
  train = process_metrics.get('client_work', {}).get('train', {})
  return collections.OrderedDict((k, float(train[k])) for k in ('loss', 'accuracy') if k in train)


@dataclasses.dataclass
class SingleModel:
  """One `tff.learning` process on one task (see `tff_sampling.program.train_model`)."""

  task: Task
  process: tff.learning.templates.LearningProcess
  config: RunConfig
  uplink_fn: UplinkFn = communication.full_cohort_uplink
  client_weighting: tff.learning.ClientWeighting | None = None

  def __post_init__(self):
    self._client_input = contract.takes_client_input(self.process)
    self._parameters = 0
    self._loss_probe: tff.Computation | None = None  # Built by `start`.
    self._evaluate: evaluation.CentralEvaluator | None = None  # Built by `start`.
    self._feed: client_feed.ClientFeed | None = None  # Built by `start`.

  @property
  def round_computation(self) -> tff.Computation:
    if self._feed is None:
      return self.process.next
    return self._feed.compose(self.process.next)

  @property
  def clients(self) -> Clients:
    return Clients(
      self.task.client_ids,
      np.asarray(self.task.client_num_examples),
      self.task.client_label_histograms,
      self.task.num_classes,
    )

  @property
  def uploads(self) -> contract.Uploads:
    return contract.uploads(self.process)

  def check(self, sampler: samplers_base.Sampler | None) -> None:
    contract.check_sampler_process(sampler, self.process)
    if not self._client_input:
      checks.check_plain_process_weighting(sampler, self.client_weighting, self.config)

  def initial_state(self) -> Any:
    state = self.process.initialize()
    return self.process.set_model_weights(state, self.task.initial_model_weights(self.config.seed))

  def model_weights(self, state: Any) -> tff.learning.models.ModelWeights:
    return checks.model_weights_of(self.process, state)

  def with_client_learning_rate(self, state: Any, learning_rate: float) -> Any:
    """`state` with the clients' learning rate set, through TFF's ``set_hparams``.

    Raises:
      ValueError: If the process has no ``client_work`` learning rate in its
        hyper-parameters.
    """
    hparams = self.process.get_hparams(state)
    client_work = hparams.get('client_work') if isinstance(hparams, Mapping) else None
    if not isinstance(client_work, Mapping) or 'learning_rate' not in client_work:
      raise ValueError(
        'A client learning-rate decay needs a process whose get_hparams() holds '
        "['client_work']['learning_rate'] (TFF's FedAvg builders and this project's do); "
        f'this one has {hparams!r}.'
      )
    client_work = dict(client_work, learning_rate=np.float32(learning_rate))
    return self.process.set_hparams(state, dict(hparams, client_work=client_work))

  def start(self, state: Any, probe_signal: str | None) -> None:
    if not self.config.workers:  # Remote workers cannot read this machine's data.
      self._feed = client_feed.ClientFeed.build(
        self.task, self.config.client_steps, os.path.join(self.config.output_dir, FEED_FOLDER)
      )
    if probe_signal is not None:  # contract.LOSS, the only probe (checked).
      self._loss_probe = signals_lib.build_loss_probe(
        self.task.model_fn,
        self.process.get_model_weights.type_signature.result,
        self.task.element_spec,
      )
      if self._feed is not None:
        self._loss_probe = self._feed.compose(self._loss_probe)
    # Built last: Keras flips the class of every functional model to its
    # graph-mode (v1) engine whenever a model is built inside a TFF computation,
    # and back when one is built eagerly, so the evaluator's model must come
    # after the process's and the probe's.
    self._evaluate = evaluation.CentralEvaluator(self.task)
    self._parameters = communication.count_parameters(self.model_weights(state))
    logging.info(
      'Devices: %s; model parameters: %d; clients: %d.',
      [d.name for d in tf.config.list_logical_devices()],
      self._parameters,
      self.task.num_clients,
    )

  def stop(self) -> None:
    self._feed = None
    shutil.rmtree(os.path.join(self.config.output_dir, FEED_FOLDER), ignore_errors=True)

  def probe(self, round_num: int, state: Any) -> contract.Probe:
    weights = self.model_weights(state)

    def losses(clients: np.ndarray) -> np.ndarray:
      data = self._client_inputs(round_num, clients, [1.0] * len(clients))
      assert self._loss_probe is not None  # `start` built it.
      return np.asarray(self._loss_probe(weights, data))

    return losses

  def evaluate(self, model_weights: Any) -> Mapping[str, Any]:
    assert self._evaluate is not None  # `start` built it.
    return self._evaluate(model_weights)

  def _seeds(self, round_num: int, clients: np.ndarray) -> list[int]:
    return [randomness.client_shuffle_seed(self.config.seed, round_num, int(c)) for c in clients]

  def _datasets(self, round_num: int, clients: np.ndarray) -> list[Any]:
    """Each client's training stream for the round (its reference, with a feed)."""
    seeds = self._seeds(round_num, clients)
    if self._feed is not None:
      return self._feed.references(clients, seeds)
    return [
      self.task.client_dataset(int(c), seed, steps=self.config.client_steps)
      for c, seed in zip(clients, seeds)
    ]

  def _client_inputs(self, round_num: int, clients: np.ndarray, weights: Sequence[float]) -> list:
    """The signals' client input for the round: slot ``k`` gets client ``clients[k]``'s
    stream and ``weights[k]`` (their references, with a feed)."""
    if self._feed is not None:
      return self._feed.references(clients, self._seeds(round_num, clients), weights)
    return signals_lib.selection_client_data(self._datasets(round_num, clients), weights)

  def client_data(self, round_num: int, selection: samplers_base.Selection) -> list[Any]:
    if not self._client_input:
      if selection.weights is not None and self.client_weighting is None:
        raise ValueError(
          f'The sampler returned aggregation weights in round {round_num} that '
          'the plain TFF process would drop; declare its weighting '
          '(samplers.weighting) or use a process built on '
          'tff_sampling.learning.signals.'
        )
      return self._datasets(round_num, selection.clients)
    weights = selection.weights
    if weights is None:  # The sampler leaves weighting to FedAvg: example counts.
      weights = np.asarray(self.task.client_num_examples)[selection.clients]
    return self._client_inputs(round_num, selection.clients, [float(w) for w in weights])

  def round_output(
    self, output: tff.learning.templates.LearningProcessOutput, cohort_size: int
  ) -> RoundOutput:
    process_metrics, signals = contract.split_signals(output.metrics)
    uploaded = None
    if contract.UPDATE_FINGERPRINT in signals:
      slots = signals.pop(contract.UPDATE_FINGERPRINT)
      aggregator = collections.OrderedDict(process_metrics['aggregator'])
      uploaded = communication.uploaded_slots(slots, aggregator.pop('uploader_fingerprints'))
      process_metrics = collections.OrderedDict(process_metrics, aggregator=aggregator)
    uplink = self.uplink_fn(process_metrics, cohort_size)
    return RoundOutput(
      uplink=uplink,
      round_bits=communication.upload_bits(uplink, self._parameters),
      released=collections.OrderedDict(
        train=_train_metrics(process_metrics), process=process_metrics
      ),
      signals=signals,
      uploaded=uploaded,
    )
