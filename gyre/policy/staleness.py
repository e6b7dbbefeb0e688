"""Scheduling staleness under boundary dispatch.

With mu optimizer steps per burst and phi extra batches in flight, new groups
enter only right after a weight publication, topping the outstanding queue up to
Q_b = (phi + mu) B groups. Counting argument (paper, Appendix A): every surviving
group ages by one version per update, replacements enter at age zero, and in
steady state the total outstanding age does not drift, so the group-weighted mean
version gap between sampler and trainer is

    E[d] = phi + (mu - 1) / 2.

(mu - 1) / 2 is the mean position of a step inside its burst; phi is the extra
age of work dispatched ahead. Compare placements only at equal E[d].
"""

from __future__ import annotations

from fractions import Fraction

from gyre.policy.config import Placement


def expected_staleness(phi: float, mu: int) -> float:
    """E[d] = phi + (mu - 1) / 2."""
    if mu < 1 or phi < 0:
        raise ValueError(f"need mu >= 1 and phi >= 0, got phi={phi}, mu={mu}")
    return phi + (mu - 1) / 2.0


def staleness_pairs(
    placement: Placement | str,
    target: float,
    batch_groups: int | None = None,
    max_mu: int = 16,
) -> list[tuple[float, int]]:
    """All (phi, mu) with phi + (mu - 1)/2 == target that ``placement`` can run, by increasing mu.

    Colocate cannot dispatch ahead without interrupting live executions, so it
    only gets phi = 0 (hence mu = 2 * target + 1, which must be a whole number).
    With ``batch_groups`` given, phi * B must be a whole number of groups.
    """
    placement = Placement(placement)
    if target < 0:
        raise ValueError(f"target staleness must be >= 0, got {target}")
    t = Fraction(target).limit_denominator(10_000)
    out: list[tuple[float, int]] = []
    for mu in range(1, max_mu + 1):
        phi = t - Fraction(mu - 1, 2)
        if phi < 0:
            break
        if placement is Placement.COLOCATE and phi != 0:
            continue
        if batch_groups is not None and (phi * batch_groups).denominator != 1:
            continue
        out.append((float(phi), mu))
    return out
