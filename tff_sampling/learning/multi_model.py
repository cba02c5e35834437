r"""Multi-model federated learning (MMFL) with variance-reduced model assignment.

Zhang et al., "Poster: Optimal Variance-Reduced Client Sampling for Multiple
Models Federated Learning", IEEE ICDCS 2024 (``docs/algorithms.md`` §5; the
probabilities are §1a's and §1b's). ``S`` models, each with its own task
(model, data, local optimizer), are trained over the same ``N`` clients; in
each round a client trains **at most one** of them. One round is one
federated computation (`build_multi_model_process`)::

    broadcast w_1 … w_S to every client
    signal    client i computes Ũ_{i,s} for every model s:
                update_norm: d_{i,s} ‖U_{i,s}‖ after local training of s
                loss:        d_{i,s} f_{i,s}(w_s), a forward pass only
    sample    p_i from M_i = Σ_s Ũ_{i,s}          (exact, or secure sums only)
              p_{s|i} = p_i · Ũ_{i,s} / M_i       (each client, locally)
    choose    client i trains model s with probability p_{s|i}, none with 1 − p_i
    upload    the chosen model's update, weighted d_{i,s} / p_{s|i}
    server    w_s ← w_s − η Σ_{i ∈ A_s} (d_{i,s} / p_{s|i}) U_{i,s}

``U_{i,s} = w_s − w_{i,s}^local`` is TFF's model-delta convention, ``d_{i,s} =
n_{i,s} / Σ_j n_{j,s}`` the client's share of model ``s``'s examples and ``η``
the server learning rate. Since ``E[1[i ∈ A_s] / p_{s|i}] = 1``, the server
step is unbiased for the full-participation FedAvg step ``η Σ_i d_{i,s} U_{i,s}``
whatever the probabilities; they decide only its variance,
``Σ_{i,s} (1 − p_{s|i}) / p_{s|i} · Ũ_{i,s}²`` (update-norm signal).

Samplings (`SAMPLINGS`, ``signal`` × ``assignment``):

* ``optimal`` — update-norm signal, **exact** closed form (§5's sorting
  formula on ``M_i``, then the proportional split). The server needs every
  individual ``M_i``: **not compatible with secure aggregation**. It gathers
  them (revealing them), computes the water level ``λ`` and broadcasts it;
  each client sets ``p_i = min(1, M_i / λ)``.
* ``optimal_loss`` — the same with the loss signal: clients run a forward
  pass of every model and train only the chosen one (``S`` times cheaper
  local training).
* ``optimal_secure``, ``optimal_loss_secure`` — **ours**, with secure sums
  only; derivation below.
* ``random`` — a client takes part with probability ``min(1, m/N)`` and
  trains a uniformly random model among those it has data for:
  ``p_{s|i} = min(1, m/N) / S_i`` with ``S_i = #{s: d_{i,s} > 0}``.
* ``round_robin`` — a client takes part with probability ``min(1, m/N)`` and
  trains model ``(i + t + o) mod S`` in round ``t`` (``o`` a seeded offset),
  so each client cycles through the models. Its marginal probability is
  ``min(1, m/N) / S``, which the upload weight uses: unbiased over the
  rotation's phase (a uniformly random offset), not within one round. A
  client with no data for its turn's model sits the round out.

Secure version (derivation). By Cauchy–Schwarz the optimum splits any
client total ``q_i = Σ_s p_{s|i}`` in proportion to ``Ũ_{i,s}``, which leaves
``Σ_i M_i² / q_i`` to minimise under ``0 ≤ q_i ≤ 1, Σ q_i = m``: exactly the
single-model problem of §1 with norms ``M_i``
(`tff_sampling.probabilities.multi_model_probabilities`). Algorithm 2 solves
that problem with sums only, and each client can compute both its own ``M_i``
and the split from its own ``Ũ_{i,·}``. So the secure version is Algorithm 2
on ``M_i`` followed by the local split: the server sees ``Σ_i M_i`` and, per
rescaling step, ``(P, I) = Σ_i (p_i [p_i < 1], [p_i < 1])``, all through
secure sums (`tff_sampling.aggregators.protocol`, the code the single-model
aggregator runs), never a single client's value. The step is unbiased for any
``p``; what the approximation costs is variance. Algorithm 2's iterates rise
monotonically to the exact ``p`` (proved in `tff_sampling.probabilities`), so
the secure variance is at least the optimum's and reaches it within ``N``
steps; `multi_model_probabilities` vs `approximate_multi_model_probabilities`
measure the ratio, and the exact-mode process reports it each round on the
real norms (``secure_variance_ratio``, for 0 … `max_rescaling_steps` steps):
with the proportional split the variance is ``Σ_i M_i²/p_i − Σ_{i,s} Ũ_{i,s}²``,
a function of the gathered ``M`` and one scalar sum.

Client data (`client_data`): a struct of the client's ``S`` training datasets
and a one-element ``meta`` dataset holding its index ``i`` (the source of its
randomness: the draw is ``stateless_uniform`` seeded by (seed, round, i)) and
its shares ``d_{i,·}``. A client with no data for model ``s`` has an empty
dataset and ``d_{i,s} = 0``, hence ``Ũ_{i,s} = 0`` and ``p_{s|i} = 0``: it never
trains ``s`` (documented handling of a model without data on some clients).

Bad values: a non-finite signal counts as zero (``non_finite_signals``) and a
non-finite local update is zeroed by TFF's client update and not uploaded
(``non_finite_updates``); ``M_i`` above `norm_bound` is clipped
(``clipped_signals``). The model never receives a NaN from a client.

Structure: the process is composed (`_compose`, the multi-model counterpart
of ``tff.learning.templates.compose_learning_process``) from a client work
(`_build_client_work`: the signals, then each client trains the model it was
assigned), an assignment aggregator (`_build_assignment_aggregator`: the
probabilities of `tff_sampling.aggregators.protocol`, the clients' draws, the
per-model sums and the measurements) and TFF's SGD finalizer, one per model.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# TFF's own FedAvg client update (its module's builder; `build_model_delta_client_work`
# wraps it), used here so that a client can train a model on a gated dataset.
from tensorflow_federated.python.learning.templates import model_delta_client_work

from tff_sampling import probabilities
from tff_sampling import validation
from tff_sampling.aggregators import protocol
from tff_sampling.aggregators import secure_context
from tff_sampling.learning import fedavg
from tff_sampling.learning import signals as signals_lib


@dataclasses.dataclass(frozen=True)
class Sampling:
  """What a sampling name means: the clients' signal and how models are assigned."""

  signal: str  # 'update_norm', 'loss' or 'none'.
  assignment: str  # 'exact', 'approximate', 'random' or 'round_robin'.

  @property
  def secure(self) -> bool:
    """Whether every client value reaches the server through secure sums."""
    return self.assignment == 'approximate'


SAMPLINGS = collections.OrderedDict(
  optimal=Sampling('update_norm', 'exact'),
  optimal_loss=Sampling('loss', 'exact'),
  optimal_secure=Sampling('update_norm', 'approximate'),
  optimal_loss_secure=Sampling('loss', 'approximate'),
  random=Sampling('none', 'random'),
  round_robin=Sampling('none', 'round_robin'),
)

_FLOAT = np.float32
_COUNT = np.int32


def meta_type(num_models: int) -> tff.StructWithPythonType:
  """The type of the one element of a client's ``meta`` dataset."""
  return tff.StructWithPythonType(
    [('client', tff.TensorType(np.int32)), ('shares', tff.TensorType(np.float32, [num_models]))],
    collections.OrderedDict,
  )


def client_data(
  datasets: Sequence[tf.data.Dataset], client: int, shares: Sequence[float]
) -> collections.OrderedDict:
  """One client's input to the multi-model process.

  Args:
    datasets: The client's preprocessed training dataset for each model (empty
      where it has no data for that model).
    client: The client's index, the source of its random draws.
    shares: ``d_{i,s}``, the client's share of each model's training examples.
  """
  if len(datasets) != len(shares):
    raise ValueError(f'{len(datasets)} datasets but {len(shares)} shares: give one per model.')
  meta = tf.data.Dataset.from_tensors(
    collections.OrderedDict(client=np.int32(client), shares=np.asarray(shares, np.float32))
  )
  return collections.OrderedDict(data=tuple(datasets), meta=meta)


def data_shares(num_examples: np.ndarray) -> np.ndarray:
  """``d_{i,s} = n_{i,s} / Σ_j n_{j,s}`` from ``int[N, S]`` example counts.

  Raises:
    ValueError: If some model has no examples at all, or a count is negative.
  """
  counts = np.asarray(num_examples, np.float64)
  if counts.ndim != 2 or np.any(counts < 0) or not np.all(np.isfinite(counts)):
    raise ValueError(
      f'num_examples must be a non-negative [clients, models] array, got shape {counts.shape}.'
    )
  totals = counts.sum(axis=0)
  if np.any(totals == 0):
    raise ValueError(
      f'Model(s) {np.flatnonzero(totals == 0).tolist()} have no training '
      'examples on any client; every model needs data on at least one client.'
    )
  return counts / totals


def build_multi_model_process(
  model_fns: Sequence[Callable[[], tff.learning.models.VariableModel]],
  *,
  sampling: str,
  expected_clients: float,
  client_learning_rates: float | Sequence[float],
  server_learning_rate: float = 1.0,
  max_rescaling_steps: int = 4,
  seed: int = 0,
  norm_bound: float = 1e6,
) -> tff.templates.MeasuredProcess:
  """Builds the multi-model process (see the module docstring).

  The process has ``initialize: ( -> <round=int64, models=<W_1, …, W_S>>@SERVER)``
  and ``next: (<state@SERVER, {<data=<B_1*, …, B_S*>, meta=<client, shares>*>}@CLIENTS>
  -> <state, result=<W_1, …, W_S>@SERVER, measurements@SERVER>)``. Every client
  passed to ``next`` is a member of the population of size ``N`` (the paper
  has all clients compute their signals each round). The measurements:

  * ``cohort_size``: ``N``.
  * ``uploads``: ``int32[S]``, clients that trained and uploaded each model.
  * ``expected_uploads``: ``Σ_{i,s} p_{s|i}`` (``min(m, N)``, or fewer when
    fewer clients have a non-zero signal or data).
  * ``rescaling_steps``: Algorithm 2 steps that changed ``p`` (secure only).
  * ``full_participation``: 1 when ``m ≥ N`` forced ``p_i = 1``.
  * ``improvement_factor`` (signal samplings): the sampling variance relative
    to random assignment with the same budget (``α`` of
    `tff_sampling.probabilities.multi_model_improvement_factor`).
  * ``secure_variance_ratio`` (``optimal``, ``optimal_loss``): ``float32[J+1]``,
    the variance the secure version would have had with ``j = 0 … J``
    rescaling steps, over the exact one's (``J`` = `max_rescaling_steps`).
  * ``clipped_signals``, ``non_finite_signals``, ``non_finite_updates``.
  * ``extra_scalars_per_client``: scalars each client uploads besides a model.

  Args:
    model_fns: One builder of a fresh `tff.learning.models.VariableModel` per
      model (``S ≥ 1``).
    sampling: One of `SAMPLINGS`.
    expected_clients: ``m``, the expected number of clients that train per
      round (> 0).
    client_learning_rates: Local SGD step size, one for all models or one per
      model.
    server_learning_rate: ``η`` (> 0).
    max_rescaling_steps: ``j_max`` of the secure samplings (≥ 0), and the
      largest ``j`` of ``secure_variance_ratio``.
    seed: Root of the clients' draws (mixed with the round and the client).
    norm_bound: Upper end of the secure-sum range of ``M_i``.

  Returns:
    A `tff.templates.MeasuredProcess`.

  Raises:
    ValueError: For an unknown sampling, no models, a learning-rate count other
      than ``S``, or a non-positive rate, ``m`` or bound.
  """
  if sampling not in SAMPLINGS:
    raise ValueError(f'sampling must be one of {", ".join(SAMPLINGS)}, got {sampling!r}.')
  model_fns = tuple(model_fns)
  num_models = len(model_fns)
  if num_models == 0:
    raise ValueError('model_fns is empty: give at least one model builder.')
  if isinstance(client_learning_rates, (int, float, np.integer, np.floating)):
    client_learning_rates = [client_learning_rates] * num_models
  client_learning_rates = [
    validation.positive_number('client_learning_rates', r) for r in client_learning_rates
  ]
  if len(client_learning_rates) != num_models:
    raise ValueError(
      f'{len(client_learning_rates)} client learning rates for {num_models} '
      'models: give one rate, or one per model.'
    )
  server_learning_rate = validation.positive_number('server_learning_rate', server_learning_rate)
  m = validation.positive_number('expected_clients', expected_clients)
  norm_bound = validation.positive_number('norm_bound', norm_bound)
  if (
    isinstance(max_rescaling_steps, bool)
    or not isinstance(max_rescaling_steps, (int, np.integer))
    or max_rescaling_steps < 0
  ):
    raise ValueError(
      f'max_rescaling_steps must be a non-negative integer, got {max_rescaling_steps!r}.'
    )

  config = SAMPLINGS[sampling]
  client_work = _build_client_work(model_fns, client_learning_rates, config.signal)
  aggregator = _build_assignment_aggregator(
    num_models,
    config,
    expected_clients=m,
    max_rescaling_steps=int(max_rescaling_steps),
    seed=int(seed),
    norm_bound=norm_bound,
  )
  # TFF's finalizer skips a non-finite aggregate by default; this process applies
  # every one, as it always has (the clients already zero non-finite updates).
  finalizers = [
    tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(server_learning_rate),
      weights_type,
      should_reject_update=lambda *_: (False, collections.OrderedDict()),
    )
    for weights_type in client_work.weights_types
  ]

  @tff.tensorflow.computation
  def initial_models_fn():
    return tuple(tff.learning.models.ModelWeights.from_model(fn()) for fn in model_fns)

  return _compose(initial_models_fn, client_work, aggregator, finalizers)


def _compose(
  initial_models_fn: tff.Computation,
  client_work: _ClientWork,
  aggregator: _AssignmentAggregator,
  finalizers: Sequence[tff.learning.templates.FinalizerProcess],
) -> tff.templates.MeasuredProcess:
  """The MMFL process from its pieces: a multi-model ``compose_learning_process``.

  TFF's `tff.learning.templates.compose_learning_process` cannot express MMFL:
  its state holds one model, its client work returns one ``ClientResult`` per
  client, and its aggregator sees updates already trained, whereas here the
  assignment needs every client's signals and comes *before* the training of
  the model assigned. The order is otherwise TFF's: broadcast, client work,
  aggregation, one finalizer per model. The state stays ``<round, models>``:
  SGD's finalizer state is only its learning rate, so the finalizers start
  from it each round. A ``next`` with secure sums says how to run them
  (`secure_context.hinting_computation`).
  """
  num_models = len(finalizers)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
      collections.OrderedDict(
        round=tff.federated_value(np.int64(0), tff.SERVER),
        models=tff.federated_eval(initial_models_fn, tff.SERVER),
      )
    )

  meta_sequence_type = tff.SequenceType(meta_type(num_models))

  @tff.tensorflow.computation(meta_sequence_type)
  def read_meta(meta):
    initial = collections.OrderedDict(
      client=tf.constant(-1, tf.int32), shares=tf.zeros([num_models], tf.float32)
    )
    return meta.reduce(initial, lambda _, element: element)

  client_data_type = tff.StructWithPythonType(
    [('data', client_work.data_type), ('meta', meta_sequence_type)], collections.OrderedDict
  )

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(client_data_type, tff.CLIENTS)
  )
  def next_fn(state, data):
    models = tff.federated_broadcast(state.models)
    meta = tff.federated_map(read_meta, data.meta)
    values, trained = client_work.signal(models, data.data)
    assignment = aggregator.assign(state.round, values, meta)
    updates = client_work.train(models, data.data, assignment.choice, meta, trained)
    sums, measurements = aggregator.aggregate(assignment, updates)
    new_models = tff.federated_zip(
      tuple(
        finalizer.next(finalizer.initialize(), state.models[s], sums[s]).result
        for s, finalizer in enumerate(finalizers)
      )
    )
    new_state = tff.federated_zip(
      collections.OrderedDict(
        round=tff.federated_map(tff.tensorflow.computation(lambda r: r + 1), state.round),
        models=new_models,
      )
    )
    return tff.templates.MeasuredProcessOutput(new_state, new_models, measurements)

  if secure_context.has_secure_sums(next_fn):
    next_fn = secure_context.hinting_computation(next_fn)
  return tff.templates.MeasuredProcess(init_fn, next_fn)


class _ClientWork(NamedTuple):
  """The clients' side of a round (`_build_client_work`); functions of federated values."""

  weights_types: tuple[tff.Type, ...]  # Each model's `ModelWeights` type.
  data_type: tff.StructWithPythonType  # <B_1*, …, B_S*>.
  # (models, datasets) -> (S raw signals: norms or [1]-shaped losses, trained results or None).
  signal: Callable[..., Any]
  # (models, datasets, choice, meta, trained) -> S × <update (weighted), non_finite>.
  train: Callable[..., list[Any]]


def _build_client_work(model_fns, learning_rates: Sequence[float], signal: str) -> _ClientWork:
  """The client work: each client's signals, then its assigned model's weighted update.

  With the update-norm signal, every client trains every model before the
  assignment (the norms are the signal) and uploads the chosen one's update.
  Otherwise it computes the losses (a forward pass per model) or nothing, and
  after the assignment trains only the model it was assigned, in one
  TensorFlow call (`_train_chosen_model`).
  """
  num_models = len(model_fns)
  weights_types, data_types = zip(*(_model_types(fn) for fn in model_fns))

  if signal == 'update_norm':
    train_fns = [
      _train_computation(*args)
      for args in zip(model_fns, learning_rates, weights_types, data_types)
    ]

    weigh = tff.tensorflow.computation(
      lambda trained, choice, meta: tuple(
        _weighted_and_non_finite(result, choice, meta, s) for s, result in enumerate(trained)
      )
    )

    def signal_fn(models, datasets):
      trained = [
        tff.federated_map(train_fns[s], (models[s], datasets[s])) for s in range(num_models)
      ]
      return [t.norm for t in trained], tff.federated_zip(tuple(trained))

    def train_fn(models, datasets, choice, meta, trained):
      del models, datasets  # Trained in `signal_fn`.
      results = tff.federated_map(weigh, (trained, choice, meta))
      return [results[s] for s in range(num_models)]

  else:
    loss_fns = (
      [
        signals_lib.client_loss_computation(*args)
        for args in zip(model_fns, weights_types, data_types)
      ]
      if signal == 'loss'
      else []
    )
    train_chosen = tff.tensorflow.computation(_train_chosen_model(model_fns, learning_rates))

    def signal_fn(models, datasets):
      if loss_fns:
        return [
          tff.federated_map(loss_fns[s], (models[s], datasets[s])) for s in range(num_models)
        ], None
      return [tff.federated_value(_FLOAT(0.0), tff.CLIENTS)] * num_models, None

    def train_fn(models, datasets, choice, meta, trained):
      del trained  # None.
      results = tff.federated_map(train_chosen, (models, datasets, choice, meta))
      return [results[s] for s in range(num_models)]

  return _ClientWork(
    weights_types, tff.StructWithPythonType(data_types, tuple), signal_fn, train_fn
  )


def _model_types(model_fn) -> tuple[tff.Type, tff.SequenceType]:
  """A model's `ModelWeights` type and the type of a client's dataset for it."""
  with tf.Graph().as_default():
    model = model_fn()
    weights_type = tff.types.tensorflow_to_type(
      tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype),
        tff.learning.models.ModelWeights.from_model(model),
      )
    )
    return weights_type, tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))


def _client_update(model_fn):
  """TFF's model-delta local SGD for one model (example-weighted, our client loop).

  Builds the model: call it at the top of a TF computation, not in a branch.
  """
  return model_delta_client_work.build_model_delta_update_with_tff_optimizer(
    model_fn,
    weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    loop_implementation=fedavg.CLIENT_LOOP,
  )


def _train_result(client_update, optimizer, weights, dataset) -> collections.OrderedDict:
  """``<update, norm, weight>`` of local SGD from `weights` on `dataset`.

  ``weight`` is TFF's: the examples trained on, or 0 if the update was
  non-finite (TFF then zeroes it).
  """
  result, _ = client_update(optimizer, weights, dataset)
  # The dataset is iterated once only: a second pass (e.g. to count batches)
  # may run first and reshuffle the training order.
  return collections.OrderedDict(
    update=result.update,
    norm=tf.linalg.global_norm(tf.nest.flatten(result.update)),
    weight=result.update_weight,
  )


def _train_computation(model_fn, learning_rate: float, weights_type, data_type):
  """``(W, B*) -> <update, norm, weight>``: `_train_result` as a computation."""
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate)

  @tff.tensorflow.computation(weights_type, data_type)
  def train(weights, dataset):
    return _train_result(_client_update(model_fn), optimizer, weights, dataset)

  return train


def _weighted_and_non_finite(result, choice, meta, model: int) -> collections.OrderedDict:
  """``factor_s · update`` (zero unless model `model` was chosen), and 1 if the
  client trained the model on data (share > 0) and TFF zeroed its non-finite
  update (weight 0)."""
  factor = choice['factor'][model]
  return collections.OrderedDict(
    update=tf.nest.map_structure(lambda t: tf.cast(factor, t.dtype) * t, result['update']),
    non_finite=tf.cast((meta['shares'][model] > 0.0) & tf.equal(result['weight'], 0.0), _COUNT),
  )


def _train_chosen_model(model_fns, learning_rates):
  """``(<W_1..W_S>, <B_1*..B_S*>, choice, meta) -> <<update, non_finite>_1..S>``.

  The client trains only the model it chose (a `tf.switch_case` over the
  choice; none if it chose none); every other model's entry is a zero update.
  One TensorFlow call per client instead of one per client and model: the
  per-call cost of TFF's runtime dominated MMFL rounds on small models.
  """
  num_models = len(model_fns)

  def train_chosen(models, datasets, choice, meta):
    optimizers = [tff.learning.optimizers.build_sgdm(r) for r in learning_rates]
    client_updates = [_client_update(fn) for fn in model_fns]

    def zero(s):
      return collections.OrderedDict(
        update=tf.nest.map_structure(tf.zeros_like, models[s].trainable),
        non_finite=tf.constant(0, _COUNT),
      )

    def branch(chosen):
      def run():
        outputs = []
        for s in range(num_models):
          if s != chosen:
            outputs.append(zero(s))
            continue
          result = _train_result(client_updates[s], optimizers[s], models[s], datasets[s])
          outputs.append(_weighted_and_non_finite(result, choice, meta, s))
        return tuple(outputs)

      return run

    selected = choice['selected'] > 0
    index = tf.where(
      tf.reduce_any(selected),
      tf.argmax(tf.cast(selected, tf.int32), output_type=tf.int32),
      num_models,
    )
    return tf.switch_case(index, [branch(s) for s in range(num_models + 1)])

  return train_chosen


class _Assignment(NamedTuple):
  """One round's assignment, as federated values."""

  cohort_size: Any  # int32@SERVER, N.
  size: Any  # float32@SERVER, N.
  info: Any  # <signal, total, clipped, non_finite>@CLIENTS (`_client_signal_computation`).
  phases: protocol.FederatedProbabilities  # Of M_i (or of no signal: `_uniform_phases`).
  choice: Any  # <selected, factor, probability, marginal>@CLIENTS (`_client_choice_computation`).


class _AssignmentAggregator(NamedTuple):
  """The server's side of a round (`_build_assignment_aggregator`)."""

  assign: Callable[..., _Assignment]  # (round, values, meta) -> _Assignment.
  # (_Assignment, updates) -> (S sums of weighted updates, measurements), all @SERVER.
  aggregate: Callable[..., tuple[list[Any], Any]]


def _build_assignment_aggregator(
  num_models: int,
  config: Sampling,
  *,
  expected_clients: float,
  max_rescaling_steps: int,
  seed: int,
  norm_bound: float,
) -> _AssignmentAggregator:
  """The assignment aggregator: probabilities, draws, per-model sums and measurements.

  ``assign`` counts the cohort, clips each client's ``M_i``, runs
  `protocol.federated_probabilities` on it (or gives every client ``min(1,
  m/N)`` without a signal) and lets each client draw its model; ``aggregate``
  sums each model's weighted updates and the measurements, through secure sums
  for the secure samplings (`protocol.sum_counts`, `protocol.sum_floats`).
  """
  m, steps, secure = expected_clients, max_rescaling_steps, config.secure
  uses_signal = config.signal != 'none'
  client_signal = _client_signal_computation(norm_bound)
  client_choice = _client_choice_computation(num_models, config.assignment, seed)
  extra_scalars = 4 + num_models + 1  # Cohort count, 3 flags, upload bits, Σp.
  if uses_signal:  # M_i for Σ M_i; the two variance terms; M_i gathered, or (P, I) per step.
    extra_scalars += 1 + 2 + (1 if config.assignment == 'exact' else 2 * steps)

  def assign(round_num, values, meta) -> _Assignment:
    cohort_size = protocol.sum_counts(tff.federated_value(_COUNT(1), tff.CLIENTS), secure)
    size = tff.federated_map(tff.tensorflow.computation(lambda n: tf.cast(n, _FLOAT)), cohort_size)
    info = tff.federated_map(client_signal, (meta, tff.federated_zip(tuple(values))))
    if uses_signal:
      phases = protocol.federated_probabilities(
        info.total,
        size,
        expected_clients=m,
        mode=config.assignment,
        max_rescaling_steps=steps,
        secure=secure,
        norm_bound=norm_bound,
      )
    else:
      phases = _uniform_phases(size, m)
    choice = tff.federated_map(
      client_choice, (meta, info.signal, phases.probability, tff.federated_broadcast(round_num))
    )
    return _Assignment(cohort_size, size, info, phases, choice)

  def aggregate(assignment: _Assignment, updates):
    sums = [tff.federated_sum(update.update) for update in updates]
    counts = protocol.sum_counts(
      tff.federated_map(
        _client_counts,
        (
          assignment.info,
          assignment.choice,
          tff.federated_zip(tuple(update.non_finite for update in updates)),
        ),
      ),
      secure,
    )
    measurements = collections.OrderedDict(
      cohort_size=assignment.cohort_size,
      uploads=counts.uploads,
      expected_uploads=protocol.sum_floats(assignment.choice.probability, 1.0, secure),
      rescaling_steps=assignment.phases.rescaling_steps,
      full_participation=assignment.phases.full_participation,
    )
    if uses_signal:
      measurements.update(
        _variance_measurements(
          assignment,
          expected_clients=m,
          num_models=num_models,
          max_rescaling_steps=steps,
          exact=config.assignment == 'exact',
          secure=secure,
        )
      )
    for name in ('clipped_signals', 'non_finite_signals', 'non_finite_updates'):
      measurements[name] = counts[name]
    measurements['extra_scalars_per_client'] = tff.federated_value(
      _COUNT(extra_scalars), tff.SERVER
    )
    return sums, tff.federated_zip(measurements)

  return _AssignmentAggregator(assign, aggregate)


def _uniform_phases(size, m: float) -> protocol.FederatedProbabilities:
  """Every client takes part with probability ``min(1, m/N)``; no client value needed."""
  probability = tff.federated_broadcast(
    tff.federated_map(
      tff.tensorflow.computation(lambda n: tf.minimum(1.0, m / tf.maximum(n, 1.0))), size
    )
  )
  full_participation = tff.federated_map(
    tff.tensorflow.computation(lambda n: tf.cast(m >= n, _FLOAT)), size
  )
  return protocol.FederatedProbabilities(
    probability=probability,
    norm_sum=None,
    rescaling_steps=tff.federated_value(_COUNT(0), tff.SERVER),
    full_participation=full_participation,
    water_level=None,
    all_norms=None,
  )


def _client_signal_computation(norm_bound: float) -> tff.Computation:
  """``(meta, values) -> <signal, total, clipped, non_finite>``: ``Ũ_{i,·}`` and ``M_i``.

  ``values`` are the raw per-model values (norms, or ``[1]``-shaped losses); a
  non-finite one counts as zero, and ``M_i`` is clipped to `norm_bound`.
  """

  @tff.tensorflow.computation
  def client_signal(meta, values):
    raw = meta['shares'] * tf.reshape(tf.stack(values), [-1])
    finite = tf.math.is_finite(raw)
    signal = tf.where(finite, raw, 0.0)
    total = tf.reduce_sum(signal)
    return collections.OrderedDict(
      signal=signal,
      total=tf.minimum(total, norm_bound),
      clipped=tf.cast(total > norm_bound, _COUNT),
      non_finite=tf.cast(tf.reduce_any(tf.logical_not(finite)), _COUNT),
    )

  return client_signal


def _client_choice_computation(num_models: int, assignment: str, seed: int) -> tff.Computation:
  """``(meta, Ũ_{i,·}, p_i, round) -> <selected, factor, probability, marginal>``.

  The client's ``p_{s|i}`` (by `assignment`), its draw (``stateless_uniform``
  seeded by (seed, round, client)), the upload weight ``factor = d_{i,s} /
  p_{s|i}`` of the model it chose, ``Σ_s p_{s|i}`` and the marginals.
  """

  @tff.tensorflow.computation(
    meta_type(num_models),
    tff.TensorType(_FLOAT, [num_models]),
    tff.TensorType(_FLOAT),
    tff.TensorType(np.int64),
  )
  def client_choice(meta, signal, probability, round_num):
    shares = meta['shares']
    has_data = shares > 0.0
    index = tf.range(num_models)
    if assignment in ('exact', 'approximate'):
      draw = probability * tf.math.divide_no_nan(signal, tf.reduce_sum(signal))
      marginal = draw
    elif assignment == 'random':
      choices = tf.reduce_sum(tf.cast(has_data, _FLOAT))
      draw = tf.where(has_data, probability / tf.maximum(choices, 1.0), 0.0)
      marginal = draw
    else:  # round_robin
      offset = tf.cast(seed % num_models, tf.int64)
      turn = tf.cast(
        (tf.cast(meta['client'], tf.int64) + round_num + offset) % num_models, tf.int32
      )
      draw = tf.where(tf.equal(index, turn) & has_data, probability, 0.0)
      marginal = draw / num_models
    client_seed = tf.random.experimental.stateless_fold_in(
      tf.random.experimental.stateless_fold_in(tf.constant([seed, 0], tf.int64), round_num),
      tf.cast(meta['client'], tf.int64),
    )
    uniform = tf.random.stateless_uniform([], seed=client_seed, dtype=tf.float32)
    cumulative = tf.cumsum(draw)
    chosen = tf.reduce_sum(tf.cast(cumulative <= uniform, tf.int32))  # num_models: none.
    selected = tf.equal(index, chosen) & (draw > 0.0)
    factor = tf.where(selected, shares / tf.where(selected, marginal, 1.0), 0.0)
    return collections.OrderedDict(
      selected=tf.cast(selected, _COUNT),
      factor=factor,
      probability=tf.reduce_sum(draw),
      marginal=marginal,
    )

  return client_choice


@tff.tensorflow.computation
def _client_counts(info, choice, non_finite_updates):
  """A client's contribution to the count measurements (summed by `aggregate`)."""
  return collections.OrderedDict(
    uploads=choice['selected'],
    clipped_signals=info['clipped'],
    non_finite_signals=info['non_finite'],
    non_finite_updates=tf.add_n(list(non_finite_updates)),
  )


def _variance_measurements(
  assignment: _Assignment,
  *,
  expected_clients: float,
  num_models: int,
  max_rescaling_steps: int,
  exact: bool,
  secure: bool,
) -> collections.OrderedDict:
  """``improvement_factor`` and, if `exact`, ``secure_variance_ratio`` (see
  `build_multi_model_process`), from two sums of per-client terms."""
  m = expected_clients
  bound = max(1.0, 1.0 / m)

  @tff.tensorflow.computation
  def client_variance_terms(info, choice, norm_sum):
    # Σ_s (1 − p)/p · (Ũ_s/A)² and Σ_s (Ũ_s/A)², each in [0, max(1, 1/m)]
    # (p_{s|i} ≥ m Ũ_s / A below saturation, p_{s|i} = Ũ_s / M_i at it).
    shares = info['signal'] / tf.maximum(norm_sum, 1e-30)
    p = choice['marginal']
    terms = tf.where(p > 0.0, (1.0 - p) / tf.where(p > 0.0, p, 1.0) * shares**2, 0.0)
    return collections.OrderedDict(
      variance=tf.clip_by_value(tf.reduce_sum(terms), 0.0, bound), squares=tf.reduce_sum(shares**2)
    )

  @tff.tensorflow.computation(protocol.FLOAT_TYPE, protocol.FLOAT_TYPE, protocol.FLOAT_TYPE)
  def server_improvement(variance, squares, size):
    uniform = tf.minimum(m, size) / tf.maximum(size * num_models, 1.0)
    denominator = (1.0 - uniform) / uniform * squares
    return tf.where(
      denominator > 0.0, variance / tf.where(denominator > 0.0, denominator, 1.0), 0.0
    )

  @tff.tensorflow.computation(tff.TensorType(_FLOAT, [None]), tff.TensorType(_FLOAT))
  def server_secure_variance_ratio(totals, squares_sum):
    # Variance with the proportional split: Σ_i M_i²/p_i − Σ_{i,s} Ũ², all
    # scaled by 1/A² (squares_sum arrives scaled).
    totals = tf.cast(totals, tf.float64)
    scaled = totals / tf.maximum(tf.reduce_sum(totals), 1e-300)

    def variance(p):
      return tf.reduce_sum(tf.math.divide_no_nan(scaled**2, p)) - tf.cast(squares_sum, tf.float64)

    optimum = variance(probabilities.optimal_probabilities_tf(scaled, m, validate=False))
    ratios = [
      variance(probabilities.approximate_optimal_probabilities_tf(scaled, m, j, validate=False))
      for j in range(max_rescaling_steps + 1)
    ]
    return tf.cast(tf.math.divide_no_nan(tf.stack(ratios), optimum), _FLOAT)

  terms = protocol.sum_floats(
    tff.federated_map(
      client_variance_terms,
      (assignment.info, assignment.choice, tff.federated_broadcast(assignment.phases.norm_sum)),
    ),
    bound,
    secure,
  )
  measurements = collections.OrderedDict(
    improvement_factor=tff.federated_map(
      server_improvement, (terms.variance, terms.squares, assignment.size)
    )
  )
  if exact:
    measurements['secure_variance_ratio'] = tff.federated_map(
      server_secure_variance_ratio, (assignment.phases.all_norms, terms.squares)
    )
  return measurements
