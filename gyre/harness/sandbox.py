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


def tool_paths(command: list[str] = ()) -> list[Path]:  # type: ignore[assignment]
    """Host paths the sandboxed program needs to see, whatever tmpfs covers them.

    The sandbox mounts a fresh ``/tmp``; a venv, a checkout of Gyre or a harness
    installed under ``/tmp`` (a CI clone, say) would vanish with it. So the
    Python prefixes, the ``gyre`` package and the command's own install folder
    (its ``node_modules`` root for npm programs; also for an executable named
    later in the argv, behind a wrapper) are bound back read-only.
    """
    import sys

    import gyre

    cands = [
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(os.path.realpath(sys.executable)).parent,
        Path(gyre.__file__).resolve().parent,
    ]
    # The program, and any program a wrapper (the network bridge) runs after it.
    exes = [shutil.which(command[0]) or command[0]] if command else []
    exes += [
        a for a in command[1:] if os.path.isabs(a) and os.path.isfile(a) and os.access(a, os.X_OK)
    ]
    for exe in exes:
        if os.path.isabs(exe) and os.path.exists(exe):
            for p in (Path(os.path.abspath(exe)), Path(os.path.realpath(exe))):
                roots = [a for a in p.parents if a.name == "node_modules"]
                cands.append(roots[-1] if roots else p.parent)
    out: list[Path] = []
    for c in sorted({c.resolve() for c in cands if c.exists()}, key=lambda p: len(p.parts)):
        if not any(_covers(o, c) for o in out):
            out.append(c)
    return out


def _unhide_and_hide(hide: list[Path], command: list[str]) -> list[str]:
    """Bind tool paths under /tmp back (read-only), then cover every hidden tree.

    A hidden tree under /tmp needs no mount of its own unless a tool path
    re-exposed it (the task set inside a checkout that lives under /tmp).
    """
    exposed = [p for p in tool_paths(command) if _covers(Path("/tmp"), p)]
    argv: list[str] = []
    for p in exposed:
        argv += ["--ro-bind", str(p), str(p)]
    for h in sorted({Path(p).resolve() for p in hide}, key=lambda p: len(p.parts)):
        if not h.exists():
            continue
        if _covers(Path("/tmp"), h) and not any(_covers(e, h) or _covers(h, e) for e in exposed):
            continue
        if h.is_dir():
            argv += ["--tmpfs", str(h)]
        else:
            argv += ["--ro-bind", "/dev/null", str(h)]
    return argv


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
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    if unshare_net:
        argv.append("--unshare-net")
    argv += _unhide_and_hide(hide, command)
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
    argv = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
    ]
    for entry in sorted(Path("/").iterdir()):
        if entry.name in ("dev", "proc", "sys", "tmp") or entry.name in ("app", "tests", "logs"):
            continue
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), str(entry)]
        elif entry.is_dir():
            argv += ["--ro-bind", str(entry), str(entry)]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    argv += _unhide_and_hide(hide, command)
    argv += [
        "--tmpfs",
        home,
        "--setenv",
        "HOME",
        home,
        "--bind",
        str(Path(workspace_copy).resolve()),
        HARBOR_APP,
        "--bind",
        str(Path(tests).resolve()),
        HARBOR_TESTS,
        "--bind",
        str(Path(reward_dir).resolve()),
        HARBOR_LOGS,
        "--chdir",
        HARBOR_APP,
        "--",
    ]
    return argv + list(command)
