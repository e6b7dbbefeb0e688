"""What the runtime's supervisors may ask of the world they report to.

The world (:class:`gyre.runtime.world.RealWorld`) is the only writer of roles and step state;
a supervisor (a cell's or an engine's fault handler, the proxy's watchdog) takes its config section, the mechanisms it drives (the cluster's methods, the records) and
this bus, through which it tells the policy what happened and runs its background work. None
of them imports the world, so knowledge runs one way.

A :class:`Rig` is the one hook for what is not the product: a test or benchmark facility that
a caller attaches to a world (:meth:`RealWorld.attach`) and that reads and drives the run
through the same public handles. The world knows rigs only by this protocol.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from gyre.policy import Event


class EventBus(Protocol):
    """The world's clock, its event queue and its background tasks."""

    def now(self) -> float:
        """Seconds since the run (its segment's clock) began."""
        ...

    def emit(self, ev: Event) -> None:
        """Queue ``ev`` for the policy."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; what it raises stops the run with its cause (a dead
        core's symptom is handled as the core's loss)."""
        ...


class Rig(Protocol):
    """A test or benchmark facility attached to a run from outside (``RealWorld.attach``).

    The world runs it beside the run, shows its counts in the live view apart from the run's
    faults, puts what it recorded in ``summary.json`` under its ``name``, and closes it when the
    segment ends (a rig keeps what the next segment needs in the run directory itself)."""

    name: str

    async def run(self) -> None:
        """Its work, spawned on the world's bus once the cells are up."""
        ...

    def counts(self) -> dict[str, int]:
        """What the live view shows of it: label -> count (never counted as the run's faults)."""
        ...

    def rows(self) -> list[dict[str, Any]]:
        """What it recorded, for ``summary.json[name]``."""
        ...

    def close(self) -> None:
        """The segment ends (finished, or stopped by a fault)."""
        ...
