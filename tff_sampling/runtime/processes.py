"""Child processes that end with their parent, however it ends.

`start` runs a command as a child that Linux signals when this process dies
(``PR_SET_PDEATHSIG``), SIGKILL included, so that no process outlives the
program: the TFF workers (`tff_sampling.runtime.workers`, signalled with SIGKILL: they
hold nothing worth saving), the training binaries of ``bin.experiment`` and the
``bin.experiment`` driver of ``bin.benchmark_grid`` (signalled with SIGTERM: they
stop so that their runs resume from the last checkpoint). `stop` stops one.
This module imports neither TensorFlow nor TFF.
"""

from __future__ import annotations

from collections.abc import Sequence
import concurrent.futures
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any

# Runs in the child before it becomes the command (`os.execv`), so no Python
# code runs in a forked child of this possibly multi-threaded process (a
# `preexec_fn` can deadlock there, Python's docs warn). argv: parent pid, the
# signal's number, the command. It asks Linux to send the signal when the parent
# dies (`PR_SET_PDEATHSIG`, kept across exec), covering a parent killed by a
# signal, when none of its own clean-up runs. If the parent died before the
# request took effect, it exits at once. A program started as a shell's
# background job has SIGINT ignored, which its children would inherit; a child
# must stop on SIGINT/SIGTERM when asked.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
for signum in (signal.SIGINT, signal.SIGTERM):
  signal.signal(signum, signal.SIG_DFL)
if ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2])) == 0:
  if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.argv[3], sys.argv[3:])
"""


class _Launcher:
  """Forks children from one thread that lives as long as this process.

  Linux sends ``PR_SET_PDEATHSIG``'s signal when the *thread* that forked the
  child ends, not the process. TFF workers are started from short-lived threads
  too (TFF creates executors from the event-loop thread of an execution context,
  which ends with the context), so every fork goes through this thread, which
  only ends with the process (a daemon thread blocked on its queue).
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._requests: queue.SimpleQueue = queue.SimpleQueue()
    self._pid = None  # The process the thread runs in (a fork has none).

  def popen(self, args: Sequence[str], death_signal: int, **kwargs: Any) -> subprocess.Popen:
    if not sys.platform.startswith('linux'):
      return subprocess.Popen(args, **kwargs)
    with self._lock:
      if self._pid != os.getpid():
        self._requests = queue.SimpleQueue()
        threading.Thread(
          target=self._serve,
          args=(self._requests,),
          daemon=True,
          name='tff-sampling-process-launcher',
        ).start()
        self._pid = os.getpid()
      requests = self._requests
    result: concurrent.futures.Future[subprocess.Popen] = concurrent.futures.Future()
    requests.put((list(args), int(death_signal), kwargs, result))
    return result.result()

  @staticmethod
  def _serve(requests: queue.SimpleQueue) -> None:
    while True:
      args, death_signal, kwargs, result = requests.get()
      try:
        trampoline = [sys.executable, '-I', '-S', '-c', _DIE_WITH_PARENT, str(os.getpid())]
        result.set_result(subprocess.Popen([*trampoline, str(death_signal), *args], **kwargs))
      except BaseException as e:  # pylint: disable=broad-except  # Handed to the caller.
        result.set_exception(e)


_LAUNCHER = _Launcher()


def start(
  args: Sequence[str], *, death_signal: int = signal.SIGTERM, **popen_kwargs: Any
) -> subprocess.Popen:
  """`subprocess.Popen(args, **popen_kwargs)` whose process Linux sends `death_signal` when
  this process dies.

  `args[0]` is the absolute path of an executable (exec'd as is, no PATH lookup). Popen's
  arguments that would apply to the launching step instead of the command (`_UNSUPPORTED`)
  are refused.

  Raises:
    ValueError: If `args[0]` is not an absolute path, or an unsupported argument is given.
    FileNotFoundError, PermissionError: If `args[0]` is not an executable file.
  """
  program = args[0]
  if not os.path.isabs(program):
    raise ValueError(f'{program!r} is not an absolute path; pass the full path of the program.')
  if not os.path.isfile(program):
    raise FileNotFoundError(f'{program!r} does not exist or is not a file.')
  if not os.access(program, os.X_OK):
    raise PermissionError(f'{program!r} is not executable.')
  unsupported = sorted(set(popen_kwargs) & _UNSUPPORTED)
  if unsupported:
    raise ValueError(f'processes.start does not take {", ".join(unsupported)}; use subprocess.')
  return _LAUNCHER.popen(args, death_signal, **popen_kwargs)


# They would name the launching interpreter's program, not the command it becomes (the
# process's other settings, e.g. its session or file descriptors, carry over the exec).
_UNSUPPORTED = frozenset({'executable', 'shell'})


def stop(process: subprocess.Popen, timeout_s: float) -> None:
  """SIGTERM, then SIGKILL after `timeout_s` (0: at once); waits for (reaps) the process."""
  if process.poll() is None:
    if timeout_s > 0:
      process.terminate()
      try:
        process.wait(timeout_s)
        return
      except subprocess.TimeoutExpired:
        pass
    process.kill()
  process.wait()
