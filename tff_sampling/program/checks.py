"""Checks of the round loop: divergence, and a sampler's weights against a plain process."""

from __future__ import annotations

from collections.abc import Mapping
import math
import os
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_sampling.program.config import RunConfig
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
  sampler: samplers_base.Sampler | None, client_weighting, config: RunConfig
) -> None:
  """Raises unless a plain TFF process applies the sampler's aggregation weights."""
  if sampler is None or not weighting.sampler_sets_weights(sampler):
    return
  if client_weighting is None:
    raise ValueError(
      f'{type(sampler).__name__} sets aggregation weights, which a plain TFF process (one not '
      'built on tff_sampling.learning.signals) cannot receive: build it with client_weighting='
      f'{weighting.required_client_weighting(sampler)} and pass the same client_weighting to '
      'train_model, or build it with signals.build_fed_avg_with_signals.'
    )
  weighting.check_fed_avg_weighting(
    sampler, client_weighting, fixed_local_steps=config.client_steps is not None
  )


# A finite blow-up: the evaluation loss this many times its round-0 value.
LOSS_BLOWUP_FACTOR = 10.0
# Accuracy at chance: at most this many times 1 / number of classes ...
CHANCE_FACTOR = 1.1
# ... after at least this many rounds.
CHANCE_MIN_ROUNDS = 10
WARNINGS_FILENAME = 'warnings.txt'


class LearningMonitor:
  """Says when a run that does not diverge learns nothing, without stopping it.

  A run the user chose goes on; `check_diverged` stops only non-finite runs.
  This warns once (a log line, and a line in ``<run>/warnings.txt``) when the
  evaluation loss exceeds `LOSS_BLOWUP_FACTOR` times its round-0 value (a
  finite blow-up: usually a learning rate far too large), and at the end when
  the final evaluation accuracy is at chance (at most `CHANCE_FACTOR` / number
  of classes after `CHANCE_MIN_ROUNDS` rounds). Evaluations without a scalar
  ``loss`` / ``accuracy`` (several models) are not checked.
  """

  def __init__(self, output_dir: str, num_classes: int | None, initial_loss: float | None):
    self._path = os.path.join(output_dir, WARNINGS_FILENAME)
    self._num_classes = num_classes
    self._initial_loss = initial_loss
    self._warned_loss = False

  def _warn(self, round_num: int, message: str) -> None:
    logging.warning('%s', message)
    with open(self._path, 'a', encoding='utf-8') as f:
      f.write(f'round {round_num}: {message}\n')

  def after_evaluation(self, round_num: int, eval_metrics: Mapping[str, Any]) -> None:
    loss = _scalar(eval_metrics, 'loss')
    initial = self._initial_loss
    if self._warned_loss or loss is None or not initial or not math.isfinite(loss):
      return
    if loss > LOSS_BLOWUP_FACTOR * initial:
      self._warned_loss = True
      self._warn(
        round_num,
        f'The evaluation loss is {loss:.4g} in round {round_num}, {loss / initial:.0f}x its '
        f'round-0 value {initial:.4g}: the model is getting worse, not better (a finite blow-up, '
        'so the run goes on). The learning rate is the likely cause: lower the client or server '
        'rate.',
      )

  def at_end(self, round_num: int, eval_metrics: Mapping[str, Any]) -> None:
    accuracy = _scalar(eval_metrics, 'accuracy')
    if accuracy is None or not self._num_classes or round_num < CHANCE_MIN_ROUNDS:
      return
    chance = 1.0 / self._num_classes
    if accuracy <= CHANCE_FACTOR * chance:
      self._warn(
        round_num,
        f'The evaluation accuracy is {accuracy:.4f} after {round_num} rounds, chance level for '
        f'{self._num_classes} classes ({chance:.4f}): the run learned nothing. Check the '
        'learning rate (too large or too small) and the data.',
      )


def _scalar(metrics: Mapping[str, Any], name: str) -> float | None:
  value = metrics.get(name) if isinstance(metrics, Mapping) else None
  try:
    return None if value is None else float(np.asarray(value))
  except (TypeError, ValueError):
    return None
