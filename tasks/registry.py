"""The task registry: build any task by name with keyword options.

    task = get_task('digits', num_clients=50, client_batch_size=10)

Every task accepts the common options ``client_batch_size`` (the clients' local
batch size), ``client_epochs`` (local epochs per round), ``max_client_examples``
(optional cap on a client's examples per epoch, ``None`` = all), ``seed`` (the
task's data seed; each builder says what it seeds) and ``eval_batch_size`` (the
evaluation batch size); the TFF-backed tasks also ``cache_dir`` and
``max_eval_examples``, the TFDS-backed ``cifar10`` ``data_dir`` and
``max_eval_examples``; the rest is per task (`task_options`). The
``emnist_unbalanced_{1,2,3}`` tasks take ``emnist``'s options plus the
``unbalance_*`` ones (`tasks.emnist.create_emnist_unbalanced_task`). An option that
belongs to another task is an error, so a command-line flag meant for one task
cannot silently do nothing for another.
"""

from __future__ import annotations

from collections.abc import Callable
import inspect
from typing import Any

from tasks import cifar10
from tasks import cifar100
from tasks import digits
from tasks import emnist
from tasks import emnist_skewed
from tasks import shakespeare
from tasks import synthetic
from tff_sampling.task import Task

_CONSTRUCTORS: dict[str, Callable[..., Task]] = {
  'digits': digits.create_digits_task,
  'synthetic': synthetic.create_synthetic_task,
  'emnist': emnist.create_emnist_task,
  'emnist_skewed': emnist_skewed.create_emnist_skewed_task,
  'emnist_unbalanced_1': emnist.unbalanced_task_constructor(1),
  'emnist_unbalanced_2': emnist.unbalanced_task_constructor(2),
  'emnist_unbalanced_3': emnist.unbalanced_task_constructor(3),
  'shakespeare': shakespeare.create_shakespeare_task,
  'cifar100': cifar100.create_cifar100_task,
  'cifar10': cifar10.create_cifar10_task,
}


def task_names() -> tuple[str, ...]:
  """The registered task names."""
  return tuple(_CONSTRUCTORS)


def _constructor(name: str) -> Callable[..., Task]:
  if name not in _CONSTRUCTORS:
    raise ValueError(f'Unknown task {name!r}; valid tasks: {", ".join(task_names())}.')
  return _CONSTRUCTORS[name]


def task_options(name: str) -> tuple[str, ...]:
  """The option names task `name` accepts (its constructor's keywords)."""
  parameters = inspect.signature(_constructor(name)).parameters.values()
  return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def task_option_defaults(name: str) -> dict[str, Any]:
  """Option name -> default value for task `name`."""
  parameters = inspect.signature(_constructor(name)).parameters.values()
  return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def get_task(name: str, **options: Any) -> Task:
  """Builds task `name` with `options`.

  Args:
    name: One of `task_names`.
    **options: Options of that task (`task_options`); missing ones take their
      defaults.

  Returns:
    The `Task`.

  Raises:
    ValueError: For an unknown task, an option the task does not accept
      (naming the tasks that do accept it), or an invalid option value.
    FileNotFoundError: For a TFF-backed task whose cached database is missing,
      or ``cifar10`` without its TFDS data.
  """
  constructor = _constructor(name)
  valid = task_options(name)
  unknown = [option for option in options if option not in valid]
  if unknown:
    details = []
    for option in unknown:
      owners = [other for other in task_names() if option in task_options(other)]
      details.append(f'{option!r}' + (f' (an option of: {", ".join(owners)})' if owners else ''))
    raise ValueError(
      f'Task {name!r} does not accept option(s) {", ".join(details)}; '
      f'its options are: {", ".join(valid)}.'
    )
  return constructor(**options)
