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
(`build_client_work`: the signals, then each client trains the model it was
assigned), an assignment aggregator (`build_assignment_aggregator`: the
probabilities of `tff_sampling.aggregators.protocol`, the clients' draws, the
per-model sums and the measurements) and TFF's SGD finalizer, one per model.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# TFF's own FedAvg client update (its module's builder; `build_model_delta_client_work`
# wraps it), used here so that a client can train a model on a gated dataset.
from tff_sampling import validation
from tff_sampling.aggregators import secure_context
from tff_sampling.learning import multi_model_assignment
from tff_sampling.learning import multi_model_client_work
from tff_sampling.learning import multi_model_types


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
  if sampling not in multi_model_types.SAMPLINGS:
    raise ValueError(
      f'sampling must be one of {", ".join(multi_model_types.SAMPLINGS)}, got {sampling!r}.'
    )
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

  config = multi_model_types.SAMPLINGS[sampling]
  client_work = multi_model_client_work.build_client_work(
    model_fns, client_learning_rates, config.signal
  )
  aggregator = multi_model_assignment.build_assignment_aggregator(
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
  client_work: multi_model_client_work.ClientWork,
  aggregator: multi_model_assignment._AssignmentAggregator,
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

  meta_sequence_type = tff.SequenceType(multi_model_types.meta_type(num_models))

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
