"""Rewards and group-relative advantages (pure python, no torch).

A reward is either a *score* (a number, including a harness timeout scored on its
preserved workspace) or *missing* (the evaluator crashed, the overall budget ran
out): :class:`gyre.trace.assessment.Missing`, the very type the harness produces, with
its reason. A missing assessment is not a zero: the execution leaves its group, and
the advantages are those of the N-1 (or fewer) scored executions.

All-equal groups: when every scored execution of a group has the same score,
``R_e - mean`` is 0 for all of them, so they carry no learning signal. We keep
that literally: their advantages are 0, they give no gradient (the packing
buffer does not even pack them) but they still count as scored executions of
the batch (the batch loss is a mean over scored executions), and the metrics
count them (``batch/groups_all_equal``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gyre.trace.assessment import Missing

Reward = float | Missing


@dataclass
class GroupAdvantages:
    """Advantages of one group's scored executions."""

    advantages: dict[str, float]
    scored: list[str]
    missing: list[str]
    all_equal: bool
    mean: float = 0.0
    std: float = 0.0
    notes: dict = field(default_factory=dict)

    @property
    def n_scored(self) -> int:
        return len(self.scored)


def group_advantages(
    rewards: Mapping[str, Reward], *, eps: float = 1e-6, std: str = "population"
) -> GroupAdvantages:
    """A_e = (R_e - mean of the group's scores) / (std + eps) over scored executions only.

    ``rewards`` maps execution id -> score (float/int) or :class:`Missing`. Raises
    ``ValueError`` on a non-finite or non-numeric score (``None`` included: a missing
    assessment says so with ``Missing`` and its reason) so a broken scorer cannot
    silently become a reward.
    """
    scored: dict[str, float] = {}
    missing: list[str] = []
    for eid, r in rewards.items():
        if isinstance(r, Missing):
            missing.append(eid)
            continue
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise ValueError(
                f"reward of execution {eid!r} must be a number or Missing, got {type(r).__name__}"
            )
        if not math.isfinite(r):
            raise ValueError(f"reward of execution {eid!r} is not finite: {r!r}")
        scored[eid] = float(r)
    if not scored:
        return GroupAdvantages(advantages={}, scored=[], missing=missing, all_equal=True)
    vals = list(scored.values())
    mean = sum(vals) / len(vals)
    if std == "sample" and len(vals) > 1:
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    else:
        var = sum((v - mean) ** 2 for v in vals) / len(vals)
    sd = math.sqrt(var)
    all_equal = all(v == vals[0] for v in vals)
    if all_equal:
        adv = {e: 0.0 for e in scored}
    else:
        adv = {e: (v - mean) / (sd + eps) for e, v in scored.items()}
    return GroupAdvantages(
        advantages=adv, scored=list(scored), missing=missing, all_equal=all_equal, mean=mean, std=sd
    )
