"""The real run's records (gyre.runtime.records) and the world's notices that write them."""

import asyncio
import dataclasses

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


def test_a_fault_record_reads_and_writes_the_old_dicts_unchanged():
    """``faults.jsonl`` and ``summary.json`` keep the dicts that came before the dataclass: a
    line of an old run directory reads back to the same object, keys of one kind included."""
    import json

    from gyre.runtime.records import FaultRecord

    old = {
        "cell": 1, "kind": "died", "role": "rollout", "time": 6.0, "unix_time": 1700000006.0,
        "detected_by": "heartbeat", "cause": "x", "action": "restart", "back": 20.5,
        "segment": 0, "moved_calls": 3, "requeued": 1, "restart_s": 12.0, "cost_s": 14.5,
    }  # fmt: skip
    rec = FaultRecord.from_json(json.loads(json.dumps(old)))
    assert rec.cell == 1 and rec.back == 20.5 and rec.cost_s == 14.5
    assert rec.extra("moved_calls") == 3 and rec.core_restart is None
    assert rec.to_json() == old
    with pytest.raises(KeyError):
        rec.extra("cost_s")  # a field is read as an attribute, never by key


def test_records_complete_a_fault_in_place_and_price_its_return():
    from gyre.runtime.records import FaultRecord

    r = Records(cells=2, segment=3)
    rec = r.fault(cell=1, kind="hung", role="rollout", at=2.0, detected_by="heartbeat",
                  cause="timeout", action="restart", moved_calls=2)  # fmt: skip
    assert isinstance(rec, FaultRecord) and rec.segment == 3 and rec.back is None
    new = r.complete(rec, back=9.5, restart_s=6.0)
    assert r.faults == [new] and new.cost_s == 7.5 and new.extra("moved_calls") == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.back = 1.0  # type: ignore[misc]
    with pytest.raises(KeyError):
        r.complete(rec, back=1.0)  # a stale record: a bug, said at once
    assert set(new.to_json()) == {
        "cell", "kind", "role", "time", "unix_time", "detected_by", "cause", "action",
        "back", "segment", "moved_calls", "restart_s", "cost_s",
    }  # fmt: skip


def test_controller_times_pair_each_handle_with_the_carry_out_of_its_actions():
    """The first carry-out follows policy.start (no event); carry-out i+1 carries out what
    handle i returned. The summary's quantiles are over those pairs, split by AssignGroup."""
    from gyre.runtime.records import ControllerTimes

    c = ControllerTimes()
    c.carried.append(9.0)  # policy.start's actions: not an event's cost
    c.handled.append((0.001, "ExecutionFinished", ("AssignGroup", "StartStep")))
    c.carried.append(0.003)
    c.handled.append((0.002, "Tick", ()))
    c.carried.append(0.0)
    c.handled.append((0.0005, "Tick", ("WakeAt",)))  # its carry-out never came (run stopped)
    assert c.per_event() == [
        (0.001, 0.003, "ExecutionFinished", ("AssignGroup", "StartStep")),
        (0.002, 0.0, "Tick", ()),
    ]
    s = c.summary([{"all": 0.002, "trees": 0.001, "pack": 0.0005, "put": 0.0005, "tasks": 3}])
    assert s["per_event"]["n"] == 2 and s["per_event"]["max_ms"] == pytest.approx(4.0)
    assert s["per_event"]["p50_ms"] == pytest.approx(3.0)  # between 2 ms and 4 ms
    assert s["per_event"]["total_s"] == pytest.approx(0.006)
    assert s["with_assign"]["n"] == 1 and s["with_assign"]["max_ms"] == pytest.approx(4.0)
    assert s["without_assign"]["n"] == 1 and s["without_assign"]["p50_ms"] == pytest.approx(2.0)
    assert s["assign"]["trees"]["p50_ms"] == pytest.approx(1.0) and s["assign_tasks"] == 3
    assert [x["event"] for x in s["slowest"]] == ["ExecutionFinished", "Tick"]
    empty = ControllerTimes().summary([])
    assert empty["per_event"] == {
        "n": 0, "total_s": 0.0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None
    }  # fmt: skip
    assert empty["slowest"] == [] and empty["assign_tasks"] == 0
