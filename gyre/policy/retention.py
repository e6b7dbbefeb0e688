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

from gyre.policy.cell_roles import CellRole
from gyre.policy.config import CoreRetention, Placement
from gyre.policy.state import PolicyState


def core_stays(p: PolicyState, cap_without_core: int, next_dispatch: int) -> bool:
    """The retention test at a boundary (see the module docstring); Colocate's gang and a
    ``paper`` config get the paper's test."""
    if len(p.ready) < p.supply_groups:
        return False
    w = p.waterlevel
    if cap_without_core >= w + next_dispatch:
        return True  # the paper's test: every rule agrees
    rule = p.config.core_retention
    if p.placement is not Placement.ELASTIC or rule is CoreRetention.PAPER:
        return False  # colocate's gang keeps the paper's test: its pool is the whole cluster
    cap = _serving_after(p)
    return 0 < cap and w <= cap and p.core_clock.stint_too_short


def _serving_after(p: PolicyState) -> int:
    """Rollout capacity without the core right after the boundary: a satellite mid-switch into
    training (it goes back once there) or lost serves nothing yet."""
    out = (CellRole.LOST, CellRole.TO_TRAINING)
    serving = sum(p.roles[i] not in out for i in range(1, p.K))
    return p.standalone_live + p.Ce * serving
