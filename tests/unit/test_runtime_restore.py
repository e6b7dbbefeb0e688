"""A resume's plan for the groups in flight (gyre.runtime.restore) and the world carrying it out."""

import asyncio
import json

import pytest

from gyre.config import GyreConfig
from gyre.policy import (
    DispatchGroups,
    ExecutionFinished,
    ExecutionsLaunched,
    LaunchExecutions,
    SchedulingPolicy,
)
from gyre.runtime.restore import RELAUNCH_REASONS, group_version, plan_restore
from gyre.runtime.rundir import RunDir
from gyre.runtime.world import RealWorld
from gyre.trace.assessment import Missing, MissingReason

N = 4


def _row(g: int, a: int, reward=1.0, missing=None, seg=0, version=2) -> dict:
    return {
        "execution": f"r{seg}-g{g:05d}-a{a:02d}",
        "group": g,
        "attempt": a,
        "segment": seg,
        "reward": reward,
        "missing": missing,
        "missing_detail": "" if missing is None else "why",
        "dispatch_version": version,
    }


def test_trained_groups_are_skipped_and_only_unfinished_attempts_relaunched():
    rows = [_row(3, a) for a in range(N)]  # trained
    rows += [_row(5, 0, 0.0), _row(5, 2, 1.0)]  # two of four finished
    rows += [_row(4, a) for a in range(N)]  # all finished, not trained: kept whole
    plan = plan_restore(rows, ["g3"], N)
    assert plan.groups == [4, 5]  # in id order: the task stream's order
    assert sorted(plan.finished) == [(4, 0), (4, 1), (4, 2), (4, 3), (5, 0), (5, 2)]
    assert plan.relaunch == [(5, 1), (5, 3)]
    assert plan.summary() == {"groups": 2, "restored": 6, "relaunched": 2}
    kept = plan.finished[(5, 0)]
    assert kept.execution == "r0-g00005-a00" and kept.outcome() == 0.0 and kept.version == 2


def test_a_group_with_nothing_finished_is_not_restored():
    """Relaunching all N attempts of it costs what a fresh group costs: the resume takes fresh
    groups, as before."""
    assert plan_restore([], [], N).groups == []
    assert plan_restore([_row(1, a) for a in range(N)], [1], N).groups == []  # int ids too


def test_a_missing_assessment_stays_missing_unless_the_run_failed_it():
    rows = [
        _row(7, 0, None, MissingReason.evaluator_error.value),
        _row(7, 1, None, MissingReason.cancelled.value),
        _row(7, 2, None, MissingReason.model_unreachable.value),
        _row(7, 3, None, "a reason of a later version"),
    ]
    plan = plan_restore(rows, [], N)
    assert list(plan.finished) == [(7, 0)]
    out = plan.finished[(7, 0)].outcome()
    assert isinstance(out, Missing) and out.reason is MissingReason.evaluator_error
    assert out.detail == "why"  # never a zero reward
    assert plan.relaunch == [(7, 1), (7, 2), (7, 3)]
    assert MissingReason.infra_error.value in RELAUNCH_REASONS


def test_lines_of_other_kinds_and_duplicates():
    rows = [
        {"execution": "r0-eval-v2-t-a0", "reward": 1.0},  # not a training execution
        _row(2, 9),  # attempt beyond the group
        _row(2, 0, 1.0, seg=0),
        _row(2, 0, 0.0, seg=1),  # the first line of an attempt wins
        {k: v for k, v in _row(2, 1).items() if k != "dispatch_version"},  # older run dir
    ]
    plan = plan_restore(rows, [], N)
    assert sorted(plan.finished) == [(2, 0), (2, 1)]
    assert plan.finished[(2, 0)].reward == 1.0
    assert plan.finished[(2, 1)].version is None
    assert plan.relaunch == [(2, 2), (2, 3)]


def test_torn_last_line_of_executions_jsonl_is_dropped(tmp_path):
    rd = RunDir(tmp_path)
    text = "".join(json.dumps(_row(1, a)) + "\n" for a in range(2))
    (tmp_path / "executions.jsonl").write_text(text + json.dumps(_row(1, 2))[:25])
    plan = plan_restore(rd.read_jsonl("executions.jsonl"), [], N)
    assert sorted(plan.finished) == [(1, 0), (1, 1)] and plan.relaunch == [(1, 2), (1, 3)]


def test_group_version_is_the_mean_of_its_executions():
    assert group_version([3, 3, 3, 3]) == 3 and isinstance(group_version([3, 3]), int)
    assert group_version([1, 1, 4, 4]) == 2.5  # two restored at 1, two relaunched at 4
    with pytest.raises(ValueError):
        group_version([])


def _world(tmp_path, plan, step=4, next_group=9) -> RealWorld:
    cfg = GyreConfig(model_dir="/nonexistent")
    cfg = cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"group_size": N})})
    resume = {"step": step, "next_group": next_group, "segment": 1, "restore": plan}
    return RealWorld(cfg, RunDir(tmp_path / "run"), tasks=None, resume=resume)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_world_restores_finished_and_runs_only_the_rest(tmp_path):
    plan = plan_restore([_row(5, 0, 0.5, version=2), _row(5, 2, None, "evaluator_error")], [], N)
    world = _world(tmp_path, plan)
    ran: list[tuple[int, int, int | None]] = []

    async def run(gid, att, version=None):
        ran.append((gid, att, version))
        return 1.0

    world.execs.run = run  # type: ignore[method-assign]
    assert [world.gid(g) for g in range(3)] == [5, 9, 10]  # in flight first, then fresh ids
    launch = tuple((g, a) for g in (0, 1) for a in range(N))
    world.carry_out(
        [
            DispatchGroups(group_ids=(0, 1), version=0, group_size=N),
            LaunchExecutions(launch),
        ]
    )
    events = [await asyncio.wait_for(world.events.get(), 5) for _ in range(1 + 2 * N)]
    assert isinstance(events[0], ExecutionsLaunched) and events[0].executions == launch
    done = {e.execution: e.reward for e in events[1:] if isinstance(e, ExecutionFinished)}
    assert done[(0, 0)] == 0.5 and done[(0, 2)] is None  # restored: as they were
    assert sorted(ran) == [(5, 1, 4), (5, 3, 4), *[(9, a, 4) for a in range(N)]]
    assert world.execs.results[(5, 0)] == ("r0-g00005-a00", 0.5)
    eid, missing = world.execs.results[(5, 2)]
    assert eid == "r0-g00005-a02" and isinstance(missing, Missing)
    assert world.records.restored == 2
    # the restored executions keep the version they were dispatched at, the others the resume's
    assert [world.exec_version[(5, a)] for a in range(N)] == [2, 4, 2, 4]
    assert group_version(world.exec_version[(5, a)] for a in range(N)) == 3
    assert (5, 0) not in world.records.exec_times  # it ran in the killed segment, not this one


def test_a_policy_takes_restored_finishes_at_once():
    """The same events in the same order to the real policy: the group is scored once."""
    cfg = GyreConfig(model_dir="/nonexistent").policy.model_copy(
        update={"group_size": N, "cells": 2, "cell_capacity": N, "batch_groups": 1}
    )
    pol = SchedulingPolicy(cfg)
    acts = pol.start(0.0)
    launch = next(a for a in acts if isinstance(a, LaunchExecutions))
    pol.handle(ExecutionsLaunched(time=0.0, executions=launch.executions))
    for att in range(N):
        pol.handle(ExecutionFinished(time=0.0, execution=(0, att), reward=1.0))
    assert pol.status()["finished"] == N
