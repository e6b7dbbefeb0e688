"""Run one child program in its own process group, with capped logs and a deadline.

Shared by the executor (harnesses) and the scorer (verifiers). The child gets a
new session (``setsid``), so one ``killpg`` reaches everything it started that
did not deliberately leave the group; inside the bubblewrap sandbox the child is
also in its own pid namespace, which the kernel tears down completely when its
init dies, so even processes that called ``setsid`` are gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

StopReason = Literal["exited", "timeout", "log_limit", "disk_limit", "cancelled"]
_CHUNK = 64 * 1024


@dataclass
class ProcessResult:
    exit_code: int | None  # None when we had to kill it
    stop: StopReason
    wall_s: float
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool  # a stream went past the byte limit
    kill_s: float = 0.0  # time spent stopping the group and flushing logs after the stop
    started_at: float = 0.0  # time.monotonic() right after the process was spawned


async def _pump(
    stream: asyncio.StreamReader, path: Path, limit: int, over: asyncio.Event
) -> tuple[int, bool]:
    """Copy a pipe to a file up to ``limit`` bytes; flag ``over`` when exceeded.

    After the limit it keeps draining (discarding) so the child never blocks on
    a full pipe while we are busy killing it.
    """
    written, truncated = 0, False
    with open(path, "wb") as f:  # noqa: ASYNC230 (a local file, written as the pipe drains)
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                break
            if written < limit:
                part = chunk[: limit - written]
                f.write(part)
                written += len(part)
                if len(part) < len(chunk):
                    truncated = True
                    f.write(b"\n[gyre: output truncated at byte limit]\n")
                    f.flush()
                    over.set()
            else:
                truncated = True
                over.set()
    return written, truncated


def _descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (one /proc scan); catches children that left the group."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                data = f.read()
            ppid = int(data[data.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int, sig: int, leader_alive: bool = True) -> None:
    """Signal the process group led by ``pid`` and any descendant outside it.

    Descendants are looked up only while the leader is alive (not yet reaped):
    after that its pid could belong to an unrelated process. The group id stays
    reserved by the kernel while any member lives, so ``killpg`` is always safe.
    """
    victims = _descendants(pid) if leader_alive else []
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for d in victims:
        try:
            os.kill(d, sig)
        except (ProcessLookupError, PermissionError):
            pass


async def run_process(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout_path: Path,
    stderr_path: Path,
    timeout_s: float,
    max_log_bytes: int,
    kill_grace_s: float = 2.0,
    on_start: asyncio.Future[None] | None = None,
    pass_fds: tuple[int, ...] = (),
    abort: asyncio.Future[StopReason] | None = None,
) -> ProcessResult:
    """Start ``argv`` and wait until it exits, its deadline passes, or it floods its logs.

    Raises FileNotFoundError / PermissionError / OSError when it cannot start.
    On cancellation the process group is killed and CancelledError re-raised.
    ``abort`` (a watcher's verdict, e.g. ``"disk_limit"``) stops it like a
    timeout, with that reason; ``pass_fds`` are inherited (bwrap's ``--userns``).
    Whatever happens, the whole group is gone when this returns.
    """
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    t_spawned = time.monotonic()
    if on_start is not None and not on_start.done():
        on_start.set_result(None)
    over = asyncio.Event()
    assert proc.stdout is not None and proc.stderr is not None
    pumps = asyncio.gather(
        _pump(proc.stdout, stdout_path, max_log_bytes, over),
        _pump(proc.stderr, stderr_path, max_log_bytes, over),
    )
    waiter = asyncio.ensure_future(proc.wait())
    flood = asyncio.ensure_future(over.wait())
    stop: StopReason = "exited"
    watched = {waiter, flood} | ({abort} if abort is not None else set())
    try:
        done, _ = await asyncio.wait(
            watched, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            if flood in done:
                stop = "log_limit"
            elif abort is not None and abort in done and not abort.cancelled():
                stop = abort.result()
            else:
                stop = "timeout"
    except asyncio.CancelledError:
        stop = "cancelled"
        raise
    finally:
        t_stop = time.monotonic()
        flood.cancel()
        # Always reap the whole group, also after a clean exit: a harness may
        # leave background children (servers, watchers) behind.
        await _terminate(proc, waiter, kill_grace_s, graceful=(stop != "exited"))
        try:
            out = await asyncio.wait_for(pumps, timeout=5.0)
        except (TimeoutError, asyncio.CancelledError):
            pumps.cancel()
            out = ((0, False), (0, False))
    exit_code = proc.returncode if stop == "exited" else None
    return ProcessResult(
        exit_code=exit_code,
        stop=stop,
        wall_s=t_stop - t0,
        stdout_bytes=out[0][0],
        stderr_bytes=out[1][0],
        truncated=out[0][1] or out[1][1],
        kill_s=time.monotonic() - t_stop,
        started_at=t_spawned,
    )


async def _terminate(
    proc: asyncio.subprocess.Process, waiter: asyncio.Future, grace: float, graceful: bool
) -> None:
    pid = proc.pid
    if graceful and proc.returncode is None:
        kill_tree(pid, signal.SIGTERM, leader_alive=True)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=grace)
        except TimeoutError:
            pass
    # SIGKILL whatever is left of the group (the leader may have exited already,
    # leaving children; killpg still reaches them while the group exists).
    kill_tree(pid, signal.SIGKILL, leader_alive=proc.returncode is None)
    try:
        await asyncio.wait_for(asyncio.shield(waiter), timeout=10.0)
    except TimeoutError:  # pragma: no cover - a process that ignores SIGKILL (D state)
        pass
