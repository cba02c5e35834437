"""Parse-time checks of the binaries' numeric and list flags.

Each function registers an absl validator on a flag that is already defined,
so an impossible value stops the binary while its flags are parsed, before any
work, with one line naming the flag, the value and the allowed range, e.g.::

    flag --client_learning_rate=inf: --client_learning_rate must be a finite
    number > 0 (a step size such as 0.1), got inf.

absl's own ``lower_bound``/``upper_bound`` suffice for integers; floats need
these checks because a bound compares false with NaN and lets it through.
A flag left at ``None`` (its "unset" default) always passes.

No flags are defined here, so every binary may import this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import enum
import math
import os
import re

from absl import flags

_INTEGER = re.compile(r'[+-]?\d+')


def _describe(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
  def text(x: float) -> str:
    return f'{x:g}'

  if low is not None and high is not None:
    return f'in {"(" if low_open else "["}{text(low)}, {text(high)}{")" if high_open else "]"}'
  if low is not None:
    return f'a finite number {">" if low_open else ">="} {text(low)}'
  if high is not None:
    return f'a finite number {"<" if high_open else "<="} {text(high)}'
  return 'a finite number'


def check_number(
  name: str,
  *,
  low: float | None = None,
  high: float | None = None,
  low_open: bool = False,
  high_open: bool = False,
  hint: str = '',
  flag_values: flags.FlagValues = flags.FLAGS,
) -> None:
  """Makes ``--name`` (a float or integer flag) reject values outside the range.

  Args:
    name: The flag.
    low, high: The bounds (``None``: unbounded on that side).
    low_open, high_open: Whether the bound itself is excluded.
    hint: What the value means or an example, shown in parentheses.
    flag_values: The registry the flag is defined in.
  """
  allowed = _describe(low, high, low_open, high_open)
  if hint:
    allowed = f'{allowed} ({hint})'

  def checker(value) -> bool:
    if value is None:
      return True
    ok = math.isfinite(value)
    if ok and low is not None:
      ok = value > low if low_open else value >= low
    if ok and high is not None:
      ok = value < high if high_open else value <= high
    if not ok:
      raise flags.ValidationError(f'--{name} must be {allowed}, got {value!r}.')
    return True

  flags.register_validator(name, checker, flag_values=flag_values)


def check_learning_rate(name: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes ``--name`` accept only a finite learning rate > 0."""
  check_number(
    name, low=0.0, low_open=True, hint='a step size such as 0.1', flag_values=flag_values
  )


def check_accuracy(name: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes ``--name`` accept only an accuracy as a fraction in (0, 1]."""
  check_number(
    name,
    low=0.0,
    high=1.0,
    low_open=True,
    hint='an accuracy as a fraction: write 0.7 for 70%',
    flag_values=flag_values,
  )


def check_int_list(
  name: str,
  *,
  minimum: int = 1,
  example: str = '64,32',
  flag_values: flags.FlagValues = flags.FLAGS,
) -> None:
  """Makes the list flag ``--name`` accept only non-empty lists of integers >= `minimum`."""
  allowed = f'comma-separated integers >= {minimum}, e.g. --{name}={example}'

  def checker(values) -> bool:
    if values is None:
      return True
    if not values:
      raise flags.ValidationError(f'--{name} must be {allowed}, got an empty list.')
    for value in values:
      if not _INTEGER.fullmatch(value.strip()) or int(value) < minimum:
        raise flags.ValidationError(f'--{name} must be {allowed}, got {value!r}.')
    return True

  flags.register_validator(name, checker, flag_values=flag_values)


def int_list(name: str, values: list[str]) -> tuple[int, ...]:
  """``--name``'s list of integers, or a ValueError naming the flag and the bad entry.

  For values that bypassed parsing (set in code rather than on the command line).
  """
  try:
    return tuple(int(v) for v in values)
  except (TypeError, ValueError):
    raise ValueError(f'--{name} must be comma-separated integers, got {values!r}.') from None


def check_list(
  name: str, check: Callable[[str], object], flag_values: flags.FlagValues = flags.FLAGS
) -> None:
  """Makes the list flag ``--name`` accept only non-empty lists whose every entry `check`
  accepts (it raises ValueError naming the entry and the fix otherwise)."""

  def checker(values) -> bool:
    if values is None:
      return True
    if not values:
      raise flags.ValidationError(f'--{name} is empty; give at least one value.')
    for value in values:
      try:
        check(value)
      except ValueError as e:
        raise flags.ValidationError(str(e)) from None
    return True

  flags.register_validator(name, checker, flag_values=flag_values)


def check_choices(
  name: str, choices: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS
) -> None:
  """Makes the list flag ``--name`` accept only entries of `choices`."""

  def check(value: str) -> None:
    if value not in choices:
      raise ValueError(f'--{name} has unknown value {value!r}; choose from {", ".join(choices)}.')

  check_list(name, check, flag_values=flag_values)


# --------------------------------------------------------------------------
# Paths: what each must be, checked before anything is read or written.


def _file_on_path(path: str) -> str | None:
  """The first existing non-directory on the way to `path` (itself included), or None."""
  parts = os.path.abspath(path).split(os.sep)
  for i in range(2, len(parts) + 1):
    prefix = os.sep.join(parts[:i])
    if not os.path.lexists(prefix):
      return None
    if not os.path.isdir(prefix):
      return prefix
  return None


class Path(enum.Enum):
  """What a path flag must name."""

  FILE = 'an existing regular file'
  DIRECTORY = 'an existing directory'
  NEW_DIRECTORY = 'a directory, or a path where one can be made (no file on the way to it)'
  NEW_FILE = 'a file, or a path where one can be written (no file on the way to its folder)'


def path_problem(path: str, kind: Path) -> str | None:
  """Why `path` cannot be what `kind` says, or None if it can (nothing is created)."""
  if not path:
    return 'is empty; give a path'
  if kind == Path.FILE:
    if os.path.isdir(path):
      return 'is a directory, not a file; give a file in it'
    if not os.path.isfile(path):
      return 'does not exist; give an existing file'
    return None
  if kind == Path.DIRECTORY:
    if os.path.lexists(path) and not os.path.isdir(path):
      return 'is a file, not a directory; give a directory'
    if not os.path.isdir(path):
      return 'does not exist; give an existing directory'
    return None
  if kind == Path.NEW_FILE and os.path.isdir(path):
    return 'is a directory, not a file; give a file name'
  folder = path if kind == Path.NEW_DIRECTORY else os.path.dirname(os.path.abspath(path))
  blocker = _file_on_path(folder)
  if blocker is None:
    return None
  if os.path.abspath(blocker) == os.path.abspath(path):
    return 'is a file, not a directory; give a directory path'
  return f'cannot be made: {blocker} is a file, not a directory; give another path'


def check_path(
  name: str, kind: Path, *, hint: str = '', flag_values: flags.FlagValues = flags.FLAGS
) -> None:
  """Makes ``--name`` accept only a path that can be what `kind` says (`path_problem`), with
  `hint` (what the path is for) added to the message; unset (None) always passes."""

  def checker(value) -> bool:
    if value is None:
      return True
    problem = path_problem(value, kind)
    if problem:
      raise flags.ValidationError(f'--{name}={value} {problem}{f" ({hint})" if hint else ""}.')
    return True

  flags.register_validator(name, checker, flag_values=flag_values)
