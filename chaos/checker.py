"""The checker: reads a run's history and says what the cluster did wrong. Standard library only.

It knows the server only as its documentation describes it (``docs/scheduling.md``,
``docs/http-api.md`` for keys, ``docs/operations.md`` for durability, failover and fencing) and the
history only as :mod:`chaos.history` defines it; it imports nothing of cronoq. Its rules, each named
in the violations it reports:

``lost``
    a task an answer acknowledged (its id in a submit's answer) that the cluster no longer knows;
    ``unverified`` when the run could not ask.
``live``
    an acknowledged task that is not terminal after the drain, with no reason the history shows (a
    dependency still live, a fixed start still ahead).
``outcome-changed``
    a terminal status (or a success's output) a client was answered, which the cluster later tells
    otherwise; ``cancel-lost``: a cancel answered ``cancelled`` whose task did not end cancelled.
``unknown-outcome``
    an outcome (a success's output, a failure's message) that names no lease the workers ran, a lease
    of another task, or a lease whose worker reported something else.
``stale-attempt``
    the accepted outcome came from a lease after which the task had already been leased again: the
    server had given that attempt up before its report arrived (the worker writes its report before
    sending it, and a lease after the server dispatched it).
``stale-leader``
    the accepted outcome came from a lease whose shard saw a takeover (a server seen standing by or
    down, then leading) after the lease began and before its report: the leader that issued it had been
    deposed, and recovery counts such an attempt as lost.
``rerun``
    a task leased again after an attempt that did not fail on purpose, where no fault explains it: none
    hit that attempt's worker, or its shard's servers or store, between that lease and the next (plus
    the lease TTL, the takeover bound and a grace); explained ones are counted (``run_twice``).
``retry-early``
    a task that failed on purpose with ``retry_after`` leased again sooner, where no fault explains it.
``attempts``
    an attempt beyond the task's ``max_attempts``.
``stuck``
    a task listed running longer than its timeout plus the lease TTL plus the takeover bound plus a
    grace, plus the time faults on its shard lasted meanwhile.
``key``
    the key rule: a key names one task per shard, ever; two shards hold it only where one of them could
    not be asked when the other took it (a fault on it, or its leader changing, at the time: counted as
    ``key_splits``); every answer for a key names a task with that key; a key's task is new only once.
``dependency``
    a dependent leased before its dependency's outcome (the report of the lease whose outcome was
    accepted, or failing that the dependency's last lease), leased although its condition can no longer
    be met, or not ended ``skipped`` when it cannot be met.
``fixed-start``
    a task leased before its fixed start.
``crash``
    a process that ended by a signal the run did not send (SIGABRT, SIGSEGV, ...). One that exits with
    a status (a server that stepped down for good exits 1, as documented) is restarted and reported,
    not a violation.
"""

from __future__ import annotations

import bisect
import itertools
import math
import signal
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import TERMINAL, Record, identity_key

DEFAULT_TIMEOUT_S = 4.0
MET = {
    "success": frozenset({"succeeded"}),
    "failure": frozenset({"failed", "dead_lettered"}),
    "complete": TERMINAL,
}
REPORTED = {"succeeded": "complete", "failed": "permanent", "dead_lettered": "retry"}
ROUTER_KINDS = frozenset({"kill-router", "pause-router"})


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    task: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: " + (f"task {self.task}: " if self.task is not None else "") + self.message


@dataclass(slots=True)
class Verdict:
    violations: list[Violation]
    stats: dict[str, Any]

    def count(self, *rules: str) -> int:
        return sum(1 for v in self.violations if v.rule in rules)


@dataclass(slots=True)
class Lease:
    t: float
    key: tuple[Any, ...]
    worker: str
    task: int
    attempt: int
    pool: str
    uid: str | None
    outcome: str | None = None  # the report's, None when none was written
    reported: float = math.inf
    retry_after: float = 0.0
    hung: bool = False


@dataclass(slots=True)
class Window:
    """A fault (or a process that exited on its own) and how long it may explain what follows."""

    id: int
    kind: str
    t: float
    end: float
    process: str | None
    shards: tuple[str, ...]
    pools: tuple[str, ...]


@dataclass(slots=True)
class Task:
    id: int
    spec: dict[str, Any] | None = None
    submits: list[Record] = field(default_factory=list)  # acked submit calls that named it
    leases: list[Lease] = field(default_factory=list)
    final: Record | None = None
    seen: list[Record] = field(default_factory=list)  # terminal answers clients got (call records)
    cancels: list[Record] = field(default_factory=list)  # cancel calls answered


class History:
    """The records, indexed the way the rules read them."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.meta: Record = {}
        self.end: Record | None = None
        self.windows: list[Window] = []
        self.roles: list[Record] = []
        self.running: list[Record] = []
        self.calls: list[Record] = []
        self.tasks: dict[int, Task] = {}
        self.by_uid: dict[str, Record] = {}
        self.holders: dict[str, list[Task]] = defaultdict(list)  # key: the tasks the cluster says hold it
        leases: dict[tuple[Any, ...], Lease] = {}
        heals: dict[int, float] = {}
        self.exits: list[Record] = []
        restarts: dict[str, list[float]] = defaultdict(list)
        faults: list[Record] = []
        reports: list[Record] = []
        finals: list[Record] = []
        for record in records:
            kind = record["type"]
            if kind == "meta":
                self.meta = record
            elif kind == "end":
                self.end = record
            elif kind == "fault":
                faults.append(record)
            elif kind == "heal":
                heals[record["fault"]] = record["t"]
            elif kind == "exit":
                self.exits.append(record)
            elif kind == "restart":
                restarts[record["process"]].append(record["t"])
            elif kind == "role":
                self.roles.append(record)
            elif kind == "running":
                self.running.append(record)
            elif kind == "call":
                self.calls.append(record)
            elif kind == "lease":
                lease = Lease(
                    record["t"], identity_key(record), record["worker"], record["task"], record["attempt"],
                    record.get("pool", ""), record.get("uid"),
                )  # fmt: skip
                leases[lease.key] = lease
            elif kind == "report":
                reports.append(record)
            elif kind == "final":
                finals.append(record)
        self.leases = leases
        for report in reports:
            found = leases.get(identity_key(report))
            if found is not None:
                found.outcome, found.reported = report["outcome"], report["t"]
                found.retry_after, found.hung = (
                    float(report.get("retry_after_s", 0)),
                    bool(report.get("hung")),
                )
        last = float(self.end["t"]) if self.end else max([float(r["t"]) for r in self.calls] or [0.0])
        for fault in faults:
            if fault.get("skipped"):
                continue
            self.windows.append(
                Window(
                    fault["id"],
                    fault["kind"],
                    fault["t"],
                    heals.get(fault["id"], last),
                    fault.get("process"),
                    tuple(fault.get("shards", ())),
                    tuple(fault.get("pools", ())),
                )
            )
        servers = self.meta.get("servers", {})
        for number, gone in enumerate(self.exits):
            back = [t for t in restarts[gone["process"]] if t >= gone["t"]]
            shards = (
                (servers[gone["process"]],) if gone["process"] in servers else ()
            )  # a server's, its shard's
            self.windows.append(
                Window(-1 - number, "exit", gone["t"], min(back, default=last), gone["process"], shards, ())
            )
        self._tasks(finals, list(leases.values()))

    def _tasks(self, finals: list[Record], leases: list[Lease]) -> None:
        for call in self.calls:
            request = call.get("request", {})
            if call["op"] == "submit":
                if "uid" in request:
                    self.by_uid.setdefault(request["uid"], request)
                if call["ok"]:
                    task = self.task(int(call["answer"]["id"]))
                    task.submits.append(call)
                    if not call["answer"]["duplicate"] and task.spec is None:
                        task.spec = request
                    result = call["answer"].get("result")
                    if result and result.get("status") in TERMINAL:
                        task.seen.append(call)
            elif call["op"] == "wait" and call["ok"] and call["answer"].get("status") in TERMINAL:
                self.task(int(request["task"])).seen.append(call)
            elif call["op"] == "cancel" and call["ok"]:
                self.task(int(request["task"])).cancels.append(call)
        # In the order the server leased them: by attempt. A worker's own times can be out of that
        # order: one paused while leases reached it records them when it resumes.
        for lease in sorted(leases, key=lambda lease: (lease.attempt, lease.t)):
            task = self.task(lease.task)
            task.leases.append(lease)
            if task.spec is None and lease.uid in self.by_uid:
                task.spec = self.by_uid[lease.uid]
        for final in finals:
            task = self.task(int(final["task"]))
            task.final = final
            if final.get("key"):
                self.holders[final["key"]].append(task)

    def task(self, task_id: int) -> Task:
        found = self.tasks.get(task_id)
        if found is None:
            found = self.tasks[task_id] = Task(task_id)
        return found

    # ----------------------------------------------------------------------------------- facts

    @property
    def takeover_s(self) -> float:
        return float(self.meta.get("bounds", {}).get("takeover_s", 12.0))

    @property
    def grace_s(self) -> float:
        return float(self.meta.get("bounds", {}).get("grace_s", 3.0))

    def pool(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.meta.get("pools", {}).get(name, {})
        return found

    def pool_of(self, task: Task) -> str | None:
        if task.final is not None and task.final.get("pool"):
            return str(task.final["pool"])
        fresh = [c for c in task.submits if not c["answer"]["duplicate"]]
        if fresh:
            return str(fresh[0]["request"]["pool"])
        return task.leases[0].pool if task.leases else None

    def shard_of(self, task: Task) -> str | None:
        """The task's shard: its pool's, or else the one its id names (the shard number is the id's top
        8 bits, ``docs/operations.md``), as for a task the cluster no longer knows."""
        pool = self.pool_of(task)
        if pool is not None:
            return self.pool(pool).get("shard")
        numbered = {number: name for name, number in self.meta.get("shards", {}).items()}
        return numbered.get(task.id >> 56)

    def ttl(self, task: Task) -> float:
        pool = self.pool_of(task)
        return float(self.pool(pool).get("lease_ttl_s", 30.0)) if pool else 30.0

    def slack(self, task: Task) -> float:
        return self.ttl(task) + self.takeover_s + self.grace_s

    def explained(
        self, start: float, end: float, worker: str | None, shard: str | None, slack: float
    ) -> Window | None:
        """A fault that hit ``worker`` or ``shard``'s servers or store between ``start`` and ``end``
        (its effects lasting ``slack`` past its heal; the two times in either order)."""
        start, end = min(start, end), max(start, end)
        for window in self.windows:
            hits = (worker is not None and window.process == worker) or (
                shard is not None and shard in window.shards and window.kind not in ROUTER_KINDS
            )
            if hits and window.t <= end and window.end + slack >= start:
                return window
        return None

    def outages(self, shard: str | None, start: float, end: float) -> float:
        """How long faults on ``shard``'s servers or store lasted between ``start`` and ``end``, each
        with a grace for what follows it."""
        total = 0.0
        for window in self.windows:
            if shard in window.shards and window.t <= end and window.end >= start:
                total += min(window.end, end) - max(window.t, start) + self.grace_s
        return total

    def takeovers(self) -> dict[str, list[tuple[float, float, str]]]:
        """Per shard: (last poll that saw the server not leading, first that saw it leading, server)."""
        found: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        definite: dict[str, tuple[str, float]] = {}  # server: last definite state, when last seen so
        state: dict[str, str] = {}
        for role in self.roles:
            server, now = role["server"], role["state"]
            before = state.get(server)
            if before in ("leading", "standby", "down") and role.get("since") is not None:
                definite[server] = (before, float(role["since"]))
            if now == "leading":
                last = definite.get(server)
                if last is not None and last[0] in ("standby", "down"):
                    found[role["shard"]].append((last[1], role["t"], server))
            state[server] = now
        return found

    def accepted(self, task: Task) -> dict[str, Any] | None:
        """The lease identity of the task's accepted outcome, as the final record gives it."""
        final = task.final
        if final is None or not final.get("found"):
            return None
        if final.get("status") == "succeeded" and isinstance(final.get("output"), dict):
            output: dict[str, Any] = final["output"]
            return output
        failure = final.get("failure")
        return failure if isinstance(failure, dict) else None


def check(records: Iterable[Record]) -> Verdict:
    history = History(records)
    violations: list[Violation] = []
    counts: dict[str, int] = defaultdict(int)
    takeovers = history.takeovers()
    acked = {task.id for task in history.tasks.values() if task.submits}
    for task_id in sorted(history.tasks):
        task = history.tasks[task_id]
        found: list[Violation] = []
        if task.submits:
            found += _presence(history, task)
            found += _observed(history, task)
        found += _outcome(history, task, takeovers.get(history.shard_of(task) or "", []))
        found += _reruns(history, task, counts)
        found += _spec_rules(history, task)
        violations += found
    violations += _keys(history, counts)
    violations += _stuck(history)
    violations += _crashes(history)
    stats = _stats(history, violations, counts, acked)
    return Verdict(violations, stats)


# --------------------------------------------------------------------------------------- the rules


def _presence(history: History, task: Task) -> list[Violation]:
    final = task.final
    if final is None or final.get("found") is None:
        why = final.get("error", "") if final else "the run did not ask"
        return [Violation("unverified", task.id, f"acknowledged, and its state could not be read: {why}")]
    if not final["found"]:
        first = task.submits[0]
        return [
            Violation("lost", task.id, f"acknowledged at {first['t']:.3f} ({first['client']}), then unknown")
        ]
    status = final["status"]
    if status in TERMINAL or status == "running":  # running: the stuck rule judges it
        return []
    spec = task.spec or {}
    if status == "scheduled" and float(spec.get("start_at", 0)) > final["t"]:
        return []
    if status == "blocked":
        parents = [_parent(history, task, dep[0]) for dep in spec.get("deps", [])]
        if any(p is not None and (p.final is None or p.final.get("status") not in TERMINAL) for p in parents):
            return []
    return [Violation("live", task.id, f"still {status} after the drain, with no reason the history shows")]


def _observed(history: History, task: Task) -> list[Violation]:
    final = task.final
    if final is None or not final.get("found"):
        return []
    found: list[Violation] = []
    for call in task.seen:
        answer = call["answer"].get("result") or call["answer"]
        if answer["status"] != final["status"]:
            found.append(
                Violation(
                    "outcome-changed",
                    task.id,
                    f"a {call['op']} answered {answer['status']} at {call['t']:.3f}; it ended {final['status']}",
                )
            )
        elif (
            answer["status"] == "succeeded"
            and answer.get("output")
            and final.get("output")
            and identity_key(answer["output"]) != identity_key(final["output"])
        ):
            found.append(
                Violation(
                    "outcome-changed",
                    task.id,
                    f"answered the output of {answer['output']}, kept {final['output']}",
                )
            )
    for call in task.cancels:
        if call["answer"].get("cancelled") and final["status"] != "cancelled":
            found.append(
                Violation(
                    "cancel-lost",
                    task.id,
                    f"cancel answered true at {call['t']:.3f}; it ended {final['status']}",
                )
            )
    return found


def _outcome(history: History, task: Task, takeovers: list[tuple[float, float, str]]) -> list[Violation]:
    ident = history.accepted(task)
    if ident is None:
        return []
    assert task.final is not None
    status = task.final["status"]
    lease = history.leases.get(identity_key(ident))
    if ident.get("task") != task.id:
        return [
            Violation(
                "unknown-outcome", task.id, f"its {status} outcome names task {ident.get('task')}: {ident}"
            )
        ]
    if lease is None:
        return [
            Violation(
                "unknown-outcome", task.id, f"its {status} outcome names a lease no worker ran: {ident}"
            )
        ]
    if lease.outcome != REPORTED.get(status):
        return [
            Violation(
                "unknown-outcome",
                task.id,
                f"ended {status} from {ident}, which reported {lease.outcome or 'nothing'}",
            )
        ]
    found: list[Violation] = []
    later = [
        other
        for other in task.leases
        if (other.attempt, other.t) > (lease.attempt, lease.t) and other.t < lease.reported
    ]
    if later:
        other = later[0]
        found.append(
            Violation(
                "stale-attempt",
                task.id,
                f"{status} from attempt {lease.attempt} ({lease.worker}, reported at {lease.reported:.3f}), though "
                f"attempt {other.attempt} had begun at {other.t:.3f} on {other.worker}",
            )
        )
    for since, at, server in takeovers:
        if lease.t < since and at < lease.reported:
            found.append(
                Violation(
                    "stale-leader",
                    task.id,
                    f"{status} from attempt {lease.attempt} leased at {lease.t:.3f} and reported at "
                    f"{lease.reported:.3f}, though {server} took the shard over in between ({since:.3f}-{at:.3f})",
                )
            )
            break
    return found


def _reruns(history: History, task: Task, counts: dict[str, int]) -> list[Violation]:
    found: list[Violation] = []
    shard = history.shard_of(task)
    slack = history.slack(task)
    again = False
    for lease, after in itertools.pairwise(task.leases):
        if lease.outcome == "retry":
            early = lease.reported < after.t < lease.reported + lease.retry_after - 0.01
            if early and history.explained(lease.reported, after.t, lease.worker, shard, slack) is None:
                found.append(
                    Violation(
                        "retry-early",
                        task.id,
                        f"attempt {after.attempt} began {after.t - lease.reported:.3f} s after attempt "
                        f"{lease.attempt} failed asking {lease.retry_after:g} s",
                    )
                )
            continue
        counts["reruns"] += 1
        again = True
        if lease.hung:
            counts["reruns_hung"] += 1
            continue
        window = history.explained(lease.t, after.t, lease.worker, shard, slack)
        if window is None:
            found.append(
                Violation(
                    "rerun",
                    task.id,
                    f"leased again at {after.t:.3f} (attempt {after.attempt}, {after.worker}) after attempt "
                    f"{lease.attempt} on {lease.worker} from {lease.t:.3f} ended {lease.outcome or 'unreported'}, "
                    "and no fault explains it",
                )
            )
    counts["run_twice"] += again
    return found


def _spec_rules(history: History, task: Task) -> list[Violation]:
    spec = task.spec
    if spec is None:
        return []
    found: list[Violation] = []
    pool = history.pool_of(task)
    limit = int(spec.get("max_attempts") or (history.pool(pool).get("max_attempts", 0) if pool else 0))
    for lease in task.leases:
        if limit and lease.attempt > limit:
            found.append(Violation("attempts", task.id, f"attempt {lease.attempt} ran; it allows {limit}"))
            break
    start_at = spec.get("start_at")
    first = min((lease.t for lease in task.leases), default=None)
    if start_at is not None and first is not None and first < float(start_at):
        found.append(
            Violation(
                "fixed-start",
                task.id,
                f"leased at {first:.3f}, before its start at {start_at:.3f}",
            )
        )
    for ref, cond in spec.get("deps", []):
        parent = _parent(history, task, ref)
        if parent is not None:
            found += _dependency(history, task, parent, ref, cond)
    return found


def _parent(history: History, task: Task, ref: int | str) -> Task | None:
    """The task a dependency names: an id, or a key as the dependent's shard holds it."""
    if isinstance(ref, int):
        return history.tasks.get(ref)
    shard = history.shard_of(task)
    return next((c for c in history.holders.get(ref, []) if history.shard_of(c) == shard), None)


def _dependency(history: History, task: Task, parent: Task, ref: int | str, cond: str) -> list[Violation]:
    final = parent.final
    if final is None or not final.get("found") or final.get("status") not in TERMINAL:
        return []
    status = final["status"]
    name = f"dependency {ref!r} ({cond}, ended {status})"
    if status not in MET.get(cond, MET["success"]):
        found = []
        if task.leases:
            found.append(
                Violation(
                    "dependency", task.id, f"ran at {task.leases[0].t:.3f} though {name} can never be met"
                )
            )
        if task.final is not None and task.final.get("status") not in (None, "skipped", "cancelled"):
            found.append(
                Violation(
                    "dependency", task.id, f"ended {task.final.get('status')} though {name} cannot be met"
                )
            )
        return found
    first = min((other.t for other in task.leases), default=None)
    decided = _decided(history, parent, final)
    if decided is not None and first is not None and first < decided:
        return [
            Violation(
                "dependency",
                task.id,
                f"leased at {first:.3f}, before {name} was decided (not before {decided:.3f})",
            )
        ]
    return []


def _decided(history: History, task: Task, final: Record) -> float | None:
    """A time before which ``task`` cannot have reached its outcome: the report of the lease whose
    outcome was accepted (written before it was sent), the dispatch of its last attempt (the server's
    ``started_at``), a cancel that was answered true (sent before it took effect). Never a worker's
    record of a lease: a worker paused with a lease records it when it resumes, long after."""
    ident = history.accepted(task)
    lease = history.leases.get(identity_key(ident)) if ident else None
    bounds = [lease.reported] if lease is not None else []
    if final.get("started_at"):
        bounds.append(float(final["started_at"]))
    bounds += [call["t0"] for call in task.cancels if call["answer"].get("cancelled")]
    return max(bounds, default=None)


def _keys(history: History, counts: dict[str, int]) -> list[Violation]:
    found: list[Violation] = []
    by_key: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for call in history.calls:
        key = call["request"].get("key") if call["op"] == "submit" else None
        if key and call["ok"]:
            cluster = history.pool(call["request"]["pool"]).get("cluster", "")
            by_key[(cluster, key)].append(call)
    for (_, key), calls in sorted(by_key.items()):
        ids: dict[int, list[Record]] = defaultdict(list)
        for call in calls:
            ids[int(call["answer"]["id"])].append(call)
        shards: dict[str | None, list[int]] = defaultdict(list)
        for task_id, answers in ids.items():
            task = history.tasks[task_id]
            shards[history.shard_of(task)].append(task_id)
            if task.final is not None and task.final.get("found") and task.final.get("key") != key:
                found.append(
                    Violation(
                        "key", task_id, f"answered for key {key!r}, but holds key {task.final.get('key')!r}"
                    )
                )
            fresh = [a for a in answers if not a["answer"]["duplicate"]]
            if len(fresh) > 1:
                found.append(Violation("key", task_id, f"answered as new {len(fresh)} times for key {key!r}"))
        for shard, held in shards.items():
            if len(held) > 1:
                found.append(
                    Violation("key", None, f"key {key!r} is held by tasks {sorted(held)} on shard {shard}")
                )
        if len(shards) > 1:
            order = sorted(ids, key=lambda i: min(c["t"] for c in ids[i]))
            for task_id in order[1:]:
                first = min(ids[task_id], key=lambda c: c["t"])
                others = [s for s in shards if task_id not in shards[s]]
                if any(_unaskable(history, s, first["t0"] - 10, first["t"]) for s in others):
                    counts["key_splits"] += 1
                else:
                    found.append(
                        Violation(
                            "key",
                            task_id,
                            f"key {key!r} is held on shards {sorted(map(str, shards))}, and shard {others} could "
                            "be asked when this one took it",
                        )
                    )
    return found


def _unaskable(history: History, shard: str | None, start: float, end: float) -> bool:
    """Whether a fault hit ``shard``, or its leader changed, between ``start`` and ``end``."""
    if history.explained(start, end, None, shard, history.grace_s) is not None:
        return True
    return any(
        role["shard"] == shard and start <= role["t"] <= end + history.grace_s for role in history.roles
    )


def _stuck(history: History) -> list[Violation]:
    found: dict[int, Violation] = {}
    seen = [
        (record["t"], task_id, attempt, started)
        for record in history.running
        for task_id, attempt, started in record["tasks"]
    ]
    seen += [
        (task.final["t"], task.id, task.final.get("attempt"), task.final.get("started_at"))
        for task in history.tasks.values()
        if task.final is not None and task.final.get("status") == "running"
    ]
    for at, task_id, attempt, started in seen:
        if started is None or task_id in found:
            continue
        task = history.task(task_id)
        timeout = float((task.spec or {}).get("timeout_s", DEFAULT_TIMEOUT_S))
        shard = history.shard_of(task)
        bound = (
            timeout
            + history.ttl(task)
            + history.takeover_s
            + history.grace_s
            + history.outages(shard, started, at)
        )
        if at - started > bound:
            found[task_id] = Violation(
                "stuck",
                task_id,
                f"attempt {attempt} running since {started:.3f}, still at {at:.3f} (bound {bound:.1f} s)",
            )
    return [found[task_id] for task_id in sorted(found)]


def _crashes(history: History) -> list[Violation]:
    """Processes that ended by a signal the run did not send: its kills hold their process down, so
    the run records no exit for them, and it sends nothing else that ends a process."""
    found = []
    for gone in history.exits:
        if int(gone["code"]) < 0:
            try:
                name = signal.Signals(-int(gone["code"])).name
            except ValueError:
                name = f"signal {-int(gone['code'])}"
            found.append(Violation("crash", None, f"{gone['process']} ended by {name} at {gone['t']:.3f}"))
    return found


# --------------------------------------------------------------------------------------- the figures


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank (the value at or above ``q`` of them)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def recoveries(history: History) -> dict[str, list[float | None]]:
    """Per fault kind, each fault's time to recovery: from its injection until a task of every pool
    it affects, submitted after it (plain: no dependency, no fixed start), began on a worker; None when
    no such task ran."""
    firsts: dict[str, tuple[list[float], list[float]]] = {}  # pool: submit times, suffix minima of starts
    plain: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for task in history.tasks.values():
        spec = task.spec
        if spec is None or spec.get("deps") or spec.get("start_at") is not None or not task.leases:
            continue
        fresh = [c for c in task.submits if not c["answer"]["duplicate"]]
        if fresh:
            plain[spec["pool"]].append((fresh[0]["t0"], min(lease.t for lease in task.leases)))
    for pool, pairs in plain.items():
        pairs.sort()
        suffix = [p[1] for p in pairs]
        for i in range(len(suffix) - 2, -1, -1):
            suffix[i] = min(suffix[i], suffix[i + 1])
        firsts[pool] = ([p[0] for p in pairs], suffix)
    found: dict[str, list[float | None]] = defaultdict(list)
    for window in history.windows:
        if window.kind == "exit":
            continue
        worst: float | None = 0.0
        for pool in window.pools:
            times, suffix = firsts.get(pool, ([], []))
            i = bisect.bisect_left(times, window.t)
            if i == len(times) or worst is None:
                worst = None
                continue
            worst = max(worst, suffix[i] - window.t)
        found[window.kind].append(worst)
    return found


def _stats(
    history: History, violations: list[Violation], counts: dict[str, int], acked: set[int]
) -> dict[str, Any]:
    rules = Counter(violation.rule for violation in violations)
    faults = Counter(window.kind for window in history.windows)
    submits = [c for c in history.calls if c["op"] == "submit"]
    errors = Counter(call["error"]["code"] for call in submits if not call["ok"])
    stuck = {v.task for v in violations if v.rule == "stuck"}
    return {
        "seed": history.meta.get("seed"),
        "acknowledged": len(acked),
        "submits": len(submits),
        "submit_errors": dict(sorted(errors.items())),
        "lost": rules["lost"],
        "unverified": rules["unverified"],
        "stale": rules["stale-attempt"] + rules["stale-leader"],
        "run_twice": counts["run_twice"],
        "reruns": counts["reruns"],
        "reruns_hung": counts["reruns_hung"],
        "stuck": len(stuck),
        "key_splits": counts["key_splits"],
        "violations": dict(sorted(rules.items())),
        "faults": dict(sorted(faults.items())),
        "recovery": {kind: values for kind, values in sorted(recoveries(history).items())},
    }
