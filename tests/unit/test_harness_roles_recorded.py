"""Role rules for Qwen Code and Codex CLI, checked on their recorded requests
(gyre/harness/recordings) and on requests built from them for the shapes not recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.harness import roles
from gyre.harness.profiles import load_profile
from gyre.trace.roles import Role

RECORDINGS = Path(roles.__file__).parent / "recordings"


def _records(name: str) -> list[dict]:
    return json.loads((RECORDINGS / name).read_text())["records"]


def _first_of(recs: list[dict], r: dict) -> dict:
    """seq 0 of the same execution: the trajectory processor's first_meta."""
    return next(x["meta"] for x in recs if x["execution"] == r["execution"] and x["seq"] == 0)


@pytest.mark.parametrize(
    ("profile", "recording"),
    [("qwen-code", "qwen-code-0.24.4.json"), ("codex", "codex-0.171.0.json")],
)
def test_roles_on_recorded_requests(profile, recording):
    recs = _records(recording)
    prof = load_profile(profile).role_profile()
    assert prof.name == profile
    got = [prof.role_of(r["meta"], _first_of(recs, r)).value for r in recs]
    assert got == [r["observed_as"] for r in recs]
    assert {"main", "sub-agent", "main-summary"} <= set(got)


def test_qwen_code_roles_on_constructed_requests():
    recs = _records("qwen-code-0.24.4.json")
    main = next(r["meta"] for r in recs if r["observed_as"] == "main")
    sub = next(r["meta"] for r in recs if r["execution"] == "agent-tool" and r["seq"] == 1)
    cold = next(r["meta"] for r in recs if r["execution"] == "compress" and r["seq"] == 1)
    prof = roles.qwen_code_profile()
    # A sub-agent compacting its own history (cache-sharing shape) is a sub-agent summary.
    assert (
        prof.role_of({**sub, "last_user_head": cold["system_head"]}, main) == Role.SUB_AGENT_SUMMARY
    )
    # Other built-in sub-agents have their own prompts.
    explore = "You are a file search specialist agent. You excel at thoroughly navigating"
    assert prof.role_of({**main, "system_head": explore}, main) == Role.SUB_AGENT
    # The interactive main prompt is main; a tool-less side request ranks as sub-agent.
    interactive = "You are Qwen Code, an interactive CLI agent developed by Alibaba Group"
    assert prof.role_of({**main, "system_head": interactive}, main) == Role.MAIN
    assert prof.role_of({**main, "tools": []}, main) == Role.SUB_AGENT
    # A main thread whose user removed the agent tool never looks like a fork.
    no_agent = {**main, "tools": [t for t in main["tools"] if t != "agent"]}
    assert prof.role_of(no_agent, no_agent) == Role.MAIN


def test_codex_roles_on_constructed_requests():
    recs = _records("codex-0.171.0.json")
    main = recs[0]["meta"]
    sub = next(r["meta"] for r in recs if r["observed_as"] == "sub-agent")
    compact = next(r["meta"] for r in recs if r["observed_as"] == "main-summary")
    prof = roles.codex_profile()
    # A sub-agent's compaction: its headers plus the compaction request's shape.
    sub_compact = {
        **compact,
        "headers": {
            **compact["headers"],
            "x-openai-subagent": "collab_spawn",
            "x-codex-turn-metadata": sub["headers"]["x-codex-turn-metadata"].replace(
                '"request_kind":"turn"', '"request_kind":"compaction"'
            ),
        },
    }
    assert prof.role_of(sub_compact, main) == Role.SUB_AGENT_SUMMARY
    # Either sign alone is enough: the metadata header, or the checkpoint prompt.
    only_meta = {**compact, "last_user_head": "x"}
    assert prof.role_of(only_meta, main) == Role.MAIN_SUMMARY
    only_text = {**compact, "headers": {}}
    assert prof.role_of(only_text, main) == Role.MAIN_SUMMARY
    no_header = {
        **sub,
        "headers": {"x-codex-turn-metadata": sub["headers"]["x-codex-turn-metadata"]},
    }
    assert prof.role_of(no_header, main) == Role.SUB_AGENT
    assert prof.role_of({**main, "headers": {}}, main) == Role.MAIN
