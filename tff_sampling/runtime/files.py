"""Files written whole: a reader sees the old file or the new one, never half; checks
that files on disk hold what a report would write; and temporary directories of our own."""

from __future__ import annotations

import atexit
from collections.abc import Iterator, Mapping
import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[str]:
  """Yields a temporary path beside `path` to write; renames it onto `path` on success.

  The temporary file is removed whatever happens, so a failed write leaves `path`
  as it was and nothing beside it.
  """
  temporary = f'{os.fspath(path)}.tmp{os.getpid()}'
  try:
    yield temporary
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> None:
  """Writes `data` (text as UTF-8) to `path` through `replacing`."""
  with replacing(path) as temporary:
    if isinstance(data, bytes):
      with open(temporary, 'wb') as f:
        f.write(data)
    else:
      with open(temporary, 'w', encoding='utf-8') as f:
        f.write(data)


def _as_bytes(data: str | bytes) -> bytes:
  return data if isinstance(data, bytes) else data.encode('utf-8')


def differing(expected: Mapping[str, str | bytes]) -> list[str]:
  """The paths of `expected` whose file is missing or holds other bytes, in its order."""
  stale = []
  for path, data in expected.items():
    try:
      with open(path, 'rb') as f:
        same = f.read() == _as_bytes(data)
    except OSError:
      same = False
    if not same:
      stale.append(path)
  return stale


_PRIVATE_TEMPDIR: list[str] = []  # This process's, once `use_private_tempdir` made it.


def use_private_tempdir() -> None:
  """Points `tempfile` (and so TF's autograph) at a new directory of this process's own.

  Autograph writes a source file for each function it converts to the temporary
  directory and removes it from an ``atexit`` hook, which a binary ending with
  ``os._exit`` (after SIGTERM or SIGINT) skips. This directory is removed at a normal
  exit and by `remove_private_tempdir`, which such a binary calls first.
  """
  _PRIVATE_TEMPDIR.append(tempfile.mkdtemp(prefix='tff-sampling-'))
  tempfile.tempdir = _PRIVATE_TEMPDIR[-1]
  atexit.register(remove_private_tempdir)


def remove_private_tempdir() -> None:
  """Removes the directory of `use_private_tempdir`, if any (safe to call again)."""
  while _PRIVATE_TEMPDIR:
    shutil.rmtree(_PRIVATE_TEMPDIR.pop(), ignore_errors=True)


@contextlib.contextmanager
def scratch_tempdir() -> Iterator[None]:
  """Points `tempfile` at a new directory for the block and removes it afterwards.

  For a library call that leaves files in the temporary directory: TFDS makes an
  empty one there each time it builds a dataset that is not prepared on disk. Not
  for threads: `tempfile.tempdir` is the process's.
  """
  saved = tempfile.tempdir
  with tempfile.TemporaryDirectory(prefix='tff-sampling-') as scratch:
    tempfile.tempdir = scratch
    try:
      yield
    finally:
      tempfile.tempdir = saved
