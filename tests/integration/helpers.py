"""Small helpers shared by integration tests: the TOML of the servers they start (tables, tokens,
stores), SDK workers in the test's loop, subprocess workers, ``/metrics`` scrapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from cronoq.client import Client, Lease, Worker
from cronoq.v1 import cronoq_pb2 as pb

from .serverproc import ServerProcess

Handler = Callable[[Lease], Awaitable[Any]]


# ------------------------------------------------------------------------- configuration tables

Scalar = str | int | float | bool | Path
TomlValue = Scalar | Sequence[str] | Mapping[str, Scalar]
# Failed and lost attempts come back after 50 ms, always (no jitter), so retries finish within a test.
FAST_RETRY: dict[str, Scalar] = {
    "initial_backoff_s": 0.05,
    "multiplier": 1.0,
    "max_backoff_s": 0.05,
    "jitter": False,
}


def toml_value(value: TomlValue) -> str:
    """``value`` in TOML: strings and paths quoted as JSON quotes them (TOML reads that the same),
    sequences as arrays, mappings as inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{key} = {toml_value(v)}" for key, v in value.items()) + " }"
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def toml_table(table: str, /, **keys: TomlValue | None) -> str:
    """The TOML table ``[table]`` (``table`` in brackets, ``"[pools]"``, for an entry of an array of
    tables) with a line a key (None: left out) and a blank line after it, so that tables concatenate
    into a configuration."""
    lines = [f"[{table}]", *(f"{key} = {toml_value(v)}" for key, v in keys.items() if v is not None)]
    return "\n".join(lines) + "\n\n"


def token(
    value: str,
    role: str,
    pools: Sequence[str] | None = None,
    *,
    env: bool = False,
    labels: Sequence[str] | None = None,
    tenant: str | None = None,
) -> str:
    """One ``[[auth.tokens]]`` entry (``pools`` None: every pool). With ``env``, ``value`` names the
    environment variable that holds the token (``token_env``), as a deployment would keep it."""
    source = {"token_env" if env else "token": value}
    return toml_table("[auth.tokens]", **source, role=role, pools=pools, labels=labels, tenant=tenant)


def sqlite_store(path: Path, **options: TomlValue) -> str:
    """The ``[store]`` table of a SQLite store in the file ``path`` (``options``: more of its keys)."""
    return toml_table("store", kind="sqlite", path=path, **options)


def postgres_store(schema: str, **options: TomlValue) -> str:
    """The ``[store]`` table of a Postgres store in ``schema`` (the server reads its URL from
    ``DATABASE_URL``)."""
    return toml_table("store", kind="postgres", schema=schema, **options)


def durable_config(store: str, *, max_attempts: int = 3) -> str:
    """A server on a durable ``store`` (:func:`sqlite_store`, :func:`postgres_store`) made for crashes,
    restarts and failovers within a test: a clean stop waits at most 2 s for running attempts, and pool
    ``default`` (64 slots) runs a lost or failed attempt again after 50 ms, up to ``max_attempts``."""
    retry = {"max_attempts": max_attempts, **FAST_RETRY}
    return (
        toml_table("server", shutdown_grace_s=2)
        + store
        + toml_table("[pools]", name="default", max=64, retry=retry)
    )


@contextlib.asynccontextmanager
async def worker(target: str, handler: Handler, pool: str = "default", **kw: Any) -> AsyncIterator[Worker]:
    """An SDK worker running in this loop for the duration of the block (registered first)."""
    w = Worker(target, pool, handler, **kw)
    task = asyncio.create_task(w.run())
    try:
        await w.wait_registered(10)
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


async def watch_while(
    client: Client,
    subscribed: Sequence[ServerProcess],
    count: int,
    during: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
) -> list[tuple[int, str]]:
    """Watch through ``client`` (terminal events); once every server in ``subscribed`` counts one
    Watch subscription (so no event can be missed), enter ``during()`` (e.g. workers that finish the
    tasks) and return the first ``count`` events as (task id, status)."""
    seen: list[tuple[int, str]] = []

    async def collect() -> None:
        async for event in client.watch():
            seen.append((event.id, event.status))
            if len(seen) == count:
                return

    watching = asyncio.create_task(collect())
    try:
        deadline = time.monotonic() + 10
        while [await asyncio.to_thread(s.metric, "cronoq_watch_streams") for s in subscribed] != [1.0] * len(
            subscribed
        ):
            assert time.monotonic() < deadline, "the watch did not subscribe to every shard"
            await asyncio.sleep(0.05)
        async with during():
            await asyncio.wait_for(watching, 20)
    finally:
        watching.cancel()
    return seen


SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class Metrics:
    """A ``/metrics`` page; ``metrics(name, **labels)`` is one sample's value (KeyError if absent)."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for line in text.splitlines():
            if not line.startswith("#"):
                match = SAMPLE.match(line)
                assert match is not None, line
                labels = frozenset(LABEL.findall(match["labels"] or ""))
                self.samples[(match["name"], labels)] = float(match["value"])

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def get(self, name: str, **labels: str) -> float:
        """Like calling it, but 0 for a sample not (yet) there: a counter nothing has counted."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str) -> float:
        return sum(value for (family, _), value in self.samples.items() if family == name)


async def scrape_metrics(proc: ServerProcess, token: str | None = None) -> Metrics:
    """``/metrics`` of a server or a router, parsed (checks the exposition content type)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(f"{proc.http}/metrics", headers=headers) as resp:
        assert resp.status == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
        return Metrics(await resp.text())


async def eager_worker_refusals(
    workers: Any, pool: str, metadata: tuple[tuple[str, str], ...] = ()
) -> list[tuple[grpc.StatusCode, str]]:
    """Status and details of 200 Work calls (``workers``: a Workers stub), opened 20 at a time, each
    writing its Register at once as a worker does, for a server that refuses them: the grpc.aio client
    reports its own INTERNAL for a write still in flight when a refusal arrives, which workers starting
    together make likely, unless the server took the Register first."""

    async def register() -> tuple[grpc.StatusCode, str]:
        call = workers.Work(metadata=metadata)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.write(pb.WorkerMessage(register=pb.Register(pool=pool, slots=1)))
        return await call.code(), await call.details()

    answers: list[tuple[grpc.StatusCode, str]] = []
    for _ in range(10):
        answers += await asyncio.gather(*(register() for _ in range(20)))
    return answers
