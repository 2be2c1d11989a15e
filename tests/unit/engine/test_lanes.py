"""The ready queue on its own: stale entries of tasks that left are dropped and never pile up."""

from __future__ import annotations

from cronoq.engine import Priority, Status, Task, TaskSpec
from cronoq.engine.lanes import PoolQueue


def queued(
    queue: PoolQueue,
    n: int,
    *,
    priority: Priority = Priority.NORMAL,
    labels: dict[str, str] | None = None,
    deadline: float | None = None,
) -> list[Task]:
    """Push ``n`` READY tasks built from these spec fields."""
    tasks = [
        Task(
            i + 1,
            TaskSpec("p", priority=priority, labels=labels or {}, deadline=deadline),
            i + 1,
            Status.READY,
            0.0,
            ready_at=0.0,
        )
        for i in range(n)
    ]
    for task in tasks:
        queue.push(task, 0.0)
    return tasks


def leave(queue: PoolQueue, tasks: list[Task]) -> None:
    for task in tasks:
        task.status = Status.CANCELLED
        queue.forget(task)


def test_a_lane_nobody_serves_drops_entries_of_tasks_that_left() -> None:
    queue = PoolQueue(1.0)
    tasks = queued(queue, 1000, labels={"gpu": "1"})
    deadlines = queued(queue, 1000, labels={"gpu": "1"}, deadline=50.0)
    leave(queue, tasks[:990] + deadlines[:990])
    [lane] = queue.active
    assert len(lane.fresh) + len(lane.edf) < 200
    assert queue.ready == 20


def test_stale_heads_are_skipped_and_the_next_live_task_comes_out() -> None:
    queue = PoolQueue(1.0)
    tasks = queued(queue, 10, priority=Priority.HIGH)
    leave(queue, tasks[:9])
    best = queue.pop_best(0.0, lambda _: True)
    assert best is not None and best[0] is tasks[9]
    assert queue.pop_best(0.0, lambda _: True) is None
    assert queue.active == []  # an empty lane leaves the scan
