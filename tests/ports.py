"""Loopback ports for the processes the tests start (servers, routers, the fake Kubernetes API)."""

from __future__ import annotations

import random
import socket
from collections import deque

# Below Linux's ephemeral range (32768-60999 by default), from which bind(0) and every outgoing
# connection draw: a port picked there could be the same twice, or be taken by a client's connection
# before the server binds it (both happened: "duplicate listener address").
_TEST_PORTS = range(20_000, 32_000)
# Ports handed out lately. A port is free when it is picked, but its server binds it only when it
# starts, which may be after a later call: a router made before the shards it fronts start could be given
# one of their ports (seen: the router's HTTP probe answered by a shard's gRPC listener). No port is
# handed out again until this many others have been.
_RECENT: deque[int] = deque(maxlen=3_000)


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that nothing listens on."""
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            port = random.choice(_TEST_PORTS)
            if port in _RECENT:
                s.close()
                continue
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or already picked in this call
                s.close()
                continue
            held.append(s)
        ports = [int(s.getsockname()[1]) for s in held]
        _RECENT.extend(ports)
        return ports
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
