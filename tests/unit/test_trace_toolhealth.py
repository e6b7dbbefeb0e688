"""Tool-call health: per-execution counts from trace records, summed per step and profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.harness import roles
from gyre.trace.record import OutputSegment, TraceRecord
from gyre.trace.toolhealth import (
    METRICS,
    ToolHealth,
    execution_health,
    from_sums,
    profile_key,
    tool_metrics,
)

RECORDINGS = Path(roles.__file__).parent / "recordings"


def rec(seq: int, finish: str = "stop", eid: str = "e", **meta) -> TraceRecord:
    return TraceRecord(
        execution_id=eid,
        request_id=f"{eid}-{seq}",
        seq=seq,
        api="openai.chat",
        base=None,
        base_len=0,
        input_suffix=(1, 2),
        output_ids=(3,),
        output_logprobs=(-0.1,),
        segments=(OutputSegment(0, 1, "e0", 0),),
        finish_reason=finish,
        meta=meta,
    )


def test_counts_of_one_execution():
    recs = [
        rec(0, n_tool_calls=2, system_sha1="m"),
        rec(1, n_tool_calls=0, n_tool_calls_unparsed=1, system_sha1="m"),
        rec(2, finish="length", n_tool_calls=0, n_tool_calls_unparsed=1, system_sha1="m"),
        rec(3, n_tool_calls=1, system_sha1="s"),  # default profile: other system
        rec(4, n_tool_calls=0, system_sha1="m", last_user_head="Summarize the work so far"),
        rec(5, finish="abort", client_disconnected=True),  # the client hung up: not a turn
    ]
    h = execution_health(reversed(recs))  # any order: roles are read against seq 0
    assert h == ToolHealth(
        executions=1,
        turns=5,
        calls=3,
        unparsed=2,
        truncated=1,
        no_call_executions=0,
        compactions=1,
        subagent_calls=1,
    )


def test_an_execution_without_a_tool_call_is_flagged():
    # the failure this exists for: the parser never matched, one answer, the agent ended
    assert execution_health([rec(0, n_tool_calls=0, n_tool_calls_unparsed=1)]).no_call_executions
    assert execution_health([]) == ToolHealth(executions=1, no_call_executions=1)
    # traces written before the proxy counted unparsed calls (or with junk) read as zero
    h = execution_health([rec(0, n_tool_calls="3", n_tool_calls_unparsed=True)])
    assert (h.calls, h.unparsed, h.no_call_executions) == (0, 0, 1)


@pytest.mark.parametrize(
    ("profile", "recording"),
    [
        ("claude-code", "claude-code-2.1.332.json"),
        ("qwen-code", "qwen-code-0.24.4.json"),
        ("codex", "codex-0.171.0.json"),
    ],
)
def test_compactions_and_sub_agents_follow_the_harness_role_rules(profile, recording):
    """On each harness's recorded requests: the counts are the recorded roles."""
    data = json.loads((RECORDINGS / recording).read_text())["records"]
    prof = roles.role_profile(profile)
    for ex in sorted({r["execution"] for r in data}):
        mine = [r for r in data if r["execution"] == ex]
        h = execution_health([rec(r["seq"], eid=ex, **r["meta"]) for r in mine], prof)
        seen = [r["observed_as"] for r in mine]
        assert h.compactions == sum(s.endswith("summary") for s in seen), ex
        assert h.subagent_calls == sum(s.startswith("sub-agent") for s in seen), ex
        assert h.turns == len(mine)


def test_step_metrics_by_profile():
    a = execution_health([rec(0, n_tool_calls=1), rec(1)])
    b = execution_health([rec(0)])
    sums: dict[str, int] = {}
    for profile, h in [("codex", a), ("codex", b), ("my profile.toml", a)]:
        for k, v in h.sums(profile).items():  # how the runtime sums groups into a step
            sums[k] = sums.get(k, 0) + v
    sums["missing/model_unreachable"] = 4  # other keys of the step are ignored
    assert set(from_sums(sums)) == {"codex", "my_profile.toml"}
    m = tool_metrics(sums)
    assert m["tools/calls"] == 2 and m["tools/no_call_executions"] == 1
    assert m["tools/turns_per_execution"] == pytest.approx(5 / 3)
    assert m["tools/by_profile/codex/turns_per_execution"] == pytest.approx(1.5)
    assert m["tools/by_profile/codex/no_call_executions"] == 1
    assert m["tools/by_profile/my_profile.toml/calls"] == 1
    assert set(m) == {f"tools/{s}" for s in METRICS} | {
        f"tools/by_profile/{p}/{s}" for p in ("codex", "my_profile.toml") for s in METRICS
    }
    assert tool_metrics({"reward_sum": 1.0}) == {}
    assert profile_key("") == "_"
