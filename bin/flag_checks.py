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

import math
import re

from absl import flags

_INTEGER = re.compile(r'[+-]?\d+')


def _describe(low: float | None, high: float | None, low_open: bool,
              high_open: bool) -> str:
  def text(x: float) -> str:
    return f'{x:g}'

  if low is not None and high is not None:
    return (f'in {"(" if low_open else "["}{text(low)}, {text(high)}'
            f'{")" if high_open else "]"}')
  if low is not None:
    return f'a finite number {">" if low_open else ">="} {text(low)}'
  if high is not None:
    return f'a finite number {"<" if high_open else "<="} {text(high)}'
  return 'a finite number'


def check_number(name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, hint: str = '',
                 flag_values: flags.FlagValues = flags.FLAGS) -> None:
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
  check_number(name, low=0.0, low_open=True, hint='a step size such as 0.1',
               flag_values=flag_values)


def check_accuracy(name: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes ``--name`` accept only an accuracy as a fraction in (0, 1]."""
  check_number(name, low=0.0, high=1.0, low_open=True,
               hint='an accuracy as a fraction: write 0.7 for 70%', flag_values=flag_values)


def check_int_list(name: str, *, minimum: int = 1, example: str = '64,32',
                   flag_values: flags.FlagValues = flags.FLAGS) -> None:
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
