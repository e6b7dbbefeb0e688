"""The policy's shared state: what its rules, its fault handlers and the core's retention test
all read and write.

:class:`~gyre.policy.scheduling.SchedulingPolicy` is a :class:`PolicyState` with the rules that
move it; :mod:`gyre.policy.faults` (a cell or engine lost or back) and
:mod:`gyre.policy.retention` (does the core stay at a boundary) take the state, not the policy,
so none of them imports another and each field here has one definition. The policy's own
bookkeeping (queue, groups, counters only its rules touch) stays in the policy.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gyre.policy.cell_roles import CellRole
from gyre.policy.config import Placement, PolicyConfig


@dataclass(slots=True)
class CoreClock:
    """The core's last rollout stint and switching times, from event times (world units)."""

    rollout_since: float = 0.0  # the core starts the run in rollout
    switch_since: float = 0.0
    rollout_stint: float = math.inf  # unknown until the core first leaves rollout
    to_training: float = 0.0
    to_rollout: float = 0.0

    def left_rollout(self, t: float) -> None:
        self.rollout_stint = t - self.rollout_since
        self.switch_since = t

    def in_training(self, t: float) -> None:
        self.to_training = t - self.switch_since

    def left_training(self, t: float) -> None:
        self.switch_since = t

    def in_rollout(self, t: float) -> None:
        self.to_rollout = t - self.switch_since
        self.rollout_since = t

    @property
    def stint_too_short(self) -> bool:
        """The last rollout stint was shorter than the round trip (in + out) that bought it."""
        return self.rollout_stint < self.to_training + self.to_rollout


class PolicyState:
    """Roles, capacity and the open step's bookkeeping, shared by the rules and the fault
    handlers. ``K`` cells of ``Ce`` slots each (the paper's names)."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        c = config
        self.K = c.cells
        self.Ce = c.cell_capacity
        self.placement = c.placement
        self.supply_groups = c.supply_groups  # derived config values, cached off the hot path
        self.roles: list[CellRole] = [CellRole.ROLLOUT] * c.cells
        if c.placement is Placement.ASYNC:
            for i in range(c.train_cells):
                self.roles[i] = CellRole.TRAINING
        self.standalone_live = c.standalone_capacity  # less a lost standalone engine's slots
        self.capacity = c.standalone_capacity + c.cell_capacity * self.roles.count(CellRole.ROLLOUT)
        self.dispatched = 0
        self.finished = 0
        self.ready: list[tuple[int, int, int]] = []  # heap of (version, seq, group_id)
        self.steps_done = 0
        # current step
        self.step_open = False
        self.micro: deque[tuple[int, int]] = deque()
        self.inflight = 0
        self.finishing = False
        self.busy = [False] * c.cells
        # faults: each cell's claim in flight and micro-steps done in the open step (a lost
        # satellite's go back to the queue), and cells whose claim in flight was void
        self.claim: list[tuple[int, int] | None] = [None] * c.cells
        self.done_by: list[list[tuple[int, int]]] = [[] for _ in range(c.cells)]
        self.void: set[int] = set()
        self.lost = 0  # CellLost events handled
        # burst boundary
        self.boundary = False
        self.republish = False  # the core was lost during its publication: it publishes again
        self.core_stays = False
        self.core_clock = CoreClock()  # the core's measured rollout stint and switches

    @property
    def waterlevel(self) -> int:
        """w(t) = dispatched - finished: every queued or running execution."""
        return self.dispatched - self.finished
