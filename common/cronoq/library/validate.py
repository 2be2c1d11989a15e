"""Argument checks shared by every library-mode constructor and call.

Each check names the argument it refused, so ``ValueError: timeout must be a finite, non-negative
number of seconds (got -1)`` tells the caller what to fix. Wrong types raise ``TypeError``; wrong values
of the right type raise ``ValueError``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from datetime import datetime
from typing import TypeVar

E = TypeVar("E", bound=enum.Enum)


def text(field: str, value: object) -> str:
    """A string without NUL characters (they would truncate keys and names in C-backed stores)."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str (got {type(value).__name__})")
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters")
    return value


def name(field: str, value: object) -> str:
    """A non-empty string without NUL characters."""
    checked = text(field, value)
    if not checked:
        raise ValueError(f"{field} must not be empty")
    return checked


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a finite int or float (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range is no finite number either
        return None
    return number if math.isfinite(number) else None


def seconds(field: str, value: object) -> float:
    """A duration: finite and >= 0."""
    number = _number(value)
    if number is None or number < 0:
        raise ValueError(f"{field} must be a finite, non-negative number of seconds (got {value!r})")
    return number


def positive(field: str, value: object) -> float:
    """A finite number > 0."""
    number = _number(value)
    if number is None or number <= 0:
        raise ValueError(f"{field} must be a finite number > 0 (got {value!r})")
    return number


def at_least(field: str, value: object, low: float) -> float:
    """A finite number >= ``low``."""
    number = _number(value)
    if number is None or number < low:
        raise ValueError(f"{field} must be a finite number >= {low:g} (got {value!r})")
    return number


def fraction(field: str, value: object) -> float:
    """A finite number in [0, 1]."""
    number = _number(value)
    if number is None or not 0.0 <= number <= 1.0:
        raise ValueError(f"{field} must be a number between 0 and 1 (got {value!r})")
    return number


def count(field: str, value: object, low: int) -> int:
    """An int >= ``low`` (bools are refused: ``True`` slots is a bug, not 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int (got {type(value).__name__})")
    if value < low:
        raise ValueError(f"{field} must be >= {low} (got {value})")
    return value


def unix_time(field: str, value: object) -> float:
    """A point in time: a datetime (naive means local time) or Unix seconds."""
    stamp = value.timestamp() if isinstance(value, datetime) else _number(value)
    if stamp is None:
        raise ValueError(f"{field} must be a datetime or finite Unix seconds (got {value!r})")
    return stamp


def choice(field: str, value: object, kind: type[E]) -> E:
    """A member of a string-valued enum, given as the member or as its (case-insensitive) value."""
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        for member in kind:
            if member.value == value.lower():
                return member
    allowed = ", ".join(str(member.value) for member in kind)
    raise ValueError(f"{field} must be one of {allowed} (got {value!r})")


def strings(field: str, value: object) -> dict[str, str]:
    """A mapping with keys and values converted with ``str()`` (tags, labels)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} must be a mapping (got {type(value).__name__})")
    out: dict[str, str] = {}
    for k, v in value.items():
        key = text(f"{field} key", str(k))
        out[key] = text(f"{field}[{key!r}]", str(v))
    return out
