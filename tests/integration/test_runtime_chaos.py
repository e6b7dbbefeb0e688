"""`gyre run` under the chaos nemesis: a rollout cell, a satellite, the core, a standalone
engine, the proxy and a harness are killed for real at seeded random moments of one small run.

Checked from the run's own records (:func:`gyre.runtime.chaos_audit.audit`): the run finishes
every step; every kill was found and dealt with; no execution was interrupted but the one
whose harness was killed; no execution ran twice, none finished was lost; every group was
trained exactly once with all its attempts; every call the proxy counted answered has its
trace record (the proxy was restarted by the watchdog on its address, its tallies carried).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.runtime.chaos_audit import audit

N = 4  # examples/chaos.toml's group size
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "chaos.toml"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(tmp_path: Path, model: Path, chaos: list[str], steps: int | None = None) -> dict:
    argv = [sys.executable, "-m", "gyre.cli", "run", str(CONFIG)]
    sets = [f"model_dir={model}", f"run.out_dir={tmp_path / 'runs'}", "run.standalone_engines=1"]
    sets += chaos + ([f"policy.total_steps={steps}"] if steps else [])
    for x in sets:
        argv += ["--set", x]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    a = audit(tmp_path / "runs" / "chaos", N)
    print({k: v for k, v in a.items() if k not in ("chaos", "faults")})
    for k in a["chaos"]:
        print(k)
    assert a["steps"] == (steps or 32)
    assert a["handled"] + a["restarting_at_end"] == sum(a["kills"].values()), a["chaos"]
    kills = [k for k in a["chaos"] if "target" in k]
    open_ = [i for i, k in enumerate(kills) if not k.get("handled")]
    assert open_ in ([], [len(kills) - 1]), kills  # one fault at a time: only the last
    assert a["interrupted_other"] == 0, a
    assert a["relaunched"] == 0 and a["finished_lost"] == 0
    assert a["trained_twice"] == 0 and a["incomplete_groups"] == 0
    assert a["answered_missing"] == 0 and a["answered_counter_gap"] == 0, a
    return a


@pytest.mark.extended  # the nemesis run kills the proxy once; test_proxy_restart covers each crash point
def test_the_proxy_killed_mid_run_is_restarted_and_no_answered_call_is_lost(
    tmp_path: Path, tiny_model_dir
) -> None:
    chaos = ["run.chaos.seed=2", "run.chaos.kills=3", 'run.chaos.kinds=["proxy"]']
    a = _run(tmp_path, tiny_model_dir, chaos + ["run.chaos.window_s=[2.0, 12.0]"], steps=10)
    assert a["kills"] == {"proxy": 3} and a["proxy_restarts"] == 3, a["chaos"]
    # (a loaded machine may add a cell whose ping timed out: the nemesis did not do that)
    for f in [f for f in a["faults"] if f["kind"] == "proxy"]:
        assert f["action"] == "restart" and f["back"] is not None, f


def s_segment(rd: Path) -> int:
    return int(json.loads((rd / "summary.json").read_text())["segment"])


def test_a_run_survives_the_nemesis(tmp_path: Path, tiny_model_dir) -> None:
    rd = tmp_path / "runs" / "chaos"
    a = _run(tmp_path, tiny_model_dir, [])  # the file's nemesis: 6 kills, one of each kind
    kinds = {"rollout_cell", "satellite", "core", "engine", "proxy", "harness"}
    assert set(a["kills"]) == kinds, a
    assert s_segment(rd) == 0  # the core was restarted in place: the run's segment went on
    (pf,) = [f for f in a["faults"] if f["kind"] == "proxy"]
    assert pf["action"] == "restart" and pf["back"] is not None, pf
    s = json.loads((rd / "summary.json").read_text())
    assert s["proxy"]["errors_5xx"] == 0
    placed = json.loads((rd / "cells.json").read_text())
    for k in a["chaos"]:  # each killed cell serves as a new process (cells.json names it)
        if "cell" in k["target"]:
            assert placed[k["target"]["cell"]]["pid"] != k["target"]["pid"], k
