"""FedAvg and DSGD whose clients upload with optimal sampling probabilities.

Chen, Horváth, Richtárik, "Optimal Client Sampling for Federated Learning"
(TMLR 2022), Algorithm 3 (FedAvg) and its DSGD special case. Both processes are
TFF's own builders — which join TFF's broadcast distributor, a client work, the
model aggregator and TFF's optimizer finalizer with
`tff.learning.templates.compose_learning_process` — with
`tff_sampling.aggregators.OptimalSamplingFactory` as the model aggregator:

* FedAvg: clients run local SGD for the given epochs from the broadcast model;
  the update ``U_i`` is the model delta; the server applies the aggregate with
  its optimizer (paper: SGD, learning rate 1).
* DSGD: clients compute the gradient of their loss over their whole local data
  at the broadcast model (TFF's FedSGD client work); the server steps
  ``x ← x − η G`` (server SGD with learning rate ``η``).

The aggregator's measurements appear under ``metrics['aggregator']``; the
program loop counts uploads with
`tff_sampling.communication.uplink_from_measurements`. Secure sums need
`tff_sampling.runtime.tff_context.use_secure_sum_simulation` (the program loop calls it);
without it ``next`` raises `tff_sampling.aggregators.SecureSumContextError`
saying so (`tff_sampling.aggregators.with_secure_sum_hint`).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow_federated as tff

from tff_sampling.aggregators import optimal_sampling as aggregator_lib
from tff_sampling.aggregators import secure_context
from tff_sampling.learning import fedavg

ModelFn = Callable[[], tff.learning.models.VariableModel]


def _factory(expected_clients, max_rescaling_steps, mode, secure, seed, aggregator_options):
  return aggregator_lib.OptimalSamplingFactory(
    expected_clients,
    max_rescaling_steps=max_rescaling_steps,
    mode=mode,
    secure=secure and mode != aggregator_lib.Mode.EXACT,
    seed=seed,
    **aggregator_options,
  )


def _hinting_for(process, aggregator):
  """`process` raising `SecureSumContextError` if its secure sums cannot run; the walk over
  its computation that looks for them is skipped when `aggregator` is known to bring some."""
  known = isinstance(aggregator, aggregator_lib.OptimalSamplingFactory) and aggregator.secure
  return secure_context.with_secure_sum_hint(process, check=not known)


def build_fed_avg_with_aggregator(
  model_fn: ModelFn,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  aggregator: tff.aggregators.WeightedAggregationFactory,
  *,
  client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> tff.learning.templates.LearningProcess:
  """TFF's FedAvg with `aggregator` (e.g. an `OptimalSamplingFactory`) as its model aggregator,
  raising `SecureSumContextError` where its secure sums cannot run."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
    model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    client_weighting=client_weighting,
    model_aggregator=aggregator,
    loop_implementation=fedavg.CLIENT_LOOP,
  )
  return _hinting_for(process, aggregator)


def build_dsgd_with_aggregator(
  model_fn: ModelFn,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  aggregator: tff.aggregators.WeightedAggregationFactory,
) -> tff.learning.templates.LearningProcess:
  """TFF's FedSGD (distributed SGD: each client's gradient over its whole data) with
  `aggregator` as its model aggregator, raising `SecureSumContextError` where its secure sums
  cannot run."""
  process = tff.learning.algorithms.build_fed_sgd(
    model_fn,
    server_optimizer_fn=server_optimizer_fn,
    model_aggregator=aggregator,
    loop_implementation=fedavg.CLIENT_LOOP,
  )
  return _hinting_for(process, aggregator)


def build_fed_avg_with_optimal_sampling(
  model_fn: ModelFn,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  *,
  expected_clients: float,
  max_rescaling_steps: int = 4,
  mode: str = aggregator_lib.Mode.APPROXIMATE,
  secure: bool = True,
  client_weighting: tff.learning.ClientWeighting = tff.learning.ClientWeighting.NUM_EXAMPLES,
  seed: int = 0,
  **aggregator_options,
) -> tff.learning.templates.LearningProcess:
  """FedAvg where each cohort client uploads with probability ``p_i``.

  Args:
    model_fn: Builds a fresh `tff.learning.models.VariableModel`.
    client_optimizer_fn: Local optimizer (e.g. ``tff.learning.optimizers.build_sgdm(0.1)``).
    server_optimizer_fn: Server optimizer (paper: SGD with learning rate 1).
    expected_clients: ``m``, expected uploads per round.
    max_rescaling_steps: ``j_max`` of the secure protocol.
    mode: ``'approximate'`` (secure protocol), ``'exact'`` (reveals norms, so
      never secure), ``'uniform'`` (``p = m/n``) or ``'full'`` (``p = 1``).
    secure: Use secure sums for every client value (ignored for ``'exact'``).
    client_weighting: ``NUM_EXAMPLES`` (``w_i ∝ n_i``) or ``UNIFORM``.
    seed: Seed of the clients' Bernoulli draws.
    **aggregator_options: Further `OptimalSamplingFactory` options
      (``norm_bound``, ``weight_bound``, ``inner_factory``).

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: For an ``inner_factory`` that does not return a sum.
  """
  return build_fed_avg_with_aggregator(
    model_fn,
    client_optimizer_fn,
    server_optimizer_fn,
    _factory(expected_clients, max_rescaling_steps, mode, secure, seed, aggregator_options),
    client_weighting=client_weighting,
  )


def build_dsgd_with_optimal_sampling(
  model_fn: ModelFn,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  *,
  expected_clients: float,
  max_rescaling_steps: int = 4,
  mode: str = aggregator_lib.Mode.APPROXIMATE,
  secure: bool = True,
  seed: int = 0,
  **aggregator_options,
) -> tff.learning.templates.LearningProcess:
  """Distributed SGD where each cohort client uploads its gradient with probability ``p_i``.

  Clients are weighted by their number of examples (TFF's FedSGD). Arguments
  as in `build_fed_avg_with_optimal_sampling`; the server optimizer's learning
  rate is the step size ``η``.
  """
  return build_dsgd_with_aggregator(
    model_fn,
    server_optimizer_fn,
    _factory(expected_clients, max_rescaling_steps, mode, secure, seed, aggregator_options),
  )
