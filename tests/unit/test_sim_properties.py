"""Property tests: random workloads and parameters through the real simulator + policy."""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.policy.config import CoreRetention, Placement, PolicyConfig
from gyre.sim.config import CostConfig, PlacementSpec, SimConfig, WorkloadConfig
from gyre.sim.report import burst_breakdown, lower_bound
from gyre.sim.run import make_draw
from gyre.sim.world import World

PLACEMENTS = ["colocate", "async", "elastic"]
# Modest by default so the suite stays fast; GYRE_HYPOTHESIS_SCALE=10 for a deeper search.
SCALE = int(os.environ.get("GYRE_HYPOTHESIS_SCALE", "1"))


@st.composite
def sim_configs(draw, min_steps=2, max_steps=10):
    K = draw(st.integers(2, 6))
    B = draw(st.integers(1, 4))
    N = draw(st.integers(1, 4))
    mu = draw(st.integers(1, 3))
    phi_groups = draw(st.integers(0, 2 * B))
    streaming = draw(st.booleans())
    overall = draw(st.one_of(st.none(), st.floats(1.0, 6.0)))
    # drawn in the order the strategy has always used, so saved examples keep their meaning
    seed = draw(st.integers(0, 10_000))
    cell_capacity, standalone = draw(st.integers(1, 6)), draw(st.integers(0, 4))
    steps = draw(st.integers(min_steps, max_steps))
    workload = WorkloadConfig(
        median_h=draw(st.floats(0.2, 3.0)),
        tail=draw(st.floats(0.0, 1.0)),
        query_sigma=draw(st.floats(0.0, 0.6)),
        harness_timeout_h=draw(st.floats(1.0, 6.0)),
        score_mean_h=draw(st.sampled_from([0.0, 0.1])),
        overall_timeout_h=overall,
        slowdown=draw(st.sampled_from([0.0, 0.5])),
    )
    train_h, optim_h, publish_h = (
        draw(st.floats(0.0, 3.0)),
        draw(st.sampled_from([0.0, 0.05])),
        draw(st.sampled_from([0.0, 0.02])),
    )
    micro = draw(st.sampled_from([1, 3]))
    rho_min, hold_tau = draw(st.sampled_from([0.25, 0.5, 1.0])), draw(st.sampled_from([0.0, 0.05]))
    cfg = SimConfig(
        seed=seed,
        policy=PolicyConfig(
            placement=Placement.ELASTIC,
            cells=K,
            cell_capacity=cell_capacity,
            standalone_capacity=standalone,
            group_size=N,
            batch_groups=B,
            total_steps=steps,
            micro_steps_per_execution=micro,
            rho_min=rho_min,
            hold_tau=hold_tau,
        ),
        workload=workload,
        costs=CostConfig(train_step_cell_h=train_h, optim_h=optim_h, publish_h=publish_h),
        placements={
            "colocate": PlacementSpec(placement="colocate", phi=0.0, mu=mu, streaming=streaming),
            "async": PlacementSpec(
                placement="async",
                phi=phi_groups / B,
                mu=mu,
                streaming=streaming,
                async_train_cells=draw(st.integers(1, K - 1)),
            ),
            "elastic": PlacementSpec(
                placement="elastic", phi=phi_groups / B, mu=mu, streaming=streaming
            ),
        },
    )
    return cfg


@settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_configs())
def test_invariants_hold_for_every_placement(cfg):
    draw = make_draw(cfg)
    S, B = cfg.policy.total_steps, cfg.policy.batch_groups
    lb = lower_bound(cfg, draw).hours
    for name in PLACEMENTS:
        w = World(cfg, name, draw, record=True, drain=True).run()
        # the run completes, no faster than the lower bound allows
        assert w.makespan is not None and w.policy.steps_done == S, name
        assert lb <= w.makespan + 1e-9, (name, lb, w.makespan)
        # no execution ever lost its engine, and launches never exceeded capacity
        assert w.interrupted == 0 and w.overbooked == 0, name
        assert w.trace.min_slack >= 0, name
        # cells switch in order, one at a time; only the core holds optimizer state
        assert w.order_violations == 0, name
        assert w.trace.optimizer_cells <= {0}, name
        assert not w.protocol_errors, (name, w.protocol_errors[:3])
        # every dispatched execution finishes exactly once (drain mode runs them all out)
        assert w.finished_execs == w.dispatched_execs, name
        assert set(Counter(w.trace.finish_count.values())) <= {1}, name
        assert len(w.trace.finish_count) == w.dispatched_execs, name
        # every group is trained exactly once, S*B of them, each in a step after its dispatch version
        gids = [g for _, g, _ in w.trace.consumed]
        assert len(gids) == len(set(gids)) == S * B, name
        assert all(step >= version for step, _, version in w.trace.consumed), name
        # steps of a burst train on groups whose version is never newer than the trainer
        per_step = Counter(step for step, _, _ in w.trace.consumed)
        assert all(per_step[s] == B for s in range(S)), name
        # the per-burst breakdown accounts for the whole makespan
        bs = burst_breakdown(w)
        total = sum(b["gather_h"] + b["overhang_h"] + b["publish_gap_h"] for b in bs)
        assert abs(total - w.makespan) <= 1e-6, (name, total, w.makespan)


@settings(max_examples=12 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_configs(min_steps=48, max_steps=60))
def test_realised_staleness_matches_formula_in_steady_state(cfg):
    """Mean version gap over steps after the first burst within 0.1 of phi + (mu-1)/2."""
    draw = make_draw(cfg)
    for name in PLACEMENTS:
        w = World(cfg, name, draw, record=False).run()
        pc = w.pcfg
        S = pc.total_steps
        # steady state: skip the first burst (everything there was sampled at version 0) and
        # stop at the last full burst boundary
        last = (S // pc.mu) * pc.mu
        gaps = [s - v for s, _, v in w.trace.consumed if pc.mu <= s < last]
        mean = sum(gaps) / len(gaps)
        assert abs(mean - pc.expected_staleness) <= 0.1, (name, mean, pc.expected_staleness)


@st.composite
def configs_with_new_costs(draw):
    """``sim_configs`` plus the issue-10 costs (drawn after it, so its examples keep their meaning)."""
    cfg = draw(sim_configs())
    costs = cfg.costs.model_copy(
        update={
            "reshard_to_training_h": draw(st.sampled_from([0.0, 0.1])),
            "reshard_to_rollout_h": draw(st.sampled_from([0.0, 0.05])),
            "publish_stall_h": draw(st.sampled_from([0.0, 0.03, 0.3])),
            "satellite_refresh_h": draw(st.sampled_from([0.0, 0.02])),
            "reroute_delay_h": draw(st.sampled_from([0.0, 0.05, 0.5])),
        }
    )
    return cfg.model_copy(update={"costs": costs})


@settings(max_examples=30 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs_with_new_costs())
def test_new_costs_keep_the_invariants(cfg):
    """Stalls, refreshes, resharding and reroutes only delay work: the run still completes,
    never interrupts or overbooks, trains every group once, and the lower bound holds."""
    draw = make_draw(cfg)
    S, B = cfg.policy.total_steps, cfg.policy.batch_groups
    lb = lower_bound(cfg, draw).hours
    for name in PLACEMENTS:
        w = World(cfg, name, draw, record=True, drain=True).run()
        assert w.makespan is not None and w.policy.steps_done == S, name
        assert lb <= w.makespan + 1e-9, (name, lb, w.makespan)
        assert w.interrupted == 0 and w.overbooked == 0 and w.order_violations == 0, name
        assert not w.protocol_errors, (name, w.protocol_errors[:3])
        assert w.finished_execs == w.dispatched_execs, name
        assert len({g for _, g, _ in w.trace.consumed}) == S * B, name
        if cfg.workload.overall_timeout_h is None:  # no missing: per execution = per group
            r = w.serving.acc
            assert r[1] / r[0] <= sum(s - v for s, _, v in w.trace.consumed) / (S * B) + 1e-9


def _outside_prefix(w: World) -> list[tuple[int, float]]:
    """(cell, time) where a cell was in training while an earlier cell was not."""
    segs = w.trace.segments
    bad = []
    for cell in range(1, w.K):
        for s0, s1, role in segs[cell]:
            if role != "training" or s1 - s0 <= 1e-12:
                continue
            mid = (s0 + s1) / 2  # segments are split at every role change of any cell's
            for j in range(cell):
                at = [r for a, b, r in segs[j] if a <= s0 + 1e-12 and b >= s1 - 1e-12]
                if not at or at[0] != "training":
                    bad.append((cell, mid))
                    break
    return bad


@st.composite
def configs_with_retention(draw):
    """``configs_with_new_costs`` plus a core-retention rule and switch costs that matter."""
    cfg = draw(configs_with_new_costs())
    rule = draw(st.sampled_from(list(CoreRetention)))
    switch = draw(st.sampled_from([0.0, 0.05, 0.5]))
    costs = cfg.costs.model_copy(
        update={"switch_to_training_h": switch, "switch_to_rollout_h": switch / 2}
    )
    policy = cfg.policy.model_copy(update={"core_retention": rule})
    return cfg.model_copy(update={"costs": costs, "policy": policy})


@settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs_with_retention())
def test_retention_rules_keep_the_invariants(cfg):
    """A retained core only queues the next dispatch: nothing is interrupted or overbooked,
    the run completes, cells train as a prefix (a switch that straddles a boundary goes
    back), and the dispatch staleness is the formula's."""
    draw = make_draw(cfg)
    S, B = cfg.policy.total_steps, cfg.policy.batch_groups
    for name in PLACEMENTS:
        w = World(cfg, name, draw, record=True, drain=True).run()
        assert w.makespan is not None and w.policy.steps_done == S, name
        assert w.interrupted == 0 and w.overbooked == 0 and w.order_violations == 0, name
        assert not w.protocol_errors, (name, w.protocol_errors[:3])
        assert len({g for _, g, _ in w.trace.consumed}) == S * B, name
        assert not _outside_prefix(w), (name, _outside_prefix(w)[:3])
