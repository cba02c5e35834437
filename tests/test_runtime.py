"""Tests for tff_sampling/runtime.py."""

import logging
import os
import subprocess
import sys

import psutil

from tff_sampling import runtime

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worker_pids():
  pids = set()
  for proc in psutil.process_iter(['name', 'cmdline']):
    try:
      if proc.info['name'] == 'worker_binary' or any(
          'worker_binary' in part for part in (proc.info['cmdline'] or [])[:1]):
        pids.add(proc.pid)
    except psutil.Error:
      continue
  return pids


def test_no_worker_outlives_a_program():
  # Without the atexit hook, TFF's local C++ worker survives its parent.
  code = ('import numpy as np, tensorflow_federated as tff, tff_sampling\n'
          'print(tff.tensorflow.computation(lambda: np.int32(7))())\n')
  before = _worker_pids()
  proc = subprocess.run([sys.executable, '-c', code], cwd=_REPO, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == '7', proc.stderr[-2000:]
  assert _worker_pids() - before == set()


def test_quiet_library_logs_keeps_own_info_and_library_warnings():
  runtime.quiet_library_logs()
  runtime.quiet_library_logs()  # Idempotent.
  logger = logging.getLogger('absl')
  assert sum(isinstance(f, runtime._OwnInfoOnly) for f in logger.filters) == 1

  def record(level, path):
    return logging.LogRecord('absl', level, path, 1, 'message', None, None)

  library = '/x/site-packages/tensorflow_federated/program/file.py'
  assert not logger.filter(record(logging.INFO, library))
  assert logger.filter(record(logging.WARNING, library))
  assert logger.filter(record(logging.INFO, '/work/tff_sampling/program.py'))


def test_a_worker_that_ignores_the_shutdown_does_not_hang_the_exit():
  """TFF's own shutdown waits for its worker with no time limit; after a long
  run a worker was seen ignoring SIGINT, hanging the exit forever. Simulated
  here by a release that blocks until the worker dies: the watchdog kills it."""
  code = ('import time, numpy as np, tensorflow_federated as tff\n'
          'from tff_sampling import runtime\n'
          'tff.tensorflow.computation(lambda: np.int32(7))()\n'
          'workers = runtime._local_workers()\n'
          'runtime._release_execution_context = lambda: [w.wait() for w in workers]\n'
          'start = time.monotonic()\n'
          'stopped = runtime.stop_local_workers(timeout_s=2.0)\n'
          'print(len(workers), stopped, round(time.monotonic() - start),\n'
          '      any(w.is_running() for w in workers))\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=_REPO, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  workers, stopped, seconds, running = proc.stdout.split()[-4:]
  assert int(workers) >= 1 and int(stopped) == int(workers)
  assert 2 <= int(seconds) <= 10 and running == 'False'


def test_switching_to_the_secure_sum_context_cannot_hang_on_the_old_worker():
  """Replacing a context that already ran a computation stops its worker the
  same blocking way (seen hanging a LEFL run after its pre-processing round);
  simulated by a switch that blocks until the worker dies."""
  code = ('import time, numpy as np, tensorflow_federated as tff\n'
          'from tff_sampling import runtime\n'
          'tff.tensorflow.computation(lambda: np.int32(7))()\n'
          'workers = runtime._local_workers()\n'
          'tff.backends.test.set_sync_test_cpp_execution_context = (\n'
          '    lambda: [w.wait() for w in workers])\n'
          'runtime._SHUTDOWN_TIMEOUT_S = 2.0\n'
          'start = time.monotonic()\n'
          'runtime.use_secure_sum_simulation()\n'
          'print(len(workers), round(time.monotonic() - start),\n'
          '      any(w.is_running() for w in workers))\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=_REPO, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  workers, seconds, running = proc.stdout.split()[-3:]
  assert int(workers) >= 1 and 2 <= int(seconds) <= 10 and running == 'False'
