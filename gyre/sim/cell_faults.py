"""The simulated world's fault ledger: which scheduled work belongs to which cell, and what died
when.

The virtual-time twin of :mod:`gyre.runtime.faults` (which finds a dead or hung actor, kills
it and restarts it): here a fault is scheduled (``Lost`` at its time, as
:mod:`gyre.sim.faults` parses the schedule) and the world handles it
(:meth:`gyre.sim.world.World._lose`): what the cell had scheduled is void (this ledger), its
capacity leaves (its executions' calls move, as the proxy's drain does), the policy gets
``CellLost``, and ``restart_h`` later ``CellBack``. The core is lost like any cell: a
publication it had in flight is void too (the policy publishes again when it is back), and
``restart_h`` stands for its new process loading the last checkpoint. As in the runtime, a
participant lost during the step's reduce stops the run, unless the schedule spares the reduce
(``World(spare_reduce=True)``): such a fault waits for the reduce to end.
"""

from __future__ import annotations

from gyre.sim.scheduled import MicroDone, Published, Scheduled, Switched


class CellFaults:
    """Which scheduled completions belong to which cell (void once it dies), and what died
    when (``log``: one row per loss and per return, for the fault report)."""

    def __init__(self, cells: int) -> None:
        self._pending: list[set[int]] = [set() for _ in range(cells)]
        self._void: set[int] = set()
        self.log: list[dict[str, float | int | str]] = []

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

    def void(self, cell: int) -> None:
        """``cell`` died: everything it had scheduled is void."""
        self._void |= self._pending[cell]
        self._pending[cell] = set()
