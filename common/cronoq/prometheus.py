"""Prometheus text exposition format 0.0.4, as ``/metrics`` of a server or a router answers it.

Every family has ``# HELP`` and ``# TYPE``; label values are escaped (``\\``, ``"``, newline); ``NaN``,
``+Inf`` and ``-Inf`` are spelled the Prometheus way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[Mapping[str, str], float]
K = TypeVar("K", bound=tuple[str, ...])


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def labelled(counts: Mapping[K, int], names: tuple[str, ...]) -> Iterable[Sample]:
    """Samples of a counter kept as a mapping from label-value tuples, in sorted label order."""
    for key in sorted(counts):
        yield dict(zip(names, key, strict=True)), float(counts[key])


class Writer:
    """Collects families; :meth:`text` is the exposition."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            label_text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
            self.lines.append(
                f"{name}{{{label_text}}} {number(value)}" if label_text else f"{name} {number(value)}"
            )

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


__all__ = ["CONTENT_TYPE", "Sample", "Writer", "escape", "labelled", "number"]
