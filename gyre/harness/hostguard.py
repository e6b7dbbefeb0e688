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
    local user may walk in. A root owned by someone else is refused.
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise HostSetupError(
            f"workspace root {path} belongs to uid {st.st_uid}, not to this user: "
            "choose a folder of your own (executor.workspace_root)"
        )
    if st.st_mode & 0o077:
        path.chmod(0o700)


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
