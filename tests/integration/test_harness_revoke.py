"""The execution's key dies with its harness: a child that outlived it (setsid) cannot call.

Unsandboxed, a ``setsid`` child is in neither the harness's process group nor (once the
harness has exited) its descendants; it used to keep the key through scoring and its calls
landed in the execution's trace. The executor now revokes the key as soon as the harness has
stopped, before scoring: the child's call gets 401 and nothing reaches the trace.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gyre.engine.app import create_app
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.task import load_task
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer
from gyre.trace import trace_path

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task, shell_profile

# The verifier takes its time: the survivor calls while the execution is being scored.
SLOW_CHECK = 'sleep 3; echo 1 > "$GYRE_REWARD_DIR/reward.txt"\n'


@pytest.fixture
def proxy(tiny_model_dir, tiny_tokenizer, tmp_path):
    eng = ServerRunner(create_app(NullEngine()), name="null-engine").start()
    cfg = ProxyConfig(
        model_dir=str(tiny_model_dir),
        engines=[eng.url],
        mode="managed",
        trace_dir=str(tmp_path / "traces"),
        fsync=False,
    )
    px = ProxyServer(cfg, tiny_tokenizer).start()
    yield px
    px.stop()
    eng.stop()


async def test_a_surviving_setsid_child_loses_the_key_when_the_harness_stops(proxy, tmp_path):
    admin = proxy.admin_client()
    status = tmp_path / "survivor-status"
    call = (
        "import json, os, time, urllib.error, urllib.request\n"
        "time.sleep(2.5)\n"  # the harness has exited by now; scoring has begun
        "req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',"
        " data=json.dumps({'model': 'm', 'max_tokens': 2,"
        " 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(),"
        " headers={'content-type': 'application/json',"
        " 'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
        "try:\n"
        "    code = urllib.request.urlopen(req, timeout=20).status\n"
        "except urllib.error.HTTPError as e:\n"
        "    code = e.code\n"
        f"open({str(status)!r}, 'w').write(str(code))\n"
    )
    (tmp_path / "survivor.py").write_text(call)
    script = f"setsid {sys.executable} {tmp_path / 'survivor.py'} </dev/null >/dev/null 2>{tmp_path / 'survivor.err'} &\necho 42 > answer.txt; sleep 1"

    async def register(eid: str, label: str) -> str:
        return await asyncio.to_thread(admin.register, eid, label)

    async def revoke(eid: str) -> None:
        await asyncio.to_thread(admin.revoke, eid)

    task = load_task(make_task(tmp_path, test_sh=SLOW_CHECK))
    cfg = ExecutorConfig(workspace_root=tmp_path / "runs", sandbox=SandboxConfig(enabled=False))
    async with HarnessExecutor(cfg, register=register, revoke=revoke) as ex:
        r = await ex.run(
            ExecutionSpec(
                execution_id="survivor",
                task=task,
                profile=shell_profile(script),
                base_url=proxy.url + "/v1",
            )
        )
    assert r.reward == 1.0, r.assessment
    for _ in range(100):
        if status.exists():
            break
        await asyncio.sleep(0.1)
    admin.close()
    err = tmp_path / "survivor.err"
    assert status.exists(), err.read_text() if err.exists() else "no stderr"
    assert status.read_text() == "401", status.read_text()
    assert not trace_path(tmp_path / "traces", "survivor").exists()
