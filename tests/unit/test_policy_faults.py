"""Faults as policy events: a cell lost (and back) keeps capacity, the waterlevel rule and
in-order joining right; a lost satellite's micro-steps are computed by the others."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.policy import (
    CellBack,
    CellLost,
    CellRole,
    CellSwitched,
    ClaimMicroStep,
    DispatchGroups,
    EngineBack,
    EngineLost,
    ExecutionFinished,
    FinishStep,
    LaunchExecutions,
    MicroStepDone,
    Placement,
    PolicyConfig,
    PolicyError,
    PublishWeights,
    SchedulingPolicy,
    StepDone,
    SwitchCell,
    WeightsPublished,
)
from gyre.sim.faults import fault_cost, parse_faults
from gyre.sim.presets import preset


def cfg(placement="elastic", **kw) -> PolicyConfig:
    base = dict(
        cells=4, cell_capacity=4, group_size=2, batch_groups=2, phi=0.5, mu=2, total_steps=4,
        streaming=True, rho_min=0.5, hold_tau=0.0,
    )  # fmt: skip
    base.update(kw)
    return PolicyConfig(placement=Placement(placement), **base)


def of(acts, typ):
    return [a for a in acts if isinstance(a, typ)]


def test_lost_rollout_cell_takes_its_capacity_and_back_restores_it_through_a_switch():
    p = SchedulingPolicy(cfg(cell_capacity=2))
    acts = p.start(0.0)
    assert p.capacity == 8 and len(of(acts, LaunchExecutions)[0].executions) == 8
    acts = p.handle(CellLost(1.0, cell=2))
    assert p.capacity == 6 and p.roles[2] is CellRole.LOST and p.running == 8
    # overbooked until enough finish: no launch while running >= capacity
    acts = p.handle(ExecutionFinished(2.0, (0, 0), 1.0))
    assert not of(acts, LaunchExecutions)
    acts = p.handle(CellBack(3.0, cell=2))
    assert of(acts, SwitchCell) == [SwitchCell(cell=2, role=CellRole.ROLLOUT)]
    assert p.capacity == 6  # not before its engine serves
    acts = p.handle(CellSwitched(4.0, cell=2, role=CellRole.ROLLOUT))
    assert p.capacity == 8 and p.roles[2] is CellRole.ROLLOUT
    with pytest.raises(PolicyError):
        p.handle(CellBack(5.0, cell=2))  # not lost


def _training(p: SchedulingPolicy, cells: list[int]) -> None:
    """Put ``cells`` into training by hand (the unit under test is the fault handling)."""
    for c in cells:
        p.roles[c] = CellRole.TRAINING
        p.capacity -= p.config.cell_capacity


def _scored_group(p: SchedulingPolicy, gid: int, t: float) -> list:
    acts = []
    for a in range(p.config.group_size):
        acts += p.handle(ExecutionFinished(t, (gid, a), 1.0))
    return acts


def test_lost_satellite_micro_steps_go_back_and_are_computed_by_the_others():
    p = SchedulingPolicy(cfg(cells=4, micro_steps_per_execution=1, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0, 1, 2])
    acts = _scored_group(p, 0, 1.0)  # one group of 2 executions: 2 micro-steps
    claims = of(acts, ClaimMicroStep)
    assert [(c.cell, c.index) for c in claims] == [(0, 0), (1, 1)]
    # cell 1 reports its micro-step, then dies: that gradient is gone with it
    p.handle(MicroStepDone(2.0, cell=1, step=0, group_id=0, index=1))
    acts = p.handle(CellLost(2.5, cell=1))
    assert p.roles[1] is CellRole.LOST
    assert not of(acts, FinishStep)
    # the core finishes its own and takes the lost one back
    acts = p.handle(MicroStepDone(3.0, cell=0, step=0, group_id=0, index=0))
    (again,) = of(acts, ClaimMicroStep)
    assert (again.cell, again.group_id, again.index) == (0, 0, 1)
    acts = p.handle(MicroStepDone(4.0, cell=0, step=0, group_id=0, index=1))
    assert of(acts, FinishStep)


def test_cells_past_a_lost_satellite_leave_the_prefix_and_their_void_report_is_ignored():
    p = SchedulingPolicy(cfg(cells=4, micro_steps_per_execution=2, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0, 1, 2])
    acts = _scored_group(p, 0, 1.0)  # 4 micro-steps; 3 claimed
    assert [c.cell for c in of(acts, ClaimMicroStep)] == [0, 1, 2]
    acts = p.handle(CellLost(2.0, cell=1))
    # cell 2 is past the hole: back to rollout; its claim and cell 1's go back to the queue
    assert of(acts, SwitchCell) == [SwitchCell(cell=2, role=CellRole.ROLLOUT)]
    assert p.roles[2] is CellRole.TO_ROLLOUT
    acts = p.handle(MicroStepDone(3.0, cell=2, step=0, group_id=0, index=2))  # void: ignored
    assert not of(acts, ClaimMicroStep)
    done = 0
    t = 4.0
    idx = 0
    while True:  # the core alone computes the rest: 4 micro-steps in all
        acts = p.handle(MicroStepDone(t, cell=0, step=0, group_id=0, index=idx))
        done += 1
        t += 1
        if of(acts, FinishStep):
            break
        (c,) = of(acts, ClaimMicroStep)
        assert c.cell == 0
        idx = c.index
    assert done == 4
    # no cell joins training past the lost one (in-order joining)
    assert p.roles[1] is CellRole.LOST and p.training_cells() == [0]


def _run_micro_steps(p: SchedulingPolicy, first: list, t: float) -> tuple[list, float, int]:
    """Report every claim, in order, until FinishStep: (its actions, time, micro-steps done)."""
    pending, done = list(first), 0
    while pending:
        c = pending.pop(0)
        acts = p.handle(
            MicroStepDone(t, cell=c.cell, step=c.step, group_id=c.group_id, index=c.index)
        )
        done, t = done + 1, t + 1
        if of(acts, FinishStep):
            return acts, t, done
        pending += of(acts, ClaimMicroStep)
    raise AssertionError("the step never finished")


def test_core_lost_mid_step_requeues_the_whole_step_and_goes_straight_back_to_training():
    p = SchedulingPolicy(cfg(cells=4, micro_steps_per_execution=2, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0, 1])
    cap = p.capacity
    acts = _scored_group(p, 0, 1.0)  # 4 micro-steps; cells 0 and 1 claim one each
    assert [c.cell for c in of(acts, ClaimMicroStep)] == [0, 1]
    p.handle(MicroStepDone(2.0, cell=0, step=0, group_id=0, index=0))  # the core did one, then
    acts = p.handle(CellLost(2.5, cell=0))  # dies: its gradient and cell 1's are void
    assert p.roles[0] is CellRole.LOST and p.capacity == cap  # a training cell held none
    assert of(acts, SwitchCell) == [SwitchCell(cell=1, role=CellRole.ROLLOUT)]
    assert not of(acts, ClaimMicroStep) and not of(acts, FinishStep)
    p.handle(MicroStepDone(3.0, cell=1, step=0, group_id=0, index=1))  # void: ignored
    acts = p.handle(CellBack(4.0, cell=0))
    assert of(acts, SwitchCell) == [SwitchCell(cell=0, role=CellRole.TRAINING)]
    acts = p.handle(CellSwitched(5.0, cell=0, role=CellRole.TRAINING))
    claims = of(acts, ClaimMicroStep)
    assert [c.cell for c in claims] == [0] and claims[0].index in (0, 1)  # requeued first
    acts, _, done = _run_micro_steps(p, claims, 6.0)
    assert done == 4 and len(of(acts, FinishStep)) == 1  # every micro-step, once, one finish
    assert p.steps_done == 0 and p.capacity == cap  # the step is not done until StepDone


def test_core_lost_during_its_publication_publishes_again_when_back():
    p = SchedulingPolicy(cfg(cells=2, micro_steps_per_execution=1, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0])
    acts, t, _ = _run_micro_steps(p, of(_scored_group(p, 0, 1.0), ClaimMicroStep), 2.0)
    acts = p.handle(StepDone(t, step=0))
    assert of(acts, PublishWeights) == [PublishWeights(version=1, cell=0)]
    acts = p.handle(CellLost(t + 1, cell=0))  # while it writes the weights
    assert not of(acts, DispatchGroups) and p.version == 0
    acts = p.handle(CellBack(t + 2, cell=0))
    assert of(acts, SwitchCell) == [SwitchCell(cell=0, role=CellRole.TRAINING)]
    acts = p.handle(CellSwitched(t + 3, cell=0, role=CellRole.TRAINING))
    assert of(acts, PublishWeights) == [PublishWeights(version=1, cell=0)]  # the same version
    acts = p.handle(WeightsPublished(t + 4, version=1))
    assert p.version == 1 and of(acts, DispatchGroups)


def test_core_lost_after_it_wrote_the_weights_takes_that_publication():
    p = SchedulingPolicy(cfg(cells=2, micro_steps_per_execution=1, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0])
    acts, t, _ = _run_micro_steps(p, of(_scored_group(p, 0, 1.0), ClaimMicroStep), 2.0)
    p.handle(StepDone(t, step=0))
    p.handle(CellLost(t + 1, cell=0))
    acts = p.handle(WeightsPublished(t + 2, version=1))  # the engines had the weights already
    assert p.version == 1 and of(acts, DispatchGroups) and p.roles[0] is CellRole.LOST
    acts = p.handle(CellBack(t + 3, cell=0))  # nothing open: back as any lost cell
    assert of(acts, SwitchCell) == [SwitchCell(cell=0, role=CellRole.ROLLOUT)]
    assert not of(acts, PublishWeights)


def test_core_lost_in_rollout_takes_its_capacity_and_comes_back_to_rollout():
    p = SchedulingPolicy(cfg(cell_capacity=2))
    p.start(0.0)
    p.handle(CellLost(1.0, cell=0))
    assert p.capacity == 6 and p.roles[0] is CellRole.LOST
    acts = p.handle(CellBack(2.0, cell=0))
    assert of(acts, SwitchCell) == [SwitchCell(cell=0, role=CellRole.ROLLOUT)]
    p.handle(CellLost(3.0, cell=1))
    with pytest.raises(PolicyError, match="twice"):
        p.handle(CellLost(3.0, cell=1))


def test_fault_spec_parses_units_and_refuses_nonsense():
    (f,) = parse_faults("cell=1@300s,restart=60s", cells=4)
    assert (f.cell, f.at_h, f.restart_h) == (1, 300 / 3600, 60 / 3600)
    a, b = parse_faults("cell=2@1h,restart=never; cell=3@5m")
    assert (a.cell, a.at_h, a.restart_h) == (3, 5 / 60, 0.0)  # in time order
    assert (b.cell, b.at_h, b.restart_h) == (2, 1.0, None)
    for bad in ["cell=9@1h", "cell=1", "cell=x@1h", "cell=1@-1h", "cell=1@1h,wait=2s", ""]:
        with pytest.raises(ValueError):
            parse_faults(bad, cells=4)


@pytest.mark.parametrize("placement", ["elastic", "colocate", "async"])
def test_sim_survives_a_satellite_fault_and_reports_its_cost(placement):
    cfg_ = preset("seed-toy")
    r = fault_cost(cfg_, placement, parse_faults("cell=1@2h,restart=0.2h"))
    assert r["survived"] and r["protocol_errors"] == [] and r["interrupted"] == 0
    assert r["events"][0]["cell"] == 1 and r["events"][-1]["back_h"] == pytest.approx(2.2)
    assert r["cost_h"] is not None
    # a cell that never comes back costs at least as much as one that does
    never = fault_cost(cfg_, placement, parse_faults("cell=1@2h,restart=never"))
    assert never["survived"] and never["makespan_faults_h"] >= r["makespan_faults_h"] - 1e-9


@pytest.mark.parametrize("placement", ["elastic", "colocate", "async"])
def test_sim_survives_a_core_fault_and_it_costs_more_than_none(placement):
    r = fault_cost(preset("seed-toy"), placement, parse_faults("cell=0@1h,restart=0.1h"))
    assert r["survived"], r.get("why")
    assert r["protocol_errors"] == [] and r["interrupted"] == 0
    assert r["makespan_faults_h"] >= r["makespan_h"] - 1e-9


def test_sim_cli_prints_the_makespan_with_and_without_faults():
    r = CliRunner().invoke(
        app, ["sim", "--placement", "elastic", "--faults", "cell=1@2h,restart=never", "--json"]
    )
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)
    assert row["placement"] == "elastic" and row["survived"]
    assert row["makespan_faults_h"] > row["makespan_h"]  # cell 1 never back: only the core trains


def test_participant_lost_after_finish_step_voids_it_and_the_step_goes_on():
    p = SchedulingPolicy(cfg(cells=4, micro_steps_per_execution=1, batch_groups=1, mu=1, phi=1.0))
    p.start(0.0)
    _training(p, [0, 1])
    acts = _scored_group(p, 0, 1.0)
    assert [(c.cell, c.index) for c in of(acts, ClaimMicroStep)] == [(0, 0), (1, 1)]
    p.handle(MicroStepDone(2.0, cell=1, step=0, group_id=0, index=1))
    acts = p.handle(MicroStepDone(2.5, cell=0, step=0, group_id=0, index=0))
    assert of(acts, FinishStep)
    # cell 1 is found dead before the reduce: its micro-step is redone by the core, then the
    # step finishes (once) over the core alone
    acts = p.handle(CellLost(3.0, cell=1))
    (again,) = of(acts, ClaimMicroStep)
    assert (again.cell, again.index) == (0, 1)
    acts = p.handle(MicroStepDone(4.0, cell=0, step=0, group_id=0, index=1))
    assert len(of(acts, FinishStep)) == 1


@pytest.mark.parametrize("placement", ["elastic", "colocate", "async"])
def test_sim_core_fault_at_any_moment_is_survived_without_a_protocol_error(placement):
    """The core dies in rollout, mid-switch, mid-step and mid-publication alike (a sweep over
    the run): the policy always goes on, and no execution is interrupted."""
    for i in range(12):
        at = 0.1 + i * 1.3  # seed-toy runs ~16-22 h
        r = fault_cost(preset("seed-toy"), placement, parse_faults(f"cell=0@{at}h,restart=0.05h"))
        assert r["survived"] or "reduce" in r["why"], (at, r.get("why"))
        assert r["protocol_errors"] == [] and r["interrupted"] == 0, at


def test_a_lost_standalone_engine_takes_its_slots_and_back_returns_them():
    p = SchedulingPolicy(cfg(cell_capacity=2, standalone_capacity=4))
    acts = p.start(0.0)
    assert p.capacity == 12 and len(of(acts, LaunchExecutions)[0].executions) == 10
    p.handle(EngineLost(1.0, capacity=3))
    assert p.capacity == 9 and p.standalone_live == 1 and p.lost == 1
    with pytest.raises(PolicyError, match="slots lost"):
        p.handle(EngineLost(1.5, capacity=2))  # only 1 slot is live
    with pytest.raises(PolicyError, match="slots back"):
        p.handle(EngineBack(1.5, capacity=4))  # more than was lost
    p.handle(EngineBack(2.0, capacity=3))
    assert p.capacity == 12 and p.standalone_live == 4 and p.status()["standalone_live"] == 4


def test_the_waterlevel_rule_counts_only_live_standalone_engines():
    """A cell leaves rollout only while what stays covers every running execution: the same
    loss of cell 1 lets the core train with the standalone pool serving, not without it."""
    base = dict(cells=2, cell_capacity=2, standalone_capacity=4, group_size=2, batch_groups=1)

    def core_leaves(*faults) -> bool:
        p = SchedulingPolicy(cfg(mu=1, phi=1.0, **base))
        p.start(0.0)  # 2 groups dispatched: 4 executions running, capacity 8
        for ev in faults:
            p.handle(ev)
        p.handle(ExecutionFinished(1.0, (0, 0), 1.0))
        acts = p.handle(ExecutionFinished(1.0, (0, 1), 1.0))  # group 0 scored; w = 2
        return SwitchCell(cell=0, role=CellRole.TRAINING) in acts

    assert core_leaves()  # 8 - 2 >= 2
    assert core_leaves(CellLost(0.5, cell=1))  # 6 - 2 >= 2
    assert core_leaves(EngineLost(0.5, capacity=4))  # 4 - 2 >= 2
    assert not core_leaves(CellLost(0.5, cell=1), EngineLost(0.6, capacity=4))  # 2 - 2 < 2


def test_engine_fault_spec_takes_the_pool_or_its_slots_and_refuses_nonsense():
    (f,) = parse_faults("engine@300s,restart=60s", cells=4, standalone=16)
    assert (f.cell, f.at_h, f.restart_h, f.slots) == (-1, 300 / 3600, 60 / 3600, 16)
    (g,) = parse_faults("engine@1h,slots=4", standalone=16)
    assert g.slots == 4 and g.as_tuple() == (-1, 1.0, 0.0, 4)
    for bad in ["engine@1h", "engine@1h,slots=x", "engine@1h,slots=0", "engine@1h,wait=1s"]:
        with pytest.raises(ValueError):
            parse_faults(bad, standalone=0 if bad == "engine@1h" else 16)


@pytest.mark.parametrize("placement", ["elastic", "colocate", "async"])
def test_sim_standalone_engine_fault_is_survived_and_never_back_costs_most(placement):
    from gyre.sim.config import apply_overrides

    cfg_ = apply_overrides(preset("seed-toy"), ["C_s=16"])
    back = fault_cost(cfg_, placement, parse_faults("engine@2h,slots=8,restart=1h", standalone=16))
    never = fault_cost(cfg_, placement, parse_faults("engine@2h,restart=never", standalone=16))
    for r in (back, never):
        assert r["survived"] and r["protocol_errors"] == [] and r["interrupted"] == 0
    assert never["makespan_faults_h"] >= back["makespan_faults_h"] - 1e-9
    assert back["events"][0] == {"engine": 0, "lost_h": 2.0, "slots": 8}
    # more than the pool holds is the policy's error, reported as not survived
    over = fault_cost(cfg_, placement, parse_faults("engine@2h,slots=32", standalone=16))
    assert over["survived"] is False and "slots" in over["why"]
