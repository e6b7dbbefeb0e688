"""Tool-call health of executions, counted from their trace records alone.

Reward can rise while the agent loop is broken: a tool-call format the proxy's parser never
matches makes every execution end after one turn with no tool call, and the trainer still
sees rewards. These counts make that visible per step and per harness profile (metrics
``tools/*``, docs/runtime.md). They are a pure function of what the proxy recorded:

- ``turns``: model calls the policy answered (abort records, whose client hung up, excluded);
- ``calls``: tool calls the proxy parsed out of the outputs (meta ``n_tool_calls``);
- ``unparsed``: tool calls written in an output that the proxy could not parse (broken JSON,
  cut off) and returned as text (meta ``n_tool_calls_unparsed``);
- ``truncated``: outputs cut at the token limit (``finish_reason == "length"``);
- ``no_call_executions``: executions with no parsed tool call at all (no model call included);
- ``compactions``: calls whose role is main-summary or sub-agent-summary;
- ``subagent_calls``: calls whose role is sub-agent or sub-agent-summary.

Roles come from the harness's :class:`~gyre.trace.roles.RoleProfile`, the same rules the
trajectory trees use. Traces written before the proxy counted unparsed calls read as 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .record import TraceRecord
from .roles import Role, RoleProfile, default_profile

PREFIX = "tools/"
BY_PROFILE = "tools/by_profile/"
SUMS = "toolhealth/"  # per-profile sums carried between groups and steps (not a metric name)

# the published metric suffixes, in table order
METRICS = (
    "calls",
    "unparsed",
    "truncated",
    "no_call_executions",
    "turns_per_execution",
    "compactions",
    "subagent_calls",
)

_SUMMARY = (Role.MAIN_SUMMARY, Role.SUB_AGENT_SUMMARY)
_SUB = (Role.SUB_AGENT, Role.SUB_AGENT_SUMMARY)


@dataclass
class ToolHealth:
    """Counts over one or more executions (add them with ``+``)."""

    executions: int = 0
    turns: int = 0
    calls: int = 0
    unparsed: int = 0
    truncated: int = 0
    no_call_executions: int = 0
    compactions: int = 0
    subagent_calls: int = 0

    def __add__(self, other: ToolHealth) -> ToolHealth:
        return ToolHealth(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    @property
    def turns_per_execution(self) -> float:
        return self.turns / self.executions if self.executions else 0.0

    def metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """The published values under ``prefix`` (``tools/`` or ``tools/by_profile/<p>/``)."""
        return {f"{prefix}{m}": getattr(self, m) for m in METRICS}

    def sums(self, profile: str) -> dict[str, int]:
        """Summable counts keyed by profile, for a step's running totals (``from_sums`` reads)."""
        p = profile_key(profile)
        return {f"{SUMS}{p}/{f.name}": getattr(self, f.name) for f in fields(self)}


def profile_key(name: str) -> str:
    """A profile name usable inside a metric name (TensorBoard, W&B and MLflow all take it)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def execution_health(
    records: Iterable[TraceRecord], role_profile: RoleProfile | None = None
) -> ToolHealth:
    """One execution's counts from its trace records (any order; none: an execution that
    never reached the policy, so it made no tool call)."""
    recs = sorted(records, key=lambda r: r.seq)
    profile = role_profile or default_profile()
    first_meta = recs[0].meta if recs else {}
    h = ToolHealth(executions=1)
    for r in recs:
        h.truncated += int(r.finish_reason == "length")
        h.calls += _count(r.meta, "n_tool_calls")
        h.unparsed += _count(r.meta, "n_tool_calls_unparsed")
        if r.finish_reason == "abort":
            continue
        h.turns += 1
        role = profile.role_of(r.meta, first_meta)
        h.compactions += int(role in _SUMMARY)
        h.subagent_calls += int(role in _SUB)
    h.no_call_executions = int(h.calls == 0)
    return h


def _count(meta: Mapping[str, Any], key: str) -> int:
    v = meta.get(key, 0)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def from_sums(sums: Mapping[str, Any]) -> dict[str, ToolHealth]:
    """Profile -> counts, from a mapping holding ``ToolHealth.sums`` keys (others ignored)."""
    names = {f.name for f in fields(ToolHealth)}
    out: dict[str, ToolHealth] = {}
    for k, v in sums.items():
        if not k.startswith(SUMS):
            continue
        profile, _, name = k[len(SUMS) :].rpartition("/")
        if name in names and profile:
            h = out.setdefault(profile, ToolHealth())
            setattr(h, name, getattr(h, name) + int(v))
    return out


def tool_metrics(sums: Mapping[str, Any]) -> dict[str, float]:
    """A step's ``tools/*`` metrics (all profiles together, then each under
    ``tools/by_profile/<profile>/``) from its summed counts; empty when there are none."""
    per = from_sums(sums)
    if not per:
        return {}
    total = ToolHealth()
    for h in per.values():
        total = total + h
    out = total.metrics()
    for p in sorted(per):
        out.update(per[p].metrics(f"{BY_PROFILE}{p}/"))
    return out


__all__ = [
    "METRICS",
    "ToolHealth",
    "execution_health",
    "from_sums",
    "profile_key",
    "tool_metrics",
]
