"""Role rules: every operator, dotted keys, first-match order, the default profile, JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gyre.trace.roles import (
    Condition,
    Role,
    RoleProfile,
    RoleRule,
    all_main_profile,
    default_profile,
)

META = {
    "model": "qwen",
    "tools": ["Bash", "Task"],
    "system_sha1": "abc",
    "last_user_head": "Please summarise",
    "headers": {"user-agent": "claude-cli/2.1", "x-app": "cli"},
    "key_label": "sub-1",
    "n_messages": 7,
}
FIRST = {"system_sha1": "abc", "key_label": "main"}


@pytest.mark.parametrize(
    "cond,expected",
    [
        (Condition(key="model", op="equals", value="qwen"), True),
        (Condition(key="model", op="not_equals", value="qwen"), False),
        (Condition(key="tools", op="contains", value="Task"), True),
        (
            Condition(key="tools", op="contains", value="Tas"),
            False,
        ),  # list membership, not substring
        (Condition(key="last_user_head", op="contains", value="summ"), True),
        (Condition(key="headers.user-agent", op="startswith", value="claude-cli/"), True),
        (Condition(key="headers.x-app", op="in", value=["cli", "sdk"]), True),
        (Condition(key="last_user_head", op="regex", value=r"(?i)summari[sz]e"), True),
        (Condition(key="tools", op="regex", value=r"\bTask\b"), True),
        (Condition(key="n_messages", op="regex", value=r"^7$"), True),
        (Condition(key="headers.x-missing", op="exists"), False),
        (Condition(key="headers.x-missing", op="missing"), True),
        (Condition(key="headers.x-missing", op="equals", value=None), False),  # absent is not None
        (Condition(key="system_sha1", op="differs_from_first"), False),
        (Condition(key="system_sha1", op="same_as_first"), True),
        (Condition(key="key_label", op="differs_from_first"), True),
        (Condition(key="model", op="differs_from_first"), True),  # the first request lacks it
    ],
)
def test_condition_ops(cond, expected):
    assert cond.holds(META, FIRST) is expected


def test_first_matching_rule_wins_and_default_applies():
    prof = RoleProfile(
        name="p",
        default=Role.SUB_AGENT,
        rules=(
            RoleRule(
                role=Role.MAIN_SUMMARY,
                when=(
                    Condition(key="last_user_head", op="contains", value="summ"),
                    Condition(key="key_label", op="equals", value="main"),
                ),
            ),
            RoleRule(
                role=Role.SUB_AGENT_SUMMARY,
                when=(Condition(key="last_user_head", op="contains", value="summ"),),
            ),
            RoleRule(role=Role.MAIN, when=()),  # an empty condition list always holds
        ),
    )
    assert prof.role_of(META, FIRST) == Role.SUB_AGENT_SUMMARY  # rule 1 needs both conditions
    assert prof.role_of({**META, "key_label": "main"}, FIRST) == Role.MAIN_SUMMARY
    assert prof.role_of({}, FIRST) == Role.MAIN
    assert RoleProfile(default=Role.SUB_AGENT).role_of(META) == Role.SUB_AGENT


def test_default_profile_documented_behaviour():
    p = default_profile()
    first = {"system_sha1": "main"}
    assert p.role_of({"system_sha1": "main", "last_user_head": "fix the bug"}, first) == Role.MAIN
    assert (
        p.role_of({"system_sha1": "main", "last_user_head": "Summarize the conversation"}, first)
        == Role.MAIN_SUMMARY
    )
    assert p.role_of({"system_sha1": "sub", "last_user_head": "read b.py"}, first) == Role.SUB_AGENT
    assert (
        p.role_of({"system_sha1": "sub", "last_user_head": "Compact the history"}, first)
        == Role.SUB_AGENT_SUMMARY
    )
    assert p.role_of({}, {}) == Role.MAIN  # no metadata at all: main
    assert all_main_profile().role_of({"system_sha1": "sub"}, first) == Role.MAIN


def test_profiles_are_plain_data():
    p = default_profile()
    again = RoleProfile.model_validate_json(p.model_dump_json())
    assert again == p
    assert RoleProfile.model_validate(p.model_dump()) == p
    with pytest.raises(ValidationError):
        RoleProfile.model_validate({"rules": [{"role": "boss"}]})
    with pytest.raises(ValidationError):
        Condition(key="x", op="startswith_ci")
    assert [r.rank for r in Role] == [0, 1, 2, 3]
