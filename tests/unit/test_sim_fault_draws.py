"""A fault's predicted cost compares two worlds on one draw: every execution keeps its own
duration in both, so the difference is what the policy did about the fault.

The async placement's fault cost on seed-toy can be negative (cell 1 lost at 0.5 h:
-0.144 h): not a shifted random stream, but the policy's answer to the fault. The training
cells past the lost one leave the participant prefix for rollout, and return only when the
waterlevel rule lets them (no live execution is interrupted), so for a while async has more
rollout capacity than its fixed split: a group launches earlier, and the run, rollout-bound,
ends earlier.
"""

from __future__ import annotations

import pytest

from gyre.policy import CellRole
from gyre.sim.faults import fault_cost, parse_faults
from gyre.sim.presets import preset
from gyre.sim.run import make_draw
from gyre.sim.world import World

FAULT = ((1, 0.5, 1 / 60, 0),)  # cell 1 (training in async) lost at 0.5 h, back 60 s later


def _timed(cfg, draw, faults) -> tuple[World, dict]:
    """The world, and each execution's (launch, finish) time."""
    w = World(cfg, "async", draw, record=True, faults=faults)
    launched: dict = {}
    spans: dict = {}
    launch, done = w._launch, w._execution_done

    def on_launch(a):
        for key in a.executions:
            launched[key] = w.now
        return launch(a)

    def on_done(t):
        ev = done(t)
        spans[ev.execution] = (launched[ev.execution], w.now)
        return ev

    w._launch, w._execution_done = on_launch, on_done  # type: ignore[method-assign]
    return w.run(), spans


def test_the_pair_holds_every_executions_duration_fixed():
    cfg = preset("seed-toy")
    assert cfg.workload.slowdown == 0 and not cfg.workload.speed_curve
    draw = make_draw(cfg)
    base, a = _timed(cfg, draw, ())
    hit, b = _timed(cfg, draw, FAULT)
    both = set(a) & set(b)
    assert len(both) > 100
    for key in both:  # rate 1, no reroute cost, no publish stall: run time = the draw's
        g, att = key
        for s, e in (a[key], b[key]):
            assert abs((e - s) - draw.duration_h[g, att]) < 1e-9, key
    # yet some launch earlier with the fault: the capacity moved, not the draw
    assert any(b[k][0] < a[k][0] - 1e-6 for k in both)


def test_a_negative_async_fault_cost_comes_from_rollout_capacity_the_fault_freed():
    cfg = preset("seed-toy")
    r = fault_cost(cfg, "async", parse_faults("cell=1@0.5h,restart=60s"))
    assert r["cost_h"] < 0  # type: ignore[operator]
    draw = make_draw(cfg)
    hit = World(cfg, "async", draw, record=True, faults=FAULT).run()
    # cells past the lost one served rollouts for a while (the fixed split has none there)
    extra = [
        (c, s, e)
        for c in range(2, hit.K)
        for s, e, role in hit.trace.segments[c]
        if role == CellRole.ROLLOUT.value and s >= 0.5 and e - s > 0.01
    ]
    assert extra, hit.trace.segments[:4]
    base = World(cfg, "async", draw, record=True).run()
    assert all(
        role == CellRole.TRAINING.value for c in range(4) for _, _, role in base.trace.segments[c]
    )


def test_a_real_runs_fault_cost_replays_its_own_draw_without_and_with_the_faults():
    from pathlib import Path

    from gyre.sim.faults import replay_fault_cost
    from gyre.sim.replay import predict

    fixture = Path(__file__).parent.parent / "fixtures" / "workload" / "elastic_small.json"
    base = predict(str(fixture))["makespan_s"]
    none = replay_fault_cost(fixture, [])
    assert none["makespan_s"] == none["makespan_faults_s"] == base and none["cost_s"] == 0
    r = replay_fault_cost(fixture, parse_faults("cell=1@3s,restart=20s"))
    assert r["survived"] and r["makespan_s"] == base
    assert r["cost_s"] == pytest.approx(r["makespan_faults_s"] - base)  # type: ignore[operator]
    assert replay_fault_cost(fixture, parse_faults("cell=0@3s"))["survived"] in (True, False)


def test_a_nemesis_kill_that_lands_in_a_reduce_waits_for_its_end():
    """The chaos nemesis never kills a training cell in the step's reduce (it waits): its
    replay does the same, where a fault of ``gyre sim --faults`` there stops the run. (The
    bench's seed 0 of 2026-12-06 got no prediction: its core kill landed in a simulated reduce.)"""
    from gyre.policy import PolicyError
    from gyre.sim.config import apply_overrides

    cfg = apply_overrides(preset("seed-toy"), ["costs.optim_h=0.1"])  # a reduce of 6 minutes
    draw = make_draw(cfg)
    w = World(cfg, "elastic", draw, record=False)
    reduces: list[tuple[float, float]] = []
    finish = w._finish_step

    def on_finish(a):
        finish(a)
        reduces.append((w.now, w._reduce_end))

    w._finish_step = on_finish  # type: ignore[method-assign]
    w.run()
    start, end = reduces[1]
    kill = ((0, (start + end) / 2, 1 / 60, 0),)  # the core, mid-reduce of the second step
    with pytest.raises(PolicyError, match="during the step's reduce"):
        World(cfg, "elastic", draw, record=False, faults=kill).run()
    hit = World(cfg, "elastic", draw, record=False, faults=kill, spare_reduce=True)
    assert hit.run().makespan is not None
    (lost, back) = hit.faults.log
    assert lost["cell"] == 0 and abs(lost["lost_h"] - end) < 1e-12, lost
    assert abs(back["back_h"] - (end + 1 / 60)) < 1e-12
