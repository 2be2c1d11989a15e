"""Loopback ports for the processes the tests start (servers, routers, the fake Kubernetes API)."""

from __future__ import annotations

import random
import socket

# Below Linux's ephemeral range (32768-60999 by default), from which bind(0) and every outgoing
# connection draw: a port picked there could be the same twice, or be taken by a client's connection
# before the server binds it (both happened: "duplicate listener address").
_TEST_PORTS = range(20_000, 32_000)


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that nothing listens on."""
    held: list[socket.socket] = []
    try:
        while len(held) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", random.choice(_TEST_PORTS)))
            except OSError:  # in use, or already picked in this call
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
