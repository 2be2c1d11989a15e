"""Dependencies between tasks: the edges of BLOCKED tasks, and the rules that check, link and judge them.

A BLOCKED task waits for every one of its edges to be met; as soon as one can no longer be met it is
skipped, and that skip is itself an ending its own dependents see (the cascade). Targets are tasks the
engine knows (by id, or by the key a live or retained task holds) or, under ``unknown_dependency =
await``, keys no task holds yet: those edges wait in ``awaiting`` until a task with the key arrives.

Only BLOCKED tasks are registered here, and registrations are dropped lazily: a dependent that was
cancelled meanwhile is simply passed over when its target ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from .model import AdmissionError, DepOn, Status, Task, TaskSpec, UnknownDependency
from .pool import PoolState
from .table import TaskTable
from .timers import TimerKind

if TYPE_CHECKING:
    from .core import EngineCore

_BLOCKED: Final = Status.BLOCKED
_FAILED = frozenset({Status.FAILED, Status.DEAD_LETTERED})
AWAIT_TIMED_OUT: Final = "timed out awaiting unknown dependency"


def edge_met(on: DepOn, status: Status) -> bool:
    """Whether a target that ended in ``status`` (terminal) meets an edge ``on``; False means the edge
    can never be met."""
    if on is DepOn.COMPLETE:
        return True
    if on is DepOn.SUCCESS:
        return status is Status.SUCCEEDED
    return status in _FAILED


Edge = tuple[Task, DepOn]  # (the dependent, the condition it waits for)


class Dependencies:
    """The dependency feature of one engine: the edges of BLOCKED tasks not yet met, and their rules.

    The engine hands it a batch to check (``check``, ``check_cycles``) and, once inserted, to link
    (``link``); tells it when a task ends (``cascade``, only for tasks in ``waiting``) and when a BLOCKED
    task ends otherwise (``forget``); and asks it about AWAIT_TIMEOUT timers. It calls back into the
    engine to skip a dependent (``EngineCore._finish``) and to release one whose edges are all met, so
    that the counts, events and dispatch of every status change stay in one place. ``waiting`` and
    ``awaiting`` are public because the engine tests them on its hot path, where an empty table must
    cost no call.
    """

    __slots__ = ("_engine", "_pools", "_table", "_targets", "_unmet", "awaiting", "waiting")

    def __init__(self, engine: EngineCore, table: TaskTable, pools: Mapping[str, PoolState]) -> None:
        self._engine = engine
        self._table = table
        self._pools = pools
        self.waiting: dict[int, list[Edge]] = {}  # target id -> dependents waiting for it to end
        self.awaiting: dict[str, list[Edge]] = {}  # key no task holds yet -> dependents awaiting it
        self._unmet: dict[int, int] = {}  # dependent id -> edges not yet met
        # dependent id -> what it still waits for (target ids, awaited keys), for cycle checks.
        self._targets: dict[int, list[int | str]] = {}

    # ------------------------------------------------------------------------------- admission

    def check(self, pool: PoolState, spec: TaskSpec, index: int, batch_keys: Mapping[str, int]) -> None:
        """Raise AdmissionError (with ``index``, the spec's place in its batch) for an edge whose target is
        unknown: no task holds its key, none of the batch will, and the pool does not await keys; or no
        task has its id."""
        table = self._table
        for j, dep in enumerate(spec.deps):
            target = dep.target
            if isinstance(target, str):
                if target in batch_keys or target in table.by_key:
                    continue
                if pool.config.unknown_dependency is UnknownDependency.AWAIT:
                    continue
                raise AdmissionError(
                    "unknown_dependency", f"unknown dependency '{target}'", index, f".deps[{j}].key"
                )
            if target not in table.by_id:
                raise AdmissionError(
                    "unknown_dependency", f"unknown dependency {target}", index, f".deps[{j}].id"
                )

    def check_cycles(self, specs: Sequence[TaskSpec], batch_keys: Mapping[str, int]) -> None:
        """Refuse a batch whose edges close a cycle. Tasks already admitted form no cycle among
        themselves (edges only point at older tasks, or at keys not yet held), so a cycle must pass
        through the batch: a depth-first search from each spec, over batch edges, edges of live tasks,
        and awaited keys the batch provides, looks for a path back to a spec on the current path."""
        table = self._table

        def successors(node: int | str) -> list[int | str]:
            # Batch specs are nodes "#<index>" (str), live tasks are their ids (int).
            if isinstance(node, str):
                out: list[int | str] = []
                for dep in specs[int(node[1:])].deps:
                    target = dep.target
                    if isinstance(target, str) and target in batch_keys:
                        out.append(f"#{batch_keys[target]}")
                    else:
                        task = table.get(target)
                        if task is not None and task.status is _BLOCKED:
                            out.append(task.id)
                return out
            found: list[int | str] = []
            for ref in self.blocked_on(node):
                if isinstance(ref, str):
                    if ref in batch_keys:
                        found.append(f"#{batch_keys[ref]}")
                else:
                    task = table.by_id.get(ref)
                    if task is not None and task.status is _BLOCKED:
                        found.append(ref)
            return found

        done: set[int | str] = set()
        for i, spec in enumerate(specs):
            start: int | str = f"#{i}"
            if not spec.deps or start in done:
                continue
            path = {start}
            stack = [(start, iter(successors(start)))]
            while stack:
                node, todo = stack[-1]
                nxt = next(todo, None)
                if nxt is None:
                    stack.pop()
                    path.discard(node)
                    done.add(node)
                elif nxt in path:
                    raise AdmissionError("cycle", "dependency cycle", i, ".deps")
                elif nxt not in done:
                    path.add(nxt)
                    stack.append((nxt, iter(successors(nxt))))

    def link(self, created: Iterable[Task], blocked: list[Task], now: float) -> None:
        """After a batch was inserted: edges awaiting the keys of new tasks now wait for them, and each
        new BLOCKED task resolves its own edges."""
        if self.awaiting:
            for task in created:
                if task.spec.key in self.awaiting:
                    self._arrived(task)
                    if task.status.terminal:  # shed by a later spec of the batch: judge the edges now
                        self.cascade(task, now)
        for task in blocked:
            if task.status is _BLOCKED:  # not shed by a later spec of the batch
                self.resolve(task, now)

    def resolve(self, task: Task, now: float) -> None:
        """Register the edges of a new (or restored) BLOCKED task; targets already ended are judged at
        once."""
        spec = task.spec
        pool = self._pools[spec.pool]
        awaited = False
        awaits = pool.config.unknown_dependency is UnknownDependency.AWAIT
        for dep in spec.deps:
            target = self._table.get(dep.target)
            if target is None:
                if isinstance(dep.target, str) and awaits:  # a key no task holds yet
                    self._wait(task, dep.target, dep.on)
                    awaited = True
                # Otherwise only a restored task gets here: its target is gone from the store, so it
                # ended long ago, and met this edge (had it not, the task would have been skipped then).
            elif not target.status.terminal:
                self._wait(task, target, dep.on)
            elif not edge_met(dep.on, target.status):
                message = f"dependency ended as {target.status.label}"
                self._engine._finish(pool, task, Status.SKIPPED, message, now)
                return
        if task.id not in self._unmet:
            self._unblock(pool, task, now)
        elif awaited and pool.config.await_timeout is not None:
            self._engine._arm(now + pool.config.await_timeout, TimerKind.AWAIT_TIMEOUT, task.id)

    # -------------------------------------------------------------------------------- endings

    def cascade(self, ended: Task, now: float) -> None:
        """``ended`` reached a terminal status: judge the edges waiting for it. A dependent whose edge
        can no longer be met is skipped, which its own dependents judge in turn (iteratively: chains
        may be long)."""
        engine = self._engine
        stack = [ended]
        while stack:
            target = stack.pop()
            for dependent, on in self.waiting.pop(target.id, ()):
                if dependent.status is not _BLOCKED or dependent.id not in self._unmet:
                    continue  # cancelled or skipped meanwhile
                if edge_met(on, target.status):
                    if self._met(dependent):
                        self._unblock(self._pools[dependent.spec.pool], dependent, now)
                    continue
                message = f"dependency {target.id} ended as {target.status.label}"
                pool = self._pools[dependent.spec.pool]
                engine._finish(pool, dependent, Status.SKIPPED, message, now, cascade=False)
                if dependent.id in self.waiting:
                    stack.append(dependent)

    def forget(self, dependent: Task) -> None:
        """``dependent`` stops waiting (unblocked, skipped or cancelled). Its entries in ``waiting`` are
        dropped when their target ends; those in ``awaiting`` now, since that key may never arrive."""
        self._unmet.pop(dependent.id, None)
        for ref in self._targets.pop(dependent.id, ()):
            if isinstance(ref, str) and ref in self.awaiting:
                edges = [edge for edge in self.awaiting[ref] if edge[0] is not dependent]
                if edges:
                    self.awaiting[ref] = edges
                else:
                    del self.awaiting[ref]

    def blocked_on(self, dependent_id: int) -> list[int | str]:
        """What a BLOCKED task still waits for: target ids and awaited keys."""
        return self._targets.get(dependent_id, [])

    def awaits_key(self, task: Task) -> bool:
        """Whether ``task`` is still BLOCKED on a key nobody holds: its AWAIT_TIMEOUT still applies."""
        refs = self.blocked_on(task.id) if task.status is _BLOCKED else ()
        return any(isinstance(ref, str) for ref in refs)

    def timed_out(self, pool: PoolState, task: Task, now: float) -> None:
        """The await timeout of ``task`` passed with a key still unheld: it is skipped."""
        self._engine._finish(pool, task, Status.SKIPPED, AWAIT_TIMED_OUT, now)
        self._engine._mark_dirty(pool)

    # ------------------------------------------------------------------------------- internals

    def _unblock(self, pool: PoolState, task: Task, now: float) -> None:
        """Every edge of a BLOCKED task is met: READY, or on to ``FixedStarts.schedule`` for its fixed
        start (still counted as waiting: ``schedule`` knows whether it stays so)."""
        if task.spec.start is not None:
            self._engine._fixed.schedule(pool, task, now)
        else:
            self._engine._eligible(pool, task, now, now)

    def _wait(self, dependent: Task, target: Task | str, on: DepOn) -> None:
        """Register one unmet edge of ``dependent`` on a live task, or on a key nobody holds yet."""
        if isinstance(target, str):
            self.awaiting.setdefault(target, []).append((dependent, on))
            ref: int | str = target
        else:
            self.waiting.setdefault(target.id, []).append((dependent, on))
            ref = target.id
        self._unmet[dependent.id] = self._unmet.get(dependent.id, 0) + 1
        self._targets.setdefault(dependent.id, []).append(ref)

    def _arrived(self, task: Task) -> None:
        """A task with a key some dependents awaited was created: those edges now wait for it."""
        for dependent, on in self.awaiting.pop(task.spec.key, []):
            self.waiting.setdefault(task.id, []).append((dependent, on))
            refs = self._targets.get(dependent.id)
            if refs is not None:
                refs[refs.index(task.spec.key)] = task.id

    def _met(self, dependent: Task) -> bool:
        """One edge of ``dependent`` was met; True when it was the last one."""
        left = self._unmet[dependent.id] - 1
        if left:
            self._unmet[dependent.id] = left
            return False
        self.forget(dependent)
        return True
