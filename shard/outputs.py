"""Bounded in-memory cache of task outputs, for Wait and Get after a task succeeded.

The engine keeps statuses only; outputs can be large, so they live here under two bounds (entries and
bytes, ``[outputs]``). An output bigger than the whole byte budget is not kept at all, and a task whose
output was evicted reports ``output_available = false``. Content types are kept apart, for more tasks
than outputs: they are small, and an output read back from the store (or too big to cache) still
needs its type for HTTP to render JSON as JSON.
"""

from __future__ import annotations

from collections import OrderedDict

from cronoq.api.output_types import OutputTypes


class OutputCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[int, tuple[bytes, str]] = OrderedDict()
        self._types = OutputTypes()  # of the most recent outputs put here, cached or not

    def put(self, task_id: int, output: bytes, content_type: str) -> None:
        self._types.record(task_id, content_type)
        size = len(output)
        if size > self._max_bytes or self._max_entries <= 0:
            return
        old = self._items.pop(task_id, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._items[task_id] = (output, content_type)
        self._bytes += size
        while len(self._items) > self._max_entries or self._bytes > self._max_bytes:
            _, (evicted, _) = self._items.popitem(last=False)
            self._bytes -= len(evicted)

    def get(self, task_id: int) -> tuple[bytes, str] | None:
        return self._items.get(task_id)

    def content_type(self, task_id: int) -> str:
        """The content type of the task's output, if one was put here lately ("" otherwise)."""
        return self._types.get(task_id)

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes
