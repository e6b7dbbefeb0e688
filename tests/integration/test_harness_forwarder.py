"""The proxy-only bridge's outer end keeps one execution to its share of proxy connections."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.forwarder import UnixForwarder
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import load_task

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task, shell_profile


async def test_connections_past_the_share_are_closed(tmp_path):
    held: list[asyncio.StreamWriter] = []

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)
        await r.read()  # until the client goes

    srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    fw = await UnixForwarder(tmp_path / "p.sock", "127.0.0.1", port, max_connections=8).start()
    conns = [await asyncio.open_unix_connection(str(tmp_path / "p.sock")) for _ in range(12)]
    await asyncio.sleep(0.3)
    closed = 0
    for r, _ in conns:
        try:
            closed += (await asyncio.wait_for(r.read(1), 0.2)) == b""
        except TimeoutError:
            pass
    assert closed == 4 and len(held) == 8, (closed, len(held))
    for _, w in conns:
        w.close()
    await fw.stop()
    srv.close()
    await srv.wait_closed()


async def test_stop_with_open_connections_logs_no_traceback(tmp_path):
    """stop() cancels each open connection's task; none may surface as an 'Exception in
    callback' CancelledError in the loop's log (it did, once per open connection)."""
    errors: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    fw = await UnixForwarder(tmp_path / "p.sock", "127.0.0.1", port).start()
    conns = [await asyncio.open_unix_connection(str(tmp_path / "p.sock")) for _ in range(3)]
    await asyncio.sleep(0.3)  # all three piping
    await fw.stop()
    await asyncio.sleep(0.1)  # the stream callbacks run after the tasks end
    for r, w in conns:
        assert await asyncio.wait_for(r.read(), 2) == b""  # closed by the forwarder
        w.close()
    srv.close()
    await srv.wait_closed()
    loop.set_exception_handler(None)
    assert errors == [], [str(e.get("exception") or e.get("message")) for e in errors]


# The sandbox user's attempts on a live bridge, made by a host process of that uid.
_TAKEOVER = r"""
import errno, json, os, socket, sys
d = sys.argv[1]
sock = os.path.join(d, "p.sock")
out = {}
def attempt(name, f):
    try:
        f()
        out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
attempt("rename", lambda: os.rename(sock, os.path.join(d, "moved")))
attempt("unlink", lambda: os.unlink(sock))
attempt("bind_beside", lambda: socket.socket(socket.AF_UNIX).bind(os.path.join(d, "evil")))
attempt("bind_in_place", lambda: socket.socket(socket.AF_UNIX).bind(sock))
attempt("chmod_folder", lambda: os.chmod(d, 0o777))
print(json.dumps(out))
"""

# Inside the sandbox: name the bridge folder, fetch the upstream's answer through the
# bridge, then wait (at most 30 s) for the test to say it is done.
_HARNESS = (
    "ls -d /tmp/gyre-nb-* > bridge.part && mv bridge.part bridge; "
    'python3 -c "import os, urllib.request; '
    "print(urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/x').read().decode())\" "
    "> answer.txt; "
    "for i in $(seq 300); do [ -e done ] && break; sleep 0.1; done"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid is a host uid only as root")
@pytest.mark.skipif(bwrap_available() is None, reason="no bwrap")
async def test_the_sandbox_uid_cannot_replace_the_bridge_socket(tmp_path):
    """Issue 37, finding 3: a host process of the sandbox's uid (65534 under a root launcher)
    could rename the bridge socket and listen in its place: the execution's bearer key and
    its model's answers were the stranger's. Its folder and socket are the launcher's now."""

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nhonest")
        await w.drain()
        w.close()

    srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    d = make_task(tmp_path / "set")
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs",
        kill_grace_s=0.5,
        sandbox=SandboxConfig(enabled=True, network="proxy-only"),
    )
    spec = ExecutionSpec(
        execution_id="e1",
        task=load_task(d),
        profile=shell_profile(_HARNESS),
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="k",
    )
    sb = cfg.sandbox
    async with HarnessExecutor(cfg) as ex:
        run = asyncio.ensure_future(ex.run(spec))
        ws = tmp_path / "runs" / "e1" / "workspace"
        for _ in range(600):
            if (ws / "bridge").exists() or run.done():
                break
            await asyncio.sleep(0.05)
        bridge = (ws / "bridge").read_text().strip()
        p = await asyncio.to_thread(
            subprocess.run,
            ["/usr/bin/python3", "-S", "-I", "-c", _TAKEOVER, bridge],
            user=sb.uid,
            group=sb.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
        )
        (ws / "done").touch()
        res = await asyncio.wait_for(run, 60)
    srv.close()
    await srv.wait_closed()
    tried = json.loads(p.stdout)
    assert tried == {
        "rename": "EACCES",
        "unlink": "EACCES",
        "bind_beside": "EACCES",
        "bind_in_place": "EADDRINUSE",
        "chmod_folder": "EPERM",
    }, tried
    # The sandbox user still connects: the harness got the upstream's answer through it.
    assert (Path(res.workspace) / "answer.txt").read_text().strip() == "honest"
