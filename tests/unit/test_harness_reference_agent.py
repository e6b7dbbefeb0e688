"""Reference agent logic with an in-process fake chat client (a test double: no HTTP here;
the real endpoint path is covered end to end in tests/integration/test_harness_e2e.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

from gyre.harness import reference_agent as ref


class FakeClient:
    """Answers by role (system prompt) from per-role queues; records every request."""

    def __init__(self, turns: dict[str, list]):
        self.turns = {k: list(v) for k, v in turns.items()}
        self.requests: list[dict] = []
        self.chat = NS(completions=NS(create=self.create))

    def create(self, **kw):
        self.requests.append(json.loads(json.dumps(kw)))  # the agent keeps mutating its list
        system = kw["messages"][0]["content"]
        role = {
            ref.MAIN_SYSTEM: "main",
            ref.SUB_SYSTEM: "sub",
            ref.MAIN_SUMMARY_SYSTEM: "main-summary",
            ref.SUB_SUMMARY_SYSTEM: "sub-summary",
        }[system]
        content, calls = self.turns[role].pop(0)
        tcs = [
            NS(id=f"c{len(self.requests)}_{i}", function=NS(name=n, arguments=json.dumps(a)))
            for i, (n, a) in enumerate(calls)
        ]
        return NS(choices=[NS(message=NS(content=content, tool_calls=tcs or None))])


def test_tools_delegate_and_submit(tmp_path):
    c = FakeClient(
        {
            "main": [
                ("", [("run_command", {"command": "echo hi > out.txt; cat out.txt"})]),
                ("", [("delegate", {"task": "write b.txt"})]),
                ("", [("read_file", {"path": "b.txt"}), ("read_file", {"path": "../escape"})]),
                ("", [("submit", {"summary": "done"})]),
            ],
            "sub": [
                ("", [("write_file", {"path": "sub/b.txt", "content": "B"})]),
                ("", [("write_file", {"path": "b.txt", "content": "B2"})]),
                ("", [("submit", {"summary": "sub ok"})]),
            ],
        }
    )
    agent = ref.ReferenceAgent(c, tmp_path, ref.AgentConfig(context_limit=10**6))
    stats = agent.run("task")
    assert (
        stats.submitted
        and stats.final == "done"
        and stats.sub_agents == 1
        and stats.compactions == 0
    )
    assert (tmp_path / "sub" / "b.txt").read_text() == "B" and (
        tmp_path / "b.txt"
    ).read_text() == "B2"
    main_reqs = [r for r in c.requests if r["messages"][0]["content"] == ref.MAIN_SYSTEM]
    last = main_reqs[-1]["messages"]
    tool_results = [m["content"] for m in last if m["role"] == "tool"]
    assert tool_results[0].startswith("exit status 0\nhi")
    assert tool_results[1] == "sub ok"  # the sub-agent's report is the delegate result
    assert tool_results[2] == "B2" and "outside the workspace" in tool_results[3]
    # Sub-agents get a fresh context and no delegate tool.
    sub_reqs = [r for r in c.requests if r["messages"][0]["content"] == ref.SUB_SYSTEM]
    assert (
        sub_reqs[0]["messages"][1]["content"] == "write b.txt" and len(sub_reqs[0]["messages"]) == 2
    )
    assert "delegate" not in [t["function"]["name"] for t in sub_reqs[0]["tools"]]


def test_compaction_replaces_context_with_summary(tmp_path):
    c = FakeClient(
        {
            "main": [
                ("", [("write_file", {"path": "a.txt", "content": "x" * 400})]),
                ("", [("submit", {"summary": "ok"})]),
            ],
            "main-summary": [("wrote a.txt", [])],
        }
    )
    agent = ref.ReferenceAgent(c, tmp_path, ref.AgentConfig(context_limit=100))
    stats = agent.run("the task")
    assert stats.compactions == 1 and stats.submitted
    summary_req = c.requests[1]
    assert (
        summary_req["messages"][0]["content"] == ref.MAIN_SUMMARY_SYSTEM
        and "tools" not in summary_req
    )
    after = c.requests[2]["messages"]
    assert (
        len(after) == 2
        and after[1]["content"].startswith("the task")
        and "wrote a.txt" in after[1]["content"]
    )


def test_final_message_without_tools_ends_and_bad_arguments_are_reported(tmp_path):
    c = FakeClient({})
    tc = NS(id="bad", function=NS(name="write_file", arguments="{not json"))
    seq = iter(
        [
            NS(choices=[NS(message=NS(content="", tool_calls=[tc]))]),
            NS(choices=[NS(message=NS(content="aaaa", tool_calls=None))]),
        ]
    )
    reqs = []
    c.chat.completions.create = lambda **kw: (reqs.append(json.loads(json.dumps(kw))), next(seq))[1]
    agent = ref.ReferenceAgent(c, tmp_path)
    stats = agent.run("t")
    assert stats.final == "aaaa" and not stats.submitted
    assert reqs[1]["messages"][-1]["content"].startswith("error: JSONDecodeError")
