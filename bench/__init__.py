"""Benchmarks run by ``make bench``."""

from collections.abc import Coroutine
from typing import Any, TypeVar

from cronoq.grpc_settings import load_grpc
from cronoq.process import choose_event_loop

load_grpc()  # the raw-transport figures use the grpc settings cronoq runs with

T = TypeVar("T")
LOOP = choose_event_loop()  # every process of a benchmark runs on the loop cronoq's programs choose


def on_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the event loop ``cronoq-server`` would use here (``CRONOQ_EVENT_LOOP``), so
    that raw floors, producers and workers are measured on the same kind of loop as the server."""
    return LOOP.run(main)
