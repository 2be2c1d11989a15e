"""A CPU quota for one benchmark process through a Linux cgroup, so that one machine can stand in for
several smaller ones (``bench.scaleout`` gives each shard server the same fraction of a core).

cgroup v1 (a ``cpu`` hierarchy with ``cpu.cfs_quota_us``) and v2 (a unified hierarchy whose
``cgroup.controllers`` offers ``cpu``: the child's ``cpu.max``) are both handled. Each quota is a
child directory of the hierarchy's root, removed when the block ends whatever happened in it: any
process still inside is moved back to the root first, because the kernel refuses to remove a cgroup
that has members.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000  # the kernel's default CFS period: quotas are enforced per 100 ms
ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


class CgroupRefused(Exception):
    """This machine gives no CPU quota to a process; the message says why."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """A writable cgroup hierarchy with the cpu controller: its root directory and version (1 or 2)."""

    root: Path
    version: int


def find_hierarchy(roots: Sequence[Path] = ROOTS) -> Hierarchy:
    """The first of ``roots`` that can hold a CPU quota, or :class:`CgroupRefused` naming what each
    lacked."""
    reasons = []
    for root in roots:
        if (root / "cpu.cfs_quota_us").is_file():
            found = Hierarchy(root, 1)
        elif "cpu" in _read(root / "cgroup.controllers").split():
            found = Hierarchy(root, 2)
        else:
            reasons.append(f"{root}: no cpu controller")
            continue
        if os.access(root, os.W_OK):
            return found
        reasons.append(f"{root}: cgroup v{found.version} with cpu, not writable by uid {os.getuid()}")
    raise CgroupRefused("; ".join(reasons))


@dataclass(frozen=True, slots=True)
class CpuGroup:
    """A child cgroup that lets its processes use ``quota`` cores at most."""

    path: Path
    hierarchy: Hierarchy

    def add(self, pid: int) -> None:
        """Move process ``pid`` (every thread of it) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled(self) -> float:
        """The share of CFS periods so far in which the group used up its quota and was stopped:
        near 1 while its processes want more CPU than the quota gives."""
        stat = dict(line.split() for line in _read(self.path / "cpu.stat").splitlines())
        periods = int(stat.get("nr_periods", 0))
        return int(stat.get("nr_throttled", 0)) / periods if periods else 0.0


def quota_setting(version: int, quota: float) -> tuple[str, str]:
    """The file of a child cgroup that sets a quota of ``quota`` cores, and what to write in it."""
    if not 0 < quota <= (os.cpu_count() or 1):
        raise ValueError(f"quota: {quota} cores is not between 0 and this machine's {os.cpu_count()}")
    us = max(1000, round(quota * PERIOD_US))  # the kernel's smallest quota is 1 ms
    if version == 1:
        return "cpu.cfs_quota_us", str(us)
    return "cpu.max", f"{us} {PERIOD_US}"


@contextlib.contextmanager
def cpu_quota(hierarchy: Hierarchy, name: str, quota: float) -> Iterator[CpuGroup]:
    """A new child cgroup ``cronoq-bench-<pid>-<name>`` limited to ``quota`` cores, removed when the
    block ends (its remaining processes moved back to the root first)."""
    file, value = quota_setting(hierarchy.version, quota)
    if hierarchy.version == 2 and "cpu" not in _read(hierarchy.root / "cgroup.subtree_control").split():
        _enable_cpu(hierarchy.root)
    path = hierarchy.root / f"cronoq-bench-{os.getpid()}-{name}"
    path.mkdir()
    try:
        if hierarchy.version == 1:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / file).write_text(value)
        yield CpuGroup(path, hierarchy)
    finally:
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                (hierarchy.root / "cgroup.procs").write_text(pid)
        path.rmdir()


def _enable_cpu(root: Path) -> None:
    """Let v2 children of ``root`` have CPU quotas. The kernel refuses while ``root`` is not the
    hierarchy's top and has processes of its own (as in many containers): say so."""
    try:
        (root / "cgroup.subtree_control").write_text("+cpu")
    except OSError as err:
        hint = " (it has processes of its own)" if err.errno == errno.EBUSY else ""
        raise CgroupRefused(f"{root}: cannot enable the cpu controller for children{hint}: {err}") from err


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
