"""End to end: real harness processes -> real proxy -> scripted engine (a test double) -> scored workspace.

The scripted engine replays fixed assistant turns through the tiny model's real
tokenizer; everything else is real: the proxy (managed mode, keys registered by
the executor), the harness programs, the executor, the verifier. A scripted fix
must score 1 and a harness that touches nothing must score 0, through the same
path. Trace records are checked against the per-harness role rules.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from helpers.servers import scripted_proxy_stack

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import find_claude, find_mini, load_profile
from gyre.harness.roles import role_profile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import builtin_tasksets_dir, load_task

FIXED_TEMPERATURE = (
    "def c_to_f(c):\n    return c * 9 / 5 + 32\n\n\ndef f_to_c(f):\n    return (f - 32) * 5 / 9\n"
)
BASH_FIX = "cat > temperature.py <<'EOF'\n" + FIXED_TEMPERATURE + "EOF"

# Executor mechanics, not the sandbox (tested on its own): the explicit opt-out.
OFF = SandboxConfig(enabled=False)


def _call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


BOOK = {
    "scripts": [
        # Gyre's reference agent (matched by its per-role system prompts): delegate, compact, submit.
        {
            "name": "ref-sub-summary",
            "match": "You compact the working context of a sub-agent",
            "turns": [{"text": "SUBSUMMARY-OK"}],
        },
        {
            "name": "ref-main-summary",
            "match": "You compact the working context of Gyre's",
            "turns": [{"text": "MAINSUMMARY-OK"}],
        },
        {
            "name": "ref-sub-after",
            "match": "SUBSUMMARY-OK",
            "turns": [{"tool_calls": [_call("submit", summary="sub done")]}],
        },
        {
            "name": "ref-main-after",
            "match": "MAINSUMMARY-OK",
            "turns": [{"tool_calls": [_call("submit", summary="all done")]}],
        },
        {
            "name": "ref-sub",
            "match": "You are a sub-agent of Gyre's",
            "turns": [
                {
                    "text": "Writing the fix.",
                    "tool_calls": [
                        _call("write_file", path="temperature.py", content=FIXED_TEMPERATURE)
                    ],
                }
            ],
        },
        {
            "name": "ref-noop",
            "match": "matrix.py's `transpose`",
            "turns": [{"tool_calls": [_call("submit", summary="nothing")]}],
        },
        {
            "name": "ref-main",
            "match": "You are Gyre's reference coding agent",
            "turns": [
                {
                    "text": "Delegating.",
                    "tool_calls": [
                        _call(
                            "delegate",
                            task="Fix temperature.py: the conversion factors are swapped.",
                        )
                    ],
                }
            ],
        },
        # mini-swe-agent v2 (one bash tool; ends on COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT).
        {
            "name": "mini-fix",
            "match": "Please solve this issue: temperature.py",
            "turns": [
                {"text": "Fix it.", "tool_calls": [_call("bash", command=BASH_FIX)]},
                {
                    "text": "Submit.",
                    "tool_calls": [
                        _call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
                    ],
                },
            ],
        },
        {
            "name": "mini-noop",
            "match": "Please solve this issue: roman.py",
            "turns": [
                {
                    "text": "Submit.",
                    "tool_calls": [
                        _call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
                    ],
                }
            ],
        },
        # Claude Code (Anthropic messages API; Bash and Agent tools).
        {
            "name": "cc-sub",
            "match": "SUBTASK-7",
            "turns": [{"text": "Sub-agent report: SUBTASK-7 done."}],
            "exhausted": {"text": "Done."},
        },
        {
            "name": "cc-fix",
            "match": "temperature.py converts",
            "turns": [
                {
                    "text": "Fixing.",
                    "tool_calls": [
                        _call("Bash", command=BASH_FIX, description="Fix the conversion")
                    ],
                },
                {"text": "Done."},
            ],
            "exhausted": {"text": "Done."},
        },
        {
            "name": "cc-delegate",
            "match": "palindrome.py's",
            "turns": [
                {
                    "text": "Delegating.",
                    "tool_calls": [
                        _call(
                            "Agent",
                            description="check",
                            prompt="SUBTASK-7: report done",
                            subagent_type="general-purpose",
                        )
                    ],
                },
                {"text": "Done."},
            ],
            "exhausted": {"text": "Done."},
        },
        {
            "name": "cc-noop",
            "match": "rle.py's `encode`",
            "turns": [{"text": "Nothing to do."}],
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


def binary_copy(tmp_path: Path, name: str) -> Path:
    """A pyfix task copied with the binary reward rule (untouched must give exactly 0)."""
    dst = tmp_path / name
    shutil.copytree(builtin_tasksets_dir() / "pyfix" / name, dst)
    toml = dst / "task.toml"
    toml.write_text(toml.read_text().replace('reward = "fraction"', 'reward = "binary"'))
    return dst


def roles_of(traces: Path, execution_id: str, profile_name: str) -> Counter:
    from gyre.trace.store import read_trace, trace_path

    res = read_trace(trace_path(traces, execution_id))
    assert res.errors == [] and res.records, f"no clean trace for {execution_id}"
    prof = role_profile(profile_name)
    return Counter(prof.role_of(r.meta).value for r in res.records)


async def run_all(tmp_path, register, specs):
    cfg = ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs")
    async with HarnessExecutor(cfg, register=register) as ex:
        return await ex.run_many(specs)


def pyfix(name: str):
    return load_task(builtin_tasksets_dir() / "pyfix" / name)


def _diag(r) -> str:
    return (
        f"{r.execution_id}: {r.assessment} stop={r.harness.stop} exit={r.harness.exit_code} {r.harness.error}\n"
        + Path(r.harness.stdout_path).read_text()[-1500:]
        + Path(r.harness.stderr_path).read_text()[-1500:]
    )


async def test_reference_agent_e2e(stack, tmp_path):
    url, register, traces = stack
    prof = load_profile("reference")
    prof = prof.model_copy(update={"args": ["--context-limit", "50"]})  # compact after every turn
    fix, noop = await run_all(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="ref-fix", task=pyfix("temperature"), profile=prof, base_url=url
            ),
            ExecutionSpec(
                execution_id="ref-noop", task=pyfix("transpose"), profile=prof, base_url=url
            ),
        ],
    )
    assert fix.reward == 1.0, _diag(fix)
    assert noop.reward == 0.0, _diag(noop)
    # delegate -> sub-agent (write, compaction, submit) -> main compaction -> submit: all four roles.
    assert roles_of(traces, "ref-fix", "reference") == Counter(
        {"main": 2, "sub-agent": 2, "main-summary": 1, "sub-agent-summary": 1}
    )
    assert roles_of(traces, "ref-noop", "reference") == Counter({"main": 1})
    # the time around the calls, from the agent's report, in each result's timings
    for r in (fix, noop):
        t = r.timings
        assert t.first_call_s is not None and t.after_last_call_s is not None
        assert 0 < t.first_call_s + t.after_last_call_s < t.total_s


@pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.parametrize("network", ["shared", "proxy-only"])
async def test_reference_agent_sandboxed_reaches_proxy(stack, tmp_path, network):
    """In the sandbox the harness still reaches the proxy: on the shared loopback, or bridged
    through a unix socket into its own network namespace (proxy-only)."""
    url, register, traces = stack
    prof = load_profile("reference").model_copy(update={"args": ["--context-limit", "50"]})
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs", sandbox=SandboxConfig(enabled=True, network=network)
    )
    async with HarnessExecutor(cfg, register=register) as ex:
        r = await ex.run(
            ExecutionSpec(
                execution_id=f"ref-fix-sandboxed-{network}",
                task=pyfix("temperature"),
                profile=prof,
                base_url=url,
            )
        )
    assert r.reward == 1.0, _diag(r)
    assert sum(roles_of(traces, f"ref-fix-sandboxed-{network}", "reference").values()) == 6


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.skipif(
    find_mini() is None, reason="mini-swe-agent is not installed (scripts/install-harnesses.sh)"
)
async def test_mini_swe_agent_e2e(stack, tmp_path):
    url, register, traces = stack
    prof = load_profile("mini-swe-agent")
    fix, noop = await run_all(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="mini-fix",
                task=pyfix("temperature"),
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            ),
            ExecutionSpec(
                execution_id="mini-noop",
                task=load_task(binary_copy(tmp_path, "roman")),
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            ),
        ],
    )
    assert fix.reward == 1.0, _diag(fix)
    assert noop.reward == 0.0, _diag(noop)
    assert fix.harness.stop == "exited"
    assert roles_of(traces, "mini-fix", "mini-swe-agent") == Counter({"main": 2})


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.skipif(
    find_claude() is None, reason="Claude Code is not installed (scripts/install-harnesses.sh)"
)
async def test_claude_code_e2e(stack, tmp_path):
    url, register, traces = stack
    prof = load_profile("claude-code")
    fix, noop, deleg = await run_all(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="cc-fix",
                task=pyfix("temperature"),
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            ),
            ExecutionSpec(
                execution_id="cc-noop",
                task=load_task(binary_copy(tmp_path, "rle")),
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            ),
            ExecutionSpec(
                execution_id="cc-delegate",
                task=pyfix("palindrome"),
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            ),
        ],
    )
    assert fix.reward == 1.0, _diag(fix)
    assert noop.reward == 0.0, _diag(noop)
    assert isinstance(deleg.reward, float), _diag(deleg)
    assert roles_of(traces, "cc-fix", "claude-code")["main"] >= 2
    assert set(roles_of(traces, "cc-fix", "claude-code")) == {"main"}
    # The Agent tool's sub-agent request is told apart from the main thread by the rules.
    c = roles_of(traces, "cc-delegate", "claude-code")
    assert c["sub-agent"] == 1 and c["main"] >= 2 and set(c) == {"main", "sub-agent"}, c
    # A live compaction: `claude -p /compact --continue` in the fixed execution's workspace and HOME.
    key = await register("cc-compact", "compact")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(Path(fix.execution_dir) / "home"),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": key,
        **prof.env,
    }
    proc = await asyncio.create_subprocess_exec(
        find_claude(),
        "-p",
        "/compact",
        "--continue",
        "--output-format",
        "json",
        "--model",
        "policy",
        cwd=fix.workspace,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, (out[-1000:], err[-1000:])
    # (Claude Code may re-ask when the scripted summary lacks its <summary> block: all are summaries.)
    c = roles_of(traces, "cc-compact", "claude-code")
    assert set(c) == {"main-summary"} and c["main-summary"] >= 1, c


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.skipif(
    find_claude() is None, reason="Claude Code is not installed (scripts/install-harnesses.sh)"
)
@pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap (bwrap) is not installed")
async def test_claude_code_sandboxed_e2e(stack, tmp_path):
    """Claude Code under bubblewrap (read-only root, tmpfs HOME, own network namespace with only the
    proxy bridged in) still fixes the task, streaming through the bridge."""
    url, register, traces = stack
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs", sandbox=SandboxConfig(enabled=True, network="proxy-only")
    )
    async with HarnessExecutor(cfg, register=register) as ex:
        r = await ex.run(
            ExecutionSpec(
                execution_id="cc-fix-sandboxed",
                task=pyfix("temperature"),
                profile=load_profile("claude-code"),
                base_url=url,
                harness_timeout_s=240,
            )
        )
    assert r.reward == 1.0, _diag(r)


async def test_synthetic_harness_e2e(stack, tmp_path):
    """The synthetic harness makes its calls through the proxy; each lands as one trace record."""
    url, register, traces = stack
    prof = load_profile("synthetic").model_copy(
        update={
            "args": [
                "--calls",
                "3",
                "--dist",
                "lognormal",
                "--mean-s",
                "600",
                "--time-scale",
                "0.0005",
                "--write",
                "answer.txt=x",
            ]
        }
    )
    task = pyfix("rle")
    rs = await run_all(
        tmp_path,
        register,
        [
            ExecutionSpec(execution_id=f"syn-{i}", task=task, profile=prof, base_url=url)
            for i in range(3)
        ],
    )
    for r in rs:
        assert r.harness.exit_code == 0 and r.reward == 0.25, _diag(r)
        assert sum(roles_of(traces, r.execution_id, "synthetic").values()) == 3


@pytest.mark.slow
async def test_quickstart_with_tiny_model(tiny_model_dir, tmp_path):
    """The quickstart path with a real (tiny, untrained) model: embedded engine -> proxy -> reference
    agent -> answer.txt -> a graded reward in [0, 1], never missing."""
    from gyre.engine.app import create_app
    from gyre.engine.cli import build_engine
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.runner import ServerRunner
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import ProxyServer
    from gyre.trace.store import read_trace

    eng = ServerRunner(
        create_app(
            build_engine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir), torch_threads=1))
        ),
        name="tiny",
    ).start()
    proxy = ProxyServer(
        ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[eng.url],
            trace_dir=str(tmp_path / "t"),
            fsync=False,
        )
    ).start()
    try:
        prof = load_profile("reference").model_copy(
            update={"args": ["--max-tokens", "48", "--max-turns", "2", "--temperature", "1.0"]}
        )
        from gyre.harness.task import load_taskset

        tasks = load_taskset("quickstart")[:2]
        rs = await run_all(
            tmp_path,
            None,
            [
                ExecutionSpec(
                    execution_id=f"q-{t.name}",
                    task=t,
                    profile=prof,
                    base_url=proxy.url,
                    api_key=f"key-{t.name}",
                )
                for t in tasks
            ],
        )
    finally:
        proxy.stop()
        eng.stop()
    for r in rs:
        assert r.reward is not None and 0.0 <= r.reward <= 1.0, _diag(r)
    files = sorted((tmp_path / "t").glob("*.jsonl"))  # open mode: one trace per API key
    assert len(files) == len(rs)
    for f in files:
        recs = read_trace(f).records
        assert recs and all(rec.output_ids and rec.output_logprobs for rec in recs)
