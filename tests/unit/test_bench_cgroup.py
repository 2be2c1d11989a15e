"""bench.cgroup: which hierarchy can hold a CPU quota, what is written for it, and (live, where this
machine lets us) that a quota's cgroup is gone after its block whatever happened in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cgroup import CgroupRefused, Hierarchy, cpu_quota, find_hierarchy, quota_setting


def test_finds_v1_by_its_quota_file_and_v2_by_its_cpu_controller(tmp_path: Path) -> None:
    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for root in (v1, v2, none):
        root.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (none / "cgroup.controllers").write_text("cpuset hugetlb\n")  # "cpuset" is not "cpu"
    assert find_hierarchy([none, v1, v2]) == Hierarchy(v1, 1)
    assert find_hierarchy([none, v2, v1]) == Hierarchy(v2, 2)


def test_a_machine_without_a_cpu_controller_is_refused_naming_each_place_looked(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    with pytest.raises(CgroupRefused) as err:
        find_hierarchy([tmp_path, tmp_path / "missing"])
    assert str(err.value) == f"{tmp_path}: no cpu controller; {tmp_path / 'missing'}: no cpu controller"


def test_quota_in_each_version_and_out_of_range() -> None:
    assert quota_setting(1, 0.25) == ("cpu.cfs_quota_us", "25000")
    assert quota_setting(2, 0.25) == ("cpu.max", "25000 100000")
    with pytest.raises(ValueError, match="quota: 0 cores"):
        quota_setting(1, 0)


def _live_hierarchy() -> Hierarchy:
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    try:
        return find_hierarchy()
    except CgroupRefused as err:
        pytest.skip(f"no CPU quotas on this machine: {err}")


def test_the_cgroup_is_removed_with_its_process_still_in_it_when_the_block_fails() -> None:
    hierarchy = _live_hierarchy()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="drain failed"), cpu_quota(hierarchy, "test", 0.25) as group:
            group.add(sleeper.pid)
            assert (group.path / "cgroup.procs").read_text().split() == [str(sleeper.pid)]
            file, value = quota_setting(hierarchy.version, 0.25)
            assert (group.path / file).read_text().strip() == value
            raise RuntimeError("drain failed")
        assert not group.path.exists()
        assert str(sleeper.pid) in (hierarchy.root / "cgroup.procs").read_text().split()
    finally:
        sleeper.kill()
        sleeper.wait(10)
