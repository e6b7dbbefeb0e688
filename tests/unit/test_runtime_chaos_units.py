"""The chaos nemesis's schedule and target finding, and the proxy watchdog, without a run."""

from __future__ import annotations

import asyncio
import subprocess
import types
from pathlib import Path

from gyre.runtime.chaos import carry, harness_pids, schedule
from gyre.runtime.config import RunConfig
from gyre.runtime.proxy_watchdog import ProxyWatchdog
from gyre.runtime.records import FaultRecord, Records


def _f(**keys: object) -> FaultRecord:
    """A fault record with the keys a test names (the rest as an old file would lack them)."""
    return FaultRecord.from_json(keys)


KINDS = ["rollout_cell", "satellite", "engine", "proxy", "harness"]


def test_chaos_is_off_by_default():
    assert RunConfig().chaos.kills == 0


def test_schedule_is_seeded_in_the_window_and_hits_every_kind():
    a = schedule(3, 10, KINDS, (5.0, 60.0))
    assert a == schedule(3, 10, KINDS, (5.0, 60.0))
    assert a != schedule(4, 10, KINDS, (5.0, 60.0))
    times = [t for t, _ in a]
    assert times == sorted(times) and all(5.0 <= t <= 60.0 for t in times)
    assert sorted(k for _, k in a[:5]) == sorted(KINDS)  # one full cycle first
    assert sorted(k for _, k in a[5:]) == sorted(KINDS)


def test_harness_pids_finds_a_process_by_its_workspace(tmp_path: Path):
    ws = tmp_path / "workspaces" / "r0-g00007-a02" / "workspace"
    ws.mkdir(parents=True)
    other = tmp_path / "elsewhere"
    other.mkdir()
    p = subprocess.Popen(["sleep", "30"], cwd=ws)
    q = subprocess.Popen(["sleep", "30"], cwd=other)
    try:
        found = harness_pids(tmp_path / "workspaces")
        assert found == {"r0-g00007-a02": [p.pid]}
    finally:
        p.kill()
        q.kill()
        p.wait()
        q.wait()


class _Server:
    """What ManagedProxy asks of its ProxyServer here: liveness, the answered counter, restart."""

    def __init__(self, restarted: list[int]) -> None:
        self.alive, self.port, self._error = False, 1234, None
        self.service = types.SimpleNamespace(counters=types.SimpleNamespace(answered=7))
        self.restarted = restarted

    def restart(self) -> None:
        self.restarted.append(1)
        self.alive = True


def _world(alive: bool = False) -> types.SimpleNamespace:
    from gyre.runtime.managed_proxy import ManagedProxy

    records = Records(cells=1)
    restarted: list[int] = []
    proxy = ManagedProxy()
    proxy._server = _Server(restarted)  # type: ignore[assignment]
    proxy._server.alive = alive
    cfg = types.SimpleNamespace(run=RunConfig())
    return types.SimpleNamespace(
        cfg=cfg, proxy=proxy, records=records, now=records.now, restarted=restarted
    )


def test_watchdog_restarts_a_dead_proxy_once_and_records_it():
    w = _world()
    dog = ProxyWatchdog(w.cfg.run.fault, w.proxy, w.records, w.now)
    assert w.proxy.ensure == dog.ensure  # whoever uses the proxy asks the watchdog first

    async def go() -> None:
        await asyncio.gather(dog.ensure("watchdog"), w.proxy.serving("switch"))
        await dog.ensure("watchdog")  # alive now: nothing to do

    asyncio.run(go())
    assert w.restarted == [1] and dog.restarts == 1
    (f,) = w.records.faults
    assert f.kind == "proxy" and f.cell is None and f.action == "restart"
    assert f.detected_by == "watchdog" and f.extra("answered_before") == 7
    assert f.back is not None and f.restart_s is not None and f.restart_s >= 0
    assert f.cost_s == round(f.back - f.time, 3)  # completing ``back`` prices it
    assert f.to_json()["answered_before"] == 7 and f.to_json()["port"] == 1234


def test_watchdog_leaves_a_live_or_stopped_proxy_alone():
    w = _world(alive=True)
    asyncio.run(ProxyWatchdog(w.cfg.run.fault, w.proxy, w.records, w.now).ensure("watchdog"))
    assert w.restarted == [] and w.records.faults == []
    from gyre.runtime.managed_proxy import ManagedProxy

    stopped = ManagedProxy()  # never started (or stopped): nothing to restart
    asyncio.run(ProxyWatchdog(w.cfg.run.fault, stopped, w.records, w.now).ensure("watchdog"))
    assert w.records.faults == []


def test_the_live_view_says_what_died_last_and_what_it_cost():
    from gyre.runtime.progress import last_fault

    assert last_fault([]) is None
    cell = {"cell": 2, "kind": "hung", "time": 12.1, "detected_by": "heartbeat"}
    assert last_fault([_f(**cell, action="restart")]) == (
        "last fault: cell 2 hung at 12.1s (heartbeat), restart not back yet"
    )
    proxy = {"cell": None, "kind": "proxy", "time": 40.0, "detected_by": "watchdog"}
    text = last_fault([_f(**cell, action="restart"), _f(**proxy, action="restart", cost_s=0.06)])
    assert text == "last fault: proxy at 40.0s (watchdog), restart back after 0.1s"


def test_a_cell_lost_again_while_restarting_is_back_when_its_newest_loss_is():
    from gyre.runtime.chaos import _back

    first = _f(cell=2, time=6.0, back=None)
    again = _f(cell=2, time=36.9, back=68.9)
    other = _f(cell=1, time=50.0, back=None)
    assert _back([first, again, other], first) == 68.9
    assert _back([first], first) is None
    assert _back([first, again], again) == 68.9


def test_a_core_kill_carried_into_the_next_segment_is_closed_and_counted():
    """The core's kill ends its segment before the nemesis can follow it: the next segment
    closes it from the carried fault (the supervisor's action) and goes on with the rest."""
    chaos = [
        {"kind": "proxy", "time": 3.0, "unix_time": 100.0, "target": {"proxy": 1}, "handled": True},
        {"kind": "core", "time": 9.0, "unix_time": 106.0, "target": {"cell": 0, "pid": 7}},
        {"kind": "harness", "time": 5.0, "skipped": "no target"},
    ]
    faults = [
        _f(
            cell=0,
            kind="died",
            unix_time=106.02,
            detected_by="heartbeat",
            action="restart from checkpoint step 4",
            core_restart=1,
        ),
    ]
    assert carry(chaos, faults) == 3
    core = chaos[1]
    assert core["handled"] is True and core["action"] == "restart from checkpoint step 4"
    assert core["detected_s"] == 0.02 and core["detected_by"] == "heartbeat"
    lone = [{"kind": "core", "time": 1.0, "unix_time": 50.0, "target": {"cell": 0, "pid": 7}}]
    assert carry(lone, []) == 1 and lone[0]["handled"] is False  # nothing found it


def test_a_harness_kill_does_not_wait_for_a_restart_to_come_back():
    """A cell or engine restart takes 12-15 s on 2 cores: the machinery's kinds wait for it
    (one fault at a time), a harness kill only for the last kill to be found (CI's 56 s drill
    ended while its harness kill waited for a standalone engine's restart)."""
    from gyre.policy import CellRole
    from gyre.runtime.chaos import Nemesis

    records = Records(cells=3)
    records.roles[:] = [CellRole.TRAINING, CellRole.ROLLOUT, CellRole.ROLLOUT]
    proxy = types.SimpleNamespace(alive=True)  # what the nemesis reads of the ManagedProxy
    n = Nemesis.__new__(Nemesis)
    n.records, n.cluster, n.down = records, types.SimpleNamespace(proxy=proxy), set()
    n.carried_faults, n.kills = 0, []
    engine = _f(cell=None, kind="engine", action="restart", back=None)
    records.faults.append(engine)
    n.kills.append({"kind": "engine", "target": {"url": "u"}, "handled": True})
    assert not n._quiet("rollout_cell") and not n._quiet("proxy")
    assert n._quiet("harness")
    n.down.add(1)  # a cell lost, not back: still no wait for a harness kill
    assert n._quiet("harness") and not n._quiet("satellite")
    n.kills.append({"kind": "rollout_cell", "target": {"cell": 1}})  # not found yet
    assert not n._quiet("harness")
    n.kills[-1]["handled"] = True
    proxy.alive = False  # a dead proxy: nothing is killed until it serves again
    assert not n._quiet("harness")
    records.complete(engine, back=30.0)
    proxy.alive = True
    n.down.clear()
    assert n._quiet("rollout_cell") and n._quiet("harness")


def test_no_training_cell_is_killed_at_a_steps_end():
    """A satellite killed after it answered the ping before the reduce is lost in the reduce,
    which restarts the run's segment (CI: killed 63 ms before the reduce found it): the nemesis
    leaves training cells alone from that ping to the optimizer step's end."""
    import random

    from gyre.policy import CellRole
    from gyre.runtime.chaos import Nemesis

    stand_in = subprocess.Popen(["sleep", "30"])  # what a wrong kill would hit
    records = Records(cells=3)
    records.roles[:] = [CellRole.TRAINING, CellRole.TRAINING, CellRole.ROLLOUT]
    n = Nemesis.__new__(Nemesis)
    n.records, n.down, n.rng = records, set(), random.Random(0)
    n.cluster = types.SimpleNamespace(placement=[{"pid": stand_in.pid}] * 3)
    try:
        for what in ("reduce_check", "reduce", "optimizer_step"):
            records.activity = {0: {"what": what}, 1: {"what": what}}
            for kind in ("satellite", "core"):
                assert asyncio.run(n._kill(kind)) is None, (what, kind)
        records.activity = {0: {"what": "micro_step"}}  # mid-step: fair game
        assert asyncio.run(n._kill("satellite")) == {
            "cell": 1,
            "pid": stand_in.pid,
            "signal": "SIGKILL",
        }
        assert stand_in.wait(5) == -9
    finally:
        stand_in.kill()
        stand_in.wait()


def test_the_nemesis_carries_its_kills_to_the_next_segment_in_its_own_file(tmp_path: Path):
    """A rig keeps what the next segment needs itself: the kills go to ``chaos.jsonl`` when the
    segment ends, and the next segment's nemesis reads them, closes the core's kill from the
    carried fault and goes on with the rest of the schedule."""
    from gyre.runtime.chaos import CHAOS_FILE, Nemesis
    from gyre.runtime.config import ChaosConfig
    from gyre.runtime.rundir import RunDir

    cfg = ChaosConfig(seed=1, kills=3, kinds=["core", "proxy", "harness"])
    rd = RunDir(tmp_path)
    bus = types.SimpleNamespace(now=lambda: 0.0)

    def nemesis(records: Records) -> Nemesis:
        return Nemesis(cfg, None, records, bus, down=set(), results=set(), rundir=rd)  # type: ignore[arg-type]

    first = nemesis(Records(cells=2))
    assert first.rows() == [] and len(first.plan) == 3
    first.close()
    assert not (tmp_path / CHAOS_FILE).exists()  # nothing killed: no file
    kill = {"kind": "core", "time": 4.0, "unix_time": 100.0, "target": {"cell": 0, "pid": 9}}
    first.kills.append(kill)
    assert first.counts() == {"chaos kills": 1}
    first.close()
    records = Records(cells=2, segment=1)
    records.faults.append(
        _f(cell=0, kind="died", unix_time=100.01, detected_by="heartbeat",
           action="restart from checkpoint step 2")
    )  # fmt: skip
    second = nemesis(records)
    (carried,) = second.rows()
    assert carried["handled"] is True and carried["action"] == "restart from checkpoint step 2"
    assert len(second.plan) == 2  # the rest of the schedule, spaced as drawn


def test_the_live_view_shows_a_rigs_counts_apart_from_the_faults():
    from gyre.runtime.progress import _faults

    s = {"faults": {"cells_lost": 1, "core_restarts": 1}, "rigs": {"chaos kills": 2}}
    assert _faults(s) == "faults 1 (cells lost 1, core restarts 1, chaos kills 2)"
