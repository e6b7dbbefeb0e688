"""Every shipped multi-turn task, under every shipped agent harness, makes multi-turn tool
calls through the proxy: the tool call is parsed, the harness runs it and comes back for a
second turn. Counted from the trace alone (``gyre.trace.toolhealth``, what a run's ``tools/*``
metrics sum), so a tool-call format the proxy stops understanding (every execution ending
after one turn, no tool call) fails here instead of hiding behind a rising reward.

As in test_harness_e2e: the scripted engine (a test double) replays a fixed tool call and a
final answer through the tiny model's real tokenizer; the harness programs, the proxy and
the executor are real. A task is multi-turn unless tagged ``single-turn`` (quickstart).

By default every task runs under the reference agent and every other harness on one task (a
different one each): 17 executions, ~1.5 min on 2 cores. The whole cross product (65
executions, ~10 min) runs with ``GYRE_HARNESS_MATRIX=full``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from helpers.servers import scripted_proxy_stack

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import find_claude, find_codex, find_mini, find_qwen, load_profile
from gyre.harness.task import builtin_tasksets_dir, load_task
from gyre.trace.store import read_trace, trace_path
from gyre.trace.toolhealth import execution_health


def _call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


# harness profile -> (text only its main prompt holds, first turn's tool call, last turn)
HARNESSES = {
    "reference": (
        "You are Gyre's reference coding agent",
        _call("run_command", command="ls"),
        {"tool_calls": [_call("submit", summary="looked")]},
    ),
    "mini-swe-agent": (
        "Please solve this issue:",
        _call("bash", command="ls"),
        {"tool_calls": [_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]},
    ),
    "claude-code": (
        "You are an agent working with the user toward their goals",
        _call("Bash", command="ls", description="List files"),
        {"text": "Done."},
    ),
    "qwen-code": (
        "You are Qwen Code",
        _call("run_shell_command", command="ls", description="List files"),
        {"text": "Done."},
    ),
    "codex": (
        "You are a coding agent running in the Codex CLI",
        _call("exec_command", cmd="ls"),
        {"text": "Done."},
    ),
}
FINDERS = {"mini-swe-agent": find_mini, "claude-code": find_claude, "qwen-code": find_qwen}
FINDERS["codex"] = find_codex


def _book(harness: str) -> dict:
    match, call, last = HARNESSES[harness]
    return {
        "scripts": [
            {
                "name": harness,
                "match": match,
                "turns": [{"text": "Looking.", "tool_calls": [call]}, last],
                "exhausted": last,
            },
            {"name": "fallback", "turns": [{"text": "OK."}], "exhausted": {"text": "OK."}},
        ]
    }


def multi_turn_tasks() -> list[Path]:
    root = builtin_tasksets_dir()
    return [
        d
        for d in sorted(root.glob("*/*"))
        if (d / "task.toml").is_file()
        and "single-turn" not in load_task(d).metadata.get("tags", [])
    ]


def _params():
    tasks = multi_turn_tasks()
    full = os.environ.get("GYRE_HARNESS_MATRIX") == "full"
    for i, h in enumerate(HARNESSES):
        marks = [pytest.mark.slow]
        if h in FINDERS:
            missing = FINDERS[h]() is None
            why = f"{h} is not installed (scripts/install-harnesses.sh)"
            marks += [pytest.mark.harness, pytest.mark.skipif(missing, reason=why)]
        chosen = tasks if full or h == "reference" else [tasks[(3 * i) % len(tasks)]]
        for t in chosen:
            yield pytest.param(h, t, marks=marks, id=f"{h}-{t.parent.name}-{t.name}")


@pytest.fixture(scope="module")
def stacks(tiny_model_dir, tmp_path_factory):
    """One scripted engine + managed proxy per harness, each with its own trace folder
    (``gyre runs health <basetemp>/traces-<harness>0 --harness <harness>`` prints its table)."""
    with contextlib.ExitStack() as es:
        made: dict[str, tuple] = {}

        def get(harness: str) -> tuple:
            if harness not in made:
                traces = tmp_path_factory.mktemp(f"traces-{harness}")
                made[harness] = es.enter_context(
                    scripted_proxy_stack(tiny_model_dir, _book(harness), traces)
                )
            return made[harness]

        yield get


def test_shipped_tasks_exist():
    names = {t.name for t in multi_turn_tasks()}
    assert {"temperature", "rle", "transpose"} <= names and "digits" not in names


@pytest.mark.parametrize(("harness", "task_dir"), list(_params()))
async def test_multi_turn_tool_calls_through_the_proxy(stacks, tmp_path, harness, task_dir):
    url, register, traces = stacks(harness)
    eid = f"{harness}-{task_dir.name}"
    cfg = ExecutorConfig(sandbox=SandboxConfig(enabled=False), workspace_root=tmp_path / "runs")
    async with HarnessExecutor(cfg, register=register) as ex:
        r = await ex.run(
            ExecutionSpec(
                execution_id=eid,
                task=load_task(task_dir),
                profile=load_profile(harness),
                base_url=url,
                harness_timeout_s=120,
            )
        )
    diag = (
        f"{eid}: stop={r.harness.stop} exit={r.harness.exit_code} {r.harness.error}\n"
        + (Path(r.harness.stderr_path).read_text()[-1500:])
    )
    assert r.harness.stop == "exited" and r.harness.exit_code == 0, diag
    res = read_trace(trace_path(traces, eid))
    assert res.errors == [], res.errors
    h = execution_health(res.records, load_profile(harness).role_profile())
    assert h.calls >= 1 and h.turns >= 2 and not h.no_call_executions, (h, diag)
    assert h.unparsed == 0 and h.truncated == 0, h
    # the second turn carries the first one's tool call back (the harness ran it and returned)
    first = min(res.records, key=lambda x: x.seq)
    assert first.meta.get("n_tool_calls") == 1, first.meta
    assert any(x.base is not None and not x.forked for x in res.records), diag
