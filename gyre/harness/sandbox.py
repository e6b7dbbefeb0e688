"""Bubblewrap command lines for harnesses and verifiers: the containment model.

What a sandboxed program sees (host paths keep their names, so tools installed
on the host -- the venv, node, Claude Code -- work unchanged):

- a root of bubblewrap's own tmpfs, remounted read-only at the end, holding only
  the system directories (``SYSTEM_DIRS``: ``/usr``, ``/etc``, ``/opt``, the
  ``/bin``/``/lib`` links) bound read-only, plus the tool paths it needs
  (:func:`tool_paths`: the Python prefixes, the ``gyre`` package, the command's
  install folder) bound read-only. ``/home``, ``/root``, ``/srv``, ``/run``,
  ``/var``, ``/mnt``, ``/work``... are absent: a filesystem unix socket of the
  host is not reachable because it is not there (``connect()`` works through a
  read-only bind, so read-only is not enough);
- ``/tmp``, ``$HOME`` and ``/dev/shm`` fresh tmpfs of bounded size; a fresh
  ``/dev`` (read-only: bwrap's own is an unsized tmpfs) and a ``/proc`` of its
  own pid namespace (no host process is visible);
- every path in ``hide`` that lies inside something bound is covered again by
  an empty tmpfs (the task set inside a checkout, other workspaces);
- the execution's own workspace bound read-write on top.

Who it runs as: never with a capability, never as host uid 0, whoever launches
Gyre. An ordinary user's bwrap maps the sandbox uid (``SANDBOX_UID``) onto the
caller's and drops every capability (``--unshare-user --uid --cap-drop ALL
--disable-userns``). Root instead hands bwrap a user namespace it prepared
(:mod:`gyre.harness.userns`, ``--userns FD``) mapping ``SANDBOX_UID`` to the
same host uid, in which nested user namespaces are disabled; the first process
inside (:mod:`gyre.harness.confine`) switches to that uid, which leaves no
capability in any namespace, so no mount can be undone or remounted.

Resources (:class:`Confinement`): RLIMIT_NPROC set inside the user namespace
(bounds this sandbox's processes and threads), RLIMIT_FSIZE (largest file),
sized tmpfs for ``/tmp``, ``$HOME`` and ``/dev/shm``; the workspace's total
size and entry count are watched by the executor (``SandboxConfig.max_workspace_bytes``,
``max_workspace_files``, :mod:`gyre.harness.quota`).

Environment: the program's environment never reaches the host-side ``bwrap`` process, which
runs before any namespace exists (a task's ``LD_PRELOAD`` would load its own code there, on the
host). It is written to a memfd (:func:`env_memfd`) that ``confine.py`` reads inside the sandbox
and hands to the program (``--env-fd``); bwrap itself runs with :func:`bwrap_env` alone. Not in
bwrap's argv either: another local user can read a command line, not an environment.

Network: private pid, ipc, uts and cgroup namespaces always; with
``unshare_net`` its own network namespace too (only its own loopback: no host
port, no abstract unix socket) -- the executor bridges the proxy in
(:mod:`gyre.harness.netbridge`). The verifier runs with no network at all.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SANDBOX_HOME = "/tmp/gyre-home"
# The harness's uid and gid, inside the sandbox and (when root launches Gyre) on the host.
SANDBOX_UID = 65534
# Top-level host directories every sandbox sees (read-only); nothing else of the host's tree.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")


@dataclass(frozen=True)
class Confinement:
    """Who the sandboxed program runs as and what it may use up (see gyre.harness.confine)."""

    uid: int = SANDBOX_UID
    gid: int = SANDBOX_UID
    max_procs: int = 1024  # RLIMIT_NPROC inside the sandbox (processes + threads)
    max_file_bytes: int = 2 << 30  # RLIMIT_FSIZE
    tmpfs_bytes: int = 1 << 30  # size of the /tmp and $HOME tmpfs, each
    python: str = sys.executable  # runs gyre.harness.confine inside


def bwrap_env() -> dict[str, str]:
    """The whole environment of the host-side ``bwrap`` process: the launcher's ``PATH``."""
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}


def env_memfd(env: dict[str, str]) -> int:
    """A memfd holding ``env`` as ``KEY=VALUE\\0`` entries, for ``confine.py --env-fd``.

    Close-on-exec: only a child given it in ``pass_fds`` inherits it; the caller closes it."""
    fd = os.memfd_create("gyre-env", os.MFD_CLOEXEC)
    data = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def bwrap_available(bwrap: str = "bwrap") -> str | None:
    """Path of a working bwrap binary, or None."""
    return shutil.which(bwrap)


def sandbox_unusable(bwrap: str, uid: int, gid: int) -> str | None:
    """Why bubblewrap cannot confine a harness on this machine, or None when it can.

    A present ``bwrap`` may still fail at every launch (unprivileged user namespaces
    disabled, a container without them): one cheap real attempt at start says so once,
    instead of every execution failing. Root: the namespace :mod:`gyre.harness.userns`
    prepares; an ordinary user: bwrap's own ``--unshare-user``.
    """
    import subprocess

    from .userns import make_userns

    argv = [bwrap, "--die-with-parent", "--ro-bind", "/", "/"]
    fds: tuple[int, ...] = ()
    if os.geteuid() == 0:
        try:
            fd = make_userns(uid, gid)
        except OSError as e:
            return str(e)
        fds, argv = (fd,), [*argv, "--userns", str(fd)]
    else:
        argv += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
    try:
        p = subprocess.run(
            [*argv, "--unshare-pid", "--", "/bin/sh", "-c", "exit 0"],
            pass_fds=fds,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{bwrap} could not run: {e}"
    finally:
        for fd in fds:
            os.close(fd)
    if p.returncode != 0:
        return f"{bwrap} failed: {(p.stderr.strip().splitlines() or ['exit ' + str(p.returncode)])[-1]}"
    return None


def _covers(parent: Path, child: Path) -> bool:
    return child == parent or parent in child.parents


def tool_paths(command: Sequence[str] = ()) -> list[Path]:
    """Host paths the sandboxed program needs to see, whatever tmpfs covers them.

    The sandbox sees only the system directories and a fresh ``/tmp``; a venv,
    a checkout of Gyre, a pyenv Python under ``/root`` or a harness installed
    under ``/tmp`` (a CI clone, say) would not be there. So the Python
    prefixes, the ``gyre`` package and the command's own install folder (its
    ``node_modules`` root for npm programs; also for an executable named later
    in the argv, behind a wrapper) are bound back read-only, with the folder of
    the interpreter a script's ``#!`` names (``#!/usr/bin/env node`` -> the
    ``node`` on PATH, say under ``~/.nvm``).
    """
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
    exes += [i for i in (_interpreter(e) for e in exes) if i is not None]
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


def _interpreter(exe: str) -> str | None:
    """The interpreter a script's ``#!`` line names (``env X`` looked up on PATH), if any."""
    try:
        with open(os.path.realpath(exe), "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0]) if words else None
    return words[0] if words else None


def system_paths() -> list[Path]:
    """The real directories among ``SYSTEM_DIRS`` (``/bin`` may be a link into ``/usr``)."""
    out = []
    for name in SYSTEM_DIRS:
        p = Path("/") / name
        if p.is_dir() and not p.is_symlink():
            out.append(p)
    return out


def _system_root() -> list[str]:
    argv: list[str] = []
    for name in SYSTEM_DIRS:
        p = Path("/") / name
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), str(p)]
    return argv


def _tools_and_hide(hide: list[Path], command: list[str]) -> list[str]:
    """Bind the tool paths outside the system directories (read-only), then cover every
    hidden tree that something bound exposes; a hidden tree nothing exposes is simply absent."""
    sys_paths = system_paths()
    tools = [t for t in tool_paths(command) if not any(_covers(s, t) for s in sys_paths)]
    argv: list[str] = []
    for t in tools:
        argv += ["--ro-bind", str(t), str(t)]
    bound = sys_paths + tools
    # The task sets shipped in the package (hidden tests, solutions) are never a harness's.
    hide = [*hide, Path(__file__).resolve().parent / "tasksets"]
    for h in sorted({Path(p).resolve() for p in hide}, key=lambda p: len(p.parts)):
        if not h.exists() or not any(_covers(b, h) for b in bound):
            continue
        if h.is_dir():
            argv += ["--tmpfs", str(h)]
        else:
            argv += ["--ro-bind", "/dev/null", str(h)]
    return argv


def _mount_dirs(argv: list[str]) -> list[str]:
    """``--perms 0755 --dir`` for every missing ancestor of a bind destination in ``argv``.

    bwrap creates them itself, but with the host directory's mode or 0700 and owned
    by the namespace's root, which would lock the sandbox user out of a workspace
    under ``/tmp/...`` or a Python under ``/root/...``.
    """
    sys_paths = system_paths()
    out: list[str] = []
    seen: set[Path] = {Path("/"), Path("/tmp")}
    for i, a in enumerate(argv[:-2]):
        if a not in ("--ro-bind", "--bind"):
            continue
        for anc in reversed(Path(argv[i + 2]).parents):
            if anc in seen or any(_covers(s, anc) for s in sys_paths):
                continue
            seen.add(anc)
            out += ["--perms", "0755", "--dir", str(anc)]
    return out


def _namespaces(confine: Confinement, userns_fd: int | None, unshare_net: bool) -> list[str]:
    argv = [
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if userns_fd is not None:  # root: a namespace from gyre.harness.userns; confine drops the ids
        argv += ["--userns", str(userns_fd)]
    else:
        argv += [
            "--unshare-user",
            "--uid",
            str(confine.uid),
            "--gid",
            str(confine.gid),
            "--disable-userns",
            "--cap-drop",
            "ALL",
        ]
    if unshare_net:
        argv.append("--unshare-net")
    return argv


def _confined(
    command: list[str],
    confine: Confinement,
    userns_fd: int | None,
    home: str,
    env_fd: int | None,
    bridge: tuple[str, str] | None = None,
) -> list[str]:
    # By file, isolated and without site: confine is stdlib only and starts before every harness.
    argv = [confine.python, "-S", "-I", str(Path(__file__).with_name("confine.py"))]
    if env_fd is not None:
        argv += ["--env-fd", str(env_fd)]
    if bridge is not None:  # the proxy-only bridge, served by confine's own interpreter
        argv += ["--bridge-listen", bridge[0], "--bridge-unix", bridge[1]]
    if userns_fd is not None:
        argv += ["--uid", str(confine.uid), "--gid", str(confine.gid)]
        argv += ["--own", "/tmp", "--own", home]
    argv += ["--nproc", str(confine.max_procs), "--fsize", str(confine.max_file_bytes), "--"]
    return argv + list(command)


def _sandbox(
    command: list[str],
    *,
    hide: list[Path],
    home: str,
    binds: list[str],
    chdir: str,
    unshare_net: bool,
    confine: Confinement,
    userns_fd: int | None,
    bwrap: str,
    env_fd: int | None,
    bridge: tuple[str, str] | None = None,
) -> list[str]:
    size = ["--size", str(confine.tmpfs_bytes)]
    argv = [bwrap, *_namespaces(confine, userns_fd, unshare_net), *_system_root()]
    # bwrap's /dev is an unsized tmpfs (writable by the sandbox user with an unprivileged
    # launcher): /dev/shm gets a sized tmpfs of its own, and /dev is remounted read-only.
    argv += ["--dev", "/dev", "--perms", "01777", *size, "--tmpfs", "/dev/shm"]
    argv += ["--proc", "/proc", *size, "--tmpfs", "/tmp"]
    mounts = _tools_and_hide(hide, [confine.python, *command])
    mounts += [*size, "--tmpfs", home, "--setenv", "HOME", home]
    mounts += binds
    argv += _mount_dirs(mounts) + mounts
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", chdir, "--"]
    return argv + _confined(command, confine, userns_fd, home, env_fd, bridge)


def bwrap_argv(
    command: list[str],
    *,
    workspace: Path,
    hide: list[Path],
    writable: Sequence[Path] = (),
    ro_binds: Sequence[Path] = (),
    home: str = SANDBOX_HOME,
    unshare_net: bool = False,
    bwrap: str = "bwrap",
    confine: Confinement | None = None,
    userns_fd: int | None = None,
    env_fd: int | None = None,
    bridge: tuple[str, str] | None = None,
) -> list[str]:
    """The bwrap argv that runs ``command`` with ``workspace`` as its writable cwd.

    ``userns_fd`` (root only, from :func:`gyre.harness.userns.make_userns`)
    must be passed to the child (``pass_fds``); without it bwrap makes the user
    namespace itself, which as root maps the sandbox onto host uid 0. ``env_fd``
    (:func:`env_memfd`, passed likewise): the program's environment, while bwrap
    itself runs with :func:`bwrap_env`. ``bridge`` (``HOST:PORT`` inside, the unix
    socket): the proxy-only network's bridge (:mod:`gyre.harness.netbridge`), served
    by confine once it confined itself, ``command`` its child; it implies ``unshare_net``.
    """
    ws = Path(workspace).resolve()
    binds: list[str] = []
    for p in ro_binds:
        p = Path(p).resolve()
        binds += ["--ro-bind", str(p), str(p)]
    for p in writable:
        p = Path(p).resolve()
        binds += ["--bind", str(p), str(p)]
    binds += ["--bind", str(ws), str(ws)]
    return _sandbox(
        command,
        hide=hide,
        home=home,
        binds=binds,
        chdir=str(ws),
        unshare_net=unshare_net or bridge is not None,
        confine=confine or Confinement(),
        userns_fd=userns_fd,
        bwrap=bwrap,
        env_fd=env_fd,
        bridge=bridge,
    )


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
    confine: Confinement | None = None,
    userns_fd: int | None = None,
    env_fd: int | None = None,
) -> list[str]:
    """bwrap argv for a verifier with Harbor's paths: the workspace copy at ``/app``, the
    tests at ``/tests``, the result folder at ``/logs/verifier``; no network.

    The root is bubblewrap's own tmpfs (as for harnesses), which leaves room for
    ``/app``, ``/tests`` and ``/logs``.
    """
    binds = [
        "--bind",
        str(Path(workspace_copy).resolve()),
        HARBOR_APP,
        "--bind",
        str(Path(tests).resolve()),
        HARBOR_TESTS,
        "--bind",
        str(Path(reward_dir).resolve()),
        HARBOR_LOGS,
    ]
    return _sandbox(
        command,
        hide=hide,
        home=home,
        binds=binds,
        chdir=HARBOR_APP,
        unshare_net=True,
        confine=confine or Confinement(),
        userns_fd=userns_fd,
        bwrap=bwrap,
        env_fd=env_fd,
    )
