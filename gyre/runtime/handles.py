"""What the runtime's supervisors may ask of the world they report to.

The world (:class:`gyre.runtime.world.RealWorld`) is the only writer of roles and step state;
a supervisor (a cell's or an engine's fault handler, the proxy's watchdog, the chaos nemesis)
takes its config section, the mechanisms it drives (the cluster's methods, the records) and
this bus, through which it tells the policy what happened and runs its background work. None
of them imports the world, so knowledge runs one way.
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
