"""The simulated world's fault handler: a cell's process dies, and comes back later.

The virtual-time twin of :mod:`gyre.runtime.faults` (which finds a dead or hung actor, kills
it and restarts it): here a fault is scheduled (``Lost`` at its time, as
:mod:`gyre.sim.faults` parses the schedule), and handled the same way: what the cell had
scheduled is void, its capacity leaves (its executions' calls move, as the proxy's drain
does), the policy gets ``CellLost``, and ``restart_h`` later ``CellBack``. The core is lost
like any cell: a publication it had in flight is void too (the policy publishes again when
it is back), and ``restart_h`` stands for its new process loading the last checkpoint. As in
the runtime, a participant lost during the step's reduce stops the run, unless the faults are
the chaos nemesis's (``World(kills_wait_reduce=True)``): its kill waits for the reduce to end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gyre.policy import (
    CellBack,
    CellLost,
    CellRole,
    EngineBack,
    EngineLost,
    PolicyError,
    Tick,
)
from gyre.sim.scheduled import Back, Lost, MicroDone, Published, Scheduled, Switched

if TYPE_CHECKING:
    from gyre.sim.world import World


class CellFaults:
    """Which scheduled completions belong to which cell (void once it dies), and what died
    when (``log``: one row per loss and per return, for the fault report)."""

    def __init__(
        self, world: World, faults: tuple[tuple[int, float, float | None, int], ...]
    ) -> None:
        self.world = world
        self._pending: list[set[int]] = [set() for _ in range(world.K)]
        self._void: set[int] = set()
        self.log: list[dict[str, float | int | str]] = []
        for cell, at_h, restart_h, slots in faults:
            world._push(at_h, Lost(cell, restart_h, slots))

    def track(self, cell: int, seq: int) -> None:
        """``seq`` is ``cell``'s work: void if the cell dies before it is due."""
        self._pending[cell].add(seq)

    def due(self, seq: int, what: Scheduled) -> bool:
        """Whether the scheduled item ``seq`` still happens (its cell did not die since)."""
        if seq in self._void:
            self._void.discard(seq)
            return False
        if isinstance(what, MicroDone | Switched | Published):
            self._pending[what.cell].discard(seq)
        return True

    def lose(self, t: float, what: Lost) -> CellLost | EngineLost | Tick:
        """A cell's process dies: what it had scheduled is void, its capacity leaves, and it
        comes back ``restart_h`` later. A standalone engine's slots leave alike (its calls
        move to the other engines: no execution is cut)."""
        w = self.world
        cell = what.cell
        if cell < 0:
            w._account()
            w.capacity -= what.slots
            w._rerate()
            self.log.append({"engine": 0, "lost_h": t, "slots": what.slots})
            if what.restart_h is not None:
                w._push(t + what.restart_h, Back(cell, what.slots))
            return EngineLost(time=t, capacity=what.slots)
        if w._reducing and w.roles[cell] is CellRole.TRAINING:
            if w.kills_wait_reduce:  # the nemesis's kill waits for the step's end (its OptimDone
                w._push(w._reduce_end, what)  # was pushed first, so it pops first)
                return Tick(time=t)
            # as the runtime: a participant lost in the reduce stops the run
            raise PolicyError(f"cell {cell} was lost during the step's reduce: the run stops")
        w._account()
        self._void |= self._pending[cell]
        self._pending[cell] = set()
        w._busy_end(cell)
        if w.roles[cell] is CellRole.ROLLOUT:
            w.capacity -= w.Ce
            w._reroute(cell)
        self.log.append({"cell": cell, "lost_h": t, "role": w.roles[cell].value})
        w._set_role(cell, CellRole.LOST)
        w._rerate()
        if what.restart_h is not None:
            w._push(t + what.restart_h, Back(cell))
        return CellLost(time=t, cell=cell)

    def back(self, t: float, what: Back) -> CellBack | EngineBack:
        if what.cell < 0:
            self.world._account()
            self.world.capacity += what.slots
            self.world._rerate()
            self.log.append({"engine": 0, "back_h": t})
            return EngineBack(time=t, capacity=what.slots)
        self.log.append({"cell": what.cell, "back_h": t})
        return CellBack(time=t, cell=what.cell)
