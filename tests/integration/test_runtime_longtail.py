"""A tiny long-tail ``gyre run`` writes a workload.json the simulator can replay.

Elastic, K=2, N=4, B=2, 3 steps, a publication after each; each execution runs for its entry of the seeded draw
(median 1 s, harness timeout 3 s, so some are stopped by the executor's timeout). The
file must validate with the simulator's own reader, every realised duration must be its
drawn duration plus the launch and scoring overhead, and every cost must be measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gyre.runtime.longtail import LongTail, LongTailConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N, B, STEPS = 4, 2, 3
LT = LongTailConfig(
    median_s=1.0, tail=0.8, query_sigma=0.3, harness_timeout_s=3.0, call_every_s=0.5
)
CONFIG = f"""
seed = 1

[policy]
placement = "elastic"
cells = 2
cell_capacity = {N}
group_size = {N}
batch_groups = {B}
phi = 0.5
mu = 1
total_steps = {STEPS}
streaming = true
hold_tau = 0.0

[trainer.stream]
token_budget = 4096

[run]
taskset = "quickstart"
train_tasks = ["letter-a", "vowels"]
profile = "synthetic"
harness_args = ["--reply-file", "answer.txt", "--max-tokens", "4"]
eval_interval = 0
log_format = "plain"

[run.cell]
calibrate_s = 0.0  # the start-up calibration (2 s) only where a test reads it

[run.longtail]
median_s = {LT.median_s}
tail = {LT.tail}
query_sigma = {LT.query_sigma}
harness_timeout_s = {LT.harness_timeout_s}
call_every_s = {LT.call_every_s}
"""
COSTS = (
    "train_microstep_s",
    "optim_s",
    "publish_s",
    "switch_to_training_s",
    "switch_to_rollout_s",
    "reshard_s",
    "satellite_refresh_s",
    "reroute_delay_s",
    "rollout_speed",
)


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("longtail")
    cfg = out / "longtail.toml"
    cfg.write_text(CONFIG)
    argv = [sys.executable, "-m", "gyre.cli", "run", str(cfg), "--quiet"]
    for s in (f"model_dir={tiny_model_dir}", f"run.out_dir={out}", "run.name=lt"):
        argv += ["--set", s]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    for _ in range(2):  # Ray's raylet can miss its start-up window on a loaded machine
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=540)
        if p.returncode == 0 or "timed out during startup" not in p.stdout + p.stderr:
            break
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rd = out / "lt"
    return {
        "dir": rd,
        "workload": json.loads((rd / "workload.json").read_text()),
        "summary": json.loads((rd / "summary.json").read_text()),
    }


def test_the_simulators_reader_accepts_it(run):
    from gyre.sim.replay import load_workload, predict

    w = load_workload(run["workload"])
    assert w.placement.value == "elastic" and w.policy.group_size == N
    assert w.draw is not None and w.draw.harness_timeout_s == LT.harness_timeout_s
    p = predict(run["workload"])
    assert p["makespan_s"] > 0
    # each trained group's own compute: every group of every step listed once, its seconds the
    # sum of its non-empty micro-steps (together at most the cells' busy time)
    groups = run["workload"]["groups"]
    assert len(groups) == len({g["group"] for g in groups}) >= STEPS * B
    assert any(g["micro_steps"] > 0 and g["train_s"] > 0 for g in groups), groups
    assert all((g["micro_steps"] == 0) == (g["train_s"] == 0) for g in groups), groups
    busy = sum(b - a for _, a, b in run["workload"]["measured"]["busy"])
    assert sum(g["train_s"] for g in groups) <= busy + 1e-3
    assert p["executions"]["groups_measured"] == len(groups)


def test_realised_durations_are_the_draw_plus_overhead(run):
    w = run["workload"]
    lt = LongTail(LT, seed=1, total_steps=STEPS, batch_groups=B, n=N)
    realised = [e for e in w["executions"] if e["missing"] != "cancelled"]
    assert len(realised) >= STEPS * B * N
    for e in realised:
        plan = lt.planned(e["group"], e["attempt"])
        assert e["drawn_s"] == pytest.approx(plan.duration_s, abs=1e-3)
        # launch (workspace, key, spawn) and scoring add a little, never take away
        assert plan.duration_s - 0.05 <= e["duration_s"] <= plan.duration_s + 3.0, e
        assert e["harness_timeout"] == plan.harness_timeout, e
        planned = max(1, round(plan.run_s / LT.call_every_s))
        if plan.harness_timeout:  # paced to end at the cap: on loaded cores the last calls can
            assert 1 <= e["calls"] <= planned, e  # come after it (a 2-worker suite: 4 of 6)
        else:
            assert e["calls"] == planned, e
        assert not e["interrupted"] and e["missing"] is None
    assert any(e["harness_timeout"] for e in realised), "the draw should hit the 3 s cap"
    for e in realised:  # a capped execution ends at the cap (plus overhead), not at a kill
        if e["harness_timeout"]:
            assert e["duration_s"] < LT.harness_timeout_s + LT.overrun_s, e
    rewards = {e["reward"] for e in realised}
    assert len(rewards) > 1  # graded rewards vary


def test_every_cost_is_measured(run):
    c = run["workload"]["costs"]
    assert set(COSTS) <= set(c)
    for k in (
        "train_microstep_s",
        "optim_s",
        "publish_s",
        "switch_to_training_s",
        "switch_to_rollout_s",
    ):
        assert c[k] is not None and c[k] > 0, k
    assert c["reshard_s"] is None  # the runtime reshards only through the switch itself
    assert c["rollout_speed"] and c["rollout_speed"][0][1] == 1.0


def test_measured_section_matches_the_summary(run):
    m, s = run["workload"]["measured"], run["summary"]
    assert m["makespan_s"] == pytest.approx(s["makespan_s"])
    assert m["interrupted"] == s["interrupted_executions"] == 0
    assert m["steps_done"] == STEPS and len(m["steps"]) == STEPS
    cells = {seg[0] for seg in m["segments"]}
    assert cells == {0, 1}
    for _, role, t0, t1 in m["segments"]:
        assert (
            role in ("rollout", "training", "switching") and 0 <= t0 < t1 <= m["makespan_s"] + 1e-3
        )
