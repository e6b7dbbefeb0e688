"""Roles of requests and leaves, assigned by declarative rules over ``TraceRecord.meta``.

Admission ranks leaves main > main-summary > sub-agent > sub-agent-summary
(the task reward credits the main agent's turns most directly). Which request
plays which role is harness knowledge, so it lives in data: a
:class:`RoleProfile` is an ordered list of :class:`RoleRule`; the first rule
whose conditions all hold names the request's role, else ``default`` does.
Profiles are pydantic models, so they serialise to JSON/YAML and harness
packages (``gyre.harness``) can ship one per harness.

Conditions read one meta key (dotted paths reach into dicts, e.g.
``headers.user-agent``) and apply one operator. ``differs_from_first`` compares
against the same key on the execution's first request (seq 0): the agent that
opens an execution is the main agent, so "a different system prompt from the
first request" is how a sub-agent is usually recognised without knowing the
harness. A missing key makes every operator false except ``missing``.

The default profile (:func:`default_profile`), used when no harness profile is
given:

1. sub-agent-summary: system prompt differs from the first request's AND the
   last user message asks for a summary;
2. main-summary: the last user message asks for a summary;
3. sub-agent: system prompt differs from the first request's;
4. otherwise main.

"Asks for a summary" is the regex ``SUMMARY_REGEX`` on ``last_user_head``.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SUMMARY_REGEX = r"(?i)\b(summari[sz]e|summary|compact(ion)?)\b"


class Role(str, enum.Enum):
    MAIN = "main"
    MAIN_SUMMARY = "main-summary"
    SUB_AGENT = "sub-agent"
    SUB_AGENT_SUMMARY = "sub-agent-summary"

    @property
    def rank(self) -> int:
        """0 is the highest admission class."""
        return ROLE_ORDER.index(self)


ROLE_ORDER: tuple[Role, ...] = (
    Role.MAIN,
    Role.MAIN_SUMMARY,
    Role.SUB_AGENT,
    Role.SUB_AGENT_SUMMARY,
)

Op = Literal[
    "equals",
    "not_equals",
    "contains",
    "startswith",
    "regex",
    "exists",
    "missing",
    "in",
    "differs_from_first",
    "same_as_first",
]


def meta_get(meta: dict[str, Any], key: str) -> tuple[bool, Any]:
    """Look up a dotted key; returns (found, value)."""
    cur: Any = meta
    if key in meta:
        return True, meta[key]
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return False, None
    return True, cur


class Condition(BaseModel):
    """One test on one meta key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    op: Op = "equals"
    value: Any = None

    def holds(self, meta: dict[str, Any], first_meta: dict[str, Any] | None = None) -> bool:
        found, v = meta_get(meta, self.key)
        if self.op == "missing":
            return not found
        if not found:
            return False
        if self.op == "exists":
            return True
        if self.op in ("differs_from_first", "same_as_first"):
            ffound, fv = meta_get(first_meta or {}, self.key)
            same = ffound and fv == v
            return same if self.op == "same_as_first" else not same
        if self.op == "equals":
            return v == self.value
        if self.op == "not_equals":
            return v != self.value
        if self.op == "in":
            return v in (self.value or ())
        if self.op == "contains":  # substring of a string, or member of a list (e.g. tool names)
            if isinstance(v, str):
                return str(self.value) in v
            if isinstance(v, (list, tuple)):
                return self.value in v
            return False
        if self.op == "startswith":
            return isinstance(v, str) and v.startswith(str(self.value))
        if self.op == "regex":
            text = (
                v
                if isinstance(v, str)
                else " ".join(map(str, v))
                if isinstance(v, (list, tuple))
                else str(v)
            )
            return re.search(str(self.value), text) is not None
        raise ValueError(f"unknown op {self.op!r}")  # pragma: no cover (Literal guards it)


class RoleRule(BaseModel):
    """``role`` applies when every condition holds (an empty list always holds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    when: tuple[Condition, ...] = ()
    name: str = ""

    def matches(self, meta: dict[str, Any], first_meta: dict[str, Any] | None = None) -> bool:
        return all(c.holds(meta, first_meta) for c in self.when)


class RoleProfile(BaseModel):
    """Ordered rules; the first match wins, else ``default``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "default"
    rules: tuple[RoleRule, ...] = ()
    default: Role = Role.MAIN

    def role_of(self, meta: dict[str, Any], first_meta: dict[str, Any] | None = None) -> Role:
        for r in self.rules:
            if r.matches(meta, first_meta):
                return r.role
        return self.default


def default_profile() -> RoleProfile:
    """The documented fallback profile (see module docstring)."""
    summary = Condition(key="last_user_head", op="regex", value=SUMMARY_REGEX)
    other_system = Condition(key="system_sha1", op="differs_from_first")
    return RoleProfile(
        name="default",
        rules=(
            RoleRule(
                role=Role.SUB_AGENT_SUMMARY, when=(other_system, summary), name="sub-agent summary"
            ),
            RoleRule(role=Role.MAIN_SUMMARY, when=(summary,), name="main summary"),
            RoleRule(role=Role.SUB_AGENT, when=(other_system,), name="sub-agent"),
        ),
        default=Role.MAIN,
    )


def all_main_profile() -> RoleProfile:
    """Every request is main (for harnesses without sub-agents or compaction)."""
    return RoleProfile(name="all-main", rules=(), default=Role.MAIN)


__all__ = [
    "Condition",
    "ROLE_ORDER",
    "Role",
    "RoleProfile",
    "RoleRule",
    "SUMMARY_REGEX",
    "all_main_profile",
    "default_profile",
    "meta_get",
]
