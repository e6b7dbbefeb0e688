"""Elastic's core retention at a burst boundary: does the core stay in training?

The paper's test (``paper``, the default) keeps the core only if the rollout side
without it absorbs the outstanding work *plus the whole next dispatch*; at small K
that never holds, so the core pays a switch out and a switch back every burst even
when its rollout stint is shorter than those switches (issue 24: K=3, training-heavy).
``PolicyConfig.core_retention = "adaptive"`` also keeps the core when the rollout side
without it covers the work already outstanding (w, not the next dispatch: that queues for
slots) *and* the core's last rollout stint was shorter than its last switching round trip
(in + out), both measured from the policy's own events: a core that spends longer moving
than serving is worth more in training, where it also starts the next burst's steps at
once. No rule is broken: the core does not leave rollout (it is not in it), no live
execution is interrupted, satellites still join only under the waterlevel rule. The
supply check (>= rho_min B ready groups) still applies, so the core has work.

Tried and dropped (docs/scheduling.md): keeping the core whenever w fits (won more at some
K=3 points, lost up to 8 % where executions are long), a stint below twice the round trip
(lost up to 5 %), or below a third of the core's training stint (lost 1.6 % on the
flagship with 4x training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gyre.policy.cell_roles import CellRole
from gyre.policy.config import CoreRetention, Placement

if TYPE_CHECKING:
    from gyre.policy.scheduling import SchedulingPolicy


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


def core_stays(p: SchedulingPolicy, cap_without_core: int, next_dispatch: int) -> bool:
    """The retention test at a boundary (see the module docstring); Colocate's gang and a
    ``paper`` config get the paper's test."""
    if len(p._ready) < p._supply_groups:
        return False
    w = p.waterlevel
    if cap_without_core >= w + next_dispatch:
        return True  # the paper's test: every rule agrees
    rule = p.config.core_retention
    if p.placement is not Placement.ELASTIC or rule is CoreRetention.PAPER:
        return False  # colocate's gang keeps the paper's test: its pool is the whole cluster
    cap = _serving_after(p)
    return 0 < cap and w <= cap and p.core_clock.stint_too_short


def _serving_after(p: SchedulingPolicy) -> int:
    """Rollout capacity without the core right after the boundary: a satellite mid-switch into
    training (it goes back once there) or lost serves nothing yet."""
    out = (CellRole.LOST, CellRole.TO_TRAINING)
    serving = sum(p.roles[i] not in out for i in range(1, p._K))
    return p.standalone_live + p._Ce * serving
