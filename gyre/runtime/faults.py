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

The whole path of a lost rollout cell, in the five files that hold it (nothing else needs
reading to change it; the mechanisms it calls, the proxy's pool and the publications, are
used as they are):

============================== ===========================================================
``runtime/faults.py``          found (:meth:`CellFaults.heartbeat`, or a call's
                               ``ActorDied`` reported to :meth:`CellFaults.lost`), recorded,
                               told to the policy (``bus.emit``: the world's event queue),
                               replaced (:meth:`CellFaults._replace`), its record closed when
                               it serves again (:meth:`CellFaults.back`)
``runtime/cluster.py``         the mechanisms: :meth:`Cluster.take_out` (kill, drain its
                               engine), :meth:`Cluster.replace_cell` (new actor, gloo world,
                               ``cells.json``), :meth:`Cluster.to_rollout` (its new engine)
``policy/faults.py``           ``CellLost``: capacity out, its work requeued; ``CellBack``:
                               ``SwitchCell`` to rollout
``runtime/world.py``           wires the handler (``on_cell_lost``, the calls that report
                               ``ActorDied``), carries out the switch, calls ``back``
``runtime/records.py``         the fault's record (:class:`FaultRecord`), the role timeline
============================== ===========================================================

``bus`` is the world's (:class:`gyre.runtime.handles.EventBus`): ``now()``, ``emit(event)``
for the policy, ``spawn(coro)`` for background work.

The core (cell 0) is restarted in place too: its optimizer state died with its process, but
the checkpoint of the last step it finished (``trainer.checkpoint``, every step by default:
the driver's ``trainer_version``) holds it exactly, so the new actor's first switch into
training loads that checkpoint (``Cluster.resume_from`` points at it) while the rollout
cells, the proxy and every harness go on. No optimizer step is applied twice: a step the dead
core was applying when it died never reached the driver, and its checkpoint (if the core wrote
one) is not the one loaded. The policy requeues the open step and voids a publication in
flight (``gyre.policy.faults``).

What cannot be repaired in place raises :class:`CoreLost` out of the run's segment, and
:mod:`gyre.runtime.supervise` restarts the whole segment from the last checkpoint
(``run.fault.core_restarts`` times) or stops with one line: any cell lost inside the step's
reduce or the core's optimizer step (the core's gradients or weights may be half changed), a
core whose last finished step has no checkpoint (``trainer.checkpoint.every_steps`` > 1), a
multi-rank cell, or ``run.fault.restart = false``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import ray

from gyre.cli_errors import first_line
from gyre.policy import CellBack, CellLost, CellRole
from gyre.runtime import ranks
from gyre.runtime.cluster import Cluster
from gyre.runtime.config import GyreConfig
from gyre.runtime.handles import EventBus
from gyre.runtime.ray_setup import ActorDied, actor_died
from gyre.runtime.records import BREAKS_STEP, FaultRecord, Records
from gyre.runtime.rundir import RunDir


class FatalFault(RuntimeError):
    """A loss the run's segment cannot survive: the segment stops with this line."""


class CoreLost(FatalFault):
    """The core, or a cell inside the step's reduce, was lost: what the core applied since its
    last checkpoint died with it. ``record`` is the fault's entry in ``faults`` (the supervisor
    says there what it did); ``faults`` is the segment's whole list, kept for the next one."""

    def __init__(self, message: str, record: FaultRecord, faults: list[FaultRecord]):
        super().__init__(message)
        self.record = record
        self.faults = faults


class CellFaults:
    """The world's fault handler: heartbeat, loss, restart; what it did goes to the records.

    It drives the cluster's mechanisms (``take_out``, ``replace_cell``), tells the policy
    through ``bus``, and leaves the world's own state to the world: ``forget_work(cell)`` drops
    what the world recorded of a lost cell's work, ``errors`` is the list the world raises
    from, ``running()`` counts the executions a segment's end cuts."""

    def __init__(
        self,
        cfg: GyreConfig,
        cluster: Cluster,
        records: Records,
        rundir: RunDir,
        bus: EventBus,
        *,
        base_step: int,
        errors: list[BaseException],
        forget_work: Callable[[int], None],
        running: Callable[[], int],
    ) -> None:
        self.run_cfg, self.cluster, self.records, self.rundir = cfg, cluster, records, rundir
        self.bus = bus
        self.base_step, self.errors = base_step, errors
        self._forget_work, self._running = forget_work, running
        self.cfg = cfg.run.fault
        self.down: set[int] = set()  # lost, not back yet
        self._open: dict[int, FaultRecord] = {}  # cell -> its fault record until it is back
        self._dead_cores: set[str] = set()  # actor ids of the core's lost processes
        # one gloo world rebuild at a time: each joins every cell's current actor, so two
        # overlapping ones would split the cells between two rendezvous
        self._rebuilding = asyncio.Lock()

    # ------------------------------------------------------------------ detection
    async def heartbeat(self) -> None:
        """Ping every live cell every ``heartbeat_s``; a dead or silent one is lost."""
        hb = self.cfg.heartbeat_s
        self._cells_up()
        while True:
            await asyncio.sleep(hb)
            cells = [c for c in range(self.run_cfg.policy.cells) if c not in self.down]
            results = await asyncio.gather(
                *[self._ping(c, hb) for c in cells], return_exceptions=True
            )
            for c, r in zip(cells, results):
                if isinstance(r, BaseException) and c not in self.down:
                    kind = "hung" if isinstance(r, TimeoutError) else "died"
                    self.lost(c, r, "heartbeat", kind=kind)

    def _cells_up(self) -> None:
        """The segment's cells are up (the heartbeat starts then): a core restart that led here
        is over; its cost is the time from the loss to now."""
        now = round(time.time(), 3)
        for f in list(self.records.faults):
            if f.core_restart and f.back_unix_time is None:
                self.records.complete(f, back_unix_time=now, cost_s=round(now - f.unix_time, 3))

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
        actor = self.cluster.cells[cell]
        return await asyncio.wait_for(actor.ping.remote(), bound)

    # ------------------------------------------------------------------ loss
    def lost(self, cell: int, cause: BaseException, where: str, *, kind: str = "died") -> None:
        """Cell ``cell`` is gone (idempotent): record it, tell the policy, restart it."""
        if cell in self.down:
            return
        self.down.add(cell)
        now = self.bus.now()
        role = self.records.roles[cell]
        first = first_line(cause)[:200]
        stops = self._stops_segment(cell, f"{kind}: {first}")
        action = "run stopped" if stops else "restart" if self.cfg.restart else "none"
        rec = self.records.fault(
            cell=cell,
            kind=kind,
            role=role.value,
            at=now,
            detected_by=where,
            cause=first,
            action=action,
        )
        if stops is not None:
            self.errors.append(self.core_lost(stops, rec))
            return
        self._open[cell] = rec
        self._forget_work(cell)
        self.records.set_role(cell, CellRole.LOST, now)
        if cell == 0:
            self._dead_cores.update(a._actor_id.hex() for a in ranks.actors(self.cluster.cells[0]))
        self.bus.spawn(self._replace(cell, rec))

    def _stops_segment(self, cell: int, why: str) -> str | None:
        """Why losing ``cell`` ends the segment (the supervisor restarts the run from its
        checkpoint), or None when the cell is replaced in place."""
        what = self.records.activity.get(cell, {}).get("what")
        if what in BREAKS_STEP:
            return (
                f"cell {cell} was lost ({why}) during the step's {what.replace('_', ' ')}: "
                "the step cannot complete (`gyre run --resume` continues from the last checkpoint)"
            )
        if cell == 0 and (not self.cfg.restart or self.core_checkpoint() is False):
            every = self.run_cfg.trainer.checkpoint.every_steps
            return (
                f"cell 0 (the core) was lost ({why}); its optimizer state went with it and "
                + (
                    "run.fault.restart is off"
                    if not self.cfg.restart
                    else f"step {self.cluster.trainer_version} has no checkpoint (every_steps = {every})"
                )
                + ": `gyre run --resume` continues from the last checkpoint"
            )
        devices = self.run_cfg.run.cell.devices
        if devices > 1 and self.cfg.restart:
            # the survivors' sharded replicas live on meshes of the world the lost ranks were
            # in: a multi-rank cell cannot join a rebuilt one (ranks.py)
            return (
                f"cell {cell} ({devices} ranks) was lost ({why}); a multi-rank "
                "cell is restarted with the run, from the last checkpoint"
            )
        return None

    def core_checkpoint(self) -> str | None | bool:
        """Where a new core starts: the checkpoint of the last step the driver saw finish (the
        dead core's checkpoint of a step it had not returned is newer, and is not taken); the
        segment's own start (None: the initial weights) when it finished none; False when that
        step has no checkpoint."""
        v = self.cluster.trainer_version
        if v == self.base_step:
            return self.cluster.resume_from
        path = self.rundir.checkpoints / f"step-{v}"
        try:
            state = json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            return False
        return str(path) if state.get("policy_version") == v else False

    def reduce_lost(self, step: int, k: int, cause: BaseException) -> CoreLost:
        """A participant died inside the reduce of ``step`` (cells ``0..k-1``): recorded like any
        loss; the segment cannot finish the step (the core's gradients may be half reduced)."""
        cell = self.cell_of(cause, range(k))
        c = 0 if cell is None else cell
        rec = self.records.fault(
            cell=c,
            kind="died",
            role=self.records.roles[c].value,
            at=self.bus.now(),
            detected_by="reduce",
            cause=first_line(cause)[:200],
            action="run stopped",
        )
        who = "a cell" if cell is None else f"cell {cell}"
        msg = (
            f"{who} died during the reduce of step {step}: the step cannot complete "
            "(`gyre run --resume` continues from the last checkpoint)"
        )
        return self.core_lost(msg, rec)

    def core_lost(self, msg: str, rec: FaultRecord) -> CoreLost:
        """The segment's end: its executions still running are cut (the supervisor's new segment
        relaunches those it keeps a finished sibling of, and dispatches fresh groups for the
        rest), so the record counts them: the work a core restart throws away."""
        rec = self.records.complete(rec, executions_cut=self._running())
        return CoreLost(msg, rec, self.records.faults)

    def cell_of(self, e: BaseException, cells: range) -> int | None:
        """Which of ``cells`` the dead actor behind ``e`` (or its cause) was, if Ray says."""
        ids = {}
        for c in cells:
            if c < len(self.cluster.cells):
                for a in ranks.actors(self.cluster.cells[c]):  # every rank of the cell
                    ids[a._actor_id.hex()] = c
        x: BaseException | None = e
        for _ in range(5):  # the error, or what it was raised from
            if x is None:
                break
            if actor_died(x) and getattr(x, "actor_id", None) in ids:
                return ids[x.actor_id]  # type: ignore[attr-defined]
            x = x.__cause__ or x.__context__
        return None

    async def surfaced(self, e: BaseException) -> None:
        """A background task of the world raised ``e``. If the core is dead (the error says so,
        or it does not answer a ping) its loss is handled as any cell's (in place, or
        :class:`CoreLost` when it cannot be), whatever call found it (a publication's save, a
        satellite's reduce whose peer went), and an error that only said so is not the run's;
        anything else stops the run as it is."""
        if not isinstance(e, CoreLost) and self.cluster.cells:
            if 0 not in self.down:
                dead = self.cell_of(e, range(1)) == 0
                if not dead:
                    try:
                        await self._ping(0, self.cfg.heartbeat_s)
                    except (TimeoutError, ray.exceptions.RayError):  # silent, or gone
                        dead = True
                if dead:
                    self.lost(0, e, "call")
            if self._of_dead_core(e):
                return  # restarted in place: the error was a symptom of the core's loss
        errors = self.errors
        if e not in errors and not any(isinstance(x, CoreLost) and x is not e for x in errors):
            errors.append(e)

    def _of_dead_core(self, e: BaseException) -> bool:
        """Whether ``e`` (or what it was raised from) is a call to a core process that died."""
        x: BaseException | None = e
        for _ in range(5):
            if x is None:
                return False
            if actor_died(x) and getattr(x, "actor_id", None) in self._dead_cores:
                return True
            x = x.__cause__ or x.__context__
        return False

    async def in_reduce(self, step: int, k: int, e: BaseException) -> BaseException:
        """What to raise when the reduce of ``step`` over cells ``0..k-1`` raised ``e``: a
        participant's loss (its own error, or a peer's that a ping finds dead) is
        :class:`CoreLost`; an error of the reduce itself stays as it is."""
        if not actor_died(e) and await self.alive(list(range(k))):
            return e
        queued = [x for x in self.errors if isinstance(x, CoreLost)]
        return queued[0] if queued else self.reduce_lost(step, k, e)

    async def _replace(self, cell: int, rec: FaultRecord) -> None:
        """Kill the actor, move its engine's calls, tell the policy; restart and rejoin."""
        cl, bus, records = self.cluster, self.bus, self.records
        moved = await cl.take_out(cell, f"cell {cell} {rec.kind} ({rec.detected_by})")
        rec = self._open[cell] = records.complete(rec, **moved)
        bus.emit(CellLost(time=bus.now(), cell=cell))
        if not self.cfg.restart:
            return
        t0 = time.perf_counter()
        start = None
        if cell == 0:  # its first switch into training loads the last finished step's checkpoint
            found = self.core_checkpoint()
            start = found if isinstance(found, str) else None
            rec = self._open[cell] = records.complete(rec, checkpoint_step=cl.trainer_version)
        try:
            async with self._rebuilding:
                await cl.replace_cell(cell, start, rec_count(records.faults, cell))
        except ActorDied as e:
            if not await self._rebuild_lost_another(cell, e):
                raise
        rec = self._open[cell] = records.complete(rec, restart_s=round(time.perf_counter() - t0, 3))
        self.down.discard(cell)
        bus.emit(CellBack(time=bus.now(), cell=cell))

    async def _rebuild_lost_another(self, cell: int, e: BaseException) -> bool:
        """The world rebuilt for ``cell``'s new actor failed because another cell died (seen:
        one killed as hung by the heartbeat while it was due to join). That is the other
        cell's loss, whose own replacement rebuilds the world again, with ``cell``'s new actor
        in it; so ``cell`` is back. False when no other cell is found dead (its own new actor
        died, say): then the error is the run's, as before."""
        others = [c for c in range(len(self.cluster.cells)) if c != cell]
        who = self.cell_of(e, range(len(self.cluster.cells)))
        if who == cell:
            return False
        if who is not None:
            self.lost(who, e, "rebuild")
            return True
        await self.alive([c for c in others if c not in self.down])  # pings find the dead
        return bool(self.down.intersection(others))

    def back(self, cell: int) -> None:
        """The restarted cell serves again (its switch to rollout is done)."""
        rec = self._open.pop(cell, None)
        if rec is not None:
            self.records.complete(rec, back=round(self.bus.now(), 3))


def rec_count(faults: list[FaultRecord], cell: int) -> int:
    """How many times ``cell`` was restarted so far."""
    return sum(1 for f in faults if f.cell == cell and f.action == "restart")
