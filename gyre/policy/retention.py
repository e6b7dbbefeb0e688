"""Elastic's core retention at a burst boundary: does the core stay in training?

The paper's test (``paper``, the default) keeps the core only if the rollout side
without it absorbs the outstanding work *plus the whole next dispatch*; at small K
that never holds, so the core pays a switch out and a switch back every burst even
when its rollout stint is shorter than those switches (issue 24: K=3, training-heavy).
``PolicyConfig.core_retention = "adaptive"`` also keeps the core when the rollout side
without it covers the work already outstanding (w, not the next dispatch: that queues for
slots) *and* the core's last rollout stint was shorter than its last switching round trip
(in + out) or than a third of its last training stint, all measured from the policy's own
events: a core that spends longer moving than serving, or trains over 3/4 of its cycle, is
worth more in training, where it also starts the next burst's steps at once. No rule is
broken: the core does not leave rollout (it is not in it), no live execution is
interrupted, satellites still join only under the waterlevel rule. The supply check
(>= rho_min B ready groups) still applies, so the core has work.

Keeping the core whenever w fits, without the stint test, won more at some K=3 points but
lost up to 8 % where executions are long (docs/scheduling.md), so it is not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gyre.policy.cell_roles import CellRole
from gyre.policy.config import CoreRetention, Placement

# ``adaptive`` keeps the core when its rollout stint < its training stint / this (or < its
# switching round trip). Swept in the simulator (docs/scheduling.md): 2 loses up to 1.7 % at
# some K=3 points with heavy tails; 3 lost nowhere; the round trip alone misses most wins.
TRAINING_PER_ROLLOUT = 3.0

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
    training_since: float = 0.0
    training_stint: float = 0.0  # unknown (0) until the core first leaves training

    def left_rollout(self, t: float) -> None:
        self.rollout_stint = t - self.rollout_since
        self.switch_since = t

    def in_training(self, t: float) -> None:
        self.to_training = t - self.switch_since
        self.training_since = t

    def left_training(self, t: float) -> None:
        self.switch_since = t
        self.training_stint = t - self.training_since

    def in_rollout(self, t: float) -> None:
        self.to_rollout = t - self.switch_since
        self.rollout_since = t

    @property
    def stint_too_short(self) -> bool:
        """The last rollout stint was short against the round trip (in + out) that bought it,
        or against the training stint around it."""
        round_trip = self.to_training + self.to_rollout
        return self.rollout_stint < max(round_trip, self.training_stint / TRAINING_PER_ROLLOUT)


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
    return p.config.standalone_capacity + p._Ce * serving
