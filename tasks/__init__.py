"""Federated learning tasks: data, preprocessing, seeded models, statistics.

`get_task(name, **options)` builds a `tff_sampling.task.Task` (the interface the
library's round loop consumes, defined there) from the registry (`task_names`,
`task_options`): the embedded offline tasks ``digits`` and ``synthetic``,
``emnist``, ``shakespeare``, ``cifar100`` through TensorFlow Federated's
loaders (which need their cached SQLite files), the unbalanced FEMNIST sets
``emnist_unbalanced_1``, ``_2``, ``_3`` (`tasks.unbalance`), and ``cifar10``
through TensorFlow Datasets (which needs its prepared data).
"""

from tasks.registry import get_task
from tasks.registry import task_names
from tasks.registry import task_option_defaults
from tasks.registry import task_options

__all__ = ['get_task', 'task_names', 'task_option_defaults', 'task_options']
