"""Tests for tasks/registry.py: names, options, and errors."""

import pytest

import tasks
from tasks import get_task
from tasks import task_names
from tasks import task_options
from tff_sampling.task import Task

COMMON = ('client_batch_size', 'client_epochs', 'max_client_examples', 'seed', 'eval_batch_size')


def test_names_and_options():
  assert task_names() == (
    'digits',
    'synthetic',
    'emnist',
    'emnist_skewed',
    'emnist_unbalanced_1',
    'emnist_unbalanced_2',
    'emnist_unbalanced_3',
    'shakespeare',
    'cifar100',
    'cifar10',
  )
  for name in task_names():
    assert set(COMMON) <= set(task_options(name))
  for name in ('emnist', 'shakespeare', 'cifar100'):
    assert {'cache_dir', 'max_eval_examples', 'model'} <= set(task_options(name))
  assert 'only_digits' in task_options('emnist')
  assert {'only_digits', 'num_clients', 'partition', 'dirichlet_alpha', 'model'} <= set(
    task_options('emnist_skewed')
  )
  assert 'sequence_length' in task_options('shakespeare')
  assert {'crop_size', 'distort_images'} <= set(task_options('cifar100'))
  assert {'alpha', 'beta', 'num_clients'} <= set(task_options('synthetic'))
  assert {'preset', 'dirichlet_alpha', 'size_sigma'} <= set(task_options('digits'))
  assert {
    'data_dir',
    'max_eval_examples',
    'model',
    'dirichlet_alpha',
    'size_profile',
    'size_group_clients',
    'size_group_examples',
  } <= set(task_options('cifar10'))
  assert tasks.task_option_defaults('cifar10')['dirichlet_alpha'] == 0.1
  assert tasks.task_option_defaults('digits')['client_batch_size'] == 20
  assert tasks.task_option_defaults('shakespeare')['sequence_length'] == 5


def test_get_task_returns_task_with_resolved_options():
  task = get_task('synthetic', num_clients=4, client_batch_size=7)
  assert isinstance(task, Task)
  assert task.options['client_batch_size'] == 7
  assert task.options['num_clients'] == 4
  assert set(task.options) == set(task_options('synthetic'))


def test_unknown_task():
  with pytest.raises(ValueError, match=r"Unknown task 'femnist'; valid tasks: digits, synthetic"):
    get_task('femnist')
  with pytest.raises(ValueError, match='Unknown task'):
    task_options('nope')


def test_option_of_another_task():
  with pytest.raises(ValueError) as error:
    get_task('digits', only_digits=False)
  message = str(error.value)
  assert (
    "Task 'digits' does not accept option(s) 'only_digits' (an option of: emnist, "
    'emnist_skewed, emnist_unbalanced_1, emnist_unbalanced_2, emnist_unbalanced_3)'
  ) in message
  assert 'its options are: client_batch_size, client_epochs' in message
  with pytest.raises(ValueError, match=r"'crop_size' \(an option of: cifar100\)"):
    get_task('shakespeare', crop_size=24)
  with pytest.raises(ValueError, match="does not accept option\\(s\\) 'bogus';"):
    get_task('synthetic', bogus=1)


@pytest.mark.parametrize(
  'name, options, pattern',
  [
    ('digits', {'client_batch_size': 0}, 'client_batch_size must be an integer >= 1, got 0'),
    ('digits', {'client_batch_size': '20'}, "client_batch_size must be an integer, got '20'"),
    ('digits', {'client_epochs': True}, 'client_epochs must be an integer, got True'),
    ('digits', {'max_client_examples': -3}, 'max_client_examples must be an integer >= 1'),
    ('digits', {'seed': -1}, r'seed must be an integer in \[0, 4294967295\], got -1'),
    ('digits', {'eval_fraction': 1.0}, r'eval_fraction must be in \(0.0, 1.0\), got 1.0'),
    ('digits', {'dirichlet_alpha': 0}, 'dirichlet_alpha must be in'),
    ('digits', {'size_sigma': float('nan')}, 'size_sigma must be a finite number, got nan'),
    (
      'digits',
      {'preset': 'skewed'},
      r"preset must be one of \['default', 'unbalanced', 'shards', 'two_labels'\], got 'skewed'",
    ),
    (
      'digits',
      {'preset': 'shards', 'size_sigma': 0.0},
      "size_sigma does not apply to preset='shards'",
    ),
    ('digits', {'model': 'cnn'}, "model must be one of \\['mlp', 'logistic'\\], got 'cnn'"),
    ('synthetic', {'alpha': -0.5}, r'alpha must be in \[0.0, inf\], got -0.5'),
    ('synthetic', {'min_client_size': 1}, 'min_client_size must be an integer >= 2, got 1'),
    ('emnist', {'only_digits': 'yes'}, "only_digits must be True or False, got 'yes'"),
    ('emnist', {'model': 'resnet18'}, r"model must be one of \['cnn', '2nn'\]"),
    ('shakespeare', {'sequence_length': 0}, 'sequence_length must be an integer >= 1, got 0'),
    ('cifar100', {'crop_size': 33}, r'crop_size must be an integer in \[1, 32\], got 33'),
    ('cifar100', {'max_eval_examples': 0}, 'max_eval_examples must be an integer >= 1, got 0'),
    ('cifar10', {'dirichlet_alpha': 0.0}, r'dirichlet_alpha must be in \(0.0, inf\], got 0.0'),
    (
      'cifar10',
      {'size_profile': 'uniform'},
      r"size_profile must be one of \['fraboni', 'balanced'\], got 'uniform'",
    ),
    (
      'cifar10',
      {'size_group_clients': (10, 30)},
      r'same length, got \[10, 30\] and \[100, 250, 500, 750, 1000\]',
    ),
    (
      'cifar10',
      {'size_group_examples': (100, 0, 500, 750, 1000)},
      'size_group_examples must be an integer >= 1, got 0',
    ),
    (
      'cifar10',
      {'size_group_clients': '10'},
      "size_group_clients must be a non-empty list of integers >= 1, got '10'",
    ),
    (
      'cifar10',
      {'size_group_clients': (60,), 'size_group_examples': (1000,)},
      'needs 60000 training examples \\(60 clients\\), but the cifar10 train split has 50000',
    ),
    ('cifar10', {'model': 'resnet18'}, r"model must be one of \['lenet', 'vgg'\]"),
    ('cifar10', {'data_dir': 3}, 'data_dir must be a string or None, got 3'),
  ],
)
def test_bad_values(name, options, pattern):
  # Values are checked before any data is touched (no cache file needed).
  with pytest.raises(ValueError, match=pattern):
    get_task(name, **options)
