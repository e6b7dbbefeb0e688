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
