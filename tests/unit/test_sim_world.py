"""The world's own checks, the workload draw and the lower bound, on small hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.policy import SchedulingPolicy
from gyre.sim.config import apply_overrides
from gyre.sim.presets import preset
from gyre.sim.report import lower_bound
from gyre.sim.run import make_draw, simulate
from gyre.sim.workload import Draw, draw_workload
from gyre.sim.world import World


def test_world_detects_interruptions_when_the_waterlevel_rule_is_broken(monkeypatch):
    """Sabotage the policy's view of w(t): cells then leave with executions running; the world must notice."""
    cfg = preset("seed-toy")
    monkeypatch.setattr(SchedulingPolicy, "waterlevel", property(lambda self: 0))
    w = World(cfg, "elastic", make_draw(cfg), record=False).run()
    assert w.interrupted > 0
    assert w.trace.min_slack < 0


def test_same_draw_for_every_placement_and_seed_changes_it():
    cfg = preset("seed-toy")
    d1, d2 = make_draw(cfg), make_draw(cfg)
    assert np.array_equal(d1.duration_h, d2.duration_h)
    d3 = make_draw(cfg.model_copy(update={"seed": 1}))
    assert not np.array_equal(d1.duration_h, d3.duration_h)
    # every placement trains groups drawn from the same pool, sized for the deepest queue
    assert d1.groups == cfg.policy.total_steps * cfg.policy.batch_groups + 16


def test_timeouts_cap_durations_and_overall_timeout_marks_missing():
    cfg = apply_overrides(
        preset("seed-toy"), ["tail=1.5", "overall_timeout_h=3.0", "workload.score_mean_h=0.2"]
    )
    d = draw_workload(cfg.workload, 2000, cfg.policy.group_size, seed=0)
    assert d.duration_h.max() <= 3.0 + 1e-12
    assert d.missing.any() and (d.duration_h[d.missing] == 3.0).all()
    assert not (d.harness_timeout & d.missing).any()


def test_lower_bound_on_a_hand_built_draw():
    cfg = apply_overrides(
        preset("seed-toy"), ["K=2", "C_e=2", "N=2", "B=2", "steps=1", "train_cost=0.0"]
    )
    # 4 groups of 2 executions: query times 1, 2, 3, 4 h; each group occupies 2 slot-hours per hour of query
    dur = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    draw = Draw(
        duration_h=dur, missing=np.zeros_like(dur, bool), harness_timeout=np.zeros_like(dur, bool)
    )
    lb = lower_bound(cfg, draw)
    # work: cheapest 2 groups = (2 + 4) slot-hours / C_e=2 -> 3 cell-hours over K=2 cells = 1.5 h
    assert lb.work_h == pytest.approx(1.5)
    # path: the first (and last) step needs B = 2 complete groups: the 2nd fastest query takes 2 h
    assert lb.path_h == pytest.approx(2.0)
    assert lb.hours == pytest.approx(2.0)


def test_slowdown_with_occupancy_makes_rollouts_slower():
    base = preset("seed-toy")
    fast = simulate(base, ["colocate"], record=False)["colocate"].makespan_h
    slow = simulate(apply_overrides(base, ["slowdown=1.0"]), ["colocate"], record=False)[
        "colocate"
    ].makespan_h
    assert slow > fast * 1.2


def test_results_report_consistent_accounting():
    res = simulate(preset("seed-toy"))
    for r in res.values():
        assert len(r.step_end_h) == 12 and r.step_end_h[-1] == pytest.approx(r.makespan_h)
        assert sum(r.step_durations_h) == pytest.approx(r.makespan_h)
        assert 0 < r.efficiency <= 1
        assert r.groups_trained == 12 * 4
        assert 0 <= r.mean_training_share <= 1
        assert r.timeline["segments"] and len(r.timeline["segments"]) == 8
    assert res["async"].training_share[:4] == pytest.approx([1.0] * 4)
    assert res["async"].training_share[4:] == pytest.approx([0.0] * 4)


def test_burst_breakdown_splits_each_burst_into_gather_and_overhang():
    cfg = preset("seed-toy")
    res = simulate(cfg, ["elastic", "colocate"])
    for r in res.values():
        bs = r.bursts
        assert len(bs) == cfg.policy.total_steps // r.mu
        total = sum(b["gather_h"] + b["overhang_h"] + b["publish_gap_h"] for b in bs)
        assert total == pytest.approx(r.makespan_h, abs=1e-9)
        for b in bs:
            assert b["gather_h"] >= 0 and b["overhang_h"] >= 0 and b["train_idle_cell_h"] >= 0
            assert 1 <= b["max_training_cells"] <= cfg.policy.cells
    # colocate trains only once every execution finished: its gather is the whole rollout phase
    assert all(b["max_training_cells"] == cfg.policy.cells for b in res["colocate"].bursts)


def test_finer_micro_steps_keep_training_work_and_split_groups():
    cfg = preset("seed-toy")
    fine = apply_overrides(cfg, ["micro=4"])
    r1 = simulate(cfg, ["elastic"])["elastic"]
    r4 = simulate(fine, ["elastic"])["elastic"]
    w1 = World(cfg, "elastic", make_draw(cfg)).run()
    w4 = World(fine, "elastic", make_draw(fine)).run()
    # same groups trained; the compute is the same total (per-step cost unchanged), only divisible
    assert r1.groups_trained == r4.groups_trained
    assert sum(w4.busy_h) == pytest.approx(sum(w1.busy_h), rel=1e-6)
    assert r4.interrupted_executions == 0


def test_gather_floor_does_not_depend_on_training_when_capacity_never_binds():
    """seed-toy's queue (56 executions) always fits its 64 slots, so each group is ready its query
    time after its dispatch: the bursts' gathers depend only on the draw, except that part of a
    dispatch waits for the satellites' switch back (3.46 s per burst). With training and
    switching free, the makespan is exactly that floor."""
    cfg = preset("seed-toy")
    free = apply_overrides(
        cfg,
        ["train_cost=0", "tau=0", "costs.switch_to_training_h=0", "costs.switch_to_rollout_h=0"],
    )
    r = simulate(cfg, ["elastic"])["elastic"]
    f = simulate(free, ["elastic"])["elastic"]
    slack = len(r.bursts) * cfg.costs.switch_to_rollout_h
    assert f.gather_h - 1e-9 <= r.gather_h <= f.gather_h + slack + 1e-9
    assert f.overhang_h == pytest.approx(0.0, abs=1e-9)
    assert f.makespan_h == pytest.approx(f.gather_h)
    assert r.makespan_h > f.makespan_h


def test_a_recording_world_times_each_event_it_handles_and_a_fast_one_does_not():
    """The simulator's per-event cost (``World.event_costs``: policy.handle, then _apply) is
    the baseline bench_runtime sets the runtime's own record beside: one pair per event."""
    cfg = preset("seed-toy")
    events = []
    orig = SchedulingPolicy.handle

    def counting(self, ev):
        events.append(ev)
        return orig(self, ev)

    SchedulingPolicy.handle = counting
    try:
        w = World(cfg, "elastic", make_draw(cfg), record=True).run()
    finally:
        SchedulingPolicy.handle = orig
    assert len(w.event_costs) == len(events) > 12
    assert all(h >= 0 and a >= 0 for h, a in w.event_costs)
    assert sum(h + a for h, a in w.event_costs) < w.wall_s
    fast = World(cfg, "elastic", make_draw(cfg), record=False).run()
    assert fast.event_costs == [] and fast.makespan == pytest.approx(w.makespan)
