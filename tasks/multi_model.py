"""Task suites for multi-model FL: ``S`` tasks over one population of ``N`` clients.

Client ``i`` of the population is client ``i`` of every task of the suite
(`tff_sampling.program.multi_model.align_clients`).

* ``digits_noniid`` (offline; the slides' first setting, scaled): ``S``
  partitions of ``digits`` with different non-IID levels, Dirichlet
  ``α_s`` = `NONIID_ALPHAS` (0.05 … 10; geometric for other ``S``), and unbalanced
  sizes (log-normal σ = `SIZE_SIGMA` = 1.55: the largest 10% of 120 clients
  hold 51% of the examples on average over 20 seeds, the slides' 52.6%).
  Task ``s`` is partitioned with seed ``seed + s``.
* ``femnist_noniid`` (TFF's cached FEMNIST digits; the slides' setting on real
  images): ``S`` tasks, each the real FEMNIST digit examples pooled and dealt to
  the ``N`` clients (``emnist_skewed``) with the Dirichlet ``α_s`` and log-normal
  sizes of ``digits_noniid``, classified by LEFL's 784-128-10 FFNN; task ``s``
  is partitioned with seed ``seed + s``.
* ``digits_synthetic`` (offline; two different models): ``digits`` (MLP)
  and ``synthetic`` (logistic regression on Synthetic(0.5, 0.5)).
* ``leaf`` (TFF's cached LEAF data): FEMNIST, Shakespeare and CIFAR-100 (the
  first 2 or 3), each cut to its first ``N`` clients.
* ``femnist_models`` (TFF's cached FEMNIST, all 62 classes): two models of
  different size on the same writers' data, McMahan et al.'s CNN (1.69 M
  parameters) and 2NN (0.2 M), cut to the first ``N`` writers.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from tasks import registry
from tff_sampling.program import multi_model as multi_model_program
from tff_sampling.task import Task

# Suite -> (default, fewest, most) models.
_NUM_MODELS = collections.OrderedDict(
  digits_noniid=(5, 1, 20),
  femnist_noniid=(5, 1, 20),
  digits_synthetic=(2, 2, 2),
  leaf=(3, 2, 3),
  femnist_models=(2, 2, 2),
)
SUITES = tuple(_NUM_MODELS)
NONIID_ALPHAS = (0.05, 0.1, 0.3, 1.0, 10.0)
SIZE_SIGMA = 1.55
_LEAF = ('emnist', 'shakespeare', 'cifar100')


def noniid_alphas(num_models: int) -> tuple[float, ...]:
  """The Dirichlet ``α_s`` of ``digits_noniid``: `NONIID_ALPHAS` for 5 models."""
  if num_models == len(NONIID_ALPHAS):
    return NONIID_ALPHAS
  return tuple(float(a) for a in np.geomspace(0.05, 10.0, num_models)) if num_models > 1 else (0.5,)


def _check_num_models(name: str, num_models: Any) -> int:
  """`num_models` (``None``: the suite's default) if the suite can give that many."""
  default, fewest, most = _NUM_MODELS[name]
  num_models = default if num_models is None else num_models
  if (
    isinstance(num_models, bool)
    or not isinstance(num_models, (int, np.integer))
    or not fewest <= num_models <= most
  ):
    raise ValueError(f'Suite {name!r} has {fewest}-{most} models, got --num_models={num_models!r}.')
  return num_models


def _noniid_tasks(task: str, num_models: int, seed: int, **options: Any) -> list[Task]:
  """Task ``s``: `task` with ``α_s`` of `noniid_alphas`, size σ `SIZE_SIGMA`, seed ``seed + s``."""
  return [
    registry.get_task(task, seed=seed + s, dirichlet_alpha=alpha, size_sigma=SIZE_SIGMA, **options)
    for s, alpha in enumerate(noniid_alphas(num_models))
  ]


def create_suite(
  name: str,
  *,
  num_models: int | None = None,
  num_clients: int = 120,
  seed: int = 0,
  client_epochs: int = 1,
  client_batch_size: int = 10,
  cache_dir: str | None = None,
) -> list[Task]:
  """Builds the tasks of suite `name` (see the module docstring).

  Args:
    name: One of `SUITES`.
    num_models: ``S``; ``None`` takes the suite's default (5, 5, 2, 3, 2).
    num_clients: ``N``, the population size.
    seed: Data seed (partitions and evaluation splits).
    client_epochs: Local epochs of every task.
    client_batch_size: Local batch size of every task.
    cache_dir: TFF dataset cache (``femnist_noniid``, ``leaf``, ``femnist_models``).

  Raises:
    ValueError: For an unknown suite, a model count the suite cannot give, or
      more clients than a task has.
  """
  if name not in SUITES:
    raise ValueError(f'Unknown suite {name!r}; choose from {", ".join(SUITES)}.')
  num_models = _check_num_models(name, num_models)
  common = dict(client_epochs=client_epochs, client_batch_size=client_batch_size)
  if name == 'digits_noniid':
    return _noniid_tasks('digits', num_models, seed, num_clients=num_clients, **common)
  if name == 'femnist_noniid':
    femnist = dict(cache_dir=cache_dir, only_digits=True, model='ffnn', partition='dirichlet')
    return _noniid_tasks(
      'emnist_skewed', num_models, seed, num_clients=num_clients, **femnist, **common
    )
  if name == 'digits_synthetic':
    return [
      registry.get_task('digits', num_clients=num_clients, seed=seed, **common),
      registry.get_task('synthetic', num_clients=num_clients, seed=seed, **common),
    ]
  if name == 'femnist_models':
    return multi_model_program.align_clients(
      [
        registry.get_task(
          'emnist', seed=seed, cache_dir=cache_dir, only_digits=False, model=model, **common
        )
        for model in ('cnn', '2nn')
      ],
      num_clients,
    )
  return multi_model_program.align_clients(
    [
      registry.get_task(task, seed=seed, cache_dir=cache_dir, **common)
      for task in _LEAF[:num_models]
    ],
    num_clients,
  )
