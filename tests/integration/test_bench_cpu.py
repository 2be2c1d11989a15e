"""bench.cpu: postgres_cpu_s counts the CPU of the one Postgres server a benchmark uses, not of every
Postgres on the machine (other agents' servers share it); processes_cpu_s counts a backend's CPU to the
nanosecond."""

from __future__ import annotations

import os
import socket

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from bench.cpu import listening_inodes, postgres_cpu_s, processes_cpu_s
from tests.ports import free_ports
from tests.postgres import PostgresServer, server_programs, throwaway_postgres

BURN = "SELECT count(*) FROM generate_series(1, 3000000)"  # a few hundred ms of one backend's CPU


def port_of(url: str) -> int:
    return int(str(conninfo_to_dict(url)["port"]))


def burn(url: str, until: float, port: int) -> float:
    """Run BURN on ``url`` until the server on ``port`` has used ``until`` more CPU seconds; the CPU it
    used meanwhile."""
    before = postgres_cpu_s(port)
    with psycopg.connect(url) as conn:
        for _ in range(100):
            conn.execute(BURN)
            if postgres_cpu_s(port) - before >= until:
                break
    return postgres_cpu_s(port) - before


def test_counts_only_the_server_on_that_port(postgres_server: PostgresServer) -> None:
    if not postgres_server.local:
        pytest.skip("DATABASE_URL: the server's processes are not on this machine")
    ours = port_of(postgres_server.url)
    with throwaway_postgres(*server_programs()) as other:
        before = postgres_cpu_s(ours)
        assert burn(other, 0.5, port_of(other)) >= 0.5
        assert postgres_cpu_s(ours) - before < 0.25  # its own housekeeping at most, not the other's work
    assert burn(postgres_server.url, 0.2, ours) >= 0.2  # its backends' CPU is counted


def test_no_local_server_on_the_port_counts_nothing() -> None:
    [port] = free_ports(1)
    assert postgres_cpu_s(port) == 0.0


def test_the_postmaster_is_found_by_its_listening_socket() -> None:
    """Not by a ``-p`` on a command line, which a server with no TCP listener (or in another network
    namespace: other agents' clusters on this machine) may share: a socket listening on the port is
    what names it, and only while it listens."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert listening_inodes(port) == set()  # bound, not listening
        listener.listen()
        inode = str(os.stat(f"/proc/self/fd/{listener.fileno()}").st_ino)
        assert listening_inodes(port) == {inode}
    assert listening_inodes(port) == set()


def test_a_backends_cpu_is_counted_to_the_nanosecond(postgres_server: PostgresServer) -> None:
    if not postgres_server.local:
        pytest.skip("DATABASE_URL: the server's processes are not on this machine")
    with psycopg.connect(postgres_server.url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        before = processes_cpu_s([row[0]])
        conn.execute("SELECT 1")  # microseconds: less than one clock tick
        after = processes_cpu_s([row[0]])
        conn.execute(BURN)
        assert 0 < after - before < processes_cpu_s([row[0]]) - after
    assert processes_cpu_s([2**22 + 1]) == 0.0  # past Linux's largest pid_max: no such process
