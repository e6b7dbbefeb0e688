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
import subprocess
import time
from pathlib import Path

import pytest
from test_runtime import (
    ADAM_WELL_CONDITIONED,
    B,
    N,
    _adam_scale,
    _args,
    _env,
    _jsonl,
    _step_groups,
)

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
        at = time.time()  # before the signal: after it, this thread may wait its turn for a
        os.kill(self.pid, self.sig)  # core while the driver already found the loss
        self.at = at


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines()) if p.exists() else 0


class _BetweenSteps:
    """Cell ``cell`` took part in an optimizer step that did not end its burst (the core's log:
    ``optimizer_step`` over >= 2 cells, version not a multiple of ``mu``): it stays in training
    and claims the next step's micro-steps. Hit ``delay`` s later, not in a reduce (a tiny
    model's step computes in a fraction of a second, so a signal at its first ``microstep.done``
    mostly landed in the reduce, which the run does not survive: docs/runtime.md)."""

    def __init__(self, cell: int, mu: int, delay: float = 0.05) -> None:
        self.cell, self.mu, self.delay, self.seen = cell, mu, delay, None

    def __call__(self, rd: Path) -> bool:
        if self.seen is None:
            log = rd / "logs" / "cell-0.jsonl"
            if not log.exists():
                return False
            for line in log.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # being written
                if (
                    r.get("event") == "optimizer_step"
                    and r["cells"] > self.cell
                    and r["version"] % self.mu
                ):
                    self.seen = time.monotonic()
            return False
        return time.monotonic() - self.seen >= self.delay


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


def _gyre_fast(argv: list[str], log: Path, killer: _Killer, timeout: float = 900):
    """``gyre run`` with ``killer`` polled every 20 ms (a tiny model's step lasts about a
    second: test_runtime's ``_gyre`` watches once a second)."""
    with open(log, "w") as f:
        p = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=log.parent,
            start_new_session=True,
        )  # fmt: skip
    end = time.monotonic() + timeout
    try:
        while p.poll() is None and time.monotonic() < end:
            killer(p.pid)
            time.sleep(0.02)
        rc = p.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(argv, rc, log.read_text(), "")


def _kill_during_run(
    tiny_model_dir, tmp_path, name: str, steps: int, killer_args, *extra: str, timeout=900
):
    """A ``gyre run`` of ``steps`` (heartbeat 2 s, no evals) whose cell ``killer_args[0]`` gets
    signal ``killer_args[1]`` once ``killer_args[2](rd)`` holds; ``(rd, result, killer)``."""
    rd = tmp_path / name
    sets = ("run.eval_interval=0", "run.fault.heartbeat_s=2", *extra)
    argv = _args(tiny_model_dir, tmp_path, name, steps, *sets)
    killer = _Killer(rd, *killer_args)
    r = _gyre_fast(argv, tmp_path / f"{name}.log", killer, timeout=timeout)
    assert killer.at is not None, f"cell {killer_args[0]} was never hit"
    return rd, r, killer


def _run_with(tiny_model_dir, tmp_path, name: str, killer_args, steps: int = 5, mu: int = 2):
    args = (tiny_model_dir, tmp_path, name, steps, killer_args, f"policy.mu={mu}")
    rd, r, killer = _kill_during_run(*args)
    if killer_args[1] == signal.SIGSTOP and killer.pid is not None:
        try:  # the restarted run killed it; a leftover stopped process must not stay stopped
            os.kill(killer.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert r.returncode == 0, r.stdout[-6000:]
    s = _check_run(rd, r.stdout, steps)
    (fault,) = [f for f in s["faults"] if f["cell"] == killer_args[0]]
    print(
        f"{name}: detected {fault['unix_time'] - killer.at:.2f} s after the signal by "
        f"{fault['detected_by']}; {fault}"
    )
    assert fault["action"] == "restart", fault
    cells = json.loads((rd / "cells.json").read_text())
    assert cells[killer_args[0]]["pid"] != killer.pid  # a new actor serves as that cell
    # one machine: the gloo worlds met in files of the driver's private folder, no TCP port
    assert {c["gloo"] for c in cells} == {"127.0.0.1:0"}, cells
    # it served again: back in the policy's rollout (``back``), or, when the run ended first
    # (an engine start takes ~13 s on a loaded 2-core machine), its new engine came up
    log = (rd / "logs" / f"cell-{killer_args[0]}.jsonl").read_text()
    assert fault["back"] is not None or log.count('"to": "rollout"') >= 2, fault
    return s, fault, killer


@pytest.mark.extended  # the nemesis run (test_runtime_chaos) kills a rollout cell too
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
    # 8 steps: a 5-step run here (12.5 s) once ended before the hung cell's new actor was up
    s, fault, killer = _run_with(
        tiny_model_dir,
        tmp_path,
        "stop2",
        (2, signal.SIGSTOP, lambda rd: _lines(rd / "executions.jsonl") >= 1),
        steps=8,
    )
    assert fault["kind"] == "hung" and fault["detected_by"] == "heartbeat"
    assert fault["unix_time"] - killer.at < 2 * 2 + 3  # within 2 x heartbeat_s (+ load)


def test_satellite_killed_while_training_its_micro_steps_are_redone(tiny_model_dir, tmp_path):
    s, fault, _ = _run_with(
        tiny_model_dir, tmp_path, "kill1", (1, signal.SIGKILL, _BetweenSteps(1, 3)), mu=3
    )
    assert fault["role"] == "training"
    # the step the satellite died in (and the others) equal one local core's step on the same
    # groups: its micro-steps were computed by the others, none twice, none dropped
    rd = tmp_path / "kill1"
    first = _step_at(rd, fault["time"])
    compared = next((k for k in range(first, 5) if _same_as_local_core(rd, k, tmp_path)), None)
    assert compared is not None, "no step from the fault on carried gradient signal"


def _step_at(rd: Path, t: float) -> int:
    """The step open at run time ``t`` (the first one that ended after it)."""
    ends = [x["time"] for x in _jsonl(rd / "metrics.jsonl")]
    return next((i for i, e in enumerate(ends) if e >= t), 0)


def _same_as_local_core(rd: Path, step: int, tmp_path: Path) -> bool:
    """Step ``step`` of the run, retrained by one local core from the checkpoint before it with
    the run's own traces and rewards, lands on the run's checkpoint after it (the tolerance of
    test_runtime's test_runtime_steps_match_a_local_core)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from gyre.config import load_config
    from gyre.train.demo.coordinator import LocalCoordinator
    from gyre.train.demo.core import Core

    torch.set_num_threads(1)
    cfg = load_config(rd / "config.toml")
    ck = rd / "checkpoints"
    m = _jsonl(rd / "metrics.jsonl")[step]
    ex = _jsonl(rd / "executions.jsonl")
    after = load_file(str(ck / f"step-{step + 1}" / "model.safetensors"))
    if not m["batch/executions_trained"]:
        return False  # no signal: nothing to compare (the weights did not move)
    root = tmp_path / f"ck{step}"
    if step:
        shutil.copytree(ck / f"step-{step}", root / f"step-{step}")
        (root / "latest").write_text(f"step-{step}")
    ckpt = cfg.trainer.checkpoint.model_copy(
        update={"dir": str(root) if step else None, "every_steps": 10**6}
    )
    core = Core(cfg.trainer.model_copy(update={"checkpoint": ckpt}), LocalCoordinator())
    core.start(resume=bool(step))
    assert core.add_groups(_step_groups(rd, cfg, m, ex, step)) == B
    res = core.run_step()
    mine = {k: v.detach().clone() for k, v in core.model.state_dict().items()}
    scale = _adam_scale(core)
    core.stop()
    assert res.metrics["train/tokens"] == m["train/tokens"]  # every micro-step counted once
    assert res.metrics["actor/grad_norm"] == pytest.approx(m["actor/grad_norm"], rel=1e-5)
    diff = 0.0
    for k in after:
        d = (after[k] - mine[k]).abs()
        ok = (
            scale[k] >= ADAM_WELL_CONDITIONED
            if k in scale
            else torch.ones_like(d, dtype=torch.bool)
        )
        diff = max(diff, float(d[ok].max()) if ok.any() else 0.0)
    assert diff <= 1e-5, (step, diff)
    return True
