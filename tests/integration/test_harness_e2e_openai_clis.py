"""End to end for the OpenAI-dialect CLIs: Qwen Code (chat completions) and Codex CLI
(Responses API), unmodified, through the real proxy to a scripted engine, on pyfix tasks.

As in test_harness_e2e: the scripted engine (a test double) replays fixed assistant turns
through the tiny model's real tokenizer; the harness programs, the proxy, the executor and
the verifier are real. A scripted fix scores 1 and an untouched workspace 0 through the same
path, and every call after an execution's first extends the previous one token for token
(a continuation: no ``forked`` record), which is what makes the trace a tree and not a pile
of re-renders. Each harness also runs once in Gyre's bubblewrap sandbox (proxy-only network,
tmpfs HOME seeded with the profile's config file).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import pytest
from helpers.servers import scripted_proxy_stack

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import find_codex, find_qwen, load_profile
from gyre.harness.roles import role_profile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import builtin_tasksets_dir, load_task

FIXED_TEMPERATURE = (
    "def c_to_f(c):\n    return c * 9 / 5 + 32\n\n\ndef f_to_c(f):\n    return (f - 32) * 5 / 9\n"
)
BASH_FIX = "cat > temperature.py <<'EOF'\n" + FIXED_TEMPERATURE + "EOF"


def _call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


# Scripts are tried in order; the first whose text occurs in the rendered prompt plays.
BOOK = {
    "scripts": [
        # Qwen Code's compaction (`qwen -p /compress --continue`), in either of its two shapes.
        {
            "name": "qwen-compress",
            "match": "produce the <state_snapshot> XML",
            "turns": [
                {"text": "<analysis>ok</analysis><state_snapshot>SUMMARY-OK</state_snapshot>"}
            ],
            "exhausted": {
                "text": "<analysis>ok</analysis><state_snapshot>SUMMARY-OK</state_snapshot>"
            },
        },
        # Untouched workspaces: matched by the task (transpose), whichever harness asks.
        {
            "name": "noop",
            "match": "matrix.py's `transpose`",
            "turns": [{"text": "Nothing to do."}],
            "exhausted": {"text": "Done."},
        },
        # Codex CLI's automatic compaction (a separate execution with a low token limit):
        # the checkpoint request, then the turn resumed on the summary.
        {
            "name": "codex-compact",
            "match": "You are performing a CONTEXT CHECKPOINT COMPACTION",
            "turns": [{"text": "SUMMARY-OK"}],
            "exhausted": {"text": "SUMMARY-OK"},
        },
        {
            "name": "codex-resumed",
            "match": "Another language model started to solve this problem",
            "turns": [{"text": "Done."}],
            "exhausted": {"text": "Done."},
        },
        # Qwen Code's agent tool: the main thread delegates (foreground), the general-purpose
        # sub-agent (its own system prompt) reports back, the main thread finishes.
        {
            "name": "qwen-sub",
            "match": "You are a general-purpose subagent working for a parent agent",
            "turns": [{"text": "Sub-agent report: SUBTASK-7 done."}],
            "exhausted": {"text": "Done."},
        },
        {
            "name": "qwen-delegate",
            "match": "palindrome.py's",
            "turns": [
                {
                    "text": "Delegating.",
                    "tool_calls": [
                        _call(
                            "agent",
                            description="check",
                            prompt="SUBTASK-7: report done",
                            subagent_type="general-purpose",
                            run_in_background=False,
                        )
                    ],
                },
                {"text": "Done."},
            ],
            "exhausted": {"text": "Done."},
        },
        # Qwen Code: its run_shell_command tool, then a final answer.
        {
            "name": "qwen-fix",
            "match": "You are Qwen Code",
            "turns": [
                {
                    "text": "Fixing.",
                    "tool_calls": [
                        _call("run_shell_command", command=BASH_FIX, description="Fix it")
                    ],
                },
                {"text": "Done."},
            ],
            "exhausted": {"text": "Done."},
        },
        # Codex CLI: its exec_command tool, then a final answer.
        {
            "name": "codex-fix",
            "match": "You are a coding agent running in the Codex CLI",
            "turns": [
                {"text": "Fixing.", "tool_calls": [_call("exec_command", cmd=BASH_FIX)]},
                {"text": "Done."},
            ],
            "exhausted": {"text": "Done."},
        },
        {"name": "fallback", "turns": [{"text": "OK."}], "exhausted": {"text": "OK."}},
    ]
}


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    """Scripted engine + managed proxy on 127.0.0.1; yields (proxy_url, register, trace_dir)."""
    with scripted_proxy_stack(tiny_model_dir, BOOK, tmp_path_factory.mktemp("traces")) as s:
        yield s


def pyfix(name: str):
    return load_task(builtin_tasksets_dir() / "pyfix" / name)


def _diag(r) -> str:
    return (
        f"{r.execution_id}: {r.assessment} stop={r.harness.stop} exit={r.harness.exit_code} {r.harness.error}\n"
        + Path(r.harness.stdout_path).read_text()[-1500:]
        + Path(r.harness.stderr_path).read_text()[-1500:]
    )


def trace_of(traces: Path, execution_id: str):
    from gyre.trace.store import read_trace, trace_path

    res = read_trace(trace_path(traces, execution_id))
    assert res.errors == [] and res.records, f"no clean trace for {execution_id}"
    return res.records


def assert_continuations(traces: Path, execution_id: str) -> int:
    """Every call after the first extends an earlier one (no fork); returns the call count."""
    recs = trace_of(traces, execution_id)
    assert recs[0].base is None
    for r in recs[1:]:
        assert not r.forked and r.base is not None, (execution_id, r.seq, r.meta.get("fork_at"))
    return len(recs)


def roles_of(traces: Path, execution_id: str, profile_name: str) -> Counter:
    recs = trace_of(traces, execution_id)
    prof = role_profile(profile_name)
    return Counter(prof.role_of(r.meta, recs[0].meta).value for r in recs)


async def run_specs(tmp_path: Path, register, specs, sandbox: bool = False):
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs",
        sandbox=SandboxConfig(enabled=True, network="proxy-only")
        if sandbox
        else SandboxConfig(enabled=False),
    )
    async with HarnessExecutor(cfg, register=register) as ex:
        return await ex.run_many(specs)


def _specs(profile_name: str, url: str, prefix: str) -> list[ExecutionSpec]:
    prof = load_profile(profile_name)
    return [
        ExecutionSpec(
            execution_id=f"{prefix}-fix",
            task=pyfix("temperature"),
            profile=prof,
            base_url=url,
            harness_timeout_s=120,
        ),
        ExecutionSpec(
            execution_id=f"{prefix}-noop",
            task=pyfix("transpose"),
            profile=prof,
            base_url=url,
            harness_timeout_s=120,
        ),
    ]


needs_qwen = pytest.mark.skipif(
    find_qwen() is None, reason="Qwen Code is not installed (scripts/install-harnesses.sh)"
)
needs_codex = pytest.mark.skipif(
    find_codex() is None, reason="Codex CLI is not installed (scripts/install-harnesses.sh)"
)
needs_bwrap = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap (bwrap) is not installed"
)


@pytest.mark.harness
@pytest.mark.slow
@needs_qwen
async def test_qwen_code_e2e(stack, tmp_path):
    url, register, traces = stack
    specs = _specs("qwen-code", url, "qwen")
    delegate = specs[0].model_copy(
        update={"execution_id": "qwen-delegate", "task": pyfix("palindrome")}
    )
    fix, noop, deleg = await run_specs(tmp_path, register, [*specs, delegate])
    assert fix.reward == 1.0, _diag(fix)
    assert noop.reward == 0.0, _diag(noop)
    assert fix.harness.stop == "exited" and fix.harness.exit_code == 0, _diag(fix)
    # One turn, one call: the tool call, then the final answer; nothing on the side.
    assert assert_continuations(traces, "qwen-fix") == 2
    assert assert_continuations(traces, "qwen-noop") == 1
    assert roles_of(traces, "qwen-fix", "qwen-code") == Counter({"main": 2})
    # The agent tool's sub-agent is told apart from the main thread by the rules; the main
    # thread's second call still continues its first, the sub-agent opens its own conversation.
    assert deleg.harness.exit_code == 0, _diag(deleg)
    assert roles_of(traces, "qwen-delegate", "qwen-code") == Counter({"main": 2, "sub-agent": 1})
    recs = trace_of(traces, "qwen-delegate")
    assert not any(x.forked for x in recs)
    main_recs = [x for x in recs if x.meta["system_head"].startswith("You are Qwen Code")]
    assert main_recs[1].base == main_recs[0].request_id
    # The settings file the profile wrote is the one Qwen Code read.
    assert (Path(fix.execution_dir) / "home" / ".qwen" / "settings.json").is_file()
    # A live compaction: `qwen -p /compress --continue` in the fixed execution's workspace and
    # HOME. Every request it makes is read as a main summary.
    key = await register("qwen-compress", "compress")
    argv, env = load_profile("qwen-code").render(
        {"qwen": find_qwen() or "qwen", "instruction": "/compress", "model": "policy"}
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(Path(fix.execution_dir) / "home"),
        "OPENAI_BASE_URL": url + "/v1",
        "OPENAI_API_KEY": key,
        **env,
    }
    proc = await asyncio.create_subprocess_exec(
        *argv,
        "--continue",
        cwd=fix.workspace,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (out[-1000:], err[-1000:])
    c = roles_of(traces, "qwen-compress", "qwen-code")
    assert set(c) == {"main-summary"}, c


@pytest.mark.harness
@pytest.mark.slow
@needs_qwen
@needs_bwrap
async def test_qwen_code_sandboxed_e2e(stack, tmp_path):
    url, register, traces = stack
    (r,) = await run_specs(tmp_path, register, _specs("qwen-code", url, "qwen-sb")[:1], True)
    assert r.reward == 1.0, _diag(r)
    assert assert_continuations(traces, "qwen-sb-fix") == 2


@pytest.mark.harness
@needs_codex
async def test_codex_e2e(stack, tmp_path):
    url, register, traces = stack
    fix, noop = await run_specs(tmp_path, register, _specs("codex", url, "codex"))
    assert fix.reward == 1.0, _diag(fix)
    assert noop.reward == 0.0, _diag(noop)
    assert fix.harness.stop == "exited" and fix.harness.exit_code == 0, _diag(fix)
    assert assert_continuations(traces, "codex-fix") == 2
    assert assert_continuations(traces, "codex-noop") == 1
    assert roles_of(traces, "codex-fix", "codex") == Counter({"main": 2})
    assert (Path(fix.execution_dir) / "home" / ".codex" / "config.toml").is_file()


@pytest.mark.harness
@needs_codex
@needs_bwrap
async def test_codex_sandboxed_e2e(stack, tmp_path):
    url, register, traces = stack
    (r,) = await run_specs(tmp_path, register, _specs("codex", url, "codex-sb")[:1], True)
    assert r.reward == 1.0, _diag(r)
    assert assert_continuations(traces, "codex-sb-fix") == 2


@pytest.mark.harness
@needs_codex
async def test_codex_compaction_roles(stack, tmp_path):
    """A live automatic compaction through the proxy (token limit far below the prompt): the
    checkpoint request is read as a main summary, the turns around it as main. The compaction
    and the resumed turn rewrite the history (the tool list goes, then the turns are replaced
    by the summary), so those two records are forks by nature; the first call is not."""
    url, register, traces = stack
    prof = load_profile("codex").model_copy(
        update={"args": ["-c", "model_auto_compact_token_limit=2000"]}
    )
    (r,) = await run_specs(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="codex-compact",
                task=pyfix("temperature"),
                profile=prof,
                base_url=url,
                harness_timeout_s=120,
            )
        ],
    )
    assert r.reward == 1.0, _diag(r)
    recs = trace_of(traces, "codex-compact")
    prof_roles = role_profile("codex")
    got = [prof_roles.role_of(x.meta, recs[0].meta).value for x in recs]
    assert got == ["main", "main-summary", "main"], got
    assert not recs[0].forked
