"""The content types of recent task outputs, by task id: the HTTP API renders a JSON output as JSON,
and a server or router that no longer holds the output itself (read back from the store, too big to
cache, or forwarded from another shard) still needs its type to do so. Types are small, so they are
kept for more tasks than outputs are, within a fixed bound."""

from __future__ import annotations

from collections import OrderedDict

TYPES_KEPT = 10_000


class OutputTypes:
    """The content types of the ``kept`` most recently recorded outputs (the oldest recorded goes first)."""

    __slots__ = ("_kept", "_types")

    def __init__(self, kept: int = TYPES_KEPT) -> None:
        self._kept = kept
        self._types: OrderedDict[int, str] = OrderedDict()

    def record(self, task_id: int, content_type: str) -> None:
        if not content_type:  # unknown reads back as "" anyway
            return
        types = self._types
        types[task_id] = content_type
        types.move_to_end(task_id)
        if len(types) > self._kept:
            types.popitem(last=False)

    def get(self, task_id: int) -> str:
        """The content type recorded for the task's output ("" when none was, or it was forgotten)."""
        return self._types.get(task_id, "")
