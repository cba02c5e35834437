"""The embedded offline task ``synthetic``: Synthetic(alpha, beta) of Li et al.

The generative process of FedProx (Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020), as used by FedGS (Wang et al., AAAI
2023). For client ``k``:

* model heterogeneity: ``mu_k ~ N(0, alpha)``; ``W_k in R^{10x60}`` and
  ``b_k in R^10`` with entries ``~ N(mu_k, 1)``;
* data heterogeneity: ``B_k ~ N(0, beta)``; ``v_k in R^60`` with entries
  ``~ N(B_k, 1)``; features ``x ~ N(v_k, Sigma)``, ``Sigma = diag(j^-1.2)``,
  ``j = 1..60``;
* labels ``y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)``;
* size ``n_k ~ LogNormal(4, 2)`` (rounded down), clipped to
  ``[min_client_size, max_client_size]`` (default [20, 1000]; the authors'
  code adds 50 instead of clipping below and does not clip above).

**[choice]** ``N(0, alpha)`` is read with ``alpha`` (and ``beta``) as the
*standard deviation*, as in the authors' generator
(``np.random.normal(0, alpha, ...)``). The model is multinomial logistic
regression. A per-client evaluation hold-out (``eval_fraction`` of each
client's examples, at least one) is concatenated into the task's evaluation
data. Everything derives from ``np.random.default_rng(seed)``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import numpy as np

from tasks import _common
from tasks import models
from tff_sampling.task import Task

NUM_FEATURES = 60
NUM_CLASSES = 10
_SIZE_LOG_MEAN = 4.0
_SIZE_LOG_SIGMA = 2.0


@dataclasses.dataclass(frozen=True)
class SyntheticClients:
  """The generated clients and the parameters that generated them.

  Attributes:
    features: Per client, ``float32[n_k, 60]``.
    labels: Per client, ``int32[n_k]``.
    weights: ``float64[N, 10, 60]``, the clients' ``W_k``.
    biases: ``float64[N, 10]``, the clients' ``b_k``.
    feature_means: ``float64[N, 60]``, the clients' ``v_k``.
    model_shifts: ``float64[N]``, the clients' ``mu_k``.
    feature_shifts: ``float64[N]``, the clients' ``B_k``.
  """

  features: tuple[np.ndarray, ...]
  labels: tuple[np.ndarray, ...]
  weights: np.ndarray
  biases: np.ndarray
  feature_means: np.ndarray
  model_shifts: np.ndarray
  feature_shifts: np.ndarray


def feature_covariance_diagonal() -> np.ndarray:
  """The diagonal ``j^-1.2``, ``j = 1..60``, of the feature covariance."""
  return np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -1.2


def generate_synthetic(
  *,
  alpha: float,
  beta: float,
  num_clients: int,
  min_client_size: int,
  max_client_size: int,
  seed: int,
) -> SyntheticClients:
  """Draws Synthetic(alpha, beta) clients (see the module docstring).

  Args:
    alpha: Standard deviation of the clients' model shifts ``mu_k``.
    beta: Standard deviation of the clients' feature shifts ``B_k``.
    num_clients: Number of clients ``N``.
    min_client_size: Lower clip of the client sizes.
    max_client_size: Upper clip of the client sizes.
    seed: Seed of ``np.random.default_rng``.

  Returns:
    The `SyntheticClients`.
  """
  rng = np.random.default_rng(seed)
  sizes = np.clip(
    rng.lognormal(_SIZE_LOG_MEAN, _SIZE_LOG_SIGMA, num_clients).astype(np.int64),
    min_client_size,
    max_client_size,
  )
  model_shifts = rng.normal(0.0, alpha, num_clients)
  feature_shifts = rng.normal(0.0, beta, num_clients)
  feature_means = rng.normal(feature_shifts[:, None], 1.0, (num_clients, NUM_FEATURES))
  weights = rng.normal(model_shifts[:, None, None], 1.0, (num_clients, NUM_CLASSES, NUM_FEATURES))
  biases = rng.normal(model_shifts[:, None], 1.0, (num_clients, NUM_CLASSES))
  feature_std = np.sqrt(feature_covariance_diagonal())
  features, labels = [], []
  for k in range(num_clients):
    # Sigma is diagonal, so x = v_k + sqrt(diag) * standard normal.
    x = feature_means[k] + feature_std * rng.standard_normal((sizes[k], NUM_FEATURES))
    labels.append(np.argmax(x @ weights[k].T + biases[k], axis=1).astype(np.int32))
    features.append(x.astype(np.float32))
  return SyntheticClients(
    features=tuple(features),
    labels=tuple(labels),
    weights=weights,
    biases=biases,
    feature_means=feature_means,
    model_shifts=model_shifts,
    feature_shifts=feature_shifts,
  )


def _hold_out(
  clients: SyntheticClients, eval_fraction: float
) -> tuple[collections.OrderedDict, np.ndarray, collections.OrderedDict]:
  """``(train, sizes, evaluation)``: the clients' ``{x, y}`` examples in client order, `sizes`
  each, and their last `eval_fraction` held out (at least one, at most all but one)."""
  train_x, train_y, eval_x, eval_y = [], [], [], []
  for x, y in zip(clients.features, clients.labels):
    # Examples are i.i.d. within a client, so the last ones are a fair hold-out.
    held_out = min(len(y) - 1, max(1, int(round(eval_fraction * len(y)))))
    train_x.append(x[:-held_out])
    train_y.append(y[:-held_out])
    eval_x.append(x[-held_out:])
    eval_y.append(y[-held_out:])
  return (
    collections.OrderedDict(x=np.concatenate(train_x), y=np.concatenate(train_y)),
    np.array([len(y) for y in train_y], np.int64),
    collections.OrderedDict(x=np.concatenate(eval_x), y=np.concatenate(eval_y)),
  )


def create_synthetic_task(
  *,
  client_batch_size: int = 20,
  client_epochs: int = 1,
  max_client_examples: int | None = None,
  seed: int = 0,
  eval_batch_size: int = 256,
  alpha: float = 0.5,
  beta: float = 0.5,
  num_clients: int = 30,
  min_client_size: int = 20,
  max_client_size: int = 1000,
  eval_fraction: float = 0.2,
) -> Task:
  """Builds the ``synthetic`` task (Synthetic(alpha, beta), logistic regression).

  Args:
    client_batch_size, client_epochs, max_client_examples, eval_batch_size: The
      common options (`tasks.registry`).
    seed: Seed of the generated data.
    alpha: Model heterogeneity (standard deviation of ``mu_k``), >= 0.
    beta: Data heterogeneity (standard deviation of ``B_k``), >= 0.
    num_clients: Number of clients.
    min_client_size: Lower clip of the generated client sizes (>= 2, so a
      client keeps at least one training and one evaluation example).
    max_client_size: Upper clip of the generated client sizes.
    eval_fraction: Fraction of each client's examples held out for
      evaluation (rounded, at least one, at most ``n_k - 1``).

  Returns:
    The `Task`. Raw elements are ``OrderedDict(x=float32[60], y=int32[])``;
    training batches ``OrderedDict(x=float32[B, 60], y=int32[B])``. The
    client statistics count training examples only.
  """
  options = _common.check_common_options(
    client_batch_size, client_epochs, max_client_examples, seed, eval_batch_size
  )
  options.update(
    alpha=_common.check_float('alpha', alpha, min_inclusive=True),
    beta=_common.check_float('beta', beta, min_inclusive=True),
    num_clients=_common.check_int('num_clients', num_clients),
    min_client_size=_common.check_int('min_client_size', min_client_size, minimum=2),
    max_client_size=_common.check_int('max_client_size', max_client_size, minimum=2),
    eval_fraction=_common.check_float(
      'eval_fraction', eval_fraction, maximum=1.0, max_inclusive=False
    ),
  )
  if options['max_client_size'] < options['min_client_size']:
    raise ValueError(
      f'max_client_size={options["max_client_size"]} is smaller than '
      f'min_client_size={options["min_client_size"]}.'
    )

  clients = generate_synthetic(
    alpha=options['alpha'],
    beta=options['beta'],
    num_clients=options['num_clients'],
    min_client_size=options['min_client_size'],
    max_client_size=options['max_client_size'],
    seed=options['seed'],
  )
  train, sizes, evaluation = _hold_out(clients, options['eval_fraction'])
  return _common.in_memory_task(
    'synthetic',
    options,
    train=train,
    sizes=sizes,
    eval_data=_common.tf_dataset_from_arrays(evaluation),
    keras_model_fn=functools.partial(models.logistic_regression, NUM_FEATURES, NUM_CLASSES),
    num_classes=NUM_CLASSES,
  )
