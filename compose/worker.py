"""An example cronoq worker for the development cluster: serves one pool with the Python SDK.

compose.yaml runs it from the cronoq image (``/opt/cronoq/bin/python3 /srv/cronoq/worker.py``), once
per pool. It connects to the router, which redirects it to the leader of the shard owning its pool, and
follows that leader across failovers. Settings come from the environment:

- ``CRONOQ_TARGET``: the gRPC address to connect to (default ``127.0.0.1:7070``);
- ``CRONOQ_TOKEN``: a bearer token with the ``worker`` role;
- ``CRONOQ_POOL``: the pool to serve (default ``default``);
- ``CRONOQ_SLOTS``: how many tasks run at once (default 4);
- ``CRONOQ_WORKER_NAME``: the name shown by ``cronoq workers`` and in results (default: the host name);
- ``CRONOQ_INSECURE_REDIRECT_HTTP``: ``1`` to follow redirects that send the token over plain http to
  another host, as on the Compose network, which has no TLS;
- ``CRONOQ_REDIRECT_ALLOW``: where redirects may lead (the SDK's ``redirect_allow``: URLs, host names or
  ``*.suffix``, comma-separated); unset, the worker follows the router to the shard endpoints it names.

A task's JSON payload is echoed back in its result. ``{"sleep": 2}`` makes the attempt last 2 s (to
watch busy slots and autoscaling on the dashboards), ``{"fail": "why"}`` fails it as retryable (to
watch retries and dead letters). On SIGTERM (``docker compose stop``) the worker stops taking leases
and lets running ones finish before it exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import cronoq
from cronoq.client import Lease, Worker

NAME = os.environ.get("CRONOQ_WORKER_NAME") or socket.gethostname()
Handler = Callable[[Lease], Awaitable[Any]]


async def handle(lease: Lease) -> dict[str, Any]:
    """Echo the payload, naming who ran it, so a caller sees which pool and worker did the work."""
    body = lease.json() if lease.content_type == "application/json" else lease.text()
    if isinstance(body, dict):
        if "sleep" in body:
            await asyncio.sleep(float(body["sleep"]))
        if "fail" in body:
            raise cronoq.Retryable(str(body["fail"]))
    return {"pool": lease.pool, "worker": NAME, "attempt": lease.attempt, "echo": body}


def _listed(value: str | None) -> list[str] | None:
    """A comma-separated environment variable as a list (None when unset or empty)."""
    return [item.strip() for item in value.split(",") if item.strip()] if value else None


def from_env(handler: Handler, name: str) -> Worker:
    """The worker the environment describes (above), running ``handler``; also the chaos suite's
    (``chaos/worker.py``), which runs its own handler under the same settings."""
    return Worker(
        os.environ.get("CRONOQ_TARGET", "127.0.0.1:7070"),
        os.environ.get("CRONOQ_POOL", "default"),
        handler,
        slots=int(os.environ.get("CRONOQ_SLOTS", "4")),
        token=os.environ.get("CRONOQ_TOKEN") or None,
        name=name,
        insecure_redirect_http=os.environ.get("CRONOQ_INSECURE_REDIRECT_HTTP") == "1",
        redirect_allow=_listed(os.environ.get("CRONOQ_REDIRECT_ALLOW")),
    )


async def serve(worker: Worker) -> None:
    """Run ``worker`` until SIGTERM or SIGINT, then let its running handlers finish."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"worker {worker.name}: serving pool {worker.pool}", flush=True)
    running = asyncio.create_task(worker.run())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not running.done():
        await worker.stop()  # lets running handlers finish (the SDK's grace, 10 s)
    stopping.cancel()
    await running  # raises what ended the worker, e.g. a rejected token


async def main() -> None:
    await serve(from_env(handle, NAME))


if __name__ == "__main__":
    asyncio.run(main())
