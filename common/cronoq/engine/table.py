"""Every task the engine knows: the live ones, and finished ones retained for lookups and key dedup.

A finished task's record (Get, Wait, ListTasks, dependency edges by id) is kept for ``record_retention``
seconds and at most ``record_max`` of them; its key still deduplicates submissions for
``key_retention`` seconds and while fewer than ``key_retention_max`` tasks finished after it. Both
oldest first out, so memory does not grow with traffic. A key never outlives its record: the caller
keeps the key bounds within the record bounds. Payloads are dropped at the finish: nothing reads them.
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
        "_key_max",
        "_key_retention",
        "_keyed",
        "_keyed_at",
        "_record_max",
        "_record_retention",
        "_retired",
        "by_id",
        "by_key",
        "live",
        "next_id",
    )

    def __init__(
        self,
        first_id: int,
        key_retention: float,
        key_retention_max: int,
        record_retention: float | None = None,
        record_max: int | None = None,
    ) -> None:
        self.by_id: dict[int, Task] = {}
        self.by_key: dict[str, Task] = {}
        self.live = 0
        self.next_id = first_id
        # Every id added, ascending, for listing by id; evicted ids linger until the next compaction.
        # (Ids are not dense: a new leader starts a new epoch far above the last id.)
        self._ids: list[int] = []
        self._key_retention = key_retention
        self._key_max = key_retention_max
        self._record_retention = key_retention if record_retention is None else record_retention
        self._record_max = key_retention_max if record_max is None else record_max
        # Finished tasks and when they finished, oldest first. Two deques rather than one of pairs: a
        # float is not tracked by the garbage collector, a pair is, and there may be 100,000 of them.
        self._finished: deque[Task] = deque()
        self._finished_at: deque[float] = deque()
        # The finished tasks with a key whose key still dedups, oldest first: when each finished, and
        # how many tasks had finished before it (its key goes once key_max more have).
        self._keyed: deque[tuple[Task, int]] = deque()
        self._keyed_at: deque[float] = deque()
        self._retired = 0  # tasks finished so far

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
        if task.spec.key:
            self._keyed.append((task, self._retired))
            self._keyed_at.append(now)
        self._retired += 1
        if len(self._finished) > self._record_max:
            self._evict()
        keyed = self._keyed
        while keyed and self._retired - keyed[0][1] > self._key_max:
            self._forget_key()

    def next_prune(self) -> float | None:
        """When the oldest retained record or key expires, if any is retained."""
        record = self._finished_at[0] + self._record_retention if self._finished_at else None
        key = self._keyed_at[0] + self._key_retention if self._keyed_at else None
        if record is None or (key is not None and key < record):
            return key
        return record

    def prune(self, now: float) -> None:
        finished_at = self._finished_at
        cutoff = now - self._record_retention
        while finished_at and finished_at[0] <= cutoff:
            self._evict()
        keyed_at = self._keyed_at
        cutoff = now - self._key_retention
        while keyed_at and keyed_at[0] <= cutoff:
            self._forget_key()

    def _forget_key(self) -> None:
        """The oldest retained key no longer dedups (its record may stay)."""
        self._keyed_at.popleft()
        task, _ = self._keyed.popleft()
        key = task.spec.key
        if key and self.by_key.get(key) is task:
            del self.by_key[key]

    def _evict(self) -> None:
        """Forget the oldest finished task (its key went before it, or goes now)."""
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
