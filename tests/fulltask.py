"""One task that sets every field, for the tests that carry tasks through a codec: the stores
(``test_store_contract``, ``test_store_upgrade``) and the wire conversion (``unit/test_convert``).
A field added to the model is added here once, and every one of those tests then checks it.

Every field has a value no other field of its type has, so that a field written to another's place
shows; times are ``now`` plus halves, which survive the trip through nanoseconds exactly.
"""

from __future__ import annotations

from cronoq.engine.model import DepEdge, DepOn, MissPolicy, Priority, RetryRule, Status, Task, TaskSpec

NOW = 1_700_000_000.0


def full_spec(now: float = NOW, nul: str = "") -> TaskSpec:
    """A spec with every field set, ``nul`` in every string that may hold a NUL: ``"\\x00"`` as a store
    is given it, ``"\\ufffd"`` as a store gives it back, ``""`` where NUL is refused (the wire)."""
    return TaskSpec(
        pool="gpu",
        payload=b"\x00\x01binary\xff",
        content_type=f"application/x{nul}y",
        kind=f"report{nul}",
        priority=Priority.HIGH,
        key=f"key{nul}one",
        deadline=now + 60.5,
        duration_hint=1.25,
        timeout=30.0,
        retry=RetryRule(5, 0.5, 3.0, 120.0, False),
        tags={f"t{nul}": f"v{nul}", "env": "prod"},
        labels={"team": f"core{nul}"},
        tenant=f"acme{nul}",
        start=now + 120.5,
        tolerance=2.5,
        on_miss=MissPolicy.SKIP,
        # Ids and keys with every outcome; "7" is a key that looks like an id, and stays a key.
        deps=(
            DepEdge(7, DepOn.SUCCESS),
            DepEdge(8, DepOn.FAILURE),
            DepEdge(9, DepOn.COMPLETE),
            DepEdge(f"up{nul}stream", DepOn.SUCCESS),
            DepEdge("7", DepOn.FAILURE),
            DepEdge("cleanup", DepOn.COMPLETE),
        ),
        resources={f"gpu{nul}": 2, "db": 1},
    )


def full_task(task_id: int, nul: str = "") -> Task:
    """:func:`full_spec` (at :data:`NOW`) as a stored task between two attempts, with every field of
    the state a store keeps that such a task has (``finished`` is set when it ends; ``lease`` and
    ``worker`` live in memory only)."""
    return Task(
        id=task_id,
        spec=full_spec(NOW, nul),
        seq=42,
        status=Status.RETRYING,
        created=NOW + 0.5,
        attempt=2,
        max_attempts=5,
        ready_at=NOW + 1.5,
        started=NOW + 2.5,
        finished=None,
        message=f"retrying{nul}after timeout",
    )
