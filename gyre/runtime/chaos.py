"""The chaos nemesis: kills real parts of a running ``gyre run`` at seeded random moments.

A test and benchmark facility, like Jepsen's nemesis; never meant for a training run. Off
unless ``[run.chaos] kills`` > 0. At ``kills`` times drawn uniformly in ``window_s`` (seeded by
``seed``), it takes the next kind of a seeded shuffled cycle of ``kinds`` and kills one target
of that kind for real:

=============== ===================================================================
rollout_cell    SIGKILL a cell serving rollouts (its pid from the cluster's placement)
satellite       SIGKILL a training cell other than the core, outside a step's end (the ping
                before its reduce, the reduce, the optimizer step)
core            SIGKILL cell 0, outside a step's end (restarted in place from the checkpoint
                of its last step; a loss in the reduce is the supervisor's, which restarts
                the run's segment: ``tests/integration/test_runtime_core_restart.py``)
engine          SIGKILL a standalone engine's process
proxy           :meth:`ManagedProxy.kill` (stops the way a crash does)
harness         SIGKILL one running harness's processes (found in /proc by its workspace)
cell_hang       SIGSTOP a rollout cell (found by the heartbeat's timeout)
engine_hang     SIGSTOP a standalone engine (found by the proxy's engine heartbeat; then
                SIGKILLed, so no stopped process outlives the run)
=============== ===================================================================

One fault at a time: a kill waits until the previous one is handled (no cell or engine lost
and not back, the proxy serving), and a proxy kill until no engine switch is using it; a
harness kill waits only until the previous kill was found. A kind with no
target yet (no satellite, say) waits up to ``patience_s`` from then, then is recorded as
skipped. Each
kill is a record in ``summary.json`` ``chaos`` (kind, run time, target), completed as the run
handles it: after how long it was found, by what, what was done, when it served again.

The product never names it: :func:`attach` (called by :func:`gyre.runtime.loop.train`) is the
one place that reads ``[run.chaos]``; it builds the nemesis from the world's public handles and
attaches it through :meth:`RealWorld.attach` (a :class:`gyre.runtime.handles.Rig`). The nemesis
keeps its own records: ``chaos.jsonl`` in the run directory carries them into the next segment
after a core restart.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from collections.abc import Container
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.policy import CellRole
from gyre.runtime.cluster import Cluster
from gyre.runtime.config import ChaosConfig
from gyre.runtime.handles import EventBus
from gyre.runtime.records import BREAKS_STEP, FaultRecord, Phase, Records
from gyre.runtime.rundir import RunDir

if TYPE_CHECKING:  # the world imports nothing of this file: the edge runs one way
    from gyre.runtime.world import RealWorld

CHAOS_FILE = "chaos.jsonl"  # the kills of ended segments, carried into the next
FOLLOW_S = 180.0  # how long a kill's record is completed from what the run does about it
_EID = re.compile(r"^r\d+-g(\d+)-a(\d+)$")
_SWITCHING = (CellRole.TO_TRAINING, CellRole.TO_ROLLOUT)
# a step's end, where a training cell is not killed: the ping before the reduce (a cell killed
# after it answered would be lost in the reduce: CI saw one, 63 ms apart), the reduce, the step
_STEP_END = BREAKS_STEP | {Phase.REDUCE_CHECK}


def schedule(seed: int, kills: int, kinds: list[str], window: tuple[float, float]) -> list:
    """``[(run time, kind)]`` in time order: the same for the same seed, each kind in turn."""
    rng = random.Random(seed)
    lo, hi = window
    times = sorted(rng.uniform(lo, hi) for _ in range(kills))
    order: list[str] = []
    while len(order) < kills:
        cycle = list(kinds)
        rng.shuffle(cycle)
        order += cycle
    return list(zip(times, order[:kills]))


def attach(cfg: ChaosConfig, world: RealWorld) -> Nemesis | None:
    """Build the nemesis for ``world`` from its public handles and attach it (None: off, the
    default). The one place ``[run.chaos]`` is read."""
    if cfg.kills <= 0:
        return None
    nemesis = Nemesis(
        cfg,
        world.cluster,
        world.records,
        world,
        down=world.faults.down,
        results=world.execs.results,
        rundir=world.rundir,
    )
    world.attach(nemesis)
    return nemesis


class Nemesis:
    """Carries out the schedule on the cluster's processes; its records are ``kills`` (a
    :class:`gyre.runtime.handles.Rig` named ``chaos``). ``down``: the cells lost and not back
    yet (the cell fault handler's); ``results``: the executions recorded so far, by (group,
    attempt); ``rundir``: where harness processes run and where ``chaos.jsonl`` is kept."""

    name = "chaos"  # its key in summary.json

    def __init__(
        self,
        cfg: ChaosConfig,
        cluster: Cluster,
        records: Records,
        bus: EventBus,
        *,
        down: set[int],
        results: Container[tuple[int, int]],
        rundir: RunDir,
    ) -> None:
        self.cfg, self.cluster, self.records, self.bus = cfg, cluster, records, bus
        self.down, self.results, self.rundir = down, results, rundir
        self.workspaces = rundir.workspaces
        # what it did: one record per kill, those of the segments before first (chaos.jsonl)
        self.kills: list[dict[str, Any]] = rundir.read_jsonl(CHAOS_FILE)
        c = self.cfg
        self.plan = schedule(c.seed, c.kills, list(c.kinds), c.window_s)
        self.rng = random.Random(c.seed + 1)
        # a segment after a core restart: the kills done before it are carried (chaos.jsonl);
        # go on with the rest, spaced as drawn, and judge only this segment's faults
        self.carried_faults = len(records.faults)
        done = carry(self.kills, records.faults)
        if done:
            base = self.plan[done - 1][0]
            self.plan = [(at - base, kind) for at, kind in self.plan[done:]]
            self.rng = random.Random(c.seed + 1 + done)

    # ------------------------------------------------------------------ the Rig hook
    def counts(self) -> dict[str, int]:
        return {"chaos kills": sum(1 for k in self.kills if "target" in k)}

    def rows(self) -> list[dict[str, Any]]:
        return self.kills

    def close(self) -> None:
        """The segment ends: its kills (completed as far as it followed them) go to
        ``chaos.jsonl`` for the next segment, which closes the ones left open."""
        if self.kills:
            self.rundir.replace_jsonl(CHAOS_FILE, self.kills)

    async def run(self) -> None:
        for at, kind in self.plan:
            await asyncio.sleep(max(0.0, at - self.bus.now()))
            rec = await self._one(kind)
            self.kills.append(rec)
            if "target" in rec:
                self.bus.spawn(self._follow(rec))

    async def _one(self, kind: str) -> dict[str, Any]:
        w = self.bus
        t_asked = w.now()
        end = None  # patience runs from the first moment the run is quiet
        while True:
            if self._quiet(kind):
                end = end or time.monotonic() + self.cfg.patience_s
                try:
                    hit = await self._kill(kind)
                except ProcessLookupError:  # it died meanwhile (a restart): pick again
                    hit = None
                if hit is not None:
                    now = w.now()
                    return {
                        "kind": kind,
                        "time": round(now, 3),
                        "unix_time": round(time.time(), 3),
                        "waited_s": round(now - t_asked, 3),
                        "target": hit,
                    }
            if end is not None and time.monotonic() > end:
                return {"kind": kind, "time": round(w.now(), 3), "skipped": "no target"}
            await asyncio.sleep(0.05)

    def _quiet(self, kind: str) -> bool:
        """The previous fault is handled (and, for the proxy, no switch is using it).

        A harness is outside the run's machinery: its kill waits only until the last kill was
        found, not for a cell or engine restart (12-15 s on 2 cores) to come back, which could
        outlast a short run."""
        records = self.records
        if not self.cluster.proxy.alive:
            return False
        if any("target" in k and "handled" not in k for k in self.kills):
            return False  # the last kill is not found and dealt with yet
        if kind == "harness":
            return True
        if self.down:
            return False
        mine = records.faults[self.carried_faults :]  # earlier segments' are closed
        last = {f.cell: f for f in mine}  # a cell's newest loss supersedes
        if any(f.back is None and f.action == "restart" for f in last.values()):
            return False
        return kind != "proxy" or not any(r in _SWITCHING for r in records.roles)

    # ------------------------------------------------------------------ the kills
    async def _kill(self, kind: str) -> dict[str, Any] | None:
        match kind:
            case "rollout_cell" | "cell_hang":
                sig = signal.SIGSTOP if kind == "cell_hang" else signal.SIGKILL
                return self._cell([c for c in self._cells(CellRole.ROLLOUT) if c != 0], sig)
            case "satellite" | "core":
                busy = {a.get("what") for a in self.records.activity.values()}
                if busy & _STEP_END:
                    return None  # a loss in the reduce restarts the segment: another fault
                if kind == "core":
                    return self._cell([0] if 0 not in self.down else [])
                return self._cell([c for c in self._cells(CellRole.TRAINING) if c != 0])
            case "engine" | "engine_hang":
                sig = signal.SIGSTOP if kind == "engine_hang" else signal.SIGKILL
                return self._engine(sig)
            case "proxy":
                return await self._proxy()
            case "harness":
                return self._harness()
        raise ValueError(f"unknown chaos kind {kind!r}")

    def _cells(self, role: CellRole) -> list[int]:
        roles = self.records.roles
        return [c for c in range(len(roles)) if roles[c] is role and c not in self.down]

    def _cell(self, cells: list[int], sig: int = signal.SIGKILL) -> dict[str, Any] | None:
        if not cells:
            return None
        cell = self.rng.choice(cells)
        pid = int(self.cluster.placement[cell]["pid"])
        os.kill(pid, sig)
        return {"cell": cell, "pid": pid, "signal": signal.Signals(sig).name}

    def _engine(self, sig: int) -> dict[str, Any] | None:
        cl = self.cluster
        live = {u for _, u in cl.standalone if u and u not in cl.dead_engines}
        rows = [p for p in cl.placement if "standalone" in p and p.get("url") in live]
        if not rows:
            return None
        row = self.rng.choice(rows)
        os.kill(int(row["pid"]), sig)
        return {
            "engine": row["standalone"],
            "url": row["url"],
            "pid": row["pid"],
            "signal": signal.Signals(sig).name,
        }

    async def _proxy(self) -> dict[str, Any] | None:
        proxy = self.cluster.proxy
        if not proxy.alive:
            return None
        answered = proxy.answered()
        await asyncio.to_thread(proxy.kill)
        return {"proxy": proxy.port, "answered_before": answered}

    def _harness(self) -> dict[str, Any] | None:
        found = harness_pids(self.workspaces)
        if not found:
            return None
        eid = self.rng.choice(sorted(found))
        for pid in found[eid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return {"execution": eid, "pids": found[eid]}

    # ------------------------------------------------------------------ what came of it
    async def _follow(self, rec: dict[str, Any]) -> None:
        """Complete ``rec`` with what the run did: found when and by what, done what, back when."""
        end = time.monotonic() + FOLLOW_S
        while time.monotonic() < end:
            if self._handled(rec):
                return
            await asyncio.sleep(0.2)
        rec.setdefault("handled", False)

    def _handled(self, rec: dict[str, Any]) -> bool:
        records, t = self.records, rec["target"]
        if "cell" in t or "proxy" in t:
            want = t.get("cell")
            kind = "proxy" if "proxy" in t else None
            f = next(
                (
                    f
                    for f in records.faults
                    if f.cell == want
                    and (kind is None or f.kind == kind)
                    and f.unix_time >= rec["unix_time"] - 0.05
                ),
                None,
            )
            if f is None:
                return False
            rec.update(detected_s=round(f.unix_time - rec["unix_time"], 3))
            rec.update(detected_by=f.detected_by, action=f.action, fault_kind=f.kind)
            back = _back(records.faults, f)
            if back is not None:
                rec.update(back_s=round(back - rec["time"], 3), handled=True)
            if f.action != "restart":  # e.g. a loss in the reduce: the segment stops
                rec["handled"] = True
            return bool(rec.get("handled"))
        if "engine" in t:
            return self._engine_handled(rec, t)
        m = _EID.match(t["execution"])
        if m and (int(m[1]), int(m[2])) in self.results:
            rec.update(action="execution recorded as failed", handled=True)
            rec["detected_s"] = round(time.time() - rec["unix_time"], 3)
            return True
        return False

    def _engine_handled(self, rec: dict[str, Any], t: dict[str, Any]) -> bool:
        cl = self.cluster
        ev = next(
            (
                e
                for e in cl.engine_events
                if e.kind == "lost" and e.url == t["url"] and e.at >= rec["unix_time"] - 0.05
            ),
            None,
        )
        if ev is None and t["url"] not in cl.dead_engines:
            return False
        at = ev.at if ev is not None else time.time()
        rec.update(
            detected_s=round(at - rec["unix_time"], 3),
            detected_by="engine heartbeat" if ev is not None else "publication",
            action="taken out of the pool, its calls moved",
            handled=True,
        )
        if t["signal"] == "SIGSTOP":  # found: no stopped process outlives the run
            try:
                os.kill(int(t["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True


def _back(faults: list[FaultRecord], f: FaultRecord) -> float | None:
    """When the cell of fault ``f`` served again: its own ``back``, or, when it was lost again
    while restarting (its new actor hung, say), the ``back`` of its newest loss."""
    if f.back is not None or f.cell is None:
        return f.back
    later = [g for g in faults if g.cell == f.cell and g.time > f.time]
    return later[-1].back if later else None


def harness_pids(workspaces: Path) -> dict[str, list[int]]:
    """Running harness processes of this run, by execution id (the first part of their
    workspace path under ``workspaces``, which their command line or working directory names)."""
    root = str(workspaces.resolve()) + os.sep
    out: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        hits = [a for a in [*args, cwd] if root in a]
        if not hits:
            continue
        eid = hits[0].split(root, 1)[1].split(os.sep, 1)[0]
        if _EID.match(eid):
            out.setdefault(eid, []).append(int(proc.name))
    return out


def carry(chaos: list[dict[str, Any]], faults: list[FaultRecord]) -> int:
    """Close the kills an earlier segment left open (the core's: its segment stopped before it
    could follow it) from the carried fault records; return how many kills were done."""
    for rec in chaos:
        cell = rec.get("target", {}).get("cell")
        if cell is None or (rec.get("handled") and cell != 0):
            continue
        f = next(
            (f for f in faults if f.cell == cell and f.unix_time >= rec["unix_time"] - 0.05),
            None,
        )
        if f is None:
            rec["handled"] = False  # its segment ended before anything found it
            continue
        rec.update(detected_s=round(f.unix_time - rec["unix_time"], 3))
        rec.update(detected_by=f.detected_by, action=f.action, fault_kind=f.kind)
        rec["handled"] = True
    return len(chaos)
