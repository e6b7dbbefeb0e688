"""run.cell.cpu_quota against the kernel: a confined process is really held to its quota, and a
``gyre run`` puts each cell into its own group and leaves none behind.

Skipped where the cgroup cpu controller is not writable (not Linux, not root, no delegation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gyre.runtime.cpulimit import CpuLimitError, check, confine, find_controller, sweep, throttled


def _writable() -> str | None:
    try:
        check(0.5)
    except CpuLimitError as e:
        return str(e)
    return None


WHY = _writable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no writable cgroup cpu controller: {WHY}")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_confined_busy_loop_gets_its_quota_not_a_core():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        group = confine(busy.pid, 0.2)
        assert str(busy.pid) in (group / "cgroup.procs").read_text().split()
        t0, c0 = time.monotonic(), _cpu_s(busy.pid)
        time.sleep(2.0)
        share = (_cpu_s(busy.pid) - c0) / (time.monotonic() - t0)
        # unconfined it would take ~1.0 of a core (0.5 if another job shares it); 0.2 + slack
        assert share < 0.3, share
        assert (throttled(group) or 0) > 5
    finally:
        busy.kill()
        busy.wait()
    c = find_controller()
    for _ in range(50):
        sweep(c)
        if not group.exists():
            break
        time.sleep(0.1)
    assert not group.exists()


def test_check_leaves_no_probe_behind():
    check(0.5)
    assert not list(find_controller().parent().glob("probe-*"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_confines_each_cell_and_removes_the_groups(tiny_model_dir, tmp_path):
    cfg = tmp_path / "quota.toml"
    cfg.write_text(
        """
[policy]
placement = "colocate"
cells = 2
cell_capacity = 2
group_size = 2
batch_groups = 1
phi = 0.0
mu = 1
total_steps = 1

[run]
taskset = "quickstart"
train_tasks = ["letter-a"]
profile = "synthetic"
harness_args = ["--reply-file", "answer.txt", "--max-tokens", "4", "--calls", "1", "--mean-s", "0.1"]
log_format = "plain"

[run.cell]
cpu_quota = 0.75
"""
    )
    argv = [sys.executable, "-m", "gyre.cli", "run", str(cfg), "--quiet"]
    for s in (f"model_dir={tiny_model_dir}", f"run.out_dir={tmp_path}", "run.name=q"):
        argv += ["--set", s]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=540)
    assert r.returncode == 0, r.stderr[-3000:]
    cells = json.loads((tmp_path / "q" / "cells.json").read_text())
    cells = cells["cells"] if isinstance(cells, dict) else cells
    groups = [c["cgroup"] for c in cells if "cell" in c]
    assert len(groups) == 2 and len(set(groups)) == 2
    pids = {c["pid"] for c in cells if "cell" in c}
    assert {Path(g).name for g in groups} == {f"cell-{p}" for p in pids}
    assert all(c["cpu_quota"] == 0.75 for c in cells if "cell" in c)
    assert not any(Path(g).exists() for g in groups)  # swept once the cells had exited
