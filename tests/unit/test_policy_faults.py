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
    ExecutionFinished,
    FinishStep,
    LaunchExecutions,
    MicroStepDone,
    Placement,
    PolicyConfig,
    PolicyError,
    SchedulingPolicy,
    SwitchCell,
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


def test_core_lost_while_training_is_refused():
    p = SchedulingPolicy(cfg())
    p.start(0.0)
    _training(p, [0])
    with pytest.raises(PolicyError, match="core"):
        p.handle(CellLost(1.0, cell=0))


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


def test_sim_core_lost_in_training_is_reported_not_survived():
    r = fault_cost(preset("seed-toy"), "async", parse_faults("cell=0@1h"))
    assert r["survived"] is False and "core" in r["why"]


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
