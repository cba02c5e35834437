"""The multi-model (MMFL) process (Zhang et al., ICDCS 2024): ``S`` models over one
population, each client training at most one model a round, chosen with variance-optimal
probabilities (exact, or ours with secure sums only) or at random / round robin
(`multi_model_types.SAMPLINGS`). It is composed (`_compose`, the multi-model counterpart of
``tff.learning.templates.compose_learning_process``) from the client work of
`multi_model_client_work`, the assignment aggregator of `multi_model_assignment` and TFF's SGD
finalizer per model. The math is ``docs/algorithms.md`` §5; samplings, measurements and bad
input ``docs/mmfl.md``."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow_federated as tff

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
  has all clients compute their signals each round); its ``meta`` dataset holds
  one element (`multi_model_types.client_data` builds it). The measurements:

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
  config = _sampling_config(sampling)
  model_fns = tuple(model_fns)
  learning_rates = _check_client_learning_rates(client_learning_rates, len(model_fns))
  server_learning_rate = validation.positive_number('server_learning_rate', server_learning_rate)
  m = validation.positive_number('expected_clients', expected_clients)
  norm_bound = validation.positive_number('norm_bound', norm_bound)
  _check_max_rescaling_steps(max_rescaling_steps)

  client_work = multi_model_client_work.build_client_work(model_fns, learning_rates, config.signal)
  aggregator = multi_model_assignment.build_assignment_aggregator(
    len(model_fns),
    config,
    expected_clients=m,
    max_rescaling_steps=int(max_rescaling_steps),
    seed=int(seed),
    norm_bound=norm_bound,
  )
  finalizers = _sgd_finalizers(client_work.weights_types, server_learning_rate)

  @tff.tensorflow.computation
  def initial_models_fn():
    return tuple(tff.learning.models.ModelWeights.from_model(fn()) for fn in model_fns)

  return _compose(initial_models_fn, client_work, aggregator, finalizers)


def _sampling_config(sampling: str) -> multi_model_types.Sampling:
  """The `multi_model_types.Sampling` named `sampling`, or a ValueError."""
  if sampling not in multi_model_types.SAMPLINGS:
    raise ValueError(
      f'sampling must be one of {", ".join(multi_model_types.SAMPLINGS)}, got {sampling!r}.'
    )
  return multi_model_types.SAMPLINGS[sampling]


def _check_client_learning_rates(rates, num_models: int) -> list[float]:
  """One positive rate per model, from one rate for all or a sequence (`num_models` > 0)."""
  if num_models == 0:
    raise ValueError('model_fns is empty: give at least one model builder.')
  if isinstance(rates, (int, float, np.integer, np.floating)):
    rates = [rates] * num_models
  rates = [validation.positive_number('client_learning_rates', r) for r in rates]
  if len(rates) != num_models:
    raise ValueError(
      f'{len(rates)} client learning rates for {num_models} '
      'models: give one rate, or one per model.'
    )
  return rates


def _check_max_rescaling_steps(value) -> None:
  """A ValueError unless `value` is a non-negative integer."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f'max_rescaling_steps must be a non-negative integer, got {value!r}.')


def _sgd_finalizers(weights_types, server_learning_rate: float) -> list:
  """TFF's SGD finalizer per model. TFF's skips a non-finite aggregate by default; this process
  applies every one, as it always has (the clients already zero non-finite updates)."""
  return [
    tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(server_learning_rate),
      weights_type,
      should_reject_update=lambda *_: (False, collections.OrderedDict()),
    )
    for weights_type in weights_types
  ]


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
    # Not a ``meta.reduce``: TFF's worker would instantiate its function at every call.
    return meta.get_single_element()

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
