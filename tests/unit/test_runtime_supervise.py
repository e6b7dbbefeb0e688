"""The core's loss without Ray: what the supervisor restarts from, what it records, when it
stops; and which errors of the world count as the core's loss.

``gyre.runtime.loop.run`` is replaced by a stand-in that plays the segments: each writes the
metrics lines and checkpoints a real segment would, then loses its core (``CoreLost``). The
real run is tests/integration/test_runtime_core_restart.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.exceptions import ActorDiedError, OutOfMemoryError

from gyre.config import GyreConfig
from gyre.policy import CellRole
from gyre.runtime import loop
from gyre.runtime.faults import ActorDied, CellFaults, CoreLost, actor_died
from gyre.runtime.progress import closing_lines
from gyre.runtime.records import FaultRecord, Records
from gyre.runtime.supervise import FAULTS_FILE, resume_state, supervise


def _cfg(restarts: int = 2, steps: int = 4) -> GyreConfig:
    return GyreConfig.model_validate(
        {
            "model_dir": "/nonexistent",
            "policy": {"total_steps": steps, "group_size": 2, "batch_groups": 1},
            "run": {"fault": {"core_restarts": restarts}},
        }
    )


def _checkpoint(rd: Path, step: int, groups: list[str]) -> None:
    ck = rd / "checkpoints" / f"step-{step}"
    ck.mkdir(parents=True)
    state = {"step": step, "policy_version": step, "consumed_groups": groups}
    (ck / "trainer_state.json").write_text(json.dumps(state))
    (rd / "checkpoints" / "latest").write_text(ck.name)


def _metrics(rd: Path, step: int) -> None:
    with open(rd / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "version": step + 1, "groups": [f"g{step}"]}) + "\n")


class Segments:
    """Stands in for ``loop.run``: segment i trains from its resume step, checkpoints every
    ``every`` steps, and loses its core after ``dies[i]`` steps (None: finishes)."""

    def __init__(self, dies: list[int | None], every: int = 2, steps: int = 4) -> None:
        self.dies, self.every, self.steps = dies, every, steps
        self.resumes: list[dict | None] = []

    def __call__(self, cfg, *, run_dir, resume, quiet, log_format):
        self.resumes.append(resume)
        i = len(self.resumes) - 1
        step = (resume or {}).get("step", 0)
        records = Records(cells=3, segment=(resume or {}).get("segment", 0))
        records.faults.extend(FaultRecord.from_json(f) for f in (resume or {}).get("faults", []))
        for _ in range(self.dies[i] if self.dies[i] is not None else self.steps - step):
            _metrics(run_dir, step)
            step += 1
            if step % self.every == 0 or step == self.steps:
                _checkpoint(run_dir, step, [f"g{s}" for s in range(step)])
        if self.dies[i] is None:
            return {"steps": step, "faults": [f.to_json() for f in records.faults]}
        rec = FaultRecord(
            cell=0, kind="died", role="training", time=1.0, unix_time=1.0, detected_by="call",
            cause="x", action="run stopped", segment=records.segment,
        )  # fmt: skip
        records.faults.append(rec)
        raise CoreLost(
            "cell 0 (the core) was lost (died: x); ... --resume ...", rec, records.faults
        )


def _supervise(tmp_path, monkeypatch, segments: Segments, restarts: int = 2):
    monkeypatch.setattr(loop, "run", segments)
    said: list[str] = []
    summary = supervise(
        _cfg(restarts), tmp_path, None, quiet=True, log_format="plain", say=said.append
    )
    return summary, said


def test_a_core_loss_restarts_from_the_last_checkpoint_and_redoes_what_it_lost(
    tmp_path, monkeypatch
):
    seg = Segments([3, None])  # checkpoint at 2, step 3 applied, then the core dies
    summary, said = _supervise(tmp_path, monkeypatch, seg)
    assert seg.resumes[1]["step"] == 2 and seg.resumes[1]["segment"] == 1
    assert said == [
        "core lost (cell 0 died, found by call): restarting from checkpoint step 2 "
        "(restart 1 of 2, segment 1)"
    ]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]  # step 3 once: the dead one's dropped
    (f,) = summary["faults"]
    assert f["action"] == "restart from checkpoint step 2" and f["steps_redone"] == 1
    assert f["core_restart"] == 1 and f["segment"] == 0
    first = closing_lines({**_summary(), "faults": summary["faults"]}, 10, "r")[0]
    assert first == "core restarted 1x (from checkpoint step 2); 1 finished steps trained again"


def _summary() -> dict:
    return {"makespan_s": 1.0, "reward_first_quarter": None, "reward_last_quarter": None}


def test_no_checkpoint_yet_restarts_from_step_0(tmp_path, monkeypatch):
    seg = Segments([1, None])  # died after step 1, before the first checkpoint (every 2)
    summary, said = _supervise(tmp_path, monkeypatch, seg)
    assert seg.resumes[1]["step"] == 0 and seg.resumes[1]["checkpoint"] is None
    assert "restarting from checkpoint step 0" in said[0]
    assert summary["faults"][0]["steps_redone"] == 1


def test_restarts_run_out_then_the_run_stops_with_one_line(tmp_path, monkeypatch):
    seg = Segments([3, 0, 0])
    with pytest.raises(CoreLost) as e:
        _supervise(tmp_path, monkeypatch, seg)
    assert "no core restart left: run.fault.core_restarts = 2" in str(e.value)
    assert [r["segment"] for r in seg.resumes[1:]] == [1, 2]  # segment ids never reused
    kept = [json.loads(x) for x in (tmp_path / FAULTS_FILE).read_text().splitlines()]
    assert [f["action"] for f in kept] == [
        "restart from checkpoint step 2",
        "restart from checkpoint step 2",
        "run stopped",
    ]
    assert resume_state(tmp_path, 2)["segment"] == 3  # a --resume after it: a new segment


def test_core_restarts_0_is_todays_stop(tmp_path, monkeypatch):
    seg = Segments([1])
    with pytest.raises(CoreLost) as e:
        _supervise(tmp_path, monkeypatch, seg, restarts=0)
    assert str(e.value) == "cell 0 (the core) was lost (died: x); ... --resume ..."
    assert len(seg.resumes) == 1
    (f,) = [json.loads(x) for x in (tmp_path / FAULTS_FILE).read_text().splitlines()]
    assert f["action"] == "run stopped"


def test_a_resume_carries_the_faults_of_earlier_segments(tmp_path):
    (tmp_path / FAULTS_FILE).write_text(json.dumps({"cell": 0, "segment": 0}) + "\n")
    st = resume_state(tmp_path, 2)
    assert st["faults"] == [{"cell": 0, "segment": 0}] and st["segment"] == 1


# ---------------------------------------------------------------------------- the world's side
class _Actor:
    def __init__(self, hex_id: str, alive: bool = True) -> None:
        self._actor_id = SimpleNamespace(hex=lambda: hex_id)
        self.ping = SimpleNamespace(remote=self._ping)
        self.alive = alive

    async def _ping(self) -> int:
        if not self.alive:
            raise ActorDiedError()
        return 0


def _world(core_alive: bool = True, tmp: Path | None = None, checkpointed: bool = False):
    """A world whose driver saw 3 steps finish; ``checkpointed``: step 3's checkpoint exists
    (in ``tmp``), so the core can restart in place."""
    records = Records(cells=3)
    records.roles[:] = [CellRole.TRAINING, CellRole.TRAINING, CellRole.ROLLOUT]
    rd = SimpleNamespace(checkpoints=(tmp or Path("/nonexistent")) / "checkpoints")
    if checkpointed:
        _checkpoint(tmp, 3, ["g0", "g1", "g2"])
    spawned: list = []
    w = SimpleNamespace(
        cfg=_cfg(),
        K=3,
        base_step=0,
        rundir=rd,
        cluster=SimpleNamespace(
            cells=[_Actor("c0", core_alive), _Actor("c1"), _Actor("c2")],
            trainer_version=3,
            resume_from=None,
        ),
        errors=[],
        execs=SimpleNamespace(running=5),
        records=records,
        roles=records.roles,
        now=records.now,
        forget_cell_work=lambda cell: None,
        spawn=lambda coro: (spawned.append(coro), coro.close()),
        spawned=spawned,
    )
    faults = CellFaults(
        w.cfg,
        w.cluster,
        records,
        rd,
        w,
        base_step=w.base_step,
        errors=w.errors,
        forget_work=w.forget_cell_work,
        running=lambda: w.execs.running,
    )
    return w, faults


def _died(actor: str) -> ActorDiedError:
    e = ActorDiedError()
    e.actor_id = actor
    return e


def test_the_cores_death_found_by_any_call_is_core_lost():
    w, faults = _world()
    err = RuntimeError("the core's save failed")
    err.__cause__ = _died("c0")  # raised from Ray's error, as a wrapper would
    asyncio.run(faults.surfaced(err))
    (e,) = w.errors
    assert isinstance(e, CoreLost) and e.record.detected_by == "call"
    assert "step 3 has no checkpoint" in str(e)  # so not in place: the segment restarts
    assert w.records.faults == [e.record]
    assert e.record.executions_cut == 5  # the work the restart throws away, counted


def test_the_cores_death_with_its_last_steps_checkpoint_is_restarted_in_place(tmp_path):
    w, faults = _world(tmp=tmp_path, checkpointed=True)
    err = RuntimeError("the core's save failed")
    err.__cause__ = _died("c0")
    asyncio.run(faults.surfaced(err))
    assert w.errors == []  # the error only said the core died: not the run's
    (rec,) = w.records.faults
    assert rec.cell == 0 and rec.action == "restart" and rec.executions_cut is None
    assert 0 in faults.down and len(w.spawned) == 1  # its replacement is under way
    assert faults.core_checkpoint() == str(tmp_path / "checkpoints" / "step-3")
    # a later symptom of the same dead process is not the run's either; another error is
    asyncio.run(faults.surfaced(_died("c0")))
    assert w.errors == []
    asyncio.run(faults.surfaced(ValueError("a bug")))
    assert len(w.errors) == 1


def test_a_checkpoint_of_another_step_is_not_taken(tmp_path):
    """The dead core may have written the checkpoint of a step it never returned (step 4):
    the new one starts from the driver's step (3), or not in place when that one is gone."""
    w, faults = _world(tmp=tmp_path)
    _checkpoint(tmp_path, 4, ["g0", "g1", "g2", "g3"])
    assert faults.core_checkpoint() is False
    w.cluster.trainer_version = 0  # nothing finished in this segment: its own start
    assert faults.core_checkpoint() is None


def test_an_error_while_the_core_is_dead_is_the_cores_loss_and_others_stay_as_they_are():
    w, faults = _world(core_alive=False)
    asyncio.run(faults.surfaced(RuntimeError("gloo: connection reset")))
    assert [type(e) for e in w.errors] == [CoreLost]
    w, faults = _world(core_alive=True)
    err = RuntimeError("a bug")
    asyncio.run(faults.surfaced(err))
    assert w.errors == [err] and w.records.faults == []


def test_a_satellite_dead_in_the_reduce_is_core_lost_naming_it():
    w, faults = _world()
    e = asyncio.run(faults.in_reduce(5, 2, _died("c1")))
    assert isinstance(e, CoreLost) and "cell 1 died during the reduce of step 5" in str(e)
    assert e.record.cell == 1 and e.record.detected_by == "reduce"
    w, faults = _world()
    plain = ValueError("shapes differ")  # the reduce's own error, every participant alive
    assert asyncio.run(faults.in_reduce(5, 2, plain)) is plain


def test_a_call_cut_by_rays_memory_monitor_is_the_cells_death():
    """Ray's memory monitor killing a cell's worker mid-call raises OutOfMemoryError (no
    actor id) from that call: it must reach the cell-loss path, not stop the run with a
    traceback (seen: a micro-step's compute on an agent run with a TRL run beside it)."""
    oom = OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")
    assert actor_died(oom)
    with pytest.raises(ActorDied):  # what world._micro and the switch paths catch
        raise oom
    w, faults = _world(core_alive=False)
    asyncio.run(faults.surfaced(oom))  # no actor id: the ping finds the core dead
    (e,) = w.errors
    assert isinstance(e, CoreLost) and e.record.detected_by == "call"
    assert not actor_died(RuntimeError("the call's own error"))


def test_a_cell_dead_while_the_world_is_rebuilt_is_its_own_loss_not_the_runs():
    """Cell 2's replacement rebuilds the gloo world; cell 1, killed as hung by the heartbeat
    meanwhile, makes that rebuild raise ActorDiedError (seen once in the nemesis run). That is
    cell 1's loss, whose replacement rebuilds again; cell 2 is back, and the run goes on.
    The new actor's own death is still the run's error."""
    w, faults = _world()
    events: list = []
    w.emit = events.append
    rebuilt: list[int] = []

    async def take_out(cell, why):
        return {}

    async def replace_cell(cell, start, restarts):
        rebuilt.append(cell)
        raise _died("c1")

    w.cluster.take_out, w.cluster.replace_cell = take_out, replace_cell
    faults.lost(2, TimeoutError(), "heartbeat", kind="hung")
    asyncio.run(faults._replace(2, faults._open[2]))  # what lost() spawned
    assert rebuilt == [2] and w.errors == []
    assert 2 not in faults.down and [type(e).__name__ for e in events][-1] == "CellBack"
    (_, r1) = w.records.faults
    assert (r1.cell, r1.detected_by, r1.action) == (1, "rebuild", "restart")
    assert 1 in faults.down and len(w.spawned) == 2  # cell 1's own replacement is under way

    w, faults = _world()
    w.emit = lambda e: None
    w.cluster.take_out = take_out

    async def own_death(cell, start, restarts):
        raise _died("c2")  # the new actor itself

    w.cluster.replace_cell = own_death
    faults.lost(2, TimeoutError(), "heartbeat", kind="hung")
    with pytest.raises(ActorDiedError):
        asyncio.run(faults._replace(2, faults._open[2]))
