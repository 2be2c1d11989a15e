"""Every task the engine knows: the live ones, and finished ones retained for key dedup and lookups.

Finished tasks are kept for ``key_retention`` seconds and at most ``key_retention_max`` of them, oldest
first out, so a repeated submission with the same key is recognised for a while without memory growing
with traffic. Their payload is dropped when they finish: nothing reads it any more.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Collection, Iterable

from .model import Status, Task


class TaskTable:
    """Tasks by id (ids ascend in submission order) and by key; ``live`` counts the non-terminal ones."""

    __slots__ = (
        "_finished",
        "_finished_at",
        "_ids",
        "_retention",
        "_retention_max",
        "by_id",
        "by_key",
        "live",
        "next_id",
    )

    def __init__(self, first_id: int, retention: float, retention_max: int) -> None:
        self.by_id: dict[int, Task] = {}
        self.by_key: dict[str, Task] = {}
        self.live = 0
        self.next_id = first_id
        # Every id added, ascending, for listing by id; evicted ids linger until the next compaction.
        # (Ids are not dense: a new leader starts a new epoch far above the last id.)
        self._ids: list[int] = []
        self._retention = retention
        self._retention_max = retention_max
        # Finished tasks and when they finished, oldest first. Two deques rather than one of pairs: a
        # float is not tracked by the garbage collector, a pair is, and there may be 100,000 of them.
        self._finished: deque[Task] = deque()
        self._finished_at: deque[float] = deque()

    def add(self, task: Task) -> None:
        """Insert a new live task; its id must be ``next_id``."""
        self.by_id[task.id] = task
        self._ids.append(task.id)
        if task.spec.key:
            self.by_key[task.spec.key] = task
        self.next_id = task.id + 1
        self.live += 1

    def restore(self, task: Task) -> None:
        """Insert a task recovered from the store, in ascending id order, below ``next_id``, as live;
        once all are in, the caller hands the finished ones to ``retain_restored``."""
        if self._ids and task.id <= self._ids[-1]:
            raise ValueError(f"task {task.id} restored out of order")
        self.by_id[task.id] = task
        self._ids.append(task.id)
        if task.spec.key:  # ascending ids: the newest task with a key holds it
            self.by_key[task.spec.key] = task
        self.live += 1

    def retain_restored(self, finished: Iterable[Task], now: float) -> None:
        """Retain restored finished tasks from when they finished, so that a takeover does not restart
        their retention; ``now`` when that is unknown or ahead of ``now`` (the previous leader's clock).
        Sorted first: retention expires them oldest first, and ids are not in finishing order."""

        def finished_at(task: Task) -> float:
            return now if task.finished is None else min(task.finished, now)

        for task in sorted(finished, key=finished_at):
            self.retire(task, finished_at(task))

    def get(self, ref: int | str) -> Task | None:
        return self.by_key.get(ref) if isinstance(ref, str) else self.by_id.get(ref)

    def retire(self, task: Task, now: float) -> None:
        """``task`` just finished: keep it (without payload) until retention lets it go."""
        self.live -= 1
        task.spec.payload = None
        self._finished.append(task)
        self._finished_at.append(now)
        if len(self._finished) > self._retention_max:
            self._evict()

    def next_prune(self) -> float | None:
        """When the oldest retained task expires, if any is retained."""
        return self._finished_at[0] + self._retention if self._finished_at else None

    def prune(self, now: float) -> None:
        finished_at = self._finished_at
        cutoff = now - self._retention
        while finished_at and finished_at[0] <= cutoff:
            self._evict()

    def _evict(self) -> None:
        """Forget the oldest finished task."""
        self._finished_at.popleft()
        task = self._finished.popleft()
        del self.by_id[task.id]
        key = task.spec.key
        if key and self.by_key.get(key) is task:
            del self.by_key[key]
        if len(self._ids) > 2 * len(self.by_id) + 1024:
            by_id = self.by_id
            self._ids = [i for i in self._ids if i in by_id]

    def page(
        self, pools: Collection[str] | None, statuses: Collection[Status] | None, after: int, limit: int
    ) -> tuple[list[Task], int]:
        """Up to ``limit`` tasks with id > ``after``, ascending, and the id to continue after (0 when
        this is the last page)."""
        found: list[Task] = []
        get = self.by_id.get
        ids = self._ids
        for i in range(bisect_right(ids, after), len(ids)):
            task = get(ids[i])
            if task is None:
                continue
            if pools is not None and task.spec.pool not in pools:
                continue
            if statuses is not None and task.status not in statuses:
                continue
            if len(found) == limit:
                return found, found[-1].id
            found.append(task)
        return found, 0
