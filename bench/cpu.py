"""CPU seconds used by the processes of a benchmark (Linux): on a machine whose cores are all busy,
cores / (CPU per task) bounds the rate whatever the scheduling does, so the benchmarks print both."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def postgres_cpu_s(port: int) -> float:
    """CPU seconds used so far by the Postgres server listening on ``port`` on this machine: its
    postmaster (including the backends that exited and were waited for) and the processes it runs
    now (backends, WAL writer, checkpointer...). The database's share of a drain. Only that server's:
    other agents' Postgres servers on a shared machine are left out. 0 when no local postmaster
    listens there (``DATABASE_URL`` pointing elsewhere).

    The postmaster is the process holding the TCP socket that listens on ``port``, not one whose
    command line says ``-p port``: a server without a TCP listener, or one in another network
    namespace, may say the same port."""
    sockets = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    stats: dict[int, tuple[int, list[str]]] = {}  # pid -> (parent pid, the fields after the name)
    postmaster = None
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if postmaster is None and sockets and text.rpartition(")")[0].endswith("(postgres"):
                fds = stat.parent / "fd"
                if any(os.readlink(fd) in sockets for fd in fds.iterdir()):
                    postmaster = int(stat.parent.name)
        except OSError:  # exited meanwhile
            continue
        fields = text.rpartition(")")[2].split()
        stats[int(stat.parent.name)] = (int(fields[1]), fields)
    if postmaster is None:
        return 0.0
    total = 0
    for pid, (parent, fields) in stats.items():
        if pid == postmaster or parent == postmaster:
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def listening_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets listening on ``port`` in this network namespace (/proc/net)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def processes_cpu_s(pids: list[int]) -> float:
    """CPU seconds the running processes ``pids`` have used so far, to the nanosecond (Linux
    ``/proc/<pid>/schedstat``, where ``/proc/<pid>/stat`` counts clock ticks): precise enough to
    measure one short statement of a Postgres backend. A process that is gone counts 0."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except OSError:
            continue
    return total / 1e9


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent on anything but idling and waiting for I/O
    (Linux /proc/stat), whoever ran: divided by a run's wall time, the cores that run had busy, other
    people's work on the machine included."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cost_line(unit: str, us: dict[str, float]) -> str:
    """The CPU microseconds each process (by name) spent per ``unit`` (task, job), in all, and the rate
    the machine's cores allow at those costs; a process that spent nothing (a Postgres not on this
    machine) is left out."""
    spent = {name: v for name, v in us.items() if v}
    total = sum(spent.values())
    return (
        f"  CPU per {unit}: {', '.join(f'{name} {v:.0f} us' for name, v in spent.items())}, {total:.0f} us in "
        f"all: {os.cpu_count()} cores allow at most {(os.cpu_count() or 1) * 1e6 / total:,.0f} {unit}s/s at "
        "these costs"
    )
