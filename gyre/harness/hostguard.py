"""What keeps a run's host safe from its harnesses, outside the sandbox itself.

- execution folders closed to other local users (:func:`private_dir`);
- what a harness leaves behind stripped of set-id bits and open modes before anything
  copies it (:func:`strip_modes`, :mod:`gyre.harness.fsmode`);
- the task's parts the sandbox must hide, as resolved paths (:func:`task_paths`);
- the sandbox on by default, so a missing or non-working bubblewrap is refused in one
  line, with the explicit opt-out named (:func:`working_bwrap`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .config import SandboxConfig
from .fsmode import strip_tree
from .sandbox import bwrap_available, sandbox_unusable
from .task import Task


class HostSetupError(RuntimeError):
    """The host is not fit to run harnesses as configured (the message is one line)."""


def private_dir(path: Path) -> None:
    """Create the workspace root 0700, or close an existing one of ours to other users.

    Workspaces hold whatever harnesses wrote (and, unsandboxed, as the launcher): no other
    local user may walk in. A root owned by someone else is refused, and so is a path through
    a link another user owns: ``/tmp/gyre-executions`` planted as a link to ``/etc`` would
    have had ``/etc`` chmod'ed 0700 (and the workspaces written there). The mode is set
    through a descriptor opened without following a link.
    """
    path = Path(os.path.abspath(path))
    me = os.geteuid()
    _refuse_foreign_links(path, me)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _refuse_foreign_links(path, me)  # made by now: nothing of it may be someone else's link
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise HostSetupError(f"workspace root {path} cannot be opened: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != me:
            raise HostSetupError(
                f"workspace root {path} belongs to uid {st.st_uid}, not to this user: "
                "choose a folder of your own (executor.workspace_root)"
            )
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _refuse_foreign_links(path: Path, me: int) -> None:
    """HostSetupError if ``path`` or a folder above it is a link owned by another user (root
    and this user are trusted: ``/var/run -> /run`` is root's); a link that is ours is fine
    only above the last part: the workspace root itself is opened without following one."""
    for p in [*reversed(path.parents), path]:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        except OSError:
            continue
        if not stat.S_ISLNK(st.st_mode):
            continue
        if p == path:
            raise HostSetupError(
                f"workspace root {path} is a link (to {os.readlink(p)}): give the folder itself"
            )
        if st.st_uid not in (0, me):
            raise HostSetupError(
                f"workspace root {path}: {p} is a link owned by uid {st.st_uid}, not by this "
                "user: choose a folder of your own (executor.workspace_root)"
            )


GYRE_ROOT = str(Path(__file__).resolve().parent.parent.parent)
_OPT_OUT = "or opt out with executor.sandbox = false (harnesses then run as you, unconfined)"


def working_bwrap(sb: SandboxConfig) -> str:
    """The bwrap binary, checked to confine on this machine; HostSetupError (one line) if not."""
    bwrap = bwrap_available(sb.bwrap)
    if bwrap is None:
        raise HostSetupError(
            f"the harness sandbox is on (the default) but {sb.bwrap!r} is not installed: "
            f"apt-get install bubblewrap, {_OPT_OUT}"
        )
    why = sandbox_unusable(bwrap, sb.uid, sb.gid)
    if why is not None:
        raise HostSetupError(f"the harness sandbox is on but cannot work here ({why}); {_OPT_OUT}")
    return bwrap


def task_paths(task: Task) -> list[Path]:
    """What of the task a harness must not see, each resolved (bwrap_argv resolves too): its
    hidden root (the whole task set), its folder, its tests and solution wherever they lie."""
    paths = [task.hidden, task.root, task.tests_dir]
    if task.solution_dir is not None:
        paths.append(task.solution_dir)
    return [p.resolve() for p in paths]


def strip_modes(*trees: Path) -> None:
    """Cut every mode under each existing tree to its owner's rwx (once the harness stopped)."""
    for t in trees:
        if t.is_dir():
            strip_tree(t)
