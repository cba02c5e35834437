"""Checks of the round loop: divergence, and a sampler's weights against a plain process."""

from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling.program.config import ProgramConfig
from tff_sampling.samplers import base as samplers_base
from tff_sampling.samplers import weighting


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


def check_diverged(
  round_num: int, model_weights: Any = None, released: Mapping[str, Any] | None = None
) -> None:
  """Stops a diverging run: raises FloatingPointError naming the round and the sign.

  Signs of divergence: a global model (one `ModelWeights` or a sequence of
  them) with a non-finite weight; a released ``loss`` (training or evaluation)
  that is not finite; or a ``…non_finite…`` measurement above 0, as TFF's
  optimizer finalizer reports (``update_non_finite``) when it refuses a
  non-finite aggregate and keeps the old model, which would otherwise let the
  run go on without learning.
  """
  models = list(model_weights) if isinstance(model_weights, list) else [model_weights]
  signs = []
  for s, weights in enumerate(m for m in models if m is not None):
    if not all(np.all(np.isfinite(t)) for t in tf.nest.flatten(weights.trainable)):
      signs.append(
        'the global model has non-finite weights'
        if len(models) == 1
        else f'global model {s} has non-finite weights'
      )
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
      'client or server learning rate (or check the data for non-finite values).'
    )


def check_plain_process_weighting(
  sampler: samplers_base.Sampler | None, client_weighting, config: ProgramConfig
) -> None:
  """Raises unless a plain TFF process applies the sampler's aggregation weights."""
  if sampler is None or not weighting.sampler_sets_weights(sampler):
    return
  if client_weighting is None:
    raise ValueError(
      f'{type(sampler).__name__} sets aggregation weights, which a plain TFF process (one not '
      'built on tff_sampling.learning.signals) cannot receive: build it with client_weighting='
      f'{weighting.required_client_weighting(sampler)} and pass the same client_weighting to '
      'run_experiment, or build it with signals.build_fedavg_with_signals.'
    )
  weighting.check_fed_avg_weighting(
    sampler, client_weighting, fixed_local_steps=config.client_steps is not None
  )
