"""What the client methods return: plain frozen data classes, decoupled from the generated messages.

Statuses and priorities are lower-case names ("succeeded", "high"), times are Unix seconds, and empty
wire strings for optional names (key, tenant) become ``None``, so callers never see protobuf defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cronoq.client._codec import decode_json, decode_text
from cronoq.client._wire import (
    PRIORITY_NAMES,
    TERMINAL_STATUSES,
    optional_seconds,
    overlap_name,
    priority_name,
    seconds,
    status_name,
)
from cronoq.v1 import cronoq_pb2 as pb


@dataclass(frozen=True, slots=True)
class Result:
    """How a task ended. ``output`` is ``None`` unless it succeeded and the server still holds it."""

    id: int
    status: str
    output: bytes | None
    message: str = ""
    output_available: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def json(self) -> Any:
        """The output parsed as JSON (``None`` when there is none)."""
        return decode_json(self.output)

    def text(self) -> str:
        """The output as UTF-8 text (empty when there is none)."""
        return decode_text(self.output)

    @classmethod
    def from_proto(cls, msg: pb.TaskResult) -> Result:
        return cls(
            id=msg.id,
            status=status_name(msg.status),
            output=msg.output if msg.HasField("output") else None,
            message=msg.message,
            output_available=msg.output_available,
        )


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submission's answer; ``duplicate`` means the key named an existing task, whose id this is.

    ``result`` is set when the submission waited for the task to finish.
    """

    id: int
    duplicate: bool
    result: Result | None = None

    @classmethod
    def from_proto(cls, msg: pb.SubmitResponse) -> Submitted:
        result = Result.from_proto(msg.result) if msg.HasField("result") else None
        return cls(id=msg.id, duplicate=msg.duplicate, result=result)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What the server knows about a task. Besides id and status, fields are best effort: ``0``,
    ``""`` or ``None`` when the serving leader has not seen the task's details."""

    id: int
    status: str
    pool: str
    key: str | None
    kind: str
    attempt: int
    max_attempts: int
    created_at: float | None
    started_at: float | None
    finished_at: float | None
    message: str
    output_available: bool
    tenant: str | None
    priority: str | None

    @property
    def done(self) -> bool:
        """True once the task reached a terminal status."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_proto(cls, msg: pb.TaskInfo) -> TaskInfo:
        return cls(
            id=msg.id,
            status=status_name(msg.status),
            pool=msg.pool,
            key=msg.key or None,
            kind=msg.kind,
            attempt=msg.attempt,
            max_attempts=msg.max_attempts,
            created_at=optional_seconds(msg, "created_unix_ns"),
            started_at=optional_seconds(msg, "started_unix_ns"),
            finished_at=optional_seconds(msg, "finished_unix_ns"),
            message=msg.message,
            output_available=msg.output_available,
            tenant=msg.tenant or None,
            priority=priority_name(msg.priority),
        )


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of ``list_tasks``; pass ``next_after`` as ``after`` for the next (0 on the last page).

    ``unavailable_shards`` names shards that did not answer, whose tasks are missing from the page.
    """

    tasks: list[TaskInfo]
    next_after: int
    unavailable_shards: list[str]

    @classmethod
    def from_proto(cls, msg: pb.ListTasksResponse) -> TaskPage:
        return cls(
            tasks=[TaskInfo.from_proto(t) for t in msg.tasks],
            next_after=msg.next_after,
            unavailable_shards=list(msg.unavailable_shards),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """A status change from ``Client.watch``; ``attempt`` is 0 before the first dispatch."""

    id: int
    pool: str
    key: str | None
    status: str
    attempt: int
    at: float
    message: str

    @classmethod
    def from_proto(cls, msg: pb.StatusEvent) -> Event:
        return cls(
            id=msg.id,
            pool=msg.pool,
            key=msg.key or None,
            status=status_name(msg.status),
            attempt=msg.attempt,
            at=seconds(msg.at_unix_ns),
            message=msg.message,
        )


@dataclass(frozen=True, slots=True)
class WorkerGroup:
    """Capacity of the connected workers sharing one label set."""

    labels: dict[str, str]
    capacity: int
    busy: int

    @classmethod
    def from_proto(cls, msg: pb.WorkerGroup) -> WorkerGroup:
        return cls(labels=dict(msg.labels), capacity=msg.capacity, busy=msg.busy)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool's state and metrics. Counters and ratios cover the server's metrics window.

    ``pending_by_class`` maps class names (critical, high, normal, low) to not-yet-running tasks.
    """

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending_by_class: dict[str, int]
    reservations: int
    dispatched: int
    succeeded: int
    failed: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    cost: float
    workers_connected: int
    groups: list[WorkerGroup]

    @property
    def pending(self) -> int:
        """Tasks of every class not yet running."""
        return sum(self.pending_by_class.values())

    @classmethod
    def from_proto(cls, msg: pb.PoolSnapshot) -> PoolSnapshot:
        return cls(
            name=msg.name,
            capacity=msg.capacity,
            busy=msg.busy,
            held=msg.held,
            desired=msg.desired,
            pending_by_class=dict(zip(PRIORITY_NAMES.values(), msg.pending_by_class, strict=False)),
            reservations=msg.reservations,
            dispatched=msg.dispatched,
            succeeded=msg.succeeded,
            failed=msg.failed,
            priority_adherence=msg.priority_adherence,
            fixed_start_hit_rate=msg.fixed_start_hit_rate,
            utilization=msg.utilization,
            schedule_efficiency=msg.schedule_efficiency,
            wait_p50=msg.wait_p50_s,
            wait_p90=msg.wait_p90_s,
            wait_p99=msg.wait_p99_s,
            cost=msg.cost,
            workers_connected=msg.workers_connected,
            groups=[WorkerGroup.from_proto(g) for g in msg.groups],
        )


@dataclass(frozen=True, slots=True)
class Totals:
    """The scheduler's counters; a new leader counts on from those the last one committed, so they
    never go back across a failover (with the memory store: since the server started)."""

    submitted: int
    dispatched: int
    succeeded: int
    failed: int
    dead_lettered: int
    cancelled: int
    skipped: int
    missed: int
    shed: int
    retries: int
    timeouts: int
    lease_expiries: int
    stale_completions: int

    @classmethod
    def from_proto(cls, msg: pb.Totals) -> Totals:
        return cls(**{name: getattr(msg, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole scheduler at one moment, as ``Admin.Snapshot`` reports it."""

    pools: list[PoolSnapshot]
    live_tasks: int
    running: int
    pending: int
    totals: Totals
    workers_connected: int
    unavailable_shards: list[str]

    def pool(self, name: str) -> PoolSnapshot:
        """The named pool's snapshot (``KeyError`` if the snapshot has no such pool)."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r} in this snapshot")

    @classmethod
    def from_proto(cls, msg: pb.SnapshotResponse) -> Snapshot:
        return cls(
            pools=[PoolSnapshot.from_proto(p) for p in msg.pools],
            live_tasks=msg.live_tasks,
            running=msg.running,
            pending=msg.pending,
            totals=Totals.from_proto(msg.totals),
            workers_connected=msg.workers_connected,
            unavailable_shards=list(msg.unavailable_shards),
        )


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A connected worker; ``connected_at`` in Unix seconds."""

    id: int
    name: str
    pool: str
    labels: dict[str, str]
    slots: int
    busy: int
    connected_at: float

    @classmethod
    def from_proto(cls, msg: pb.WorkerInfo) -> WorkerInfo:
        return cls(
            id=msg.id,
            name=msg.name,
            pool=msg.pool,
            labels=dict(msg.labels),
            slots=msg.slots,
            busy=msg.busy,
            connected_at=seconds(msg.connected_unix_ns),
        )


@dataclass(frozen=True, slots=True)
class RecurringInfo:
    """A recurring schedule; ``next_at`` is the next occurrence's start in Unix seconds."""

    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: str
    next_at: float | None
    last_task_id: int | None

    @classmethod
    def from_proto(cls, msg: pb.RecurringInfo) -> RecurringInfo:
        return cls(
            name=msg.name,
            cron=msg.cron,
            tz=msg.tz,
            pool=msg.pool,
            kind=msg.kind,
            overlap=overlap_name(msg.overlap),
            next_at=optional_seconds(msg, "next_unix_ns"),
            last_task_id=msg.last_task_id if msg.HasField("last_task_id") else None,
        )
