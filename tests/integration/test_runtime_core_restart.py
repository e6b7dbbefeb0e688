"""The core (cell 0) SIGKILLed where it cannot restart in place: the run restarts from its
last checkpoint by itself.

A short ``gyre run`` (test_runtime.py's config, K=3, checkpoints every 2 steps) whose core is
killed by its pid from ``cells.json`` once step 3's metrics line is written: the step after
the checkpoint of step 2 is applied by the dead core and lost with it, and it has no
checkpoint of its own, so the new core cannot start from it in place (test_runtime_core_inplace
covers that case, a checkpoint every step). The run must finish
rc 0 with all steps, and its own records must show that no optimizer step was applied twice in
the final lineage: metrics versions 1..N once each, every group trained once, the final
checkpoint at step N, no finished execution run again, and one core restart in ``faults``.
With ``run.fault.core_restarts = 0`` the same kill stops the run with one line.
"""

from __future__ import annotations

import json
import signal

import pytest
from test_runtime import B, N, _jsonl
from test_runtime_cell_faults import _kill_during_run, _lines

from gyre.runtime.restore import _kept

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 4


def _core_run(tiny_model_dir, tmp_path, name: str, *extra: str, ready):
    sets = ("trainer.checkpoint.every_steps=2", *extra)
    killer_args = (0, signal.SIGKILL, ready)
    return _kill_during_run(tiny_model_dir, tmp_path, name, STEPS, killer_args, *sets, timeout=800)


def test_core_killed_mid_run_restarts_from_checkpoint_and_applies_no_step_twice(
    tiny_model_dir, tmp_path
):
    rd, r, killer = _core_run(
        tiny_model_dir, tmp_path, "core", ready=lambda rd: _lines(rd / "metrics.jsonl") == 3
    )
    assert r.returncode == 0, r.stdout[-6000:]
    assert "core lost (cell 0 died" in r.stdout and "restart 1 of 2" in r.stdout, r.stdout[-4000:]
    s = json.loads((rd / "summary.json").read_text())
    assert s["steps"] == STEPS and s["segment"] == 1
    # each optimizer step once in the final lineage: versions 1..N, strictly increasing
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["step"] for x in m] == list(range(STEPS))
    assert [x["version"] for x in m] == list(range(1, STEPS + 1))
    trained = [g for x in m for g in x["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * B  # every group trained once
    latest = (rd / "checkpoints" / "latest").read_text().strip()
    state = json.loads((rd / "checkpoints" / latest / "trainer_state.json").read_text())
    assert state["step"] == STEPS
    assert sorted(state["consumed_groups"]) == sorted(trained)
    # no finished execution ran again: one standing outcome per (group, attempt), and every
    # trained group has its N
    ex = _jsonl(rd / "executions.jsonl")
    kept = [(e["group"], e["attempt"]) for e in ex if _kept(e)]
    assert len(kept) == len(set(kept)), kept
    for g in trained:
        assert sorted(a for gg, a in kept if gg == int(g[1:])) == list(range(N)), g
    # the restart in the run's records
    (fault,) = [f for f in s["faults"] if f.get("core_restart")]
    assert fault["cell"] == 0 and fault["kind"] == "died" and fault["segment"] == 0, fault
    assert fault["action"] == "restart from checkpoint step 2" and fault["restart_step"] == 2
    assert fault["steps_redone"] >= 1  # step 3 (at least) was applied by the dead core
    assert fault["unix_time"] >= killer.at
    assert fault["back_unix_time"] >= fault["restart_unix_time"] and fault["cost_s"] > 0
    assert (rd / "faults.jsonl").exists()
    cells = json.loads((rd / "cells.json").read_text())
    assert cells[0]["pid"] != killer.pid  # a new core
    print(
        f"core restart: found {fault['unix_time'] - killer.at:.2f} s after the kill by "
        f"{fault['detected_by']}; restart began {fault['restart_unix_time'] - killer.at:.2f} s "
        f"after it; cells up again {fault['cost_s']:.1f} s after the loss; "
        f"{fault['steps_redone']} steps redone"
    )


def test_core_restarts_0_stops_with_one_line(tiny_model_dir, tmp_path):
    rd, r, _ = _core_run(
        tiny_model_dir,
        tmp_path,
        "nocore",
        "run.fault.core_restarts=0",
        # step 1 has no checkpoint (every 2 steps): the core cannot restart in place
        ready=lambda rd: _lines(rd / "metrics.jsonl") == 1,
    )
    assert r.returncode == 1, r.stdout[-4000:]
    errs = [x for x in r.stdout.splitlines() if x.startswith("gyre run: ")]
    assert len(errs) == 1 and "cell 0 (the core) was lost" in errs[0], r.stdout[-4000:]
    assert "gyre run --resume" in errs[0] and "Traceback" not in r.stdout
    assert not (rd / "summary.json").exists()
    # the fault is kept for a resume's summary
    (f,) = _jsonl(rd / "faults.jsonl")
    assert f["cell"] == 0 and f["action"] == "run stopped"
