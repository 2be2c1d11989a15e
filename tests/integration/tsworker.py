"""The TypeScript SDK's test worker (``sdk/typescript/test/fixtures/worker.ts``) in its own process, for
the integration tests: ``runWorker`` with the options given, a handler whose behaviour each task's
payload chooses (``{"do": "complete", ...}``), and a JSON line on stdout for everything that happens
(registered, started, aborted, finished, disconnected, stopping, stopped, error), which the test waits
for. SIGTERM aborts the worker's signal: it drains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

Event = dict[str, Any]
WAIT = 15.0  # upper bound for a step a test waits for; reached only when something is wrong


class TsWorker:
    """One worker process; ``events`` holds every line it printed so far, parsed, in order."""

    def __init__(self, dist: Path, **options: Any) -> None:
        self.proc = subprocess.Popen(
            [
                "node",
                "--enable-source-maps",
                str(dist / "test" / "fixtures" / "worker.js"),
                json.dumps(options),
            ],
            stdout=subprocess.PIPE,  # its stderr is the test's, which pytest shows on a failure
            text=True,
        )
        self.events: list[Event] = []
        self._taken: set[int] = set()
        self._arrived: queue.Queue[None] = queue.Queue()
        self._lock = threading.Lock()
        # A thread owns the pipe: buffered reads would otherwise hide a second line from select().
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.events.append(json.loads(line))
            self._arrived.put(None)
        self._arrived.put(None)  # the process ended: wake a waiter, which then gives up

    def expect(self, event: str, timeout: float = WAIT, **fields: Any) -> Event:
        """The first printed ``event`` whose fields include ``fields`` that no earlier call returned,
        waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for i, seen in enumerate(self.events):
                    if i not in self._taken and seen["event"] == event and fields.items() <= seen.items():
                        self._taken.add(i)
                        return seen
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self._arrived.empty()):
                raise AssertionError(f"no {event} {fields} from the TypeScript worker:\n{self.transcript()}")
            with contextlib.suppress(queue.Empty):
                self._arrived.get(timeout=min(left, 0.5))

    async def wait_for(self, event: str, timeout: float = WAIT, **fields: Any) -> Event:
        return await asyncio.to_thread(self.expect, event, timeout, **fields)

    def seen(self, event: str, **fields: Any) -> list[Event]:
        """Every ``event`` with ``fields`` printed so far."""
        with self._lock:
            return [e for e in self.events if e["event"] == event and fields.items() <= e.items()]

    def transcript(self) -> str:
        with self._lock:
            lines = [json.dumps(e) for e in self.events]
        return "\n".join(lines[-60:])

    def stop(self, timeout: float = WAIT) -> int:
        """SIGTERM (the worker drains) and the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen one must be able to die
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> TsWorker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def registered(dist: Path, **options: Any) -> TsWorker:
    """A worker process that has registered once."""
    worker = TsWorker(dist, **options)
    try:
        worker.expect("registered")
    except BaseException:
        worker.close()
        raise
    return worker
