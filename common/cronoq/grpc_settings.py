"""The gRPC core settings every cronoq process loads grpc with (server, router, SDK, CLI).

grpc core reads ``GRPC_EXPERIMENTS`` once, when the ``grpc`` module is first imported. In grpcio 1.85
the EventEngine TCP client and listener, on by default, cost more CPU per message than the older iomgr
ones they replace: on the 2-core reference machine, switching both back cut a Work-stream round trip
from 236-262 to 192-231 µs of CPU on each side and raised the end-to-end drain by 12-17 %
(``make bench``; interleaved A/B in the stop-12 note). :func:`load_grpc` imports grpc with those two
experiments off, then takes the variable away again so that child processes do not inherit it.

grpc core also writes log lines of its own, straight to stderr in a format of its own
(``I1206 16:50:59.647878 18222 ssl_transport_security.cc:2563] Handshake failed ...``), past Python's
logging and so past structlog. ``GRPC_VERBOSITY``, also read once at import, sets the least severe it
writes: a cronoq program passes its own (:data:`SERVER_VERBOSITY`, :data:`CLI_VERBOSITY`); the SDK,
inside someone else's program, leaves grpc's default alone.

Set either variable yourself (``GRPC_EXPERIMENTS`` even to an empty string) to keep grpc's defaults or
choose others; a process that imported grpc before cronoq keeps whatever it loaded with.
"""

from __future__ import annotations

import importlib
import os
import sys

EXPERIMENTS = "-event_engine_client,-event_engine_listener"
# A server's (and router's) output is a stream of JSON lines for log collectors: core's info and warning
# lines (one for every client that fails a TLS handshake) would break it. Its errors stay: they are rare,
# and say what no JSON line would.
SERVER_VERBOSITY = "ERROR"
# The CLI says every failure itself, in one line that carries core's reason
# (``cronoq: unavailable: ... Tls handshake failed ...``): core's own lines would only repeat it.
CLI_VERBOSITY = "NONE"


def load_grpc(verbosity: str | None = None) -> None:
    """Import grpc with :data:`EXPERIMENTS` and, when given, ``GRPC_VERBOSITY`` = ``verbosity``, each
    unless its variable is set already; nothing when grpc is loaded already."""
    if "grpc" in sys.modules:
        return
    wanted = {"GRPC_EXPERIMENTS": EXPERIMENTS, "GRPC_VERBOSITY": verbosity}
    added = {name: value for name, value in wanted.items() if value is not None and name not in os.environ}
    os.environ.update(added)
    try:
        importlib.import_module("grpc")
    finally:
        for name in added:
            del os.environ[name]
