"""The real run's records (gyre.runtime.records) and the world's notices that write them."""

import asyncio

import pytest

from gyre.config import GyreConfig
from gyre.policy import CellRole, DispatchGroups, EndRun, StartStep, Tick, WakeAt
from gyre.runtime import workload
from gyre.runtime.records import Records
from gyre.runtime.rundir import RunDir
from gyre.runtime.world import RealWorld


def _records() -> Records:
    """Two cells: cell 1 rollout 0-2, to_training 2-3, training since 3 (open)."""
    r = Records(cells=2)
    r.set_role(1, CellRole.TO_TRAINING, 2.0)
    r.set_role(1, CellRole.TRAINING, 3.0)
    r.set_role(0, CellRole.ROLLOUT, 0.0)  # no time passed: no empty segment is recorded
    return r


def test_role_timeline_closes_the_open_segment_once():
    r = _records()
    assert r.segments == [[], [(0.0, 2.0, "rollout"), (2.0, 3.0, "to_training")]]
    assert r.role_segments(5.0) == [
        [(0.0, 5.0, "rollout")],
        [(0.0, 2.0, "rollout"), (2.0, 3.0, "to_training"), (3.0, 5.0, "training")],
    ]
    assert r.segments[1][-1] == (2.0, 3.0, "to_training")  # reading did not record
    assert r.role_shares(5.0) == [
        {"rollout": 1.0},
        {"rollout": 0.4, "to_training": 0.2, "training": 0.4},
    ]


def test_close_segments_records_up_to_now():
    r = _records()
    r.t0 -= 10.0  # the run's clock reads ~10 s
    r.close_segments()
    last = r.segments[1][-1]
    assert last[0] == 3.0 and last[2] == "training" and last[1] >= 10.0
    assert r.since == [last[1], last[1]]


def test_switch_seconds_by_direction():
    r = Records(cells=1)
    r.switches += [
        {"to": "training", "seconds": 1.5},
        {"to": "rollout", "seconds": 0.5},
        {"to": "training", "seconds": 2.5},
    ]
    assert r.switch_seconds() == {"training": [1.5, 2.5], "rollout": [0.5]}


def test_capacity_and_timeline_from_the_records():
    r = _records()
    r.busy[1].append((3.5, 4.0))
    pol = GyreConfig(model_dir="/nonexistent").policy.model_copy(
        update={"cell_capacity": 4, "standalone_capacity": 1}
    )
    # cell 1 serves until 2, cell 0 throughout; the standalone pool adds 1
    assert workload.capacity_intervals(r, pol, 5.0) == [
        (0.0, 2.0, 9.0),
        (2.0, 3.0, 5.0),
        (3.0, 5.0, 5.0),
    ]
    tl = workload._timeline(r, 4.5)
    assert tl["segments"] == [
        [0, "rollout", 0.0, 4.5],
        [1, "rollout", 0.0, 2.0],
        [1, "switching", 2.0, 3.0],
        [1, "training", 3.0, 4.5],
    ]
    assert tl["busy"] == [[1, 3.5, 4.0]]


@pytest.mark.asyncio
async def test_world_notices_write_the_step_and_makespan(tmp_path):
    cfg = GyreConfig(model_dir="/nonexistent")
    world = RealWorld(cfg, RunDir(tmp_path / "run"), tasks=None, resume={"step": 4})  # type: ignore[arg-type]
    assert world.roles is world.records.roles
    world.carry_out(
        [
            DispatchGroups(group_ids=(0, 1), version=1, group_size=2),
            StartStep(step=2, version=1),
            WakeAt(time=0.0),
        ]
    )
    # global versions (resumed at step 4), per execution
    assert world.exec_version == {(g, a): 5 for g in (0, 1) for a in (0, 1)}
    assert world.step_rec is not None and (world.step_rec.step, world.step_rec.version) == (6, 5)
    ev = await asyncio.wait_for(world.events.get(), 5)
    assert isinstance(ev, Tick)
    world.carry_out([EndRun(steps=3)])
    assert world.records.makespan is not None and world.records.makespan >= 0.0
