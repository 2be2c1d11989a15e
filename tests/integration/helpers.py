"""Small helpers shared by integration tests (SDK workers in the test's loop, subprocess workers)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from cronoq.client import Lease, Worker

Handler = Callable[[Lease], Awaitable[Any]]


@contextlib.asynccontextmanager
async def worker(
    target: str, handler: Handler, pool: str = "default", registered_within: float = 10.0, **kw: Any
) -> AsyncIterator[Worker]:
    """An SDK worker running in this loop for the duration of the block (registered first)."""
    w = Worker(target, pool, handler, **kw)
    task = asyncio.create_task(w.run())
    try:
        await w.wait_registered(registered_within)
        yield w
    finally:
        await w.stop(grace=1)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10)


class SubprocessWorker:
    """``worker_proc.py`` in its own process; ``expect_start`` reads its stdout reports."""

    def __init__(self, target: str, pool: str = "default", slots: int = 1) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.worker_proc",
                "--target",
                target,
                "--pool",
                pool,
                "--slots",
                str(slots),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        # A thread owns the pipe: buffered reads would otherwise hide a second line from select().
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        assert self.readline(20) == "registered"

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def readline(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no output from worker process within {timeout} s") from None

    async def expect_start(self, timeout: float = 10) -> tuple[int, int]:
        line = await asyncio.to_thread(self.readline, timeout)
        word, task_id, attempt = line.split()
        assert word == "started", line
        return int(task_id), int(attempt)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
