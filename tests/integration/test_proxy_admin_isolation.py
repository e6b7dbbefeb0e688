"""Issue 13 item 3: a harness cannot reach the proxy's admin routes nor learn its token.

A real execution through the harness executor (unsandboxed, and inside the
bubblewrap sandbox when it is installed) runs a hostile script that tries every
admin route on the API port it was given (register a key for another execution,
drain and remove the engine, list, stats, engine details) and dumps every
environment and command line it can read under /proc. Every attempt must be a
404 (the routes do not exist there), the token must appear nowhere in the dump,
and the proxy's state must be unchanged.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import httpx
import pytest

from gyre.engine.app import create_app
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import HarnessProfile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import load_task
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task

ESCAPE = r"""
import json, os, urllib.request, urllib.error
base = os.environ["OPENAI_BASE_URL"].rsplit("/v1", 1)[0]
key = os.environ["OPENAI_API_KEY"]
engine = os.environ["VICTIM_ENGINE"]
attempts = [
    ("POST", "/admin/executions", {"execution_id": "victim", "key": "stolen-key"}),
    ("GET", "/admin/executions", None),
    ("DELETE", "/admin/executions/victim", None),
    ("POST", "/admin/engines/drain", {"url": engine}),
    ("POST", "/admin/engines/remove", {"url": engine}),
    ("POST", "/admin/engines", {"url": "http://127.0.0.1:9"}),
    ("GET", "/admin/stats", None),
    ("GET", "/admin/health", None),
]
out = {"status": [], "dump": []}
for method, path, body in attempts:
    for auth in (key, "", "admin"):
        req = urllib.request.Request(base + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"authorization": "Bearer " + auth, "content-type": "application/json"})
        try:
            code = urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            code = e.code
        out["status"].append([method, path, code])
out["health"] = urllib.request.urlopen(base + "/health", timeout=10).read().decode()
out["dump"].append(json.dumps(dict(os.environ)))
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("cmdline", "environ"):
            try:
                out["dump"].append(open(f"/proc/{pid}/{f}", "rb").read().decode("latin-1"))
            except OSError:
                pass
open("escape.json", "w").write(json.dumps(out))
"""


@pytest.fixture
def stack(tiny_model_dir, tmp_path):
    eng = ServerRunner(create_app(NullEngine()), name="null-engine").start()
    px = ProxyServer(
        ProxyConfig(
            model_dir=str(tiny_model_dir),
            engines=[eng.url],
            mode="managed",
            trace_dir=str(tmp_path / "traces"),
            fsync=False,
        )
    ).start()
    try:
        yield px, eng
    finally:
        px.stop()
        eng.stop()


def test_admin_socket_is_private_and_api_port_has_no_admin_routes(stack):
    px, eng = stack
    sock = Path(px.admin_socket)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o700
    with px.admin_client() as admin:
        key = admin.register("mine", "main")
        assert admin.executions() == {"mine": "main"}
        details = admin.health()
        assert details["engines"][0]["url"] == eng.url
    for auth in (px.admin_token, key):  # not even the real token opens them on the API port
        h = {"authorization": f"Bearer {auth}"}
        assert httpx.post(px.url + "/admin/executions", json={}, headers=h).status_code == 404
        assert httpx.get(px.url + "/admin/stats", headers=h).status_code == 404
    public = httpx.get(px.url + "/health")
    assert public.status_code == 200
    assert public.json()["engines"] == {"total": 1, "active": 1, "reachable": 1}
    assert eng.url.split("//")[1] not in public.text
    # the admin socket still wants the token
    from gyre.proxy.admin import ProxyAdminClient, ProxyAdminError

    with ProxyAdminClient(px.admin_socket, key) as wrong, pytest.raises(ProxyAdminError):
        wrong.stats()
    with pytest.raises(ValueError):
        ProxyAdminClient(px.url, px.admin_token)


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
async def test_harness_cannot_reach_admin_or_read_token(stack, tmp_path, sandbox):
    if sandbox and bwrap_available() is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    px, eng = stack
    admin = px.admin_client()
    task_dir = make_task(tmp_path)
    (task_dir / "environment" / "repo" / "escape.py").write_text(ESCAPE)  # lands in the workspace

    async def register(eid: str, label: str) -> str:
        return admin.register(eid, label)

    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs",
        kill_grace_s=0.5,
        sandbox=SandboxConfig(enabled=sandbox),
    )
    ex = HarnessExecutor(cfg, register=register)
    await ex.start()
    try:
        task = load_task(task_dir)
        res = await ex.run(
            ExecutionSpec(
                execution_id="hostile",
                task=task,
                profile=HarnessProfile(name="hostile", command=[sys.executable, "escape.py"]),
                base_url=px.url,
                extra_env={"VICTIM_ENGINE": eng.url},
            )
        )
    finally:
        await ex.stop()
    assert res.harness.exit_code == 0, Path(res.harness.stderr_path).read_text()[-2000:]
    out = json.loads((Path(res.workspace) / "escape.json").read_text())
    codes = {code for _, _, code in out["status"]}
    assert codes == {404}, out["status"]
    assert eng.url.split("//")[1] not in out["health"]
    assert px.admin_token not in "".join(out["dump"])
    assert len(out["dump"]) > 2  # it did read /proc
    # nothing changed: no victim key, the engine still active and reachable
    assert "victim" not in admin.executions()
    assert [e["state"] for e in admin.health()["engines"]] == ["active"]
    admin.close()


@pytest.mark.slow
def test_gyre_proxy_process_keeps_the_token_off_cmdline_and_environ(tiny_model_dir, tmp_path):
    """`gyre proxy` in managed mode: token from a 0600 file, admin only on its unix socket."""
    import subprocess
    import time

    from gyre.proxy.admin import ProxyAdminClient

    eng = ServerRunner(create_app(NullEngine()), name="null-engine").start()
    secret = "tok-" + os.urandom(12).hex()
    tf = tmp_path / "token"
    tf.write_text(secret + "\n")
    tf.chmod(0o600)
    private = tmp_path / "adm"
    private.mkdir(mode=0o700)
    sock = private / "admin.sock"
    log = tmp_path / "proxy.log"
    gyre = str(Path(sys.executable).parent / "gyre")
    cmd = [gyre, "proxy", "--model", str(tiny_model_dir), "--engine", eng.url, "--port", "0"]
    cmd += ["--trace-dir", str(tmp_path / "traces"), "--mode", "managed", "--no-fsync"]
    cmd += ["--admin-token-file", str(tf), "--admin-socket", str(sock)]
    with open(log, "w") as errf:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
    try:
        deadline = time.monotonic() + 180
        url = None
        while url is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "proxy did not start"
            for line in log.read_text().splitlines():
                if line.startswith("gyre proxy on http://") and sock.exists():
                    url = line.split()[3]
            time.sleep(0.1)
        while True:  # printed once bound; serving a moment later
            try:
                httpx.get(url + "/health", timeout=5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.1)
        for f in ("cmdline", "environ"):
            assert secret.encode() not in Path(f"/proc/{proc.pid}/{f}").read_bytes()
        assert secret not in log.read_text()
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        with ProxyAdminClient(str(sock), secret) as admin:
            key = admin.register("cli-1", "main")
        h = {"authorization": f"Bearer {secret}"}
        assert httpx.post(url + "/admin/executions", json={}, headers=h).status_code == 404
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        r = httpx.post(
            url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
        eng.stop()
    assert not sock.exists()  # removed on exit
