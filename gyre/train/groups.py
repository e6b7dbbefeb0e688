"""From trace files to a ready group: read -> trajectory tree -> admission.

The glue between the proxy's trace store and the packing buffer. For each execution of
a group: read its JSONL trace (bad lines are reported, not fatal), build its trajectory
tree with the harness's role profile, and run admission with a per-execution seed (so
a re-run after a crash admits the same paths). A missing assessment stays
``Missing``; an unreadable trace makes the execution missing too (``trace_unreadable``),
never a zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre.trace.assessment import Missing, MissingReason
from gyre.trace.toolhealth import ToolHealth, execution_health
from gyre.train.buffer import ReadyGroup
from gyre.train.rewards import Reward


@dataclass
class GroupReport:
    """What happened while building a group (for logs and metrics)."""

    trace_errors: dict[str, list[str]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)  # execution -> reason (made missing)
    health: dict[str, ToolHealth] = field(default_factory=dict)  # of the traces read (scored)


def group_from_traces(
    group_id: str,
    traces: Mapping[str, str | Path],
    rewards: Mapping[str, Reward],
    *,
    j_max: int | None,
    seed: int,
    role_profile=None,
    step: int = 0,
    vocab_size: int | None = None,
) -> tuple[ReadyGroup, GroupReport]:
    """A :class:`ReadyGroup` from execution id -> trace file and execution id -> reward.

    Every execution needs a reward entry (score, or ``Missing``); a trace
    without one is an error, because "not assessed yet" means the group is not ready.
    ``j_max`` and ``seed`` have no defaults here: they are the trainer's
    (:class:`~gyre.train.config.TrainerConfig`), declared once there.
    """
    from gyre.trace.admission import admit, execution_seed
    from gyre.trace.store import read_trace
    from gyre.trace.tree import build_tree

    no_reward = sorted(set(traces) - set(rewards))
    if no_reward:
        raise ValueError(f"group {group_id!r} is not ready: no reward for {no_reward[:3]}")
    report = GroupReport()
    out_rewards: dict[str, Reward] = {}
    admissions = {}
    for eid, r in rewards.items():
        path = traces.get(eid)
        if isinstance(r, Missing):
            out_rewards[eid] = r
            continue
        if path is None or not Path(path).exists():
            report.unreadable[eid] = f"no trace file ({path})"
            out_rewards[eid] = Missing(
                reason=MissingReason.trace_unreadable, detail="no trace file"
            )
            continue
        res = read_trace(path, vocab_size)
        if res.errors:
            report.trace_errors[eid] = res.errors
        report.health[eid] = execution_health(res.records, role_profile)
        if not res.records:
            report.unreadable[eid] = "no usable records"
            out_rewards[eid] = Missing(
                reason=MissingReason.trace_unreadable, detail="no usable records"
            )
            continue
        tree = build_tree(res.records, role_profile, vocab_size=vocab_size, execution_id=eid)
        admissions[eid] = admit(tree, j_max, seed=execution_seed(seed, eid, step))
        out_rewards[eid] = r
    return ReadyGroup(group_id=group_id, rewards=out_rewards, admissions=admissions), report
