"""Bubblewrap command lines for harnesses and verifiers.

Layout inside the sandbox (host paths keep their names, so tools installed on
the host -- the venv, node, Claude Code -- work unchanged):

- ``/`` read-only (the system, the Python venv, harness binaries);
- ``/tmp`` and ``$HOME`` fresh tmpfs (a harness writes its caches there);
- every path in ``hide`` covered by an empty tmpfs: the root of all execution
  workspaces, the task folder or task set (hidden tests, reference solution),
  the trace directory -- so the harness cannot read another execution's
  workspace or the hidden tests;
- the execution's own workspace bound read-write on top;
- private pid, ipc and uts namespaces; ``--die-with-parent`` and the pid
  namespace mean nothing started inside outlives the sandbox.

The network namespace is shared on purpose: ``--unshare-net`` gives the sandbox
its own loopback, so a harness could not reach the proxy on 127.0.0.1. The
verifier needs no network and runs with ``--unshare-net``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SANDBOX_HOME = "/tmp/gyre-home"


def bwrap_available(bwrap: str = "bwrap") -> str | None:
    """Path of a working bwrap binary, or None."""
    return shutil.which(bwrap)


def _covers(parent: Path, child: Path) -> bool:
    return child == parent or parent in child.parents


def bwrap_argv(
    command: list[str],
    *,
    workspace: Path,
    hide: list[Path],
    writable: list[Path] = (),  # type: ignore[assignment]
    ro_binds: list[Path] = (),  # type: ignore[assignment]
    home: str = SANDBOX_HOME,
    unshare_net: bool = False,
    bwrap: str = "bwrap",
) -> list[str]:
    """The bwrap argv that runs ``command`` with ``workspace`` as its writable cwd."""
    ws = Path(workspace).resolve()
    argv = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
    ]
    if unshare_net:
        argv.append("--unshare-net")
    # Hide trees (an empty tmpfs over each). Skip ones already under /tmp
    # (hidden by the /tmp tmpfs) and ones that do not exist.
    for h in sorted({Path(p).resolve() for p in hide}, key=lambda p: len(p.parts)):
        if _covers(Path("/tmp"), h) or not h.exists():
            continue
        if h.is_dir():
            argv += ["--tmpfs", str(h)]
        else:
            argv += ["--ro-bind", "/dev/null", str(h)]
    argv += ["--tmpfs", home, "--setenv", "HOME", home]
    for p in ro_binds:
        p = Path(p).resolve()
        argv += ["--ro-bind", str(p), str(p)]
    for p in writable:
        p = Path(p).resolve()
        argv += ["--bind", str(p), str(p)]
    argv += ["--bind", str(ws), str(ws), "--chdir", str(ws), "--"]
    return argv + list(command)


HARBOR_APP, HARBOR_TESTS, HARBOR_LOGS = "/app", "/tests", "/logs/verifier"


def harbor_verifier_argv(
    command: list[str],
    *,
    workspace_copy: Path,
    tests: Path,
    reward_dir: Path,
    hide: list[Path],
    home: str,
    bwrap: str = "bwrap",
) -> list[str]:
    """bwrap argv for a verifier with Harbor's paths: the workspace copy at ``/app``, the
    tests at ``/tests``, the result folder at ``/logs/verifier``; no network.

    ``/`` cannot be bound read-only as a whole here (new top-level mount points
    could not be created on it), so the root is bubblewrap's own tmpfs with each
    top-level host directory bound read-only into it (symlinks such as
    ``/bin -> usr/bin`` recreated), which leaves room for ``/app``, ``/tests``
    and ``/logs``.
    """
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"]
    for entry in sorted(Path("/").iterdir()):
        if entry.name in ("dev", "proc", "sys", "tmp") or entry.name in ("app", "tests", "logs"):
            continue
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), str(entry)]
        elif entry.is_dir():
            argv += ["--ro-bind", str(entry), str(entry)]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for h in sorted({Path(p).resolve() for p in hide}, key=lambda p: len(p.parts)):
        if _covers(Path("/tmp"), h) or not h.is_dir():
            continue
        argv += ["--tmpfs", str(h)]
    argv += ["--tmpfs", home, "--setenv", "HOME", home,
             "--bind", str(Path(workspace_copy).resolve()), HARBOR_APP,
             "--bind", str(Path(tests).resolve()), HARBOR_TESTS,
             "--bind", str(Path(reward_dir).resolve()), HARBOR_LOGS,
             "--chdir", HARBOR_APP, "--"]
    return argv + list(command)
