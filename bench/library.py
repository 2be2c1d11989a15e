"""Library mode end to end: tasks/s through ``cronoq.Scheduler`` with in-process no-op executors.

``n`` tasks go in one ``await scheduler.enqueue(None)`` call at a time into one pool of ``slots``
(fixed capacity, ``autoscale=False``) whose executor is an ``async def`` returning None; the clock runs
from the first call until an event stream has delivered the last terminal event. The second figure
does the same with ``submit`` and then awaits every handle. Target: >= 12,600 tasks/s for ``enqueue``
with 50,000 tasks and 64 slots on the 2-core reference machine (three times the 4,200/s measured for
the reference package's in-process mode there).

Each figure is the best of ``repeat`` runs, since interference on a shared machine only ever slows a
run down; the CPU seconds of the best run are shown beside it, and the machine speed (ns per trivial
loop step, as in the engine bench) to compare runs across machines. The garbage collector is left as
Python configures it, as a user would have it. Nothing asserts: ``python -m bench.library`` prints.
"""

from __future__ import annotations

import argparse
import time

import cronoq

from . import on_loop
from .engine_bench import baseline_loop_ns

TARGET = 12_600


async def _noop(ctx: cronoq.TaskContext, payload: object) -> None:
    return None


async def _drain(n: int, slots: int, handles: bool) -> tuple[float, float]:
    """Wall and CPU seconds to run ``n`` tasks, by enqueue (or submit + awaiting the handles)."""
    pool = cronoq.Pool("bench", _noop, min=slots, max=slots, autoscale=False)
    async with cronoq.Scheduler([pool], event_capacity=n) as scheduler:
        stream = scheduler.events()
        wall, cpu = time.perf_counter(), time.process_time()
        if handles:
            submitted = [await scheduler.submit(None) for _ in range(n)]
            for handle in submitted:
                await handle
        else:
            for _ in range(n):
                await scheduler.enqueue(None)
            done = 0
            async for _event in stream:
                done += 1
                if done == n:
                    break
        return time.perf_counter() - wall, time.process_time() - cpu


def run(n: int = 50_000, slots: int = 64, repeat: int = 3) -> dict[str, float]:
    """The best of ``repeat`` runs of each variant, after a short warm-up."""
    on_loop(_drain(max(1, n // 10), slots, handles=False))
    enqueue = min(on_loop(_drain(n, slots, handles=False)) for _ in range(repeat))
    submit = min(on_loop(_drain(n, slots, handles=True)) for _ in range(repeat))
    return {
        "tasks": n,
        "enqueue_per_s": n / enqueue[0],
        "enqueue_cpu_s": enqueue[1],
        "enqueue_wall_s": enqueue[0],
        "submit_per_s": n / submit[0],
        "submit_wall_s": submit[0],
        "baseline_loop_ns": min(baseline_loop_ns() for _ in range(repeat)),
    }


def report(n: int = 50_000, slots: int = 64) -> None:
    r = run(n, slots)
    print(
        f"library mode: {r['tasks']:,.0f} no-op tasks, enqueue x1, 1 pool x {slots}: "
        f"{r['enqueue_per_s']:,.0f} tasks/s ({r['enqueue_wall_s']:.2f} s, {r['enqueue_cpu_s']:.2f} s CPU)"
        f"   target >= {TARGET:,}\n"
        f"  with submit + awaiting each handle: {r['submit_per_s']:,.0f} tasks/s ({r['submit_wall_s']:.2f} s); "
        f"machine speed: {r['baseline_loop_ns']:.0f} ns per trivial loop step",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.library")
    p.add_argument("--tasks", type=int, default=50_000)
    p.add_argument("--slots", type=int, default=64)
    args = p.parse_args()
    report(args.tasks, args.slots)


if __name__ == "__main__":
    main()
