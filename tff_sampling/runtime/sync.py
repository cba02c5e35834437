"""Running `tff.program`'s coroutines from synchronous code, inside Jupyter too.

TFF's release and program-state managers are ``async``. A script runs them with
`asyncio.run`, which refuses to start while an event loop is already running in
the thread, as one always is in a Jupyter kernel. `run` uses `asyncio.run` where it
can and otherwise runs the coroutine on a fresh event loop in a helper thread,
waiting for it, so the same call works in a script, a test and a notebook.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
import concurrent.futures
from typing import Any, TypeVar

_T = TypeVar('_T')


def run(coroutine: Coroutine[Any, Any, _T]) -> _T:
  """Runs `coroutine` to completion and returns its result (or raises its exception)."""
  try:
    asyncio.get_running_loop()
  except RuntimeError:  # No loop running in this thread: the ordinary case.
    return asyncio.run(coroutine)

  def run_in_thread() -> _T:
    return asyncio.run(coroutine)

  with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='tff-sampling-sync') as pool:
    return pool.submit(run_in_thread).result()
