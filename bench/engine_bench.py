"""Engine decisions per second, in-process, with no I/O: the ceiling the server's own overhead sits on.

``n`` no-op tasks spread over the four classes are submitted in batches of 1000 to one pool served by one
1024-slot worker; then every lease is completed as soon as it is issued, which frees a slot and
dispatches the next task, until all are done. Decisions = submits + dispatches + outcomes. Simulated
time advances 10 us per outcome, so the metrics window rotates as it would under real load. Nothing is
printed by ``run``; ``python -m bench.engine_bench`` prints its result.
"""

from __future__ import annotations

import gc
import random
import time
from collections import deque

from cronoq.engine import Dispatch, Engine, PoolConfig, Priority, TaskSpec

BATCH = 1000
SLOTS = 1024
STEP = 1e-5  # simulated seconds per outcome


def run(n: int = 100_000) -> dict[str, float]:
    """Run the benchmark twice: with the cyclic garbage collector paused while timing (the engine's own
    cost, ``decisions_per_s``) and with it on as Python configures it by default
    (``decisions_per_s_with_gc``). The collector's share depends on everything else the process keeps
    alive, here 100,000 queued and retained tasks, which a server controls with its own GC policy
    (``gc.freeze()`` after start-up, higher thresholds); so both numbers are reported."""
    paused = _measure(n, collect=False)
    with_gc = _measure(n, collect=True)
    decisions = paused["decisions"]
    return {
        **paused,
        "decisions_per_s": decisions / paused["seconds"],
        "seconds_with_gc": with_gc["seconds"],
        "decisions_per_s_with_gc": decisions / with_gc["seconds"],
    }


def _measure(n: int, *, collect: bool) -> dict[str, float]:
    """One timed run; like the server, the loop takes the engine's actions after every input."""
    engine = Engine([PoolConfig("bench", max=SLOTS)], rng=random.Random(0))
    classes = list(Priority)
    specs = [TaskSpec("bench", payload=None, priority=classes[i % len(classes)]) for i in range(n)]
    now = 1_000_000.0
    engine.add_worker(1, "bench", SLOTS, {}, now)
    complete = engine.complete
    take_actions = engine.take_actions
    leases: deque[int] = deque()
    lease = leases.append
    completed = 0

    gc.collect()
    if not collect:
        gc.disable()
    try:
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            engine.submit(specs[i : i + BATCH], now)
            for action in take_actions():
                if action.__class__ is Dispatch:
                    lease(action.lease)
        while leases:
            now += STEP
            complete(1, leases.popleft(), now)
            completed += 1
            for action in take_actions():
                if action.__class__ is Dispatch:
                    lease(action.lease)
        seconds = time.perf_counter() - start
    finally:
        gc.enable()

    dispatched = engine.snapshot(now).totals.dispatched
    return {
        "submitted": float(n),
        "dispatched": float(dispatched),
        "completed": float(completed),
        "decisions": float(n + dispatched + completed),
        "seconds": seconds,
    }


if __name__ == "__main__":
    print(run())
