"""A cell that dies or hangs: found, taken out, restarted, and told to the policy.

Found two ways: any call to the cell's actor raises Ray's ``RayActorError`` (the actor
died: killed, OOM, crashed), or its heartbeat (``Cell.ping``, in a concurrency group of its
own, so a training cell answers it too) does not answer within ``run.fault.heartbeat_s``
(hung: e.g. SIGSTOP). Then, in this order:

1. the actor is killed (a hung process holds its engine's sockets open; a killed one breaks
   them), and its engine leaves the proxy's pool through the pool's own drain: every call it
   held resumes on another engine with the tokens generated so far;
2. the policy gets ``CellLost``: the capacity leaves, a satellite's micro-steps go back to the
   queue (the world drops what it had recorded of them);
3. a new actor with the same cell id starts, every cell rebuilds the gloo world with it (the
   prefix communicators of the new membership), and the policy gets ``CellBack``: it sends the
   cell to rollout, whose switch starts an engine on the newest published weights.

The core (cell 0) is not restarted: its optimizer state lives in its process, so its loss
ends the run with one line (``gyre run --resume`` continues from the last checkpoint).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import ray

from gyre.policy import CellBack, CellLost, CellRole

if TYPE_CHECKING:
    from gyre.runtime.world import RealWorld


class FatalFault(RuntimeError):
    """A loss the run cannot survive (the core, or a cell in the step's reduce): the run stops
    with this line."""


def actor_died(e: BaseException) -> bool:
    """Whether ``e`` says the actor behind a call is gone (not an error of the call itself)."""
    return isinstance(e, ray.exceptions.RayActorError)


class CellFaults:
    """The world's fault handler: heartbeat, loss, restart; what it did goes to the records."""

    def __init__(self, world: RealWorld) -> None:
        self.world = world
        self.cfg = world.cfg.run.fault
        self.down: set[int] = set()  # lost, not back yet
        self._open: dict[int, dict[str, Any]] = {}  # cell -> its fault record until it is back

    # ------------------------------------------------------------------ detection
    async def heartbeat(self) -> None:
        """Ping every live cell every ``heartbeat_s``; a dead or silent one is lost."""
        hb = self.cfg.heartbeat_s
        while True:
            await asyncio.sleep(hb)
            cells = [c for c in range(self.world.K) if c not in self.down]
            results = await asyncio.gather(
                *[self._ping(c, hb) for c in cells], return_exceptions=True
            )
            for c, r in zip(cells, results):
                if isinstance(r, BaseException) and c not in self.down:
                    kind = "hung" if isinstance(r, TimeoutError) else "died"
                    self.lost(c, r, "heartbeat", kind=kind)

    async def alive(self, cells: list[int]) -> bool:
        """Ping ``cells`` at once (a dead actor answers in milliseconds): any lost is reported
        and False returned. The world asks before a reduce, which a dead participant would
        break (an idle satellite's death is otherwise found only by the next heartbeat)."""
        bound = self.cfg.heartbeat_s
        results = await asyncio.gather(
            *[self._ping(c, bound) for c in cells], return_exceptions=True
        )
        ok = True
        for c, r in zip(cells, results):
            if isinstance(r, BaseException):
                kind = "hung" if isinstance(r, TimeoutError) else "died"
                self.lost(c, r, "reduce_check", kind=kind)
                ok = False
        return ok and not self.down.intersection(cells)

    async def _ping(self, cell: int, bound: float) -> int:
        actor = self.world.cluster.cells[cell]
        return await asyncio.wait_for(actor.ping.remote(), bound)

    # ------------------------------------------------------------------ loss
    def lost(self, cell: int, cause: BaseException, where: str, *, kind: str = "died") -> None:
        """Cell ``cell`` is gone (idempotent): record it, tell the policy, restart it."""
        if cell in self.down:
            return
        w = self.world
        self.down.add(cell)
        now = w.now()
        role = w.roles[cell]
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        rec: dict[str, Any] = {
            "cell": cell,
            "kind": kind,
            "role": role.value,
            "time": round(now, 3),
            "unix_time": round(time.time(), 3),  # to compare with when a test killed it
            "detected_by": where,
            "cause": first,
            "action": "restart" if self.cfg.restart and cell != 0 else "none",
            "back": None,
        }
        w.records.faults.append(rec)
        if w.records.activity.get(cell, {}).get("what") == "reduce":
            rec["action"] = "run stopped"
            w.errors.append(
                FatalFault(
                    f"cell {cell} was lost ({kind}: {first}) during the step's reduce: the step "
                    "cannot complete (`gyre run --resume` continues from the last checkpoint)"
                )
            )
            return
        if cell == 0:
            rec["action"] = "run stopped"
            w.errors.append(
                FatalFault(
                    f"cell 0 (the core) was lost ({kind}: {first}); its optimizer state went "
                    "with it: `gyre run --resume` continues from the last checkpoint"
                )
            )
            return
        self._open[cell] = rec
        w.forget_cell_work(cell)
        w.records.set_role(cell, CellRole.LOST, now)
        w._spawn(self._replace(cell, rec))

    async def _replace(self, cell: int, rec: dict[str, Any]) -> None:
        """Kill the actor, move its engine's calls, tell the policy; restart and rejoin."""
        w = self.world
        cl = w.cluster
        old = cl.cells[cell]
        try:
            ray.kill(old, no_restart=True)
        except Exception:  # already gone
            pass
        url = cl.urls[cell]
        cl.urls[cell] = None
        if url is not None and cl.proxy is not None:
            t0 = time.perf_counter()
            moved0 = cl.proxy.service.pool.counters.moved
            try:
                await asyncio.to_thread(cl.proxy.remove_engine, url, 30)
            except Exception:
                pass
            rec["moved_calls"] = cl.proxy.service.pool.counters.moved - moved0
            rec["engine_removed_s"] = round(time.perf_counter() - t0, 3)
        w._emit(CellLost(time=w.now(), cell=cell))
        if not self.cfg.restart:
            return
        t0 = time.perf_counter()
        cl.cells[cell] = cl.cell_actor(cell)
        await cl.build_world()  # the survivors and the new actor: the new membership's world
        rec["restart_s"] = round(time.perf_counter() - t0, 3)
        pid = await cl.cells[cell].pid.remote()
        if cell < len(cl.placement):  # cells.json names the new process
            cl.placement[cell] = {**cl.placement[cell], "pid": pid, "restarts": rec_count(w, cell)}
            cl.placement[cell].pop("url", None)
            w.rundir.write_cells(cl.placement)
        self.down.discard(cell)
        w._emit(CellBack(time=w.now(), cell=cell))

    def back(self, cell: int) -> None:
        """The restarted cell serves again (its switch to rollout is done)."""
        rec = self._open.pop(cell, None)
        if rec is not None:
            rec["back"] = round(self.world.now(), 3)
            rec["cost_s"] = round(rec["back"] - rec["time"], 3)


def rec_count(world: RealWorld, cell: int) -> int:
    """How many times ``cell`` was restarted so far."""
    return sum(1 for f in world.records.faults if f["cell"] == cell and f["action"] == "restart")
