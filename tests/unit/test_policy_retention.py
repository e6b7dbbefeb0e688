"""Elastic's core retention rules and the late-join rule, on small hand-driven policies."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gyre.policy import (
    CellRole,
    CellSwitched,
    ClaimMicroStep,
    ExecutionFinished,
    FinishStep,
    LaunchExecutions,
    MicroStepDone,
    Placement,
    PolicyConfig,
    PublishWeights,
    SchedulingPolicy,
    StepDone,
    SwitchCell,
    WeightsPublished,
)
from gyre.policy.config import CoreRetention


def cfg(placement="elastic", **kw) -> PolicyConfig:
    base = dict(group_size=2, batch_groups=2, total_steps=4, streaming=True, hold_tau=0.0)
    base.update(kw)
    return PolicyConfig(placement=Placement(placement), **base)


def of(acts, typ):
    return [a for a in acts if isinstance(a, typ)]


def finish_group(p: SchedulingPolicy, gid: int, t: float) -> list:
    acts = []
    for a in range(p.config.group_size):
        acts += p.handle(ExecutionFinished(t, (gid, a), 1.0))
    return acts


def drive_training(p: SchedulingPolicy, acts: list, t: float) -> tuple[list, float]:
    """Answer claims, steps, publications and switches (0.01 each) until none are left."""
    out, queue = list(acts), list(acts)
    while queue:
        a = queue.pop(0)
        t += 0.01
        if isinstance(a, ClaimMicroStep):
            new = p.handle(MicroStepDone(t, a.cell, a.step, a.group_id, a.index))
        elif isinstance(a, FinishStep):
            new = p.handle(StepDone(t, a.step))
        elif isinstance(a, PublishWeights):
            new = p.handle(WeightsPublished(t, a.version))
        elif isinstance(a, SwitchCell):
            new = p.handle(CellSwitched(t, a.cell, a.role))
        else:
            continue
        out += new
        queue += new
    return out, t


def boundary_with_leftover(rule: str, t0: float = 1.0) -> tuple[SchedulingPolicy, list]:
    """K=2, C_e=4, N=2, B=2, mu=1, phi=1: Q_b = 4 groups = 8 executions on 8 slots.

    Groups 0-2 finish at ``t0`` (the core leaves once w = 4 <= 4), group 3 keeps running.
    At the boundary: group 2 ready, w = 2, next dispatch 4 executions; without the core
    4 slots: the paper's test fails (4 < 2 + 4), the work outstanding fits (4 >= 2).
    """
    p = SchedulingPolicy(
        cfg(
            cells=2,
            cell_capacity=4,
            mu=1,
            phi=1.0,
            streaming=False,
            rho_min=0.5,
            core_retention=rule,
        )
    )
    p.start(0.0)
    acts = finish_group(p, 0, t0) + finish_group(p, 1, t0) + finish_group(p, 2, t0)
    assert of(acts, SwitchCell) == [SwitchCell(0, CellRole.TRAINING)]
    out, _ = drive_training(p, acts, t0)
    assert p.steps_done == 1 and p.waterlevel == 2 + 4  # group 3 running + the new dispatch
    return p, out


def test_paper_retention_sends_the_core_back_when_the_next_dispatch_does_not_fit():
    p, out = boundary_with_leftover("paper")
    assert SwitchCell(0, CellRole.ROLLOUT) in out
    assert p.roles[0] is CellRole.ROLLOUT and p.capacity == 8


def test_adaptive_retention_returns_a_core_whose_rollout_stint_outlasted_its_switching():
    # the core served 1.0 in rollout and its switch in took 0.01: rollout was worth it
    p, out = boundary_with_leftover("adaptive", t0=1.0)
    assert p.core_clock.rollout_stint == pytest.approx(1.0)
    assert p.core_clock.to_training == pytest.approx(0.01)
    assert SwitchCell(0, CellRole.ROLLOUT) in out


def test_adaptive_retention_keeps_a_core_that_moves_longer_than_it_serves():
    # the core left rollout at 0.001, its switch took 0.01: it stays in training
    p, out = boundary_with_leftover("adaptive", t0=0.001)
    assert p.core_clock.rollout_stint < p.core_clock.to_training
    assert SwitchCell(0, CellRole.ROLLOUT) not in out
    assert p.roles == [CellRole.TRAINING, CellRole.ROLLOUT]
    # nothing interrupted: the new groups launch only into the 2 free slots, 2 wait
    assert p.capacity == 4 and p.running == 4 and p.queued == 2
    launched = [e for a in of(out, LaunchExecutions) for e in a.executions]
    assert (4, 0) in launched and (5, 1) not in launched
    # the satellite still obeys the waterlevel rule: it cannot leave while w > 0
    acts = p.handle(ExecutionFinished(9.0, (3, 0), 1.0))
    assert not [a for a in of(acts, SwitchCell) if a.cell == 1]


def test_retention_needs_supply_whatever_the_rule():
    # phi = 0: nothing left over at the boundary, so no rule keeps the core
    for rule in CoreRetention:
        p = SchedulingPolicy(
            cfg(cells=2, cell_capacity=4, mu=1, phi=0.0, streaming=False, core_retention=rule)
        )
        p.start(0.0)
        acts = finish_group(p, 0, 1.0) + finish_group(p, 1, 1.0)
        out, _ = drive_training(p, acts, 1.0)
        assert p.roles[0] is CellRole.ROLLOUT, rule


def test_colocate_keeps_the_paper_test_under_any_rule():
    # the colocated gang is the whole cluster: staying would leave no rollout at all
    p = SchedulingPolicy(cfg("colocate", cells=4, cell_capacity=4, mu=1, core_retention="adaptive"))
    p.start(0.0)
    acts = finish_group(p, 0, 1.0) + finish_group(p, 1, 1.0)
    out, _ = drive_training(p, acts, 1.0)
    assert p.steps_done == 1
    assert all(r is CellRole.ROLLOUT for r in p.roles)


def test_config_default_is_the_paper_rule_and_rejects_unknown_rules():
    assert cfg().core_retention is CoreRetention.PAPER
    assert cfg(core_retention="adaptive").core_retention is CoreRetention.ADAPTIVE
    with pytest.raises(ValidationError):
        PolicyConfig(placement="elastic", core_retention="sometimes")


# ---------------------------------------------------------------- a switch across a boundary
def test_a_satellite_still_switching_at_the_boundary_goes_back_once_there():
    # K=3, C_e=8: everything fits, so cells 0 and 1 join; cell 1's switch is still on when
    # the step (mu = 1) ends. Once it lands it must return, like the satellites did.
    p = SchedulingPolicy(cfg(cells=3, cell_capacity=8, mu=1, phi=0.0, rho_min=0.5))
    p.start(0.0)
    acts = finish_group(p, 0, 1.0)
    assert of(acts, SwitchCell) == [SwitchCell(0, CellRole.TRAINING)]
    acts = p.handle(CellSwitched(1.1, 0, CellRole.TRAINING))
    acts += finish_group(p, 1, 1.2)  # w = 0: cell 1 may leave too
    assert SwitchCell(1, CellRole.TRAINING) in acts
    # the core alone finishes the step (drive everything except cell 1's switch)
    pending = [a for a in acts if not isinstance(a, SwitchCell)]
    out, t = drive_training(p, pending, 1.2)
    assert p.steps_done == 1 and p.roles[1] is CellRole.TO_TRAINING
    acts = p.handle(CellSwitched(t + 1, 1, CellRole.TRAINING))
    assert acts == [SwitchCell(1, CellRole.ROLLOUT)] or SwitchCell(1, CellRole.ROLLOUT) in acts
    assert p.roles[1] is CellRole.TO_ROLLOUT


def test_a_satellite_that_lands_within_its_burst_stays():
    p = SchedulingPolicy(cfg(cells=3, cell_capacity=8, mu=2, phi=0.0, rho_min=0.5))
    p.start(0.0)
    finish_group(p, 0, 1.0)
    p.handle(CellSwitched(1.1, 0, CellRole.TRAINING))
    acts = finish_group(p, 1, 1.2)
    assert SwitchCell(1, CellRole.TRAINING) in acts
    acts = p.handle(CellSwitched(1.3, 1, CellRole.TRAINING))
    assert not of(acts, SwitchCell) and p.roles[1] is CellRole.TRAINING
    assert not [a for a in acts if isinstance(a, StepDone)]


def test_core_clock_compares_the_last_rollout_stint_with_the_round_trip():
    from gyre.policy.state import CoreClock

    c = CoreClock()
    assert not c.stint_too_short  # nothing measured yet: an infinite stint
    c.left_rollout(1.0)  # rolled out 1.0
    c.in_training(1.01)
    assert not c.stint_too_short  # 1.0 >= the 0.01 switch in
    c.left_training(5.01)
    c.in_rollout(5.51)  # 0.5 back
    c.left_rollout(6.01)  # rolled out 0.5 < 0.01 + 0.5
    assert c.rollout_stint == pytest.approx(0.5) and c.stint_too_short
    c.in_training(6.02)  # the round trip is now 0.01 + 0.5, still > 0.5
    assert c.stint_too_short
    c.left_training(8.0)
    c.in_rollout(8.1)
    c.left_rollout(9.1)  # 1.0 >= 0.01 + 0.1
    c.in_training(9.11)
    assert not c.stint_too_short
