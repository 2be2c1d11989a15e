"""The store that keeps nothing across restarts: the default, and the reference for the contract.

It is a real implementation, not a stub: rows go through the same codec as the SQL stores
(:mod:`.rows`), so the contract suite can hold it to the same answers (NUL comes back as U+FFFD, a
spec is written once, a row that does not decode is quarantined). Several :class:`MemoryStore`
instances can share one :class:`MemoryDatabase`, which stands in for the database a cluster of
replicas shares: only one of them leads at a time, the others poll in :meth:`MemoryStore.acquire`,
and :meth:`MemoryDatabase.take_over` lets a test force a new epoch, as if the leader's lease had run
out and someone else took over, so that fencing can be exercised without any database.

The first leader of a fresh :class:`MemoryDatabase` gets epoch 0, so that its task ids start at 1
(:meth:`cronoq.cluster.shards.ShardMap.first_id`) as they do in a server without a durable store; every later leader gets the
next epoch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cronoq.engine.model import Status, Task
from cronoq.logs import get_logger

from .base import Batch, Fenced, Leadership, Recovered, StoredTask, StoreError
from .rows import (
    COLUMNS,
    SPEC_COLUMNS,
    Row,
    dep_targets,
    ns,
    recurring_from_row,
    row_of,
    schedule_changes,
    task_from_row,
    text,
    totals_from_text,
    totals_text,
)

log = get_logger("cronoq.store")

_STATE_AT = len(SPEC_COLUMNS)
_KEY = COLUMNS.index("key")
_STATUS = COLUMNS.index("status")
_TERMINAL = COLUMNS.index("terminal")
_FINISHED = COLUMNS.index("finished_ns")
_MESSAGE = COLUMNS.index("message")


@dataclass(slots=True)
class _Record:
    """One stored task: its row in COLUMNS order, and its output once it succeeded."""

    row: list[Any]
    output: bytes | None = None
    output_type: str = ""


@dataclass(slots=True)
class MemoryDatabase:
    """What the replicas of one in-memory cluster share: the task rows, the schedule rows (by stored
    name, in SCHEDULE_COLUMNS order), the epoch, the id high-water mark, the totals the last commit
    kept (as text, as the SQL stores keep them) and which store leads (``holder``). Pass one to several :class:`MemoryStore` instances to run a leader and standbys in
    one process."""

    tasks: dict[int, _Record] = field(default_factory=dict)
    schedules: dict[str, Row] = field(default_factory=dict)
    # -1 so that the first acquire bumps it to 0: ids then start at 1, as without a store.
    epoch: int = -1
    max_id: int = 0
    totals: str | None = None
    holder: MemoryStore | None = None

    def take_over(self) -> int:
        """Force a new epoch and free the lead, as when a leader's lease ran out and another instance
        took over: the old leader is not told, so its next commit is fenced. Returns the new epoch;
        the next :meth:`MemoryStore.acquire` gets the one after it."""
        self.epoch += 1
        self.holder = None
        return self.epoch


class MemoryStore:
    """The :class:`.base.Store` contract in process memory, on a private or shared
    :class:`MemoryDatabase`. ``lock_poll`` is how often a standby checks whether the lead is free."""

    def __init__(self, db: MemoryDatabase | None = None, *, lock_poll: float = 0.5) -> None:
        self._db = MemoryDatabase() if db is None else db
        self._lock_poll = lock_poll
        self._leadership: Leadership | None = None
        self._closed = False

    @property
    def durable(self) -> bool:
        return False

    async def open(self) -> None:
        self._check_open()

    async def acquire(self) -> Leadership:
        self._check_open()
        db = self._db
        while db.holder is not None and db.holder is not self:
            await asyncio.sleep(self._lock_poll)
            self._check_open()
        db.epoch += 1
        db.holder = self
        self._leadership = Leadership(db.epoch)
        log.info("acquired cronoq leadership", epoch=db.epoch, store="memory")
        return self._leadership

    async def recover(self, finished_since: float) -> Recovered:
        self._check_open()
        cutoff = ns(finished_since)
        records = self._db.tasks
        loaded = [
            task_id
            for task_id, record in records.items()
            if not record.row[_TERMINAL]
            or (isinstance(record.row[_FINISHED], int) and record.row[_FINISHED] >= cutoff)
        ]
        tasks = self._decode(loaded)
        target_ids, target_keys = dep_targets(tasks)
        newest: dict[str, int] = {}  # the most recent holder of each target key
        if target_keys:
            for task_id, record in records.items():
                key = record.row[_KEY]
                if key in target_keys and task_id > newest.get(key, 0):
                    newest[key] = task_id
        targets = (target_ids | set(newest.values())) - set(loaded)
        tasks += self._decode(task_id for task_id in targets if task_id in records)
        tasks.sort(key=lambda task: task.id)
        schedules = []
        for name, row in sorted(self._db.schedules.items()):
            try:
                schedules.append(recurring_from_row(row))
            except ValueError as err:
                log.error("schedule_row_undecodable", name=name, error=str(err), store="memory")
        max_id = max(self._db.max_id, max(records, default=0))
        return Recovered(tasks, max_id, schedules, totals_from_text(self._db.totals))

    def _decode(self, task_ids: Iterable[int]) -> list[Task]:
        """The tasks of ``task_ids``; a row that does not decode is quarantined instead."""
        tasks = []
        for task_id in task_ids:
            row = self._db.tasks[task_id].row
            try:
                tasks.append(task_from_row(tuple(row)))
            except ValueError as err:
                _quarantine(row, err)
                log.error("task_row_quarantined", task_id=task_id, error=str(err), store="memory")
        return tasks

    async def commit(self, batch: Batch) -> None:
        self._check_open()
        leadership = self._leadership
        if leadership is None or leadership.lost.is_set():
            raise Fenced("this cronoq instance does not lead")
        db = self._db
        if db.epoch != leadership.epoch:
            reason = f"fenced: the cronoq leader epoch is now {db.epoch}, this leader had {leadership.epoch}"
            leadership.lose(reason)
            self._leadership = None
            log.warning("cronoq leader was fenced; stepping down", epoch=leadership.epoch, current=db.epoch)
            raise Fenced(reason)
        rows = [row_of(task) for task in batch.tasks]
        upserts, deletes = schedule_changes(batch.schedules)
        for row in rows:
            record = db.tasks.get(row[0])
            if record is None:
                db.tasks[row[0]] = _Record(list(row))
            else:
                record.row[_STATE_AT:] = row[_STATE_AT:]
        for task_id, output, output_type in batch.outputs:
            record = db.tasks.get(task_id)
            if record is not None:
                record.output = bytes(output)
                record.output_type = output_type
        for row in upserts:
            db.schedules[row[0]] = row
        for name in deletes:
            db.schedules.pop(name, None)
        db.max_id = max(db.max_id, batch.max_id)
        if batch.totals is not None:
            db.totals = totals_text(batch.totals)

    async def fetch(self, ref: int | str) -> StoredTask | None:
        self._check_open()
        if isinstance(ref, str):
            key = text(ref)
            ids = [task_id for task_id, record in self._db.tasks.items() if record.row[_KEY] == key]
            if not ids:
                return None
            ref = max(ids)
        record = self._db.tasks.get(ref)
        if record is None:
            return None
        try:
            task = task_from_row(tuple(record.row))
        except ValueError as err:
            log.warning("task_row_undecodable", task_id=ref, error=str(err), store="memory")
            return None
        return StoredTask(task, record.output, record.output_type)

    async def prune(self, finished_before: float) -> int:
        self._check_open()
        cutoff = ns(finished_before)
        records = self._db.tasks
        live = self._decode(task_id for task_id, record in records.items() if not record.row[_TERMINAL])
        kept, keys = dep_targets(live)  # what live tasks still depend on stays, however old
        newest: dict[str, int] = {}
        for task_id, record in records.items():
            key = record.row[_KEY]
            if key in keys and task_id > newest.get(key, 0):
                newest[key] = task_id
        kept |= set(newest.values())
        doomed = [
            task_id
            for task_id, record in records.items()
            if record.row[_TERMINAL]
            and isinstance(record.row[_FINISHED], int)
            and record.row[_FINISHED] < cutoff
            and task_id not in kept
        ]
        for task_id in doomed:
            del self._db.tasks[task_id]
        return len(doomed)

    async def release(self) -> None:
        self._leadership = None
        if self._db.holder is self:
            self._db.holder = None

    async def close(self) -> None:
        if not self._closed:
            await self.release()
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the cronoq memory store is closed")


def _quarantine(row: list[Any], err: ValueError) -> None:
    """Mark an undecodable row FAILED (terminal) so that it is no longer recovered as live work, with a
    finish time so that pruning removes it after the retention like any finished task."""
    row[_STATUS] = int(Status.FAILED)
    row[_TERMINAL] = True
    row[_MESSAGE] = text(f"quarantined: row could not be decoded ({err})")
    if not isinstance(row[_FINISHED], int):
        row[_FINISHED] = time.time_ns()
