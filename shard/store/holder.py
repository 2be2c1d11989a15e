"""Which process holds a SQLite store's lease, told precisely enough to know when it is gone.

SQLite's write lock is an fcntl lock of the process that holds it: a leader that is stopped (SIGSTOP,
a paused VM, a long stall) in the middle of a commit keeps it for as long as it is stopped, and no
standby can take over, since taking over is a write. Nothing takes such a lock away short of ending
the process. A SQLite store lives on a local disk, so its leader and standbys share a host, and the
standby can do what HA clusters do (STONITH): see that the holder is gone and take over at once, or
end a holder that is stuck past its lease while it holds the lock.

For that the lease row's ``holder`` names the process exactly: its host (hostname and kernel boot id),
its PID and time namespaces, its pid, and the time it started (field 22 of ``/proc/<pid>/stat``), so
that another process that was given the same pid later is never taken for the holder. The ``name`` is
what the instance was called (an explicit ``holder`` option, or a random default): a restart with the
same name takes its own lease back. A holder on another host or in another namespace cannot be seen
from here, so it is never judged gone and never ended: its lease is waited out, and, if it is stuck
holding the write lock, until it lets go. That needs Linux's ``/proc``; elsewhere every holder is of
that kind.
"""

from __future__ import annotations

import enum
import json
import os
import select
import signal
import socket
from dataclasses import dataclass
from typing import Final

# SQLite's unix VFS takes a WAL database's write lock as a POSIX lock on this byte of the ``-shm`` file
# (UNIX_SHM_BASE = (22 + SQLITE_SHM_NLOCK) * 4 = 120, and WAL_WRITE_LOCK is lock 0).
WAL_WRITE_LOCK_BYTE: Final = 120
_PROC: Final = "/proc"


@dataclass(frozen=True, slots=True)
class Holder:
    """One process that holds, or held, the lease. Fields other than ``name`` are empty (0, "") when
    unknown: a row written by an older cronoq, or a process without ``/proc``."""

    name: str
    host: str = ""  # hostname and boot id
    namespaces: str = ""  # the PID and time namespaces: pids and start times mean something within them
    pid: int = 0
    start: int = 0  # clock ticks after boot

    def text(self) -> str:
        """The lease row's ``holder``: JSON, so that any name survives the round trip."""
        fields = {
            "name": self.name,
            "host": self.host,
            "ns": self.namespaces,
            "pid": self.pid,
            "start": self.start,
        }
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Holder:
        """The holder a row names. Anything else (an older cronoq's plain name, a hand-written row) is a
        holder of that name and unknown whereabouts."""
        try:
            fields = json.loads(text)
            holder = cls(
                name=fields["name"],
                host=fields["host"],
                namespaces=fields["ns"],
                pid=fields["pid"],
                start=fields["start"],
            )
        except (ValueError, TypeError, KeyError):
            return cls(text)
        kinds = (holder.name, holder.host, holder.namespaces, holder.pid, holder.start)
        if [type(value) for value in kinds] != [str, str, str, int, int]:
            return cls(text)
        return holder

    @property
    def located(self) -> bool:
        """Whether the row says where the holder runs (else it can never be judged gone)."""
        return bool(self.host and self.namespaces and self.pid > 0)


class Presence(enum.Enum):
    """What can be told about a lease's holder from this process."""

    GONE = "gone"  # on this host and namespace, and no longer running (exited, or its pid reused)
    RUNNING = "running"  # on this host and namespace, and still running (maybe stopped)
    UNSEEN = "unseen"  # on another host or in another namespace, or of unknown whereabouts


def this_process(name: str) -> Holder:
    """The identity of the calling process under ``name``."""
    pid = os.getpid()
    stat = _stat(pid)
    boot = _read(f"{_PROC}/sys/kernel/random/boot_id")
    namespaces = [_link(f"{_PROC}/self/ns/{kind}") for kind in ("pid", "time")]
    if stat is None or not boot or not namespaces[0]:
        return Holder(name)  # no /proc: nobody can tell where this process runs
    return Holder(name, f"{socket.gethostname()}/{boot}", " ".join(namespaces), pid, stat[1])


def presence(holder: Holder, here: Holder) -> Presence:
    """Whether ``holder`` is still running, as seen from the process ``here``."""
    same_place = (holder.host, holder.namespaces) == (here.host, here.namespaces)
    if not (holder.located and here.located and same_place):
        return Presence.UNSEEN
    stat = _stat(holder.pid)
    if stat is None:
        # /proc may hide other users' processes (mount option hidepid): ask the kernel itself.
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return Presence.GONE
        except PermissionError:
            pass
        return Presence.RUNNING  # it exists, and its start time cannot be compared: assume it is the holder
    state, start = stat
    # A zombie has exited: its files, and the locks on them, are gone already.
    return Presence.GONE if state in ("Z", "X") or start != holder.start else Presence.RUNNING


def write_lock_owner(database: str) -> int | None:
    """The pid that holds the write lock of the WAL database at ``database`` (from ``/proc/locks``), or
    None when nobody does or it cannot be told. ``/proc/locks`` shows pids in this PID namespace, and
    leaves out locks of processes this namespace cannot see.

    The lock file is matched by inode number alone: the device numbers that file shows are those of the
    filesystem's superblock, which on btrfs or overlayfs differ from what ``stat`` returns.
    """
    try:
        inode = os.stat(os.path.realpath(database) + "-shm").st_ino
        with open(f"{_PROC}/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.readlines()
    except OSError:
        return None
    return parse_write_lock_owner(lines, inode)


def parse_write_lock_owner(lines: list[str], inode: int) -> int | None:
    """The pid holding a POSIX write lock over SQLite's write-lock byte of the file with ``inode``, from
    ``/proc/locks`` lines such as ``1: POSIX  ADVISORY  WRITE 5493 fe:00:2146907 120 120`` (the kernel
    merges a process's adjacent locks into one range; lines of waiters read ``1: -> POSIX ...``)."""
    for line in lines:
        fields = line.split()
        if len(fields) != 8 or fields[1:4] != ["POSIX", "ADVISORY", "WRITE"]:
            continue
        pid, file, first, last = fields[4:]
        if file.rsplit(":", 1)[-1] != str(inode) or not pid.isdigit() or not first.isdigit():
            continue
        reaches = last == "EOF" or (last.isdigit() and int(last) >= WAL_WRITE_LOCK_BYTE)
        if int(first) <= WAL_WRITE_LOCK_BYTE and reaches:
            return int(pid) or None  # 0: a process this namespace cannot see
    return None


def kill(holder: Holder, wait: float) -> bool:
    """SIGKILL ``holder`` and wait up to ``wait`` seconds for it to end; True when it is gone.

    The process is pinned by a pidfd and its start time checked after that, so that the signal can
    only reach the holder, never a process that was given its pid after it ended; one whose start time
    cannot be read is left alone. Raises OSError when the kernel refuses (PermissionError when this
    process may not signal it).
    """
    try:
        pidfd = os.pidfd_open(holder.pid)
    except ProcessLookupError:
        return True
    try:
        stat = _stat(holder.pid)
        if stat is None:
            return False
        if stat[0] in ("Z", "X") or stat[1] != holder.start:
            return True
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return True
        # A pidfd turns readable when its process has ended (its locks released). poll, not select:
        # a server's descriptors may number past select's 1024.
        waiter = select.poll()
        waiter.register(pidfd, select.POLLIN)
        return bool(waiter.poll(round(wait * 1000)))
    finally:
        os.close(pidfd)


def _stat(pid: int) -> tuple[str, int] | None:
    """The state and start time of process ``pid`` (fields 3 and 22 of its stat), or None."""
    text = _read(f"{_PROC}/{pid}/stat")
    # Field 2 is the command name in parentheses, which may hold spaces and parentheses itself.
    fields = text[text.rfind(")") + 1 :].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return fields[0], int(fields[19])


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read().strip()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
