"""The gRPC core settings every cronoq process loads grpc with (server, router, SDK, CLI).

grpc core reads ``GRPC_EXPERIMENTS`` once, when the ``grpc`` module is first imported. In grpcio 1.85
the EventEngine TCP client and listener, on by default, cost more CPU per message than the older iomgr
ones they replace: on the 2-core reference machine, switching both back cut a Work-stream round trip
from 236-262 to 192-231 µs of CPU on each side and raised the end-to-end drain by 12-17 %
(``make bench``; interleaved A/B in the stop-12 note). :func:`load_grpc` imports grpc with those two
experiments off, then takes the variable away again so that child processes do not inherit it.

Set ``GRPC_EXPERIMENTS`` yourself (even to an empty string) to keep grpc's defaults or choose others;
a process that imported grpc before cronoq keeps whatever it loaded with.
"""

from __future__ import annotations

import importlib
import os
import sys

EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def load_grpc() -> None:
    """Import grpc with :data:`EXPERIMENTS`, unless grpc is loaded or the variable is set already."""
    if "grpc" in sys.modules or "GRPC_EXPERIMENTS" in os.environ:
        return
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    try:
        importlib.import_module("grpc")
    finally:
        del os.environ["GRPC_EXPERIMENTS"]
