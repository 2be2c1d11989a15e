"""Prometheus text exposition format 0.0.4, as ``/metrics`` of a server or a router answers it.

Every family has ``# HELP`` and ``# TYPE``; label values are escaped (``\\``, ``"``, newline); ``NaN``,
``+Inf`` and ``-Inf`` are spelled the Prometheus way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[Mapping[str, str], float]


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


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


__all__ = ["CONTENT_TYPE", "Sample", "Writer", "escape", "number"]
