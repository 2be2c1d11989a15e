"""A worker in its own process, for tests that freeze (SIGSTOP) or kill (SIGKILL) a worker.

Prints ``started <task_id> <attempt>`` when a handler starts, so the test knows the lease is held here
before it signals the process. The handler then sleeps for the number of seconds in the payload.
"""

from __future__ import annotations

import argparse
import asyncio

from cronoq.client import Lease, Worker


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--pool", default="default")
    p.add_argument("--slots", type=int, default=1)
    args = p.parse_args()

    async def handler(lease: Lease) -> str:
        print(f"started {lease.task_id} {lease.attempt}", flush=True)
        await asyncio.sleep(float(lease.text() or "0"))
        return "done-in-subprocess"

    worker = Worker(args.target, args.pool, handler, slots=args.slots, name="subprocess-worker")
    task = asyncio.create_task(worker.run())
    await worker.wait_registered(30)
    print("registered", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
