"""Dependency edges between tasks: who waits for whom, and whether an ended target meets an edge.

A BLOCKED task waits for every one of its edges to be met; as soon as one can no longer be met it is
skipped, and that skip is itself an ending its own dependents see (the cascade). Targets are tasks the
engine knows (by id, or by the key a live or retained task holds) or, under ``unknown_dependency =
await``, keys no task holds yet: those edges wait in ``awaiting`` until a task with the key arrives.

Only BLOCKED tasks are registered here, and registrations are dropped lazily: a dependent that was
cancelled meanwhile is simply passed over when its target ends.
"""

from __future__ import annotations

from .model import DepOn, Status, Task

_FAILED = frozenset({Status.FAILED, Status.DEAD_LETTERED})


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
    """The edges of BLOCKED tasks not yet met."""

    __slots__ = ("awaiting", "targets", "unmet", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[int, list[Edge]] = {}  # target id -> dependents waiting for it to end
        self.awaiting: dict[str, list[Edge]] = {}  # key no task holds yet -> dependents awaiting it
        self.unmet: dict[int, int] = {}  # dependent id -> edges not yet met
        # dependent id -> what it still waits for (target ids, awaited keys), for cycle checks.
        self.targets: dict[int, list[int | str]] = {}

    def wait(self, dependent: Task, target: Task | str, on: DepOn) -> None:
        """Register one unmet edge of ``dependent`` on a live task, or on a key nobody holds yet."""
        if isinstance(target, str):
            self.awaiting.setdefault(target, []).append((dependent, on))
            ref: int | str = target
        else:
            self.waiting.setdefault(target.id, []).append((dependent, on))
            ref = target.id
        self.unmet[dependent.id] = self.unmet.get(dependent.id, 0) + 1
        self.targets.setdefault(dependent.id, []).append(ref)

    def arrived(self, task: Task) -> list[Edge]:
        """A task with a key some dependents awaited was created: those edges now wait for it."""
        edges = self.awaiting.pop(task.spec.key, [])
        for dependent, on in edges:
            self.waiting.setdefault(task.id, []).append((dependent, on))
            refs = self.targets.get(dependent.id)
            if refs is not None:
                refs[refs.index(task.spec.key)] = task.id
        return edges

    def met(self, dependent: Task) -> bool:
        """One edge of ``dependent`` was met; True when it was the last one."""
        left = self.unmet[dependent.id] - 1
        if left:
            self.unmet[dependent.id] = left
            return False
        self.forget(dependent)
        return True

    def forget(self, dependent: Task) -> None:
        """``dependent`` stops waiting (unblocked, skipped or cancelled). Its entries in ``waiting`` are
        dropped when their target ends; those in ``awaiting`` now, since that key may never arrive."""
        self.unmet.pop(dependent.id, None)
        for ref in self.targets.pop(dependent.id, ()):
            if isinstance(ref, str) and ref in self.awaiting:
                edges = [edge for edge in self.awaiting[ref] if edge[0] is not dependent]
                if edges:
                    self.awaiting[ref] = edges
                else:
                    del self.awaiting[ref]

    def blocked_on(self, dependent_id: int) -> list[int | str]:
        """What a BLOCKED task still waits for: target ids and awaited keys."""
        return self.targets.get(dependent_id, [])
