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


def postgres_cpu_s() -> float:
    """CPU seconds used so far by every process named ``postgres`` on this machine (the postmaster and
    its backends, including those that exited and were waited for): the database's share of a drain.
    Meaningful only while no other Postgres works, as during ``make bench``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        head, _, rest = text.rpartition(")")
        if head.endswith("(postgres"):
            fields = rest.split()
            total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent on anything but idling and waiting for I/O
    (Linux /proc/stat), whoever ran: divided by a run's wall time, the cores that run had busy, other
    people's work on the machine included."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
