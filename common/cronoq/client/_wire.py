"""Translations between the wire's enums and times and the SDK's lower-case names and Unix seconds.

The tables are built from the generated enums, so they cannot drift from ``cronoq.proto``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import Message

from cronoq.v1 import cronoq_pb2 as pb

if TYPE_CHECKING:  # the type of a generated enum (pb.TaskStatus, ...): it exists for the type checker only
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

V = TypeVar("V", bound=int)


def _names(enum: _EnumTypeWrapper[V], prefix: str) -> dict[V, str]:
    """Wire value → lower-case name without the enum prefix; UNSPECIFIED (0) is left out."""
    return {value: name.removeprefix(prefix).lower() for name, value in enum.items() if value}


STATUS_NAMES = _names(pb.TaskStatus, "TASK_STATUS_")
PRIORITY_NAMES = _names(pb.Priority, "PRIORITY_")
TERMINAL_STATUSES = frozenset(
    {"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"}
)

_STATUS_VALUES = {name: value for value, name in STATUS_NAMES.items()}
_PRIORITY_VALUES = {name: value for value, name in PRIORITY_NAMES.items()}
_MISS_VALUES = {name: value for value, name in _names(pb.MissPolicy, "MISS_POLICY_").items()}
_OVERLAP_NAMES = _names(pb.Overlap, "OVERLAP_")
_OVERLAP_VALUES = {name: value for value, name in _OVERLAP_NAMES.items()}
_EDGE_VALUES = {name: value for value, name in _names(pb.EdgeCond, "EDGE_COND_").items()}
# The engine accepts both spellings ("success" and "on_success").
_EDGE_VALUES |= {name.removeprefix("on_"): value for name, value in _EDGE_VALUES.items()}


def _choice(field: str, value: str, table: Mapping[str, V]) -> V:
    try:
        return table[value.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"{field} must be one of {', '.join(table)} (got {value!r})") from None


def status_value(name: str) -> pb.TaskStatus.ValueType:
    return _choice("status", name, _STATUS_VALUES)


def status_name(value: pb.TaskStatus.ValueType) -> str:
    return STATUS_NAMES.get(value, "unspecified")


def priority_name(value: pb.Priority.ValueType) -> str | None:
    """``None`` when the server does not know the priority (UNSPECIFIED)."""
    return PRIORITY_NAMES.get(value)


def priority_value(priority: str | int | None) -> pb.Priority.ValueType:
    """The wire enum for a class name (any case), an engine class number 0..3, or ``None`` (normal)."""
    if priority is None:
        return pb.PRIORITY_NORMAL
    if isinstance(priority, bool):
        raise ValueError("priority must be a class name or 0..=3, not a bool")
    if isinstance(priority, int):
        if not 0 <= priority <= 3:
            raise ValueError(f"priority must be 0..=3 (got {priority})")
        return pb.Priority.ValueType(priority + 1)  # the wire enum is offset by UNSPECIFIED
    return _choice("priority", priority, _PRIORITY_VALUES)


def miss_value(on_miss: str | None) -> pb.MissPolicy.ValueType:
    return pb.MISS_POLICY_UNSPECIFIED if on_miss is None else _choice("on_miss", on_miss, _MISS_VALUES)


def overlap_value(overlap: str) -> pb.Overlap.ValueType:
    return _choice("overlap", overlap, _OVERLAP_VALUES)


def overlap_name(value: pb.Overlap.ValueType) -> str:
    """UNSPECIFIED reads as skip, as the server treats it."""
    return _OVERLAP_NAMES.get(value, "skip")


def edge_value(cond: str) -> pb.EdgeCond.ValueType:
    return _choice("dependency condition", cond, _EDGE_VALUES)


def seconds(ns: int) -> float:
    return ns / 1e9


def optional_seconds(message: Message, field: str) -> float | None:
    """An ``optional int64 *_unix_ns`` field as Unix seconds, ``None`` when unset."""
    return seconds(getattr(message, field)) if message.HasField(field) else None


def unix_ns(field: str, when: datetime | float) -> int:
    """A datetime (naive means local time) or Unix seconds as Unix nanoseconds."""
    stamp = when.timestamp() if isinstance(when, datetime) else when
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
        raise ValueError(f"{field} must be a datetime or finite Unix seconds (got {when!r})")
    return round(stamp * 1_000_000_000)


def duration(field: str, value: float | None) -> float | None:
    """A caller-supplied number of seconds, checked here so the error names the argument."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a finite, non-negative number of seconds (got {value!r})")
    return float(value)


def task_ref(ref: int | str) -> pb.TaskRef:
    """A ``TaskRef`` for a task id (int) or key (str)."""
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        raise TypeError(f"a task is named by its id (int) or key (str), not {ref!r}")
    return pb.TaskRef(id=ref) if isinstance(ref, int) else pb.TaskRef(key=ref)
