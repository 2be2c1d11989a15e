"""``make run``: the embedded default — a one-shard server on loopback plus a demo worker.

Both run in this one process so a newcomer sees the whole loop (submit → lease → outcome) with a single
command; production runs ``cronoq-server`` and separate worker processes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

import cronoq
from cronoq.client import Lease, Worker
from cronoq.config import default_config
from cronoq.logs import configure
from cronoq.process import choose_event_loop

from .server import ShardServer

BANNER = """
cronoq is running: gRPC on {grpc}, HTTP on {http}, pool "default", demo worker with 4 slots.

Submit a task over HTTP and wait for its result:
  curl -s -X POST http://{http}/v1/tasks -H 'content-type: application/json' \\
       -d '{{"pool": "default", "payload": {{"hello": "world"}}, "wait": true}}'

Or with the Python SDK (in another shell: .venv/bin/python):
  import asyncio
  from cronoq.client import Client
  async def main():
      async with Client("{grpc}") as c:
          done = await c.submit({{"hello": "world"}}, wait=True)
          print(done.result.json())
  asyncio.run(main())

The demo worker echoes the payload; {{"sleep": 2}} makes it sleep, {{"fail": "why"}} makes it fail (retried).
Look around: curl -s http://{http}/v1/snapshot | python3 -m json.tool    Stop with Ctrl-C.
"""


async def demo_handler(lease: Lease) -> Any:
    """Echo the payload; ``sleep`` and ``fail`` keys show long attempts and retries."""
    body = lease.json() if lease.content_type == "application/json" else lease.text()
    if isinstance(body, dict):
        if "sleep" in body:
            await asyncio.sleep(float(body["sleep"]))
        if "fail" in body:
            raise cronoq.Retryable(str(body["fail"]), retry_after=1)
    return {"echo": body, "attempt": lease.attempt, "task_id": lease.task_id}


async def run() -> None:
    server = ShardServer(default_config())
    await server.start()
    grpc_addr = server.config.server.grpc_addr
    worker = Worker(grpc_addr, "default", demo_handler, slots=4, name="demo-worker")
    worker_task = asyncio.create_task(worker.run())
    print(BANNER.format(grpc=grpc_addr, http=server.config.server.http_addr), file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await worker_task
    await server.shutdown("demo stopped")


def main() -> None:
    configure()
    try:
        loop = choose_event_loop()
    except ValueError as err:
        print(f"make run: {err}", file=sys.stderr)
        sys.exit(1)
    try:
        loop.run(run())
    except OSError as err:
        print(f"make run: cannot start: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
