"""run.cell.cpu_quota's cgroup plumbing against a cgroup-shaped file tree (v1 and v2).

The kernel's side (a quota that really holds a process back) is tested against the real
controller in tests/integration/test_runtime_cpulimit.py, where the machine allows it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.runtime import cpulimit
from gyre.runtime.cpulimit import Controller, CpuLimitError, check, confine, find_controller, sweep


def v1_tree(root: Path) -> Path:
    cpu = root / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    return cpu


def v2_tree(root: Path, subtree: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text(subtree)
    return root


def test_v1_is_found_first_and_the_group_gets_quota_and_pid(tmp_path):
    cpu = v1_tree(tmp_path)
    c = find_controller(tmp_path)
    assert c == Controller(cpu, 1)
    g = confine(4242, 0.5, c)
    assert g == cpu / "gyre" / "cell-4242"
    assert (g / "cpu.cfs_period_us").read_text() == "100000"
    assert (g / "cpu.cfs_quota_us").read_text() == "50000"
    assert (g / "cgroup.procs").read_text() == "4242"


def test_v2_enables_the_cpu_controller_on_both_levels_and_writes_cpu_max(tmp_path):
    v2_tree(tmp_path)
    c = find_controller(tmp_path)
    assert c.version == 2
    (tmp_path / "gyre").mkdir()
    (tmp_path / "gyre" / "cgroup.subtree_control").write_text("")
    g = confine(7, 1.25, c)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (tmp_path / "gyre" / "cgroup.subtree_control").read_text() == "+cpu"
    assert (g / "cpu.max").read_text() == "125000 100000"


def test_a_tiny_quota_is_raised_to_the_kernels_floor(tmp_path):
    c = Controller(v1_tree(tmp_path), 1)
    g = confine(1, 0.001, c)
    assert (g / "cpu.cfs_quota_us").read_text() == "1000"


def test_no_controller_is_one_line_naming_the_setting(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")  # v2 without cpu
    with pytest.raises(CpuLimitError, match=r"run.cell.cpu_quota: no cgroup cpu controller"):
        find_controller(tmp_path)


def test_an_unwritable_hierarchy_is_one_line(tmp_path):
    cpu = v1_tree(tmp_path)
    (cpu / "gyre").write_text("a file where the group directory goes")
    with pytest.raises(CpuLimitError) as e:
        confine(1, 0.5, Controller(cpu, 1))
    assert "cannot create" in str(e.value) and "\n" not in str(e.value)


def test_sweep_removes_empty_cell_groups_and_keeps_busy_ones(tmp_path):
    cpu = v1_tree(tmp_path)
    c = Controller(cpu, 1)
    (cpu / "gyre" / "cell-1").mkdir(parents=True)  # empty: its cell has exited
    busy = cpu / "gyre" / "cell-2"
    busy.mkdir()
    # rmdir fails on a non-empty directory, as the kernel refuses a group with processes
    (busy / "cgroup.procs").write_text("2")
    assert sweep(c) == 1
    assert not (cpu / "gyre" / "cell-1").exists() and busy.exists()


def test_check_refuses_more_cpus_than_the_machine_has(tmp_path):
    v1_tree(tmp_path)
    with pytest.raises(CpuLimitError, match="more than this machine's"):
        check((os.cpu_count() or 1) + 1, tmp_path)


def test_a_non_positive_quota_is_refused(tmp_path):
    with pytest.raises(CpuLimitError, match="must be > 0"):
        confine(1, 0, Controller(v1_tree(tmp_path), 1))


def test_throttled_reads_cpu_stat(tmp_path):
    (tmp_path / "cpu.stat").write_text("nr_periods 33\nnr_throttled 30\nthrottled_time 1\n")
    assert cpulimit.throttled(tmp_path) == 30
    assert cpulimit.throttled(tmp_path / "missing") is None
