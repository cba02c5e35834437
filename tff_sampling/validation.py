"""Argument checks shared by the library: one message for one kind of mistake."""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np


def is_positive_int(value: Any) -> bool:
  """Whether `value` is an integer (Python or NumPy, not a bool) greater than 0."""
  return (
    not isinstance(value, (bool, np.bool_))
    and isinstance(value, (int, np.integer))
    and bool(value > 0)
  )


def positive_number(name: str, value: Any) -> float:
  """`value` as a float; a ValueError naming `name` unless it is a finite real number > 0."""
  if (
    isinstance(value, (bool, np.bool_))
    or not isinstance(value, (int, float, np.integer, np.floating))
    or not np.isfinite(value)
    or value <= 0
  ):
    raise ValueError(f'{name} must be a positive finite number, got {value!r}.')
  return float(value)


@overload
def positive_int(name: str, value: Any, *, optional: Literal[False] = ...) -> int: ...


@overload
def positive_int(name: str, value: Any, *, optional: bool) -> int | None: ...


def positive_int(name: str, value: Any, *, optional: bool = False) -> int | None:
  """`value` as an int; a ValueError naming `name` unless it is a positive integer
  (or, with `optional`, None, which is returned as is)."""
  if optional and value is None:
    return None
  if not is_positive_int(value):
    alternative = ' or None' if optional else ''
    raise ValueError(f'{name} must be a positive integer{alternative}, got {value!r}.')
  return int(value)
