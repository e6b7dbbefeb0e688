"""One execution's launch: its state, an early end, and the harness's sandbox.

:class:`gyre.harness.executor.HarnessExecutor` runs each execution in numbered steps;
this module holds what they share (:class:`Exec`, :class:`Launch`, :class:`Abort`) and the
sandbox step (bubblewrap, the seeded HOME, the proxy-only bridge, the workspace watcher)
with its undoing once the harness stopped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gyre.trace.assessment import MissingReason

from . import homeseed
from .config import ExecutorConfig
from .execution import ExecutionSpec, HarnessRun, HarnessStop, Timings
from .forwarder import UnixForwarder
from .hostguard import GYRE_ROOT, strip_modes, task_paths
from .quota import watch_tree
from .sandbox import SANDBOX_HOME, Confinement, bwrap_argv, bwrap_env, env_memfd
from .userns import chown_tree, make_userns


class Abort(Exception):
    """Ends an execution before it is scored: ``Missing(reason)``, ``detail`` recorded as the
    harness's error (and ``stop`` as its stop, when given); ``write``: into result.json
    (never into a folder this execution did not create)."""

    def __init__(
        self,
        reason: MissingReason,
        detail: str,
        *,
        stop: HarnessStop | None = None,
        write: bool = True,
    ) -> None:
        super().__init__(detail)
        self.reason, self.detail, self.stop, self.write = reason, detail, stop, write


@dataclass
class Exec:
    """One execution from launch to result: its budget, its folders, what is recorded."""

    spec: ExecutionSpec
    t_launch: float
    deadline: float  # monotonic: the overall budget (or the caller's deadline) ends here
    overall: float
    exec_dir: Path
    ws: Path
    inputs: Path
    artifacts: Path
    home: Path
    run: HarnessRun
    timings: Timings
    call_times: tuple[float, float] | None = None  # the harness's first call, last answer


@dataclass
class Launch:
    """The harness's command line and environment, and what its sandbox holds open (undone
    once it stopped)."""

    argv: list[str]
    env: dict[str, str]
    home_files: dict[str, str]
    bridge: tuple[str, int, str] | None  # proxy-only network: command.bridge_target
    forwarder: UnixForwarder | None = None
    sock_dir: Path | None = None
    userns_fd: int | None = None
    env_fd: int | None = None  # the harness's environment, read inside (sandbox.env_memfd)
    watcher: asyncio.Task | None = None


async def sandbox(
    cfg: ExecutorConfig, bwrap: str, confine: Confinement, x: Exec, launch: Launch
) -> None:
    """The harness inside bubblewrap: HOME seeded, owned files, the proxy-only bridge,
    the workspace watcher. What it opens, :func:`undo_sandbox` closes."""
    sb = cfg.sandbox
    argv = launch.argv
    if launch.home_files:  # by file, isolated: stdlib only, like confine
        argv = [
            sys.executable,
            "-S",
            "-I",
            homeseed.__file__,
            "--from",
            str(x.inputs / "home"),
            "--",
            *argv,
        ]
    if os.geteuid() == 0:  # the harness runs as sb.uid on the host too: hand it what it writes
        try:
            for d in (x.ws, x.artifacts):
                await asyncio.to_thread(chown_tree, d, sb.uid, sb.gid)
            launch.userns_fd = await asyncio.to_thread(make_userns, sb.uid, sb.gid)
        except OSError as e:
            raise Abort(MissingReason.infra_error, f"sandbox setup failed: {e}") from None
    ro_binds = [x.inputs, *sb.ro_binds]
    bridge = None
    if launch.bridge is not None:
        bridge = _bridged(cfg, launch)
        assert launch.sock_dir is not None
        ro_binds.append(launch.sock_dir)  # connect() needs no write access to the mount
    env = launch.env
    env["HOME"] = SANDBOX_HOME
    # The sandbox binds this process's own gyre package (sandbox.tool_paths); a Python
    # inside must import that one (`python -m gyre.harness.reference_agent`), not the
    # one a venv's editable install names (which the sandbox does not show).
    env.setdefault("PYTHONPATH", GYRE_ROOT)
    # The harness's environment reaches only the sandbox (confine.py reads it), never the
    # host-side bwrap process (gyre.harness.sandbox, "Environment").
    try:
        launch.env_fd = env_memfd(env)
    except OSError as e:
        _close_setup(launch)
        raise Abort(MissingReason.infra_error, f"sandbox setup failed: {e}") from None
    launch.env = bwrap_env()
    # Off the loop: resolving the mounts stats hundreds of paths (~25 ms per call).
    try:
        launch.argv = await asyncio.to_thread(
            bwrap_argv,
            argv,
            workspace=x.ws,
            hide=[
                cfg.workspace_root.resolve(),
                *task_paths(x.spec.task),
                *sb.hide_paths,
            ],
            writable=[x.artifacts],
            ro_binds=ro_binds,
            home=SANDBOX_HOME,
            bwrap=bwrap,
            unshare_net=launch.bridge is not None,
            confine=confine,
            userns_fd=launch.userns_fd,
            env_fd=launch.env_fd,
            bridge=bridge,
        )
    except BaseException:  # cancelled or failed before the harness step owns these
        _close_setup(launch)
        raise
    if sb.max_workspace_bytes or sb.max_workspace_files:
        limit = sb.max_workspace_bytes or 1 << 62
        launch.watcher = asyncio.ensure_future(
            watch_tree(x.ws, limit, sb.disk_check_s, sb.max_workspace_files)
        )


def _close_setup(launch: Launch) -> None:
    """What :func:`sandbox` opened, when it fails before the harness step owns it."""
    for fd in (launch.userns_fd, launch.env_fd):
        if fd is not None:
            os.close(fd)
    launch.userns_fd = launch.env_fd = None
    if launch.sock_dir is not None:
        shutil.rmtree(launch.sock_dir, ignore_errors=True)


def _bridged(cfg: ExecutorConfig, launch: Launch) -> tuple[str, str]:
    """Proxy-only network: own network namespace, the proxy reachable through a unix
    socket that ``launch.forwarder`` serves. Returns the in-sandbox bridge's ``HOST:PORT``
    and socket path (confine serves it: :mod:`gyre.harness.netbridge`)."""
    assert launch.bridge is not None
    sb = cfg.sandbox
    # short: AF_UNIX paths <= 107 bytes
    sock_dir = launch.sock_dir = Path(tempfile.mkdtemp(prefix="gyre-nb-", dir="/tmp"))
    launch.forwarder = UnixForwarder(
        sock_dir / "p.sock", launch.bridge[0], launch.bridge[1], sb.max_proxy_connections
    )
    return f"127.0.0.1:{urlsplit(launch.bridge[2]).port}", str(sock_dir / "p.sock")


def open_bridge(sock_dir: Path, gid: int) -> None:
    """Let the sandbox user connect to the bridge socket, and nothing more (root launcher).

    The folder stays the launcher's, mode 0711: the sandbox uid may pass through it but not
    list, rename, unlink or create in it, so no host process of that uid (another sandbox's,
    a ``nobody`` daemon's) can move the socket aside and listen in its place, reading the
    execution's bearer key and forging its model's answers. The socket is the launcher's
    too, group ``gid``, mode 0660: connect() needs write access to it, nothing else does.
    The folder is opened last (mkdtemp made it 0700): no one reaches the socket before."""
    sock = sock_dir / "p.sock"
    os.chown(sock, os.geteuid(), gid)
    os.chmod(sock, 0o660)
    os.chmod(sock_dir, 0o711)


async def undo_sandbox(x: Exec, launch: Launch) -> None:
    """Once the harness stopped: the watcher, user namespace, bridge, and modes it left."""
    if launch.watcher is not None:
        launch.watcher.cancel()
    for fd in (launch.userns_fd, launch.env_fd):
        if fd is not None:
            os.close(fd)
    launch.userns_fd = launch.env_fd = None
    if launch.forwarder is not None:
        await launch.forwarder.stop()
    if launch.sock_dir is not None:
        shutil.rmtree(launch.sock_dir, ignore_errors=True)
    # The harness is gone: no set-id bit or open mode of its making reaches the host's
    # kept workspace or the scoring copy (gyre.harness.fsmode).
    await asyncio.to_thread(strip_modes, x.ws, x.artifacts)
