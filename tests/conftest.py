"""Shared fixtures: small tasks built once per test session."""

import gc
import os

import hypothesis
import pytest

# CI runs the property tests with a fixed example sequence, so that a red CI run
# is reproducible; local runs keep exploring new examples.
hypothesis.settings.register_profile('ci', derandomize=True)
if os.environ.get('CI'):
  hypothesis.settings.load_profile('ci')


def pytest_configure(config):
  """``CPU_CENSUS=<file>``: each test's CPU, by kind, appended to <file> (`cpu_census`)."""
  if os.environ.get('CPU_CENSUS'):
    import cpu_census

    config.pluginmanager.register(cpu_census.Census(os.environ['CPU_CENSUS']), 'cpu_census')


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
  """Collection imports TensorFlow, TFF and every test module: a few million objects that live
  as long as the worker, none of them garbage. The cyclic collector pauses while they are
  imported, then leaves them out of its passes (`gc.freeze`), as the binaries do
  (bin/__init__.py)."""
  del session
  gc.disable()
  try:
    return (yield)
  finally:
    gc.freeze()
    gc.enable()


def pytest_xdist_auto_num_workers(config):
  """``-n auto`` (pytest.ini): one worker per core and one more, at most 5.

  Many tests spend part of their time waiting (for a subprocess's TFF worker to
  start, for a deadline a fault test sets); the extra worker uses those seconds.
  Each worker imports TensorFlow and TFF (about 1.5 GB).
  """
  del config
  return max(1, min((os.cpu_count() or 1) + 1, 5))


def pytest_collection_modifyitems(items):
  """The tests marked slow first, each group in file order (a stable sort).

  Workers take contiguous shares and then steal from each other's remainders,
  so the long tests start at once and the short ones fill in at the end.
  """
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


@pytest.fixture(scope='session')
def small_digits_task():
  """`digits` with 20 clients: a FedAvg round takes ~0.1 s."""
  import tasks  # Not at the top: collection imports it, with the collector paused.

  return tasks.get_task('digits', num_clients=20, client_batch_size=10)


@pytest.fixture(autouse=True, scope='session')
def _absl_flags_parsed():
  """Binaries' flags take their defaults unless a test sets them (flagsaver)."""
  from absl import flags

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
