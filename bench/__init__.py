"""Benchmarks run by ``make bench``."""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.conninfo import conninfo_to_dict

from cronoq.grpc_settings import load_grpc
from cronoq.process import choose_event_loop

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

load_grpc()  # the raw-transport figures use the grpc settings cronoq runs with

T = TypeVar("T")
LOOP = choose_event_loop()  # every process of a benchmark runs on the loop cronoq's programs choose


def on_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the event loop ``cronoq-server`` would use here (``CRONOQ_EVENT_LOOP``), so
    that raw floors, producers and workers are measured on the same kind of loop as the server."""
    return LOOP.run(main)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def local_port(server: PostgresServer) -> int | None:
    """The port of ``server`` when it runs on this machine (``bench.cpu.postgres_cpu_s`` counts its
    CPU), else None."""
    return int(str(conninfo_to_dict(server.url)["port"])) if server.local else None


@contextlib.contextmanager
def postgres_or_skip() -> Iterator[PostgresServer | None]:
    """``DATABASE_URL``'s server or a throwaway one (``tests.postgres.running_postgres``) for the
    block; None, saying why, when there is neither, so that the caller skips its Postgres part."""
    from tests.postgres import running_postgres

    with contextlib.ExitStack() as stack:
        try:
            server: PostgresServer | None = stack.enter_context(running_postgres())
        except LookupError as err:
            print(f"postgres: skipped ({err})")
            server = None
        yield server
