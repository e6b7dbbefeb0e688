"""The core (cell 0) SIGKILLed mid-run is restarted in place: nothing else stops.

The run (test_runtime.py's config, K=3, a checkpoint every step, the default) loses its core
mid-step and, in a second run, while it serves rollouts. Its new process loads the checkpoint
of the last step the driver saw finish while the rollout cells, the proxy and every harness go
on: the run's own records must show one segment (no restart of the run), the core's fault
restarted and back, no execution cut or relaunched, every step once (versions 1..N, each
group trained once), and the step the core died in equal to one local core's step on the same
groups from the checkpoint before it (so no optimizer step was applied twice, none lost).
"""

from __future__ import annotations

import json
import signal

import pytest
from test_runtime import _jsonl
from test_runtime_cell_faults import (
    _BetweenSteps,
    _check_run,
    _kill_during_run,
    _lines,
    _same_as_local_core,
    _step_at,
)

from gyre.runtime.restore import RELAUNCH_REASONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 5


def _core_run(tiny_model_dir, tmp_path, name: str, ready, mu: int = 3):
    killer_args = (0, signal.SIGKILL, ready)
    args = (tiny_model_dir, tmp_path, name, STEPS, killer_args, f"policy.mu={mu}")
    rd, r, killer = _kill_during_run(*args, timeout=800)
    assert r.returncode == 0, r.stdout[-6000:]
    s = _check_run(rd, r.stdout, STEPS)
    assert s["segment"] == 0, "the run's segment was restarted"  # in place: one segment
    (fault,) = [f for f in s["faults"] if f["cell"] == 0]
    assert fault["action"] == "restart" and "core_restart" not in fault, fault
    assert "executions_cut" not in fault and fault["unix_time"] >= killer.at
    assert json.loads((rd / "cells.json").read_text())[0]["pid"] != killer.pid
    ex = _jsonl(rd / "executions.jsonl")
    assert not [e for e in ex if e.get("missing") in RELAUNCH_REASONS]  # none cut by the fault
    keys = [(e["group"], e["attempt"]) for e in ex]
    assert len(keys) == len(set(keys))  # none run twice
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["version"] for x in m] == list(range(1, STEPS + 1))
    print(
        f"{name}: core found {fault['unix_time'] - killer.at:.2f} s after the kill by "
        f"{fault['detected_by']} ({fault['role']}); restart {fault.get('restart_s')} s; back "
        f"{fault['cost_s'] if fault.get('back') is not None else None} s after the loss; "
        f"checkpoint step {fault['checkpoint_step']}"
    )
    return rd, fault


def test_core_killed_mid_step_is_restarted_in_place_and_its_step_is_exact(tiny_model_dir, tmp_path):
    # after an optimizer step that did not end its burst (mu = 3): the core stays in training
    rd, fault = _core_run(tiny_model_dir, tmp_path, "core_step", _BetweenSteps(0, 3))
    assert fault["role"] == "training" and fault["back"] is not None, fault
    assert fault["checkpoint_step"] >= 1
    first = _step_at(rd, fault["time"])
    compared = next((k for k in range(first, STEPS) if _same_as_local_core(rd, k, tmp_path)), None)
    assert compared is not None, "no step from the fault on carried gradient signal"


@pytest.mark.extended  # the nemesis run (test_runtime_chaos) kills the core too, in any role
def test_core_killed_at_start_is_restarted_from_the_initial_weights(tiny_model_dir, tmp_path):
    _, fault = _core_run(
        tiny_model_dir, tmp_path, "core_start", lambda rd: _lines(rd / "executions.jsonl") >= 1
    )
    assert fault["checkpoint_step"] == 0
