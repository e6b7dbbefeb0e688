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

Qwen Code (0.24.4, pinned) -- checked against ``recordings/qwen-code-0.24.4.json``
(requests recorded by the proxy: a delegation to its ``agent`` tool, a fork
sub-agent, and ``qwen -p /compress --continue``) and the prompts in its bundle:

- **main**: the system prompt starts "You are Qwen Code" (non-interactive or
  interactive variant).
- **compaction**: two shapes, both recorded. With cache sharing it keeps the
  thread's own system prompt and tools and sends the compression instructions as
  the last user message ("You are the component that summarizes a conversation
  ..."); without, the system prompt is those instructions, there are no tools, and
  the last user message is the directive "... produce the <state_snapshot> XML".
  Under a sub-agent's system prompt it is a sub-agent summary; the second shape
  carries no trace of whose history it compacts, so it counts as a main summary.
- **sub-agent** (its ``agent`` tool): built-in and user-defined sub-agents have
  their own system prompts ("You are a general-purpose subagent working for a
  parent agent", "You are a file search specialist agent", ...), so any system
  prompt that is neither Qwen Code's nor the compression prompt is a sub-agent.
  A *fork* sub-agent keeps the main system prompt but loses the ``agent`` tool
  (forks may not spawn): a tool list that differs from the execution's first
  request and lacks ``agent`` is a sub-agent.
- **side requests** without tools are ranked as sub-agent, as for Claude Code.

Codex CLI (0.171.0, pinned) -- checked against ``recordings/codex-0.171.0.json``
(requests captured from ``codex exec``: a ``spawn_agent`` delegation and an
automatic compaction). Codex names what each request is in its headers:
``x-openai-subagent`` (``collab_spawn``) on every request of a spawned
sub-agent, and ``x-codex-turn-metadata``, a JSON object whose
``request_kind`` is ``"turn"`` or ``"compaction"`` and whose ``thread_source``
is ``"user"`` or ``"subagent"``. The compaction request also ends with the user
message "You are performing a CONTEXT CHECKPOINT COMPACTION ..." (no tools), used
as a second sign. Main and sub-agent share the same developer prompt, so the
headers are the only reliable marker.

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


QWEN_MAIN_SYSTEM = "You are Qwen Code"
QWEN_COMPACT_SYSTEM = "You are the component that summarizes a conversation"
QWEN_COMPACT_USER_REGEX = (
    r"You are the component that summarizes a conversation|produce the <state_snapshot> XML"
)
# Any system prompt but Qwen Code's own and the compression prompt: a sub-agent's.
QWEN_SUBAGENT_SYSTEM_REGEX = rf"^(?!\s*(?:{QWEN_MAIN_SYSTEM}|{QWEN_COMPACT_SYSTEM}))"
# A tool list (joined by spaces) without the `agent` tool: a fork may not spawn.
QWEN_NO_AGENT_TOOL_REGEX = r"^(?!(.* )?agent( |$))"


def qwen_code_profile() -> RoleProfile:
    sub = Condition(key="system_head", op="regex", value=QWEN_SUBAGENT_SYSTEM_REGEX)
    compact_user = Condition(key="last_user_head", op="regex", value=QWEN_COMPACT_USER_REGEX)
    compact_system = Condition(key="system_head", op="contains", value=QWEN_COMPACT_SYSTEM)
    fork = (
        Condition(key="tools", op="differs_from_first"),
        Condition(key="tools", op="regex", value=QWEN_NO_AGENT_TOOL_REGEX),
    )
    return RoleProfile(
        name="qwen-code",
        rules=(
            RoleRule(
                role=Role.SUB_AGENT_SUMMARY, when=(sub, compact_user), name="sub-agent compaction"
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY,
                when=(compact_system,),
                name="compaction (compression system prompt)",
            ),
            RoleRule(
                role=Role.MAIN_SUMMARY,
                when=(compact_user,),
                name="compaction (instructions as the last user message)",
            ),
            RoleRule(role=Role.SUB_AGENT, when=(sub,), name="sub-agent (own system prompt)"),
            RoleRule(role=Role.SUB_AGENT, when=fork, name="fork sub-agent (no agent tool)"),
            RoleRule(
                role=Role.SUB_AGENT,
                when=(Condition(key="tools", op="equals", value=[]),),
                name="side request without tools",
            ),
        ),
        default=Role.MAIN,
    )


CODEX_SUBAGENT_HEADER = "headers.x-openai-subagent"
CODEX_SUBAGENT_META_REGEX = r'"thread_source"\s*:\s*"subagent"'
CODEX_COMPACT_META_REGEX = r'"request_kind"\s*:\s*"compaction"'
CODEX_COMPACT_USER = "You are performing a CONTEXT CHECKPOINT COMPACTION"


def codex_profile() -> RoleProfile:
    meta = "headers.x-codex-turn-metadata"
    subs = (
        (Condition(key=CODEX_SUBAGENT_HEADER, op="exists"),),
        (Condition(key=meta, op="regex", value=CODEX_SUBAGENT_META_REGEX),),
    )
    compacts = (
        (Condition(key=meta, op="regex", value=CODEX_COMPACT_META_REGEX),),
        (Condition(key="last_user_head", op="startswith", value=CODEX_COMPACT_USER),),
    )
    rules: list[RoleRule] = []
    for c in compacts:
        for sub in subs:
            rules.append(
                RoleRule(role=Role.SUB_AGENT_SUMMARY, when=sub + c, name="sub-agent compaction")
            )
    rules += [RoleRule(role=Role.MAIN_SUMMARY, when=c, name="compaction") for c in compacts]
    rules += [RoleRule(role=Role.SUB_AGENT, when=s, name="sub-agent (spawn_agent)") for s in subs]
    rules.append(
        RoleRule(
            role=Role.SUB_AGENT,
            when=(Condition(key="tools", op="equals", value=[]),),
            name="side request without tools",
        )
    )
    return RoleProfile(name="codex", rules=tuple(rules), default=Role.MAIN)


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
        "qwen-code": qwen_code_profile,
        "codex": codex_profile,
    }
    return table[name]() if name in table else default_profile()
