"""Files written whole: a reader sees the old file or the new one, never half; and checks
that files on disk hold what a report would write."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
