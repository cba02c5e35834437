"""Where the suite's CPU goes, test by test: a pytest plugin and its summary.

    CPU_CENSUS=/tmp/census.jsonl ./run test         # one JSON line per test (tests/conftest.py)
    python tests/cpu_census.py /tmp/census.jsonl    # totals, per file, the costliest tests

(``docs/testing_cpu_census.jsonl.gz`` is one such file, summarised in ``docs/testing.md``.)

Per test, in CPU seconds: ``self`` is the pytest worker's own (all its threads); ``children``
the processes it started and waited for (binaries, snippets, drivers' binary calls: each
also pays for importing TensorFlow); ``workers`` what its live descendants, TFF's worker
processes, used meanwhile; ``tracing`` the part of ``self`` spent tracing TensorFlow
computations (building processes), and ``invoking`` the part spent in TFF's execution
context calling them (compiling a computation on its first call, moving values). The
first two come from the kernel (``getrusage``), the third from psutil, the last two from
timing two TFF 0.87 functions. A descendant that ends during a test leaves ``workers`` (which
may then be negative) for ``children``, so their sum holds. Nothing here is asserted: it is
a developer's measurement.
"""

from __future__ import annotations

import collections
import gzip
import json
import resource
import sys
import time

import psutil
import pytest


def _rusage_cpu(who: int) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def _descendants_cpu() -> float:
  total = 0.0
  for child in psutil.Process().children(recursive=True):
    try:
      times = child.cpu_times()
    except psutil.Error:
      continue
    total += times.user + times.system + times.children_user + times.children_system
  return total


class Census:
  """Writes one JSON line per test to `path` (appending: xdist workers share the file)."""

  def __init__(self, path: str):
    self.path = path
    self.spent = {'tracing': 0.0, 'invoking': 0.0}
    self._timed = False

  def _time(self, owner, name: str, key: str) -> None:
    original = getattr(owner, name)
    depth = [0]

    def timed(*args, **kwargs):
      depth[0] += 1
      start = time.process_time()
      try:
        return original(*args, **kwargs)
      finally:
        depth[0] -= 1
        if not depth[0]:
          self.spent[key] += time.process_time() - start

    setattr(owner, name, timed)

  def _time_tff(self) -> None:
    from tensorflow_federated.python.core.environments.tensorflow_frontend import (
      tensorflow_serialization,
    )
    from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context

    self._time(tensorflow_serialization, 'serialize_py_fn_as_tf_computation', 'tracing')
    self._time(sync_execution_context.SyncExecutionContext, 'invoke', 'invoking')
    self._timed = True

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item):
    if not self._timed:
      self._time_tff()
    before = (_rusage_cpu(resource.RUSAGE_SELF), _rusage_cpu(resource.RUSAGE_CHILDREN))
    workers, spent = _descendants_cpu(), dict(self.spent)
    yield
    record = {
      'test': item.nodeid,
      'self': _rusage_cpu(resource.RUSAGE_SELF) - before[0],
      'children': _rusage_cpu(resource.RUSAGE_CHILDREN) - before[1],
      'workers': _descendants_cpu() - workers,
      **{key: self.spent[key] - spent[key] for key in spent},
    }
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')


_COLUMNS = ('self', 'children', 'workers', 'tracing', 'invoking')


def summary(path: str, top: int = 15) -> str:
  """Totals, the files by CPU, and the `top` costliest tests, as text."""
  with (gzip.open if path.endswith('.gz') else open)(path, 'rt') as f:
    records = [json.loads(line) for line in f]
  header = f'{"total":>7} ' + ' '.join(f'{c:>8}' for c in _COLUMNS)

  def cost(values):
    return values['self'] + values['children'] + values['workers']

  def row(values, name):
    return f'{cost(values):7.0f} ' + ' '.join(f'{values[c]:8.0f}' for c in _COLUMNS) + f'  {name}'

  by_file = collections.defaultdict(collections.Counter)
  for record in records:
    by_file[record['test'].split('::')[0]].update({c: record[c] for c in _COLUMNS})
  everything = collections.Counter()
  for values in by_file.values():
    everything.update(values)
  lines = [f'{len(records)} tests, CPU seconds', header, row(everything, 'all'), '', header]
  lines += [row(v, name) for name, v in sorted(by_file.items(), key=lambda kv: -cost(kv[1]))]
  lines += ['', header]
  lines += [row(r, r['test']) for r in sorted(records, key=lambda r: -cost(r))[:top]]
  return '\n'.join(lines)


if __name__ == '__main__':
  print(summary(sys.argv[1], *(int(a) for a in sys.argv[2:3])))
