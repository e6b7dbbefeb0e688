"""Executor must-shows: timeout semantics, missing assessments, orphans, isolation, bad input."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionError, ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import HarnessProfile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import load_task
from gyre.trace.assessment import Missing, MissingReason, Scored, mean_reward

sys.path.insert(0, str(Path(__file__).parent))  # robust to import modes / package layouts
from test_harness_util import live_pids_with, make_task, shell_profile

# Executor mechanics, not the sandbox (tested on its own): the explicit opt-out.
OFF = SandboxConfig(enabled=False)

needs_bwrap = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap (bwrap) is not installed"
)


def spec(eid: str, task, profile: HarnessProfile, **kw) -> ExecutionSpec:
    return ExecutionSpec(
        execution_id=eid,
        task=task,
        profile=profile,
        base_url="http://127.0.0.1:9",
        api_key="k",
        **kw,
    )


@pytest.fixture
async def executor(tmp_path):
    ex = HarnessExecutor(
        ExecutorConfig(
            sandbox=OFF, workspace_root=tmp_path / "runs", kill_grace_s=0.5, max_concurrency=8
        )
    )
    await ex.start()
    yield ex
    await ex.stop()


async def test_solved_scores_one_untouched_scores_zero(executor, tmp_path):
    task = load_task(make_task(tmp_path))
    good, none = await executor.run_many(
        [
            spec("good", task, shell_profile("echo 42 > answer.txt")),
            spec("none", task, shell_profile("true")),
        ]
    )
    assert isinstance(good.assessment, Scored) and good.assessment.reward == 1.0
    assert isinstance(none.assessment, Scored) and none.assessment.reward == 0.0
    assert good.workspace != none.workspace
    assert (Path(good.workspace) / "answer.txt").read_text().strip() == "42"
    assert not (Path(none.workspace) / "answer.txt").exists()  # fresh workspace per execution


async def test_timeout_after_correct_file_scores_one_and_nothing_scores_zero(executor, tmp_path):
    task = load_task(make_task(tmp_path, agent_timeout=1.0))
    wrote, idle = await executor.run_many(
        [
            spec("wrote", task, shell_profile("echo 42 > answer.txt; sleep 60")),
            spec("idle", task, shell_profile("sleep 60")),
        ]
    )
    for r in (wrote, idle):
        assert r.harness.stop == "harness_timeout" and r.harness.exit_code is None
        assert r.timings.harness_s < 10
    assert wrote.assessment == Scored(reward=1.0, rule="binary", detail=wrote.assessment.detail)
    assert isinstance(idle.assessment, Scored) and idle.assessment.reward == 0.0
    # The reward ignores exit status: a harness that fails loudly after solving still scores 1.
    r = await executor.run(spec("fail-after", task, shell_profile("echo 42 > answer.txt; exit 7")))
    assert r.harness.exit_code == 7 and r.reward == 1.0


async def test_evaluator_crash_hang_and_garbage_score_zero_not_missing(executor, tmp_path):
    """Issue 19: the workspace's code may be what crashed or hung the verifier (pytest imports
    it), so a verifier that gives no valid result is the workspace's zero; were it missing, a
    harness could opt out of every zero it earns. (Was: missing, evaluator_error/timeout.)"""
    crash = load_task(make_task(tmp_path, "crash", test_sh="echo boom >&2; exit 3\n"))
    hang = load_task(make_task(tmp_path, "hang", test_sh="sleep 60\n", verifier_timeout=1.0))
    garbage = load_task(
        make_task(
            tmp_path, "garbage", test_sh='echo "not a number" > "$GYRE_REWARD_DIR/reward.txt"\n'
        )
    )
    ok = load_task(make_task(tmp_path, "ok"))
    results = await executor.run_many(
        [
            spec("c", crash, shell_profile("echo 42 > answer.txt")),
            spec("h", hang, shell_profile("echo 42 > answer.txt")),
            spec("g", garbage, shell_profile("echo 42 > answer.txt")),
            spec("ok1", ok, shell_profile("echo 42 > answer.txt")),
            spec("ok0", ok, shell_profile("true")),
        ]
    )
    c, h, g, ok1, ok0 = results
    for r in (c, h, g):
        assert isinstance(r.assessment, Scored) and r.reward == 0.0, r.assessment
        assert r.assessment.detail.startswith("scored 0: ")
    assert "boom" in c.assessment.detail and "status 3" in c.assessment.detail
    assert "ran past 1.0s" in h.assessment.detail and h.timings.scoring_s < 10
    assert "not a number" in g.assessment.detail
    assert ok1.reward == 1.0 and ok0.reward == 0.0
    assert mean_reward([r.assessment for r in results]) == 0.2


async def test_overall_budget_exhausted_is_missing(executor, tmp_path):
    task = load_task(make_task(tmp_path, agent_timeout=30.0, overall=40.0))
    r = await executor.run(
        spec("o", task, shell_profile("echo 42 > answer.txt; sleep 60"), overall_timeout_s=1.0)
    )
    assert r.harness.stop == "overall_timeout"
    assert (
        isinstance(r.assessment, Missing) and r.assessment.reason == MissingReason.overall_timeout
    )
    # A caller's absolute deadline works the same way.
    r2 = await executor.run(
        spec("d", task, shell_profile("sleep 60"), deadline=time.monotonic() + 1.0)
    )
    assert (
        isinstance(r2.assessment, Missing) and r2.assessment.reason == MissingReason.overall_timeout
    )


async def test_budget_running_out_during_scoring_is_missing(executor, tmp_path):
    slow = load_task(
        make_task(
            tmp_path,
            "slowverifier",
            test_sh='sleep 30; echo 1 > "$GYRE_REWARD_DIR/reward.txt"\n',
            verifier_timeout=60.0,
        )
    )
    r = await executor.run(
        spec("sv", slow, shell_profile("echo 42 > answer.txt"), overall_timeout_s=1.5)
    )
    assert r.harness.stop == "exited"
    assert (
        isinstance(r.assessment, Missing) and r.assessment.reason == MissingReason.overall_timeout
    )
    assert r.timings.scoring_s < 10


@pytest.mark.parametrize("sandbox", [False, pytest.param(True, marks=needs_bwrap)])
async def test_no_orphans_after_timeout(tmp_path, sandbox):
    marker = f"{random.randint(100000, 999999)}"
    # Background child, a child that ignores SIGTERM, and one that left the process group (setsid).
    script = (
        f"sleep 900.{marker}1 & (trap '' TERM; sleep 900.{marker}2) & setsid sleep 900.{marker}3 & "
        f"echo started; sleep 900.{marker}4"
    )
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs", kill_grace_s=0.5, sandbox=SandboxConfig(enabled=sandbox)
    )
    task = load_task(make_task(tmp_path, agent_timeout=1.5))
    async with HarnessExecutor(cfg) as ex:
        r = await ex.run(spec("orphans", task, shell_profile(script)))
    assert r.harness.stop == "harness_timeout"
    assert "started" in Path(r.harness.stdout_path).read_text()
    await asyncio.sleep(0.2)
    left = live_pids_with(f"900.{marker}")
    for pid in left:  # clean up our own leftovers before failing
        os.kill(pid, signal.SIGKILL)
    assert left == []


async def test_stop_kills_running_executions(tmp_path):
    marker = f"{random.randint(100000, 999999)}"
    task = load_task(make_task(tmp_path))
    # One slot: one execution runs, the other waits in the queue.
    ex = HarnessExecutor(
        ExecutorConfig(
            sandbox=OFF, workspace_root=tmp_path / "runs", kill_grace_s=0.5, max_concurrency=1
        )
    )
    await ex.start()
    t = asyncio.create_task(ex.run(spec("s", task, shell_profile(f"sleep 900.{marker}"))))
    queued = asyncio.create_task(ex.run(spec("q", task, shell_profile("echo never"))))
    for _ in range(100):
        if live_pids_with(f"900.{marker}"):
            break
        await asyncio.sleep(0.05)
    assert ex.running == 2
    await ex.stop()
    q = await queued
    assert (
        isinstance(q.assessment, Missing)
        and q.assessment.detail == "executor stopped before launch"
    )
    r = await t  # the caller gets a recorded result, not an exception
    assert isinstance(r.assessment, Missing) and r.assessment.reason == MissingReason.cancelled
    assert (Path(r.execution_dir) / "result.json").exists() and Path(r.workspace).is_dir()
    assert live_pids_with(f"900.{marker}") == []
    # Cancelling the caller cancels its execution too (and kills its process group).
    async with HarnessExecutor(
        ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs2", kill_grace_s=0.5)
    ) as ex2:
        t2 = asyncio.create_task(ex2.run(spec("s2", task, shell_profile(f"sleep 901.{marker}"))))
        for _ in range(100):
            if live_pids_with(f"901.{marker}"):
                break
            await asyncio.sleep(0.05)
        t2.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t2
        assert ex2.running == 0
    assert live_pids_with(f"901.{marker}") == []


async def test_bad_input_recorded_while_others_are_served(tmp_path):
    task = load_task(make_task(tmp_path, agent_timeout=20.0))
    cfg = ExecutorConfig(
        sandbox=OFF, workspace_root=tmp_path / "runs", kill_grace_s=0.5, max_log_bytes=256 * 1024
    )
    async with HarnessExecutor(cfg) as ex:
        results = await ex.run_many(
            [
                spec(
                    "missing-cmd",
                    task,
                    HarnessProfile(name="nope", command=["/nonexistent/harness-xyz", "--go"]),
                ),
                spec(
                    "bad-template",
                    task,
                    HarnessProfile(name="tmpl", command=["echo", "{no_such_var}"]),
                ),
                spec("exits", task, shell_profile("exit 1")),
                spec("flood", task, shell_profile("echo 42 > answer.txt; yes flood-flood-flood")),
                spec("good", task, shell_profile("sleep 0.5; echo 42 > answer.txt")),
            ]
        )
    by = {r.execution_id: r for r in results}
    m = by["missing-cmd"]
    assert m.harness.stop == "launch_failed" and "/nonexistent/harness-xyz" in m.harness.error
    assert isinstance(m.assessment, Missing) and m.assessment.reason == MissingReason.launch_failed
    t = by["bad-template"]
    assert isinstance(t.assessment, Missing) and "no_such_var" in t.assessment.detail
    e = by["exits"]
    assert e.harness.stop == "exited" and e.harness.exit_code == 1 and e.reward == 0.0
    f = by["flood"]
    assert f.harness.stop == "log_limit" and f.harness.log_truncated
    assert Path(f.harness.stdout_path).stat().st_size < 300 * 1024
    assert f.reward == 1.0  # stopped for flooding, workspace still scored by the rule
    assert by["good"].reward == 1.0


async def test_missing_repository_is_a_clear_error(tmp_path):
    from gyre.harness.task import TaskError

    d = make_task(tmp_path)
    import shutil

    shutil.rmtree(d / "environment")
    with pytest.raises(TaskError, match="starting repository .* is missing"):
        load_task(d)


async def test_caller_errors(tmp_path):
    task = load_task(make_task(tmp_path))
    ex = HarnessExecutor(ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs"))
    with pytest.raises(ExecutionError, match="not started"):
        await ex.run(spec("x", task, shell_profile("true")))
    async with ex:
        await ex.run(spec("x", task, shell_profile("true")))
        with pytest.raises(ExecutionError, match="already used"):
            await ex.run(spec("x", task, shell_profile("true")))
        # No key and no register hook: a launch failure, recorded.
        r = await ex.run(
            ExecutionSpec(
                execution_id="nokey", task=task, profile=shell_profile("true"), base_url="http://x"
            )
        )
        assert isinstance(r.assessment, Missing) and "register hook" in r.assessment.detail
    # A stale folder with the same id (another executor instance): Missing, and the old record is left alone.
    (tmp_path / "runs" / "x" / "result.json").write_text("old")
    async with HarnessExecutor(ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs")) as ex:
        r = await ex.run(spec("x", task, shell_profile("true")))
    assert isinstance(r.assessment, Missing) and r.assessment.reason == MissingReason.infra_error
    assert (tmp_path / "runs" / "x" / "result.json").read_text() == "old"

    async def failing_register(eid: str, label: str) -> str:
        raise ConnectionError("proxy down")

    async with HarnessExecutor(
        ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs3"), register=failing_register
    ) as ex:
        r = await ex.run(
            ExecutionSpec(
                execution_id="k", task=task, profile=shell_profile("true"), base_url="http://x"
            )
        )
    assert r.harness.stop == "launch_failed" and "proxy down" in r.assessment.detail


async def test_concurrency_limit_and_register_hook(tmp_path):
    task = load_task(make_task(tmp_path))
    seen: list[tuple[str, str]] = []

    async def register(eid: str, label: str) -> str:
        seen.append((eid, label))
        return f"key-{eid}"

    cfg = ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs", max_concurrency=2)
    prof = shell_profile(
        'echo "$OPENAI_API_KEY $ANTHROPIC_API_KEY $OPENAI_BASE_URL $ANTHROPIC_BASE_URL"; sleep 0.6'
    )
    async with HarnessExecutor(cfg, register=register) as ex:
        specs = [
            ExecutionSpec(
                execution_id=f"e{i}", task=task, profile=prof, base_url="http://127.0.0.1:5/v1"
            )
            for i in range(4)
        ]
        rs = await ex.run_many(specs)
    assert sorted(seen) == [(f"e{i}", "t42/shell") for i in range(4)]
    out = Path(rs[0].harness.stdout_path).read_text().split()
    assert out == ["key-e0", "key-e0", "http://127.0.0.1:5/v1", "http://127.0.0.1:5"]
    # Two slots for four 0.6 s harnesses: two of them had to queue.
    assert sum(1 for r in rs if r.timings.queued_s > 0.3) == 2


@needs_bwrap
async def test_sandbox_isolates_workspaces_and_hidden_tests(tmp_path):
    task_dir = make_task(tmp_path, secret="TOP-SECRET")
    task = load_task(task_dir)
    cfg = ExecutorConfig(workspace_root=tmp_path / "runs", sandbox=SandboxConfig(enabled=True))
    runs = cfg.workspace_root.resolve()
    probe = (
        f"echo mine > mine.txt; sleep 0.5; "
        f"ls {runs}/other/workspace 2>&1; cat {runs}/other/workspace/mine.txt 2>&1; "
        f"cat {task_dir}/tests/secret.txt 2>&1; ls {task_dir} 2>&1; "
        f"touch /usr/gyre-probe 2>&1; echo HOME=$HOME; echo 42 > answer.txt"
    )
    async with HarnessExecutor(cfg) as ex:
        r, other = await ex.run_many(
            [
                spec("probe", task, shell_profile(probe)),
                spec("other", task, shell_profile("echo secret-of-other > mine.txt; sleep 1.5")),
            ]
        )
    out = Path(r.harness.stdout_path).read_text() + Path(r.harness.stderr_path).read_text()
    assert "secret-of-other" not in out and "TOP-SECRET" not in out
    assert "No such file or directory" in out and "Read-only file system" in out
    assert "HOME=/tmp/gyre-home" in out
    assert (
        r.reward == 1.0 and other.reward == 0.0
    )  # the sandboxed harness still wrote its own workspace
    # Without the sandbox the same probe does see the hidden file (what the sandbox prevents).
    async with HarnessExecutor(
        ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs2")
    ) as ex:
        r2 = await ex.run(spec("probe2", task, shell_profile(f"cat {task_dir}/tests/secret.txt")))
    assert "TOP-SECRET" in Path(r2.harness.stdout_path).read_text()


@needs_bwrap
async def test_proxy_only_network_reaches_the_proxy_and_nothing_else(tmp_path):
    """network="proxy-only": own network namespace; the base URL's port is bridged in, others are not."""
    import socket

    from gyre.engine.runner import ServerRunner

    async def app(scope, receive, send):  # a minimal ASGI endpoint standing in for the proxy
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"proxy-says-hi"})

    other = socket.socket()  # another host service on loopback the harness must not reach
    other.bind(("127.0.0.1", 0))
    other.listen()
    srv = ServerRunner(app).start()
    try:
        task = load_task(make_task(tmp_path))
        probe = (
            "python - <<'EOF'\n"
            "import os, socket, urllib.request\n"
            "print(urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/models', timeout=10).read().decode())\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {other.getsockname()[1]}), timeout=2); print('OTHER-REACHED')\n"
            "except OSError as e:\n"
            "    print('other unreachable', type(e).__name__)\n"
            "EOF\n"
            "echo 42 > answer.txt"
        )
        for network in ("proxy-only", "shared"):
            cfg = ExecutorConfig(
                workspace_root=tmp_path / f"runs-{network}",
                sandbox=SandboxConfig(enabled=True, network=network),
            )
            async with HarnessExecutor(cfg) as ex:
                r = await ex.run(
                    ExecutionSpec(
                        execution_id="p",
                        task=task,
                        profile=shell_profile(probe),
                        base_url=srv.url,
                        api_key="k",
                    )
                )
            out = Path(r.harness.stdout_path).read_text() + Path(r.harness.stderr_path).read_text()
            assert "proxy-says-hi" in out and r.reward == 1.0, out
            if network == "proxy-only":
                assert "other unreachable" in out and "OTHER-REACHED" not in out, out
            else:
                assert "OTHER-REACHED" in out, out  # what proxy-only prevents
    finally:
        srv.stop()
        other.close()


HARBOR_TEST_SH = """#!/bin/bash
# A Harbor-style verifier: hard-coded /app, /tests and /logs/verifier, no GYRE_* variables.
cd /app
cat > /tmp/test_outputs.py <<'PY'
def test_answer():
    assert open("/app/answer.txt").read().strip() == "42"
PY
if PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider /tmp/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@needs_bwrap
async def test_harbor_style_verifier_paths_with_sandbox(tmp_path):
    task = load_task(make_task(tmp_path, "harbor", test_sh=HARBOR_TEST_SH))
    cfg = ExecutorConfig(workspace_root=tmp_path / "runs", sandbox=SandboxConfig(enabled=True))
    async with HarnessExecutor(cfg) as ex:
        good, bad = await ex.run_many(
            [
                spec("h1", task, shell_profile("echo 42 > answer.txt")),
                spec("h0", task, shell_profile("echo 41 > answer.txt")),
            ]
        )
    assert good.reward == 1.0 and bad.reward == 0.0, (good.assessment, bad.assessment)
    # Without the sandbox those paths are the host's (it would write the host's /logs): the
    # verifier is refused before it runs -- a missing assessment saying why, not a zero.
    logs_before = os.path.exists("/logs/verifier/reward.txt")
    async with HarnessExecutor(
        ExecutorConfig(sandbox=OFF, workspace_root=tmp_path / "runs2")
    ) as ex:
        r = await ex.run(spec("h2", task, shell_profile("echo 42 > answer.txt")))
    assert (
        isinstance(r.assessment, Missing) and r.assessment.reason == MissingReason.evaluator_error
    )
    assert "/logs" in r.assessment.detail and "--sandbox" in r.assessment.detail, r.assessment
    assert os.path.exists("/logs/verifier/reward.txt") == logs_before
    assert not (tmp_path / "runs2" / "h2" / "scoring.verifier.stdout").exists()  # never ran
