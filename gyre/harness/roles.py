"""Role rules per harness, built with ``gyre.trace.roles`` (the mechanism lives there).

The trajectory processor ranks paths main > main-summary > sub-agent >
sub-agent-summary. Which request plays which role is harness knowledge; here
it is written down as data (a :class:`~gyre.trace.roles.RoleProfile` per
harness) over the request metadata the proxy records (``TraceRecord.meta``).

Claude Code (2.1.332, pinned) -- rules checked against recorded requests
(``recordings/claude-code-2.1.332.json``) and the prompt strings in the binary:

- **sub-agent** (its ``Agent``/``Task`` tool): the system prompt's first block
  is a billing header that carries ``cc_is_subagent=true``, and the prompt
  itself says "You are an agent for Claude Code ..." where the main thread says
  "You are an agent working with the user ...". Its tool list also lacks the
  orchestration tools (``ListAgents``, ``Workflow``, ...), but tool lists vary
  with ``--allowedTools``, so the rules do not rely on them.
- **compaction** (auto or ``/compact``): same system prompt and tools as the
  thread it compacts; the last user message asks to "create a detailed summary
  of the conversation so far" (recorded live with ``claude -p /compact --continue``);
  older versions also sent the system prompt "You are a helpful AI assistant
  tasked with summarizing conversations". A compaction request that carries the
  sub-agent marker is a sub-agent summary; one with the summariser system
  prompt and no marker counts as a main summary (the marker is gone, so a
  sub-agent's compaction under old versions is read as main-summary).
- **side requests** without tools (titles, topic checks; mostly switched off by
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``) are ranked as sub-agent, so they
  never displace the main thread in admission.
- everything else is **main**.

Gyre's reference agent uses one distinct system prompt per role (see
``reference_agent``), so its rules are exact. mini-swe-agent v2 has no
sub-agents and no compaction: every request is main.
"""

from __future__ import annotations

from gyre.trace.roles import (
    Condition,
    Role,
    RoleProfile,
    RoleRule,
    all_main_profile,
    default_profile,
)

from . import reference_agent as ref

CLAUDE_SUBAGENT_REGEX = r"cc_is_subagent=true|You are an agent for Claude Code"
CLAUDE_COMPACT_USER_REGEX = r"create a detailed summary of the conversation"
CLAUDE_COMPACT_SYSTEM = "tasked with summarizing conversations"


def claude_code_profile() -> RoleProfile:
    sub = Condition(key="system_head", op="regex", value=CLAUDE_SUBAGENT_REGEX)
    compact_user = Condition(key="last_user_head", op="regex", value=CLAUDE_COMPACT_USER_REGEX)
    compact_system = Condition(key="system_head", op="contains", value=CLAUDE_COMPACT_SYSTEM)
    return RoleProfile(
        name="claude-code",
        rules=(
            RoleRule(
                role=Role.SUB_AGENT_SUMMARY, when=(sub, compact_user), name="sub-agent compaction"
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY, when=(compact_user,), name="compaction (summary request)"
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY,
                when=(compact_system,),
                name="compaction (summariser system prompt)",
            ),
            RoleRule(role=Role.SUB_AGENT, when=(sub,), name="sub-agent (Agent/Task tool)"),
            RoleRule(
                role=Role.SUB_AGENT,
                when=(Condition(key="tools", op="equals", value=[]),),
                name="side request without tools",
            ),
        ),
        default=Role.MAIN,
    )


def reference_agent_profile() -> RoleProfile:
    def head(prefix: str) -> tuple[Condition, ...]:
        return (Condition(key="system_head", op="startswith", value=prefix[:60]),)

    return RoleProfile(
        name="reference",
        rules=(
            RoleRule(
                role=Role.SUB_AGENT_SUMMARY,
                when=head(ref.SUB_SUMMARY_SYSTEM),
                name="sub-agent summary",
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY, when=head(ref.MAIN_SUMMARY_SYSTEM), name="main summary"
            ),
            RoleRule(role=Role.SUB_AGENT, when=head(ref.SUB_SYSTEM), name="sub-agent"),
        ),
        default=Role.MAIN,
    )


def mini_swe_agent_profile() -> RoleProfile:
    return all_main_profile().model_copy(update={"name": "mini-swe-agent"})


def role_profile(name: str | None) -> RoleProfile:
    """The role rules for a harness profile's ``roles`` name; the documented default otherwise."""
    table = {
        "claude-code": claude_code_profile,
        "reference": reference_agent_profile,
        "mini-swe-agent": mini_swe_agent_profile,
    }
    return table[name]() if name in table else default_profile()
