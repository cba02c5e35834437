"""Shared fixtures: small tasks built once per test session."""

import os

import hypothesis
import pytest

import tasks

# CI runs the property tests with a fixed example sequence, so that a red CI run
# is reproducible; local runs keep exploring new examples.
hypothesis.settings.register_profile('ci', derandomize=True)
if os.environ.get('CI'):
  hypothesis.settings.load_profile('ci')


def pytest_xdist_auto_num_workers(config):
  """``-n auto`` (pytest.ini): one worker per core, at most 4.

  Each worker imports TensorFlow and TFF (about 1.5 GB); more than 4 gain
  little, because many tests run TFF's multi-threaded C++ executor.
  """
  del config
  return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(scope='session')
def small_digits_task():
  """`digits` with 20 clients: a FedAvg round takes ~0.1 s."""
  return tasks.get_task('digits', num_clients=20, client_batch_size=10)


@pytest.fixture(autouse=True, scope='session')
def _absl_flags_parsed():
  """Binaries' flags take their defaults unless a test sets them (flagsaver)."""
  from absl import flags

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
