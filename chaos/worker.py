"""The chaos run's worker program: the Python SDK's ``Worker`` with a handler that writes the history.

It replaces the example worker (``compose/worker.py``) in the run's topology and runs as it does, from
the same environment (its ``from_env`` and ``serve``), plus ``CHAOS_HISTORY``, the file its records go
to: the SDK's defaults (keepalives, backoff, redirects), as users run it.

For each lease the handler writes a ``lease`` record when it begins and a ``report`` record before it
returns or raises, so the report's time is no later than the server received it. The payload (JSON,
written by :mod:`chaos.producer`) says what to do: ``ms`` to take, ``fail`` attempts to fail on
purpose (retryable, with ``retry_after_s``), ``permanent`` to fail for good. Its output, or its
failure message, names the lease (:func:`chaos.history.identity`).

``SIGUSR1`` is the ``hang-worker`` fault: the next handler hangs (it sleeps far past the task's
timeout) until the server aborts its attempt; each signal hangs one more.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path
from typing import Any

import cronoq
from compose.worker import from_env, serve
from cronoq.client import Lease, Worker

from .history import HistoryWriter, failure_message, identity

HANG_S = 3600.0


class ChaosHandler:
    """The handler, with what it needs of the worker that runs it (its name and stream count)."""

    def __init__(self, history: HistoryWriter, name: str) -> None:
        self.history = history
        self.name = name
        self.pid = os.getpid()
        self.worker: Worker | None = None
        self.hangs = 0

    def hang_next(self) -> None:
        self.hangs += 1

    async def __call__(self, lease: Lease) -> dict[str, Any]:
        session = self.worker.connections if self.worker is not None else 0
        ident = identity(lease.task_id, lease.attempt, self.name, self.pid, session, lease.id)
        body = lease.json() if lease.content_type == "application/json" else {}
        body = body if isinstance(body, dict) else {}
        self.history.write("lease", **ident, pool=lease.pool, uid=body.get("uid"))
        hung = self.hangs > 0
        self.hangs -= hung
        try:
            await asyncio.sleep(HANG_S if hung else float(body.get("ms", 0)) / 1000)
        except asyncio.CancelledError:  # aborted by the server, or its stream ended: nothing is sent
            self.history.write("report", **ident, outcome="aborted", hung=hung)
            raise
        if lease.attempt <= int(body.get("fail", 0)):
            retry_after = float(body.get("retry_after_s", 0))
            self.history.write("report", **ident, outcome="retry", retry_after_s=retry_after)
            raise cronoq.Retryable(failure_message(ident, "failing on purpose"), retry_after=retry_after)
        if body.get("permanent"):
            self.history.write("report", **ident, outcome="permanent")
            raise cronoq.Permanent(failure_message(ident, "failing for good on purpose"))
        self.history.write("report", **ident, outcome="complete")
        return ident


async def main() -> None:
    name = os.environ.get("CRONOQ_WORKER_NAME") or socket.gethostname()
    handler = ChaosHandler(HistoryWriter(Path(os.environ["CHAOS_HISTORY"])), name)
    handler.worker = worker = from_env(handler, name)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, handler.hang_next)
    await serve(worker)


if __name__ == "__main__":
    asyncio.run(main())
