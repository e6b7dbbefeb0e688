"""`gyre run` with a standalone rollout engine that is SIGKILLed while executions run.

The engine is a separate Ray actor process (the standalone pool, C_s). Killing it with
SIGKILL while long replies are being generated must cost no execution: the proxy resumes
its calls on the cells' engines (with the tokens generated so far), the run finishes, the
dead engine leaves the pool (found by the proxy's engine heartbeat or the next publication),
the policy hears ``EngineLost`` (its slots leave the capacity), and a new engine takes its
place (``EngineBack``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFIG = """
seed = 0

[policy]
placement = "elastic"
cells = 2
cell_capacity = 4
standalone_capacity = 4
group_size = 4
batch_groups = 2
phi = 0.5
mu = 1                 # a publication after every step: the dead engine is found at the first
total_steps = 3
streaming = true

[engine]
max_batch = 16

[trainer.optim]
lr = 0.003

[trainer.objective]
clip_low = 0.8
clip_high = 1.25

[run]
taskset = "quickstart"
profile = "reference"
harness_args = ["--max-turns", "1", "--max-tokens", "400", "--no-delegate", "--client", "stdlib"]
"""

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.mark.extended  # the nemesis run (test_runtime_chaos) kills a standalone engine too
def test_killed_standalone_engine_costs_no_execution(tmp_path: Path, tiny_model_dir) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'model_dir = "{tiny_model_dir}"\n' + CONFIG)
    run_dir = tmp_path / "runs" / "kill-engine"
    cmd = [
        sys.executable,
        "-m",
        "gyre.cli",
        "run",
        str(cfg),
        "--log-format",
        "plain",
        "--set",
        f"run.out_dir={tmp_path / 'runs'}",
        "--set",
        "run.name=kill-engine",
    ]
    log = open(tmp_path / "run.log", "w")
    p = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        deadline = time.monotonic() + 300
        cells = run_dir / "cells.json"
        while not cells.exists():
            assert p.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never came up"
            time.sleep(0.5)
        pid = next(c["pid"] for c in json.loads(cells.read_text()) if "standalone" in c)
        # wait until the standalone engine has answered part of the first wave, then kill it mid-wave
        traces = run_dir / "traces"
        while not any(traces.rglob("*.jsonl")):
            assert p.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no model call was ever answered"
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        assert p.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["steps"] == 3
    assert s["interrupted_executions"] == 0
    assert s["executions"]["failed"] == 0
    assert s["proxy"]["errors_5xx"] == 0
    # calls were on the engine when it died, or were sent to it afterwards: each moved elsewhere
    assert s["proxy"]["engine_errors"] >= 1
    assert s["dead_engines"], "the dead engine was never taken out of the pool"
    rows = [json.loads(x) for x in (run_dir / "executions.jsonl").read_text().splitlines()]
    assert rows and all(not r["failed"] for r in rows)
    (f,) = [f for f in s["faults"] if f["kind"] == "engine"]
    assert f["engine"] == 0 and f["capacity"] == 4 and f["action"] == "restart", f
    assert f["detected_by"] in ("engine_heartbeat", "publication"), f
    assert f["back"] is not None and f["cost_s"] > 0, f  # a new engine served
    (row,) = [c for c in json.loads(cells.read_text()) if "standalone" in c]
    assert row["pid"] != pid and row["restarts"] == 1
    print(f"standalone engine: {f}")
