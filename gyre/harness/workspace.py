"""An execution's own folder, made fresh before its harness starts.

``<workspace_root>/<execution id>/`` holds ``workspace/`` (a copy of the task's
repository, less its ``skip_files``), ``input/`` (the instruction and, for a profile
that needs it, the task's solution: read-only inside the sandbox), ``artifacts/`` and
``home/``. A folder that already exists is never touched: a stale run with the same id
keeps what it has, and this execution writes no ``result.json`` into it.
"""

from __future__ import annotations

import asyncio
import shutil

from gyre.trace.assessment import MissingReason

from .launch import Abort, Exec


async def fresh_workspace(x: Exec) -> None:
    """Make the execution's folder (off the event loop); an early end if it cannot."""
    if x.exec_dir.exists():
        raise Abort(
            MissingReason.infra_error,
            f"execution folder {x.exec_dir} already exists (stale run with the same id?); "
            "left untouched",
            write=False,
        )
    try:
        await asyncio.to_thread(_populate, x)
    except OSError as e:
        raise Abort(MissingReason.infra_error, f"workspace setup failed: {e}") from None


def _populate(x: Exec) -> None:
    task, prof = x.spec.task, x.spec.profile
    x.exec_dir.mkdir(mode=0o700)  # the workspace root is checked private by executor.start()
    skip = task.skip_files
    shutil.copytree(
        task.repository,
        x.ws,
        symlinks=True,
        ignore=(lambda d, names: [n for n in names if n in skip]) if skip else None,
    )
    x.inputs.mkdir()
    (x.inputs / "instruction.md").write_text(task.instruction + "\n", encoding="utf-8")
    if prof.needs_solution:
        if task.solution_dir is None:
            raise FileNotFoundError(
                f"profile {prof.name!r} needs a solution/ folder; task {task.name} has none"
            )
        shutil.copytree(task.solution_dir, x.inputs / "solution", symlinks=True)
    x.artifacts.mkdir()
    x.home.mkdir()
