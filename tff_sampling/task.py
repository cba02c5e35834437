"""The task interface: one object holding everything a run needs.

Built by the `tasks` package (`tasks.get_task`); consumed by the program loop.

A task bundles the federated training data, centralised evaluation data, the
preprocessing, a Keras model builder with *seeded* initialisers, and per-client
statistics (example counts; label histograms, which are for analysis and for
simulating label-dependent availability only -- no sampler may read them unless it
is documented as an oracle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling import validation

# The options of every client's training stream, built in Python (`Task.client_dataset`) or
# inside TFF's worker (`tff_sampling.program.client_feed`): tf.data's static rewrites off. Each
# iterator made of a dataset otherwise runs Grappler over the dataset's graph: in TFF's worker
# once per client and call, for a stream of a few dozen batches. Turning the rewrites off
# changes one stream only: tf.data fuses a seeded shuffle directly followed by a repeat (the
# epochs) into one op, which gives the same first pass but another order when the stream is
# iterated again (steps beyond the epochs). Streams of several epochs therefore keep that one
# rewrite (`Task.stream_options`), at its cost, and stay the streams they always were.
STREAM_OPTIONS = tf.data.Options()
STREAM_OPTIONS.experimental_optimization.apply_default_optimizations = False
STREAM_OPTIONS.autotune.enabled = False
FUSED_STREAM_OPTIONS = tf.data.Options()
FUSED_STREAM_OPTIONS.experimental_optimization.apply_default_optimizations = False
FUSED_STREAM_OPTIONS.autotune.enabled = False
FUSED_STREAM_OPTIONS.experimental_optimization.shuffle_and_repeat_fusion = True


@dataclasses.dataclass(frozen=True)
class Task:
  """A federated learning task.

  Attributes:
    name: Registry name, e.g. ``'digits'``.
    train_data: Raw (unbatched, unpreprocessed) federated training data.
    eval_data: Raw centralised evaluation data (unbatched elements of the same
      structure as the clients' raw elements).
    preprocess_client: ``(raw_dataset, shuffle_seed) -> dataset`` turning one
      client's raw data into the batched training stream (epochs, shuffle with the
      given seed, batch). Deterministic for a fixed seed.
    preprocess_eval: ``raw_dataset -> dataset`` batching the evaluation data.
    keras_model_fn: ``seed -> tf.keras.Model`` (uncompiled); the same seed gives
      the same initial weights.
    loss_fn: Builds the training loss.
    metrics_fn: Builds the metrics (must include a ``SparseCategoricalAccuracy``
      named ``'accuracy'``).
    client_ids: The clients, in the order of every per-client array below.
    client_num_examples: ``int64[N]`` raw examples per client (one epoch).
    client_label_histograms: ``int64[N, num_classes]`` label counts per client.
    num_classes: Number of labels (vocabulary size for character tasks).
    options: The resolved task options, written beside results.
  """

  name: str
  train_data: tff.simulation.datasets.ClientData
  eval_data: tf.data.Dataset
  preprocess_client: Callable[[tf.data.Dataset, int], tf.data.Dataset]
  preprocess_eval: Callable[[tf.data.Dataset], tf.data.Dataset]
  keras_model_fn: Callable[[int], tf.keras.Model]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  metrics_fn: Callable[[], Sequence[tf.keras.metrics.Metric]]
  client_ids: tuple[str, ...]
  client_num_examples: np.ndarray
  client_label_histograms: np.ndarray
  num_classes: int
  options: Mapping[str, Any]

  @property
  def stream_options(self) -> tf.data.Options:
    """The options of a client's training stream: `STREAM_OPTIONS`, or `FUSED_STREAM_OPTIONS`
    over several epochs (``options['client_epochs']`` > 1; see there)."""
    several_epochs = int(self.options.get('client_epochs', 1)) > 1
    return FUSED_STREAM_OPTIONS if several_epochs else STREAM_OPTIONS

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  @property
  def element_spec(self):
    """The spec of one preprocessed training batch (the model's input spec)."""
    raw = self.train_data.element_type_structure
    probe = tf.data.Dataset.from_tensors(
      tf.nest.map_structure(lambda s: tf.zeros([d or 1 for d in s.shape], s.dtype), raw)
    )
    return self.preprocess_client(probe, 0).element_spec

  def client_dataset(
    self, client: int | str, seed: int, *, steps: int | None = None
  ) -> tf.data.Dataset:
    """The preprocessed training stream of one client (by index or id).

    Args:
      client: Index into `client_ids`, or a client id.
      seed: Seed of the stream's shuffling.
      steps: If given, exactly this many batches: the (epoch-repeated) stream
        is cycled and cut, so every client takes the same number of local
        steps whatever its size (FedGS's fixed local steps). A pass over a
        client's data may end in a smaller batch, in every cycle.
    """
    client_id = self.client_ids[client] if isinstance(client, (int, np.integer)) else client
    dataset = self.preprocess_client(self.train_data.create_tf_dataset_for_client(client_id), seed)
    num_steps = validation.positive_int('steps', steps, optional=True)
    if num_steps is not None:
      dataset = dataset.repeat().take(num_steps)
    return dataset.with_options(self.stream_options)

  def model_fn(self) -> tff.learning.models.VariableModel:
    """A TFF model (fresh variables each call), for ``tff.learning`` builders."""
    return tff.learning.models.from_keras_model(
      self.keras_model_fn(0),
      loss=self.loss_fn(),
      input_spec=self.element_spec,
      metrics=list(self.metrics_fn()),
    )

  def initial_model_weights(self, seed: int) -> tff.learning.models.ModelWeights:
    """Deterministic initial weights for ``seed`` (TFF's own init is unseeded)."""
    return tff.learning.models.ModelWeights.from_model(self.keras_model_fn(seed))
