"""Who holds a SQLite store's lease (``shard/store/holder.py``): the identity the lease row keeps, when
that process is judged gone, who holds the file's write lock, and ending a holder safely."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shard.store.holder import (
    Holder,
    Presence,
    kill,
    parse_write_lock_owner,
    presence,
    this_process,
    write_lock_owner,
)
from tests.holderkit import exited_pid, running_holder

HERE = this_process("here")


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], Holder]]:
    with running_holder() as running:
        yield running


def test_this_process_is_located_and_its_identity_survives_the_row() -> None:
    assert HERE.located and HERE.pid == os.getpid() and HERE.start > 0
    assert HERE.host.endswith("/" + Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    assert HERE.namespaces.startswith(os.readlink("/proc/self/ns/pid"))
    assert Holder.parse(HERE.text()) == HERE
    named = this_process('a "name" with spaces, {braces} and ünïcode')
    assert Holder.parse(named.text()) == named


@pytest.mark.parametrize(
    "text",
    [
        "vm:1234:abcd",  # an older cronoq's holder
        "",
        "[1, 2]",
        '{"name": "x"}',
        '{"name": "x", "host": "h", "ns": "n", "pid": "12", "start": 1}',
        '{"name": 1, "host": "h", "ns": "n", "pid": 12, "start": 1}',
    ],
)
def test_a_row_that_does_not_locate_its_holder_names_it_only(text: str) -> None:
    holder = Holder.parse(text)
    assert holder == Holder(text) and not holder.located
    assert presence(holder, HERE) is Presence.UNSEEN


def test_a_running_holder_is_running_and_gone_once_it_ends(
    child: tuple[subprocess.Popen[str], Holder],
) -> None:
    proc, holder = child
    assert holder.pid == proc.pid and (holder.host, holder.namespaces) == (HERE.host, HERE.namespaces)
    assert presence(holder, HERE) is Presence.RUNNING
    assert presence(HERE, HERE) is Presence.RUNNING
    proc.send_signal(signal.SIGSTOP)  # stopped is still running: it may wake
    assert presence(holder, HERE) is Presence.RUNNING
    proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
    assert presence(holder, HERE) is Presence.GONE
    proc.wait(10)
    assert presence(holder, HERE) is Presence.GONE


def test_a_pid_that_names_a_process_started_at_another_time_is_not_the_holder() -> None:
    """The pid was given to another process after the holder ended."""
    for start in (HERE.start - 1, HERE.start + 1):
        reused = Holder("old", HERE.host, HERE.namespaces, HERE.pid, start)
        assert presence(reused, HERE) is Presence.GONE


def test_a_holder_on_another_host_or_in_another_namespace_is_never_judged_gone() -> None:
    """Its pid and start time mean nothing here: even ones that name no process here are not read."""
    ended = exited_pid()
    for holder in (
        Holder("h", "other-host/" + HERE.host.split("/")[1], HERE.namespaces, ended, 1),
        Holder("h", HERE.host.split("/")[0] + "/another-boot", HERE.namespaces, ended, 1),
        Holder("h", HERE.host, "pid:[1] time:[1]", ended, 1),
    ):
        assert presence(holder, HERE) is Presence.UNSEEN
    assert presence(HERE, Holder("unlocated")) is Presence.UNSEEN


LOCKS = [
    "1: POSIX  ADVISORY  READ 700 fe:00:42 128 128\n",  # every connection's shared lock
    "2: -> POSIX  ADVISORY  WRITE 800 fe:00:42 120 120\n",  # a waiter, not a holder
    "3: POSIX  ADVISORY  WRITE 900 fe:00:43 120 120\n",  # another file
    "4: FLOCK  ADVISORY  WRITE 901 fe:00:42 0 EOF\n",
    "5: OFDLCK ADVISORY  WRITE -1 fe:00:42 0 EOF\n",
]


@pytest.mark.parametrize(
    ("line", "owner"),
    [
        ("6: POSIX  ADVISORY  WRITE 555 fe:00:42 120 120\n", 555),
        ("6: POSIX  ADVISORY  WRITE 555 00:2d:42 120 121\n", 555),  # merged with the checkpoint lock
        ("6: POSIX  ADVISORY  WRITE 555 fe:00:42 100 EOF\n", 555),
        ("6: POSIX  ADVISORY  WRITE 555 fe:00:42 121 121\n", None),
        ("6: POSIX  ADVISORY  WRITE 0 fe:00:42 120 120\n", None),  # a process this namespace cannot see
        ("6: POSIX  ADVISORY  READ 555 fe:00:42 120 120\n", None),
    ],
)
def test_the_write_lock_owner_is_read_from_proc_locks(line: str, owner: int | None) -> None:
    assert parse_write_lock_owner([*LOCKS, line], 42) == owner


def test_the_write_lock_owner_of_a_real_database(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
        assert write_lock_owner(str(path)) is None
        conn.execute("BEGIN IMMEDIATE")
        assert write_lock_owner(str(path)) == os.getpid()
        conn.execute("COMMIT")
        assert write_lock_owner(str(path)) is None
    assert write_lock_owner(str(tmp_path / "missing")) is None


def test_kill_ends_the_holder(child: tuple[subprocess.Popen[str], Holder]) -> None:
    proc, holder = child
    proc.send_signal(signal.SIGSTOP)
    assert kill(holder, wait=10.0)
    assert proc.wait(10) == -signal.SIGKILL


def test_kill_never_signals_a_process_that_only_has_the_holders_pid(
    child: tuple[subprocess.Popen[str], Holder],
) -> None:
    proc, holder = child
    reused = Holder(holder.name, holder.host, holder.namespaces, holder.pid, holder.start + 1)
    assert kill(reused, wait=10.0)  # that holder is gone
    assert proc.poll() is None
    assert kill(Holder("h", HERE.host, HERE.namespaces, exited_pid(), 1), wait=10.0)
