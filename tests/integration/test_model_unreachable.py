"""An unreachable model is not a reward: executions whose model calls all failed are missing.

Real harness processes, a real proxy and the real executor; the engine behind the
proxy is either absent (a port nothing listens on) or the scripted test double.
The same untouched workspace must come out as ``Missing(model_unreachable)`` when
the policy never answered, and as a genuine ``Scored`` zero when it did.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec, load_result
from gyre.harness.executor import HarnessExecutor
from gyre.harness.model_calls import ModelCalls
from gyre.harness.profiles import load_profile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import load_task
from gyre.ports import free_ports
from gyre.trace.assessment import Missing, MissingReason, Scored

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task, shell_profile

# Executor mechanics, not the sandbox (tested on its own): the explicit opt-out.
OFF = SandboxConfig(enabled=False)


def dead_url() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    return f"http://127.0.0.1:{free_ports()[0]}"


def reference(*extra: str):
    # the stdlib client: same requests, ~1.5 s less start-up per harness process
    return load_profile("reference").model_copy(
        update={"args": ["--client", "stdlib", "--max-turns", "2", *extra]}
    )


def spec(eid: str, task, profile, base_url: str, **kw) -> ExecutionSpec:
    return ExecutionSpec(execution_id=eid, task=task, profile=profile, base_url=base_url, **kw)


async def run(tmp_path: Path, specs, **hooks):
    cfg = ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs", kill_grace_s=0.5)
    async with HarnessExecutor(cfg, **hooks) as ex:
        return await ex.run_many(specs)


# ---- the executor's rule, with the proxy's counts stood in by a hook ----------------------------


async def test_rule_through_the_calls_hook(tmp_path):
    task = load_task(make_task(tmp_path))
    counts = {
        "none-answered": ModelCalls(2, 0, "HTTP 503: no inference engine", "proxy"),
        "one-answered": ModelCalls(3, 1, "HTTP 503: no inference engine", "proxy"),
        "no-calls": ModelCalls(0, 0, "", "proxy"),
    }

    async def calls(eid: str) -> ModelCalls:
        return counts[eid]

    solve = shell_profile("echo 42 > answer.txt")  # a workspace that would score 1
    dead, some, oracle_like = await run(
        tmp_path,
        [spec(e, task, solve, "http://127.0.0.1:9", api_key="k") for e in counts],
        calls=calls,
    )
    a = dead.assessment
    assert isinstance(a, Missing) and a.reason == MissingReason.model_unreachable, a
    assert "2 model calls attempted, none answered" in a.detail and "HTTP 503" in a.detail
    assert dead.reward is None and dead.timings.scoring_s == 0.0  # never scored
    assert dead.harness.model_calls == counts["none-answered"]
    again = load_result(Path(dead.execution_dir) / "result.json")
    assert again.assessment == a and again.harness.model_calls == counts["none-answered"]
    # the policy answered once: scored as usual, even though later calls failed
    assert isinstance(some.assessment, Scored) and some.reward == 1.0
    # no call at all (the oracle, a harness that never asks the model): scored as before
    assert isinstance(oracle_like.assessment, Scored) and oracle_like.reward == 1.0


async def test_harness_file_counts_when_the_proxy_saw_nothing(tmp_path):
    """Calls refused before they reached the proxy are only known to the harness."""
    task = load_task(make_task(tmp_path))
    writes = shell_profile(
        'echo 42 > answer.txt; echo \'{{"attempted": 1, "answered": 0, '  # {{ }}: profile template
        '"last_error": "ConnectionRefusedError"}}\' > "$GYRE_MODEL_CALLS_FILE"'
    )

    async def proxy_saw_nothing(eid: str) -> ModelCalls:
        return ModelCalls(0, 0, "", "proxy")

    async def proxy_down(eid: str) -> ModelCalls:
        raise ConnectionError("admin socket gone")

    r1, r2 = await run(
        tmp_path,
        [spec("saw-nothing", task, writes, "http://127.0.0.1:9", api_key="k")],
        calls=proxy_saw_nothing,
    ) + await run(
        tmp_path / "b",
        [spec("admin-down", task, writes, "http://127.0.0.1:9", api_key="k")],
        calls=proxy_down,
    )
    for r in (r1, r2):
        assert isinstance(r.assessment, Missing), r.assessment
        assert r.assessment.reason == MissingReason.model_unreachable
        assert "(by the harness): ConnectionRefusedError" in r.assessment.detail


# ---- the reference agent against a dead port: no proxy, no hook --------------------------------


async def test_reference_agent_against_a_dead_port_scores_its_zero_with_the_report(tmp_path):
    """No proxy: only the harness says no call was answered, and its word cannot turn a zero
    into missing (issue 19); the report is kept in the detail and in ``model_calls``.
    (Was: Missing(model_unreachable) from the harness's file alone.)"""
    task = load_task(make_task(tmp_path))
    t0 = time.monotonic()
    (r,) = await run(tmp_path, [spec("dead", task, reference(), dead_url(), api_key="k")])
    a = r.assessment
    assert isinstance(a, Scored) and a.reward == 0.0, a
    assert "none answered by the policy (by the harness)" in a.detail, a.detail
    assert "Connection refused" in a.detail, a.detail
    assert r.harness.exit_code == 2
    assert r.harness.model_calls == ModelCalls(1, 0, r.harness.model_calls.last_error, "harness")
    stderr = Path(r.harness.stderr_path).read_text()
    assert "reference agent: the model at" in stderr and "is unreachable" in stderr
    assert "Traceback" not in stderr
    assert time.monotonic() - t0 < 25  # fails fast: no retries against a refused connection


@pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.parametrize("network", ["shared", "proxy-only"])
async def test_sandboxed_reference_agent_against_a_dead_port(tmp_path, network):
    """The calls file crosses the sandbox (artifacts/ is bound writable, also for the
    unprivileged uid a root-launched sandbox runs as); in proxy-only mode the bridge, not
    the kernel, closes the connection, and it still reads as unreachable."""
    task = load_task(make_task(tmp_path))
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs",
        kill_grace_s=0.5,
        sandbox=SandboxConfig(enabled=True, network=network),
    )
    async with HarnessExecutor(cfg) as ex:
        r = await ex.run(spec(f"dead-{network}", task, reference(), dead_url(), api_key="k"))
    a = r.assessment
    assert isinstance(a, Scored) and a.reward == 0.0, a  # its own word: a zero stays a zero
    assert r.harness.model_calls is not None and r.harness.model_calls.source == "harness", (
        a,
        Path(r.harness.stderr_path).read_text()[-2000:],
    )
    assert r.harness.model_calls.unreachable


def test_cli_prints_the_harness_report_for_a_dead_port(tmp_path):
    from typer.testing import CliRunner

    from gyre.harness.cli import app

    task = make_task(tmp_path)
    out = CliRunner().invoke(
        app,
        [
            "run",
            str(task),
            "--base-url",
            dead_url(),
            "--workspace-root",
            str(tmp_path / "runs"),
            "--arg=--client",
            "--arg=stdlib",
        ],
    )
    assert out.exit_code == 0, out.output  # scored: only the harness says the model was down
    assert out.output.startswith("reward     0  [binary]"), out.output
    assert "detail     " in out.output and "1 model call attempted, none answered" in out.output


# ---- through the proxy -------------------------------------------------------------------------


@pytest.fixture
def proxy_stack(tiny_model_dir, tmp_path):
    """A managed proxy in front of ``engines``; yields (proxy url, register, calls hook, admin)."""
    from contextlib import ExitStack

    from gyre.harness.model_calls import ModelCalls
    from gyre.proxy.admin import ProxyAdminClient
    from gyre.proxy.config import ProxyConfig
    from gyre.proxy.runner import ProxyServer

    stack = ExitStack()

    def start(engines: list[str]):
        proxy = ProxyServer(
            ProxyConfig(
                model_dir=str(tiny_model_dir),
                engines=engines,
                mode="managed",
                trace_dir=str(tmp_path / "traces"),
                max_context_tokens=1 << 20,
                fsync=False,
                engine_wait_s=1.0,
                engine_max_attempts=2,
                engine_retry_budget_s=1.0,
            )
        ).start()
        stack.callback(proxy.stop)
        admin = ProxyAdminClient(proxy.admin_socket, proxy.admin_token)
        stack.callback(admin.close)

        async def register(eid: str, label: str) -> str:
            return await asyncio.to_thread(admin.register, eid, label)

        async def calls(eid: str) -> ModelCalls:
            d = await asyncio.to_thread(admin.calls, eid)
            return ModelCalls(d["attempted"], d["answered"], d["last_error"], "proxy")

        return proxy.url, register, calls, admin

    with stack:
        yield start, stack


async def test_through_the_proxy_with_no_engine_reachable(proxy_stack, tmp_path):
    start, _ = proxy_stack
    url, register, calls, admin = start([dead_url()])
    task = load_task(make_task(tmp_path))
    (r,) = await run(
        tmp_path, [spec("no-engine", task, reference(), url)], register=register, calls=calls
    )
    a = r.assessment
    assert isinstance(a, Missing) and a.reason == MissingReason.model_unreachable, a
    assert "(at the proxy): HTTP 5" in a.detail, a.detail
    assert r.harness.model_calls.source == "proxy" and r.harness.model_calls.answered == 0
    assert admin.calls("no-engine")["attempted"] >= 1


async def test_through_the_proxy_with_an_engine_is_scored_as_usual(
    proxy_stack, tiny_model_dir, tmp_path
):
    """Same task, same untouched workspace: here the policy answered, so 0 is a real zero."""
    from helpers.servers import running_engine

    start, stack = proxy_stack
    book = {"scripts": [{"name": "any", "turns": [{"text": "Done."}], "exhausted": {"text": "."}}]}
    eng = stack.enter_context(running_engine("scripted", str(tiny_model_dir), turns=book))
    url, register, calls, admin = start([eng.url])
    task = load_task(make_task(tmp_path))
    (r,) = await run(
        tmp_path, [spec("answered", task, reference(), url)], register=register, calls=calls
    )
    assert isinstance(r.assessment, Scored) and r.reward == 0.0, r.assessment
    assert r.harness.model_calls == ModelCalls(1, 1, "", "proxy")
    written = json.loads(Path(r.execution_dir, "artifacts", "model_calls.json").read_text())
    times = {k: written.pop(k) for k in ("first_call_at", "last_answer_at")}
    assert written == {"attempted": 1, "answered": 1, "last_error": ""}
    # the agent's own clock of its first call and last answer (Timings.first_call_s)
    assert 0 <= times["last_answer_at"] - times["first_call_at"] < 60, times
