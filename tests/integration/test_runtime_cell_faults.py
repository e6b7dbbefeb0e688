"""A cell actor that dies or hangs mid-run: the run goes on and finishes all its steps.

Each test runs a short ``gyre run`` (the shared config of test_runtime.py, K=3) and acts on a
cell's process from outside, by the pid the run wrote to ``cells.json``: SIGKILL (what
``ray.kill`` does to an actor's worker) or SIGSTOP (hung). The run's own records must show the
fault (``summary.json`` ``faults``), every step trained, every group trained once with its N
executions, and no finished execution lost.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from test_runtime import B, N, _args, _gyre, _jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


class _Killer:
    """Once ``ready(rd)`` holds, send ``sig`` to cell ``cell``'s process (pid from cells.json)."""

    def __init__(self, rd: Path, cell: int, sig: int, ready) -> None:
        self.rd, self.cell, self.sig, self.ready = rd, cell, sig, ready
        self.at: float | None = None
        self.pid: int | None = None

    def __call__(self, _driver: int) -> None:
        if self.at is not None or not (self.rd / "cells.json").exists():
            return
        if not self.ready(self.rd):
            return
        try:
            self.pid = json.loads((self.rd / "cells.json").read_text())[self.cell]["pid"]
        except (ValueError, KeyError, IndexError):
            return
        os.kill(self.pid, self.sig)
        self.at = time.time()


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


def _claimed(rd: Path, cell: int) -> bool:
    log = rd / "logs" / f"cell-{cell}.jsonl"
    return log.exists() and '"microstep.claimed"' in log.read_text()


def _check_run(rd: Path, log: str, steps: int) -> dict:
    s = json.loads((rd / "summary.json").read_text())
    assert s["steps"] == steps, log[-4000:]
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["step"] for x in m] == list(range(steps))
    trained = [g for x in m for g in x["groups"]]
    assert len(trained) == len(set(trained)) == steps * B
    ex = _jsonl(rd / "executions.jsonl")
    by_group: dict[int, list[dict]] = {}
    for e in ex:
        by_group.setdefault(e["group"], []).append(e)
    for g in trained:  # every trained group has its N finished executions, none failed
        rows = by_group[int(g[1:])]
        assert sorted(e["attempt"] for e in rows) == list(range(N)), rows
        assert all(e["failed"] is False for e in rows), rows
    assert s["interrupted_executions"] == 0  # 0 finished executions lost
    return s


def _run_with(tiny_model_dir, tmp_path, name: str, killer_args, steps: int = 5):
    rd = tmp_path / name
    argv = _args(
        tiny_model_dir,
        tmp_path,
        name,
        steps,
        "run.eval_interval=0",
        "run.fault.heartbeat_s=2",
        "policy.mu=2",
    )
    killer = _Killer(rd, *killer_args)
    r = _gyre(argv, tmp_path / f"{name}.log", timeout=900, watch=killer)
    assert killer.at is not None, "the cell was never hit"
    if killer_args[1] == signal.SIGSTOP and killer.pid is not None:
        try:  # the restarted run killed it; a leftover stopped process must not stay stopped
            os.kill(killer.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert r.returncode == 0, r.stdout[-6000:]
    s = _check_run(rd, r.stdout, steps)
    (fault,) = [f for f in s["faults"] if f["cell"] == killer_args[0]]
    assert fault["action"] == "restart" and fault["back"] is not None, fault
    cells = json.loads((rd / "cells.json").read_text())
    assert cells[killer_args[0]]["pid"] != killer.pid  # a new actor serves as that cell
    print(
        f"{name}: detected {fault['unix_time'] - killer.at:.2f} s after the signal by "
        f"{fault['detected_by']}; back after {fault['cost_s']} s; {fault}"
    )
    return s, fault, killer


def test_rollout_cell_killed_mid_run_is_restarted_and_the_run_finishes(tiny_model_dir, tmp_path):
    # cell 2 joins training last: at the first finished execution it serves rollouts
    s, fault, _ = _run_with(
        tiny_model_dir,
        tmp_path,
        "kill2",
        (2, signal.SIGKILL, lambda rd: _lines(rd / "executions.jsonl") >= 1),
    )
    assert fault["kind"] == "died" and fault["role"] == "rollout"


def test_rollout_cell_hung_is_found_by_the_heartbeat(tiny_model_dir, tmp_path):
    s, fault, killer = _run_with(
        tiny_model_dir,
        tmp_path,
        "stop2",
        (2, signal.SIGSTOP, lambda rd: _lines(rd / "executions.jsonl") >= 1),
    )
    assert fault["kind"] == "hung" and fault["detected_by"] == "heartbeat"
    assert fault["unix_time"] - killer.at < 2 * 2 + 3  # within 2 x heartbeat_s (+ load)


def test_satellite_killed_while_training_its_micro_steps_are_redone(tiny_model_dir, tmp_path):
    s, fault, _ = _run_with(
        tiny_model_dir, tmp_path, "kill1", (1, signal.SIGKILL, lambda rd: _claimed(rd, 1))
    )
    assert fault["role"] == "training"
