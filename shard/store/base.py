"""The store contract every implementation passes (``tests/integration/test_store_contract.py``).

The engine's state is the truth while a leader serves; the store is what survives it. The runtime
collects the tasks changed since the last commit and hands them over in one :class:`Batch` (group
commit), and answers the callers behind that batch only when :meth:`Store.commit` returned. A new leader
rebuilds its engine from :meth:`Store.recover`.

Leadership is part of the contract because it lives where the data lives: a Postgres advisory lock, a
lease row in the SQLite file, or nothing at all for memory. Every commit is fenced: it checks, in the
same transaction, that the epoch it was given by :meth:`Store.acquire` is still the current one, so a
leader that was paused or cut off can never write after another took over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from cronoq.engine.model import Recurring, Task
from cronoq.engine.snapshot import Totals


class StoreError(Exception):
    """The store cannot be used: a bad URL, a schema from a newer version, a broken file. Fatal."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer cronoq; this one refuses to touch it."""


class StoreUnavailable(StoreError):
    """A transient failure (connection lost, timeout, serialization failure): retry the same batch."""


class Fenced(StoreError):
    """Another instance took over: this one must stop serving at once and stand by."""


@dataclass(slots=True)
class Batch:
    """Everything to make durable in one transaction.

    ``tasks`` holds the current state of every task inserted or changed since the last commit, at most
    once each. A task's spec (payload included) is written when its row is first inserted and never
    rewritten; later commits update its state columns only. ``outputs`` are the results of tasks that
    succeeded in this batch: (task id, output bytes, content type). ``max_id`` is the highest task id
    issued so far, kept so that ids are never reused even after the tasks holding them were pruned.
    ``schedules`` are the recurring schedules added, advanced or removed since the last commit (the
    engine's ScheduleChanged actions, in order): (name, the whole schedule to write, or None to delete
    it); the last write for a name wins. They share the transaction, and its fence, with the tasks, so
    that an occurrence's task and the schedule's advance past it are durable together or not at all.
    ``totals`` are the engine's counters as of this batch (None: keep those stored), kept with it so that
    the next leader counts on from them, exactly as far as what it recovers got.
    """

    tasks: list[Task] = field(default_factory=list)
    outputs: list[tuple[int, bytes, str]] = field(default_factory=list)
    max_id: int = 0
    schedules: list[tuple[str, Recurring | None]] = field(default_factory=list)
    totals: Totals | None = None


@dataclass(slots=True)
class Recovered:
    """What a new leader rebuilds its engine from: every live task, every task that finished at or
    after the retention cutoff, and every task a live task depends on (by id, or as the newest task
    holding a key), however long ago it finished, in ascending id order; the id high-water mark;
    every recurring schedule, by name; and the totals the last commit kept (None when no commit kept
    any, or they no longer decode: the counters start at zero)."""

    tasks: list[Task]
    max_id: int
    schedules: list[Recurring] = field(default_factory=list)
    totals: Totals | None = None


@dataclass(slots=True)
class StoredTask:
    """One task read back from the store (for Get/Wait of tasks the engine no longer holds) and its
    output, when it succeeded and the output is still kept."""

    task: Task
    output: bytes | None = None
    output_type: str = ""


@dataclass(slots=True)
class Leadership:
    """Held while this instance leads. ``lost`` is set (once, with ``reason``) when it stops leading:
    fenced by a commit, lock session gone or unresponsive, lease taken over. It is never cleared; the
    next :meth:`Store.acquire` returns a new Leadership with a higher epoch."""

    epoch: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()


class Store(Protocol):
    """One leader group's durable state. Methods are called from one event loop; an implementation that
    blocks (SQLite) does its blocking in its own thread."""

    @property
    def durable(self) -> bool:
        """False for memory: the runtime then skips batching and answers at once."""
        ...

    async def open(self) -> None:
        """Connect and bring the schema to this version (migrations under a lock, so concurrent replicas
        migrate once). Raises SchemaTooNew for a newer schema, StoreError when unusable."""
        ...

    async def acquire(self) -> Leadership:
        """Wait until this instance leads (polling as a standby), bump the epoch, and return it."""
        ...

    async def recover(self, finished_since: float) -> Recovered:
        """Load live tasks, tasks finished at or after ``finished_since`` (Unix seconds), the tasks live
        tasks depend on, and the schedules. Rows that do not decode are quarantined (tasks: marked
        FAILED) or left alone and logged (schedules: the next write of that name replaces the row)."""
        ...

    async def commit(self, batch: Batch) -> None:
        """Make ``batch`` durable in one transaction that also verifies this leader's epoch. Raises Fenced
        (the Leadership is lost too) or StoreUnavailable (nothing written; retry with a newer batch)."""
        ...

    async def fetch(self, ref: int | str) -> StoredTask | None:
        """A task by id, or the newest task with key ``ref``; None when the store does not have it."""
        ...

    async def prune(self, finished_before: float) -> int:
        """Delete tasks that finished before ``finished_before``; returns how many. Leader only."""
        ...

    async def release(self) -> None:
        """Step down cleanly, so that a standby takes over at once rather than after a timeout."""
        ...

    async def close(self) -> None:
        """Release connections and files. Safe to call twice and after a failed open."""
        ...
