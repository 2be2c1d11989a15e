"""A lone Submit's acknowledgement: ``python -m bench.lone_submit`` (``make bench`` runs it too).

One SDK client on loopback sends single Submits one after the other, each waiting for the last one's
answer, to a server with no worker: every Submit is then a commit of its own with a durable store (a
group of one), and its latency is what a caller that submits now and then sees. Issue #25 asks for a
p50 of at most 1.5 ms on Postgres (fsync on); the memory store's figure is printed beside it as the
floor without a commit. Nothing here asserts: the numbers are for people.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cronoq.client import Client
from tests.integration.serverproc import running_server

from . import on_loop, percentile, postgres_or_skip

TARGET_P50_MS = 1.5  # Postgres (issue #25)
SUBMITS = 300
WARMUP = 50
POSTGRES_STORE = '[store]\nkind = "postgres"\nschema = "cronoq_bench_lone"\n'


async def measure(target: str, submits: int, warmup: int) -> list[float]:
    """Seconds from sending each of ``submits`` single Submits to its answer, after ``warmup`` unmeasured
    ones (connections, prepared statements, caches)."""
    seconds = []
    async with Client(target) as client:
        for i in range(warmup + submits):
            start = time.perf_counter()
            await client.submit(b"")
            if i >= warmup:
                seconds.append(time.perf_counter() - start)
    return seconds


def report(name: str, store: str, env: dict[str, str] | None, submits: int, warmup: int) -> None:
    """Start a server with ``store`` (a ``[store]`` section, or "" for memory), measure, print a line."""
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), store, env=env) as server:
        seconds = on_loop(measure(server.target, submits, warmup))
    target = f"   target p50 <= {TARGET_P50_MS} ms" if store else " (no commit: the floor)"
    print(
        f"lone Submit, {name} store ({submits} sequential single Submits, no worker): "
        f"p50 {percentile(seconds, 0.5) * 1e3:.2f} ms, p99 {percentile(seconds, 0.99) * 1e3:.2f} ms{target}",
        flush=True,
    )


def report_memory(submits: int = SUBMITS, warmup: int = WARMUP) -> None:
    report("memory", "", None, submits, warmup)


def report_postgres(url: str, submits: int = SUBMITS, warmup: int = WARMUP) -> None:
    report("Postgres", POSTGRES_STORE, {**os.environ, "DATABASE_URL": url}, submits, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--submits", type=int, default=SUBMITS, help="measured Submits (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=WARMUP, help="unmeasured first Submits (default: %(default)s)"
    )
    parser.add_argument(
        "--stores", default="memory,postgres", help="comma-separated: memory, postgres (default: %(default)s)"
    )
    args = parser.parse_args()
    stores = set(args.stores.split(","))
    if "memory" in stores:
        report_memory(args.submits, args.warmup)
    if "postgres" in stores:
        with postgres_or_skip() as pg:
            if pg is not None:
                report_postgres(pg.url, args.submits, args.warmup)


if __name__ == "__main__":
    main()
