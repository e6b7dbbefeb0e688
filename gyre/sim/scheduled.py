"""What the simulated world has scheduled: the items of its event heap.

The world's heap holds ``(time, seq, one of these)``. Each becomes the policy's event when
its time comes (:meth:`gyre.sim.world.World._arrive`); the cell fields are the world's own
bookkeeping (which cell's work it is, so a cell's death can void it).
"""

from __future__ import annotations

from typing import NamedTuple

from gyre.policy import CellRole, ExecutionId


class Launched(NamedTuple):
    executions: tuple[ExecutionId, ...]


class MicroDone(NamedTuple):
    cell: int
    step: int
    group_id: int
    micro_index: int  # not `index`: a NamedTuple field would shadow tuple.index


class Switched(NamedTuple):
    cell: int
    role: CellRole


class OptimDone(NamedTuple):
    cell: int
    step: int


class Published(NamedTuple):
    cell: int
    version: int


class Wake(NamedTuple):
    pass


class Lost(NamedTuple):
    cell: int  # -1: a standalone engine of ``slots``
    restart_h: float | None  # None: it never comes back
    slots: int = 0


class Back(NamedTuple):
    cell: int
    slots: int = 0


Scheduled = Launched | MicroDone | Switched | OptimDone | Published | Wake | Lost | Back
