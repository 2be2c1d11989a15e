"""A seeded workload over every engine feature, printed as the trace of what the engine did.

``test_compiled`` runs it on the compiled engine (the installed build) and on the same sources
interpreted, and requires identical traces: mypyc changes a few Python semantics (tuples lose their
identity when unboxed, compiled classes ignore some overrides), and a divergence would show up here
as a different action, status or snapshot. ``python -m tests.unit.engine.trace SEED STEPS`` prints it.
"""

from __future__ import annotations

import random
import sys

from cronoq.engine import (
    Abort,
    AdmissionError,
    DepEdge,
    DepOn,
    Dispatch,
    Engine,
    MissPolicy,
    Overlap,
    Priority,
    RecurringError,
    RecurringSpec,
    Semaphore,
    TaskSpec,
    TokenBucket,
    compiled,
)
from tests.unit.engine.helpers import FEATURE_POOLS

KEYS = ["", "", "", "", "", "", "k1", "k2", "k3", "k4", "k5"]
LABELS: list[dict[str, str]] = [{}, {}, {"gpu": "a100"}, {"zone": "eu"}]


def _spec(rng: random.Random, pool: str, now: float, last_id: int) -> TaskSpec:
    deps: list[DepEdge] = []
    if rng.random() < 0.2:
        target: int | str = rng.choice(KEYS[6:]) if rng.random() < 0.7 else rng.randint(1, max(1, last_id))
        deps.append(DepEdge(target, rng.choice(list(DepOn))))
    resources = rng.choice([{}, {}, {}, {"db": 1}, {"db": 2}, {"api": 1}, {"db": 1, "api": 1}])
    return TaskSpec(
        pool,
        kind=rng.choice(["render", "encode"]),
        priority=rng.choice(list(Priority)),
        key=rng.choice(KEYS),
        tenant=rng.choice(["", "t1", "t2"]),
        labels=dict(rng.choice(LABELS)),
        deadline=now + rng.uniform(0.5, 20.0) if rng.random() < 0.2 else None,
        timeout=rng.uniform(0.5, 4.0) if rng.random() < 0.2 else None,
        start=now + rng.uniform(-2.0, 12.0) if rng.random() < 0.1 else None,
        on_miss=rng.choice(list(MissPolicy)),
        deps=tuple(deps),
        resources=dict(resources),
    )


def run(seed: int, steps: int) -> list[str]:
    """The trace: every action the engine took and every answer it gave, then its final snapshot."""
    rng = random.Random(seed)
    engine = Engine(
        FEATURE_POOLS,
        resources=[Semaphore("db", 2), TokenBucket("api", rate=4.0, burst=2.0)],
        rng=random.Random(seed),
    )
    now = 1_000_000.0
    trace: list[str] = []
    leases: dict[int, int] = {}  # lease -> worker
    workers: list[int] = []
    next_worker = 1
    try:
        engine.add_recurring(
            RecurringSpec(
                "tick", "*/3 * * * * *", TaskSpec("b", key="tick"), overlap=rng.choice(list(Overlap))
            ),
            now,
        )
    except RecurringError as err:
        trace.append(f"recurring refused: {err}")

    def note(answer: object) -> None:
        trace.append(repr(answer))
        for action in engine.take_actions():
            trace.append(repr(action))
            if action.__class__ is Dispatch:
                leases[action.lease] = action.worker_id
            elif action.__class__ is Abort:
                leases.pop(action.lease, None)

    for _ in range(steps):
        roll = rng.random()
        if roll < 0.3:
            pool = rng.choice(["a", "b"])
            specs = [_spec(rng, pool, now, engine.last_id) for _ in range(rng.randint(1, 3))]
            try:
                note(engine.submit(specs, now))
            except AdmissionError as err:
                note(f"refused {err.code}: {err}")
        elif roll < 0.34 or not workers or (roll < 0.38 and len(workers) < 6):
            pool = rng.choice(["a", "b"])
            note(engine.add_worker(next_worker, pool, rng.randint(1, 3), rng.choice(LABELS), now))
            workers.append(next_worker)
            next_worker += 1
        elif roll < 0.41:
            worker = workers.pop(rng.randrange(len(workers)))
            engine.remove_worker(worker, now)
            note("removed")
            for lease in [lease for lease, owner in leases.items() if owner == worker]:
                del leases[lease]
        elif roll < 0.44:
            note(engine.set_worker_slots(rng.choice(workers), rng.randint(0, 3), now))
        elif roll < 0.75 and leases:
            lease = rng.choice(sorted(leases))
            worker = leases.pop(lease)
            outcome = rng.random()
            if outcome < 0.55:
                note(engine.complete(worker, lease, now))
            elif outcome < 0.75:
                retry_after = rng.choice([None, 0.0, 1.5])
                note(engine.fail(worker, lease, "boom", rng.random() < 0.3, retry_after, now))
            elif outcome < 0.85:
                note(engine.nack(worker, lease, "busy", now))
            elif outcome < 0.92:
                note(engine.cancelled(worker, lease, now))
            else:
                leases[lease] = worker
                note(engine.heartbeat(worker, lease, now))
        elif roll < 0.78:
            note(engine.cancel(rng.randint(1, max(1, engine.last_id)), now))
        else:
            wake = engine.next_wakeup()
            step = rng.uniform(0.0, 1.5)
            now = (
                min(now + step, wake)
                if wake is not None and wake > now and rng.random() < 0.5
                else now + step
            )
            engine.tick(now)
            note(f"ticked to {now!r}")
    trace.append(repr(engine.snapshot(now)))
    trace.append(repr(engine.workers()))
    return trace


if __name__ == "__main__":
    print(f"compiled={compiled()}")
    for line in run(int(sys.argv[1]), int(sys.argv[2])):
        print(line)
