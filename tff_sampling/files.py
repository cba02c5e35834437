"""Replacing a file all at once: a reader sees the old file or the new one, never half."""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import os


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
