"""Plumbing for the raw grpc.aio benchmarks (``grpc_ceiling``, ``latency_floor``): a free port, a
server process that says when it listens, and starting such processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable

import grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def serve(port: int, register: Callable[[grpc.aio.Server], None]) -> None:
    """Serve on loopback ``port`` what ``register`` adds, print "ready", and run until killed."""
    server = grpc.aio.server()
    register(server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def spawn(module: str, *args: str) -> subprocess.Popen[str]:
    """Run ``python -m module args`` and wait until it prints "ready"."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{module} {' '.join(args)} did not start")
    return proc
