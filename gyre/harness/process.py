"""Run one child program in its own process group, with capped logs and a deadline.

Shared by the executor (harnesses) and the scorer (verifiers). The child gets a
new session (``setsid``), so one ``killpg`` reaches everything it started that
did not deliberately leave the group; inside the bubblewrap sandbox the child is
also in its own pid namespace, which the kernel tears down completely when its
init dies, so even processes that called ``setsid`` are gone.

The fork/exec runs on a spawn thread, not on the event loop: with 100+ executions
starting in a burst, spawning on the loop stalled it for seconds (docs/runtime.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

StopReason = Literal["exited", "timeout", "log_limit", "disk_limit", "cancelled"]
_CHUNK = 64 * 1024
# Spawns run on these threads, never on the event loop: a fork/exec blocks its caller until
# the child has exec'd, which on a loaded machine is tens of ms (docs/runtime.md, "Many
# concurrent executions"). A few threads are enough: a spawn is short, and a pool of its own
# keeps launches from queueing behind workspace copies in the loop's default executor.
_SPAWN_THREADS = 4
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


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
    stream: asyncio.StreamReader, f: BinaryIO, limit: int, over: asyncio.Event
) -> tuple[int, bool]:
    """Copy a pipe to a file up to ``limit`` bytes; flag ``over`` when exceeded.

    After the limit it keeps draining (discarding) so the child never blocks on
    a full pipe while we are busy killing it.
    """
    written, truncated = 0, False
    # ``f`` was opened on the spawn thread; the child's close() closes it.
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


def _spawn_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_SPAWN_THREADS, thread_name_prefix="gyre-spawn")
        return _pool


_Spawned = tuple[subprocess.Popen[bytes], float, BinaryIO, BinaryIO]


def _popen(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    pass_fds: tuple[int, ...],
    logs: tuple[Path, Path],
) -> _Spawned:
    """Open the two log files and start the child (on a spawn thread: each of these blocks).

    Also returns the time the child existed, taken right there.
    """
    with ExitStack() as stack:
        out = stack.enter_context(open(logs[0], "wb"))
        err = stack.enter_context(open(logs[1], "wb"))
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        stack.pop_all()
    return p, time.monotonic(), out, err


def _const(protocol: asyncio.StreamReaderProtocol) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: protocol


def _discard(p: subprocess.Popen[bytes]) -> None:
    """Kill and reap a child nobody will watch (its spawn was cancelled or could not attach)."""
    kill_tree(p.pid, signal.SIGKILL, leader_alive=True)
    for pipe in (p.stdout, p.stderr):
        if pipe is not None:
            pipe.close()
    threading.Thread(target=p.wait, name=f"gyre-reap-{p.pid}", daemon=True).start()


def _discard_spawned(fut: asyncio.Future[_Spawned]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        p, _, out, err = fut.result()
        out.close()
        err.close()
        _discard(p)


class _Child:
    """A child spawned off the loop, seen from the loop: pid, pipes as streams, exit status.

    The exit is watched through a pidfd on the loop's selector (no thread per child); where
    pidfds are missing, a thread waits for it. ``returncode`` is set on the loop thread once
    the child is reaped, so ``None`` means its pid is still reserved (``kill_tree``).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        spawned_at: float,
        streams: tuple[asyncio.StreamReader, asyncio.StreamReader],
        transports: list[asyncio.BaseTransport],
        logs: tuple[BinaryIO, BinaryIO],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.pid = popen.pid
        self.returncode: int | None = None
        self.spawned_at = spawned_at
        self.stdout, self.stderr = streams
        self._popen = popen
        self._transports = transports
        self.logs = logs
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._watch()

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        pass_fds: tuple[int, ...],
        logs: tuple[Path, Path],
    ) -> _Child:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(_spawn_pool(), _popen, argv, str(cwd), env, pass_fds, logs)
        try:
            popen, at, out, err = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # The fork cannot be stopped: let it finish, then undo it -- here, before the
            # cancellation goes on, so an executor's stop() never returns with it alive.
            try:
                popen, _, out, err = await fut
            except BaseException:  # the spawn failed (nothing to undo), or cancelled again
                fut.add_done_callback(_discard_spawned)
                raise asyncio.CancelledError() from None
            out.close()
            err.close()
            _discard(popen)
            await _group_gone(popen.pid)
            raise
        transports: list[asyncio.BaseTransport] = []
        try:
            streams = []
            for pipe in (popen.stdout, popen.stderr):
                reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
                protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
                transport, _ = await loop.connect_read_pipe(_const(protocol), pipe)
                transports.append(transport)
                streams.append(reader)
            return cls(popen, at, (streams[0], streams[1]), transports, (out, err), loop)
        except BaseException:
            for opened in transports:
                opened.close()
            out.close()
            err.close()
            _discard(popen)
            raise

    def _watch(self) -> None:
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            try:
                self._loop.add_reader(fd, self._on_pidfd, fd)
                return
            except (NotImplementedError, OSError, ValueError):
                os.close(fd)
        threading.Thread(
            target=self._wait_thread, name=f"gyre-wait-{self.pid}", daemon=True
        ).start()

    def _on_pidfd(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        self._reaped(self._popen.wait())  # readable: it has exited, so this does not block

    def _wait_thread(self) -> None:
        rc = self._popen.wait()
        try:
            self._loop.call_soon_threadsafe(self._reaped, rc)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _reaped(self, rc: int) -> None:
        self.returncode = rc
        if not self._exited.done():
            self._exited.set_result(rc)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def close(self) -> None:
        """Close the pipes and the log files (the pumps are done or given up)."""
        for t in self._transports:
            t.close()
        for f in self.logs:
            f.close()


def _proc_stats() -> list[tuple[int, bytes, int, int]] | None:
    """Every process as (pid, state, ppid, pgrp) from /proc/PID/stat (after the command
    name, which may hold anything); None where /proc cannot be listed. Processes that vanish
    mid-scan are left out."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    out = []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                data = f.read()
            state, ppid, pgrp = data[data.rindex(b")") + 2 :].split()[:3]
            out.append((int(e), state, int(ppid), int(pgrp)))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (one /proc scan); catches children that left the group."""
    children: dict[int, list[int]] = {}
    for p, _state, ppid, _pgrp in _proc_stats() or ():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def group_alive(pgid: int) -> bool:
    """Does process group ``pgid`` still have a live (non-zombie) member?

    ``killpg(pgid, 0)`` answers for most cases at no cost; only when it finds members is
    ``/proc`` scanned, since a zombie nobody reaps (an init that does not) keeps the group.
    """
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):  # gone (or, reused, not ours)
        return False
    stats = _proc_stats()
    if stats is None:
        return True
    for _p, state, _ppid, pgrp in stats:
        if pgrp == pgid and state != b"Z":
            return True
    return False


async def _group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    """Wait (bounded) until a SIGKILLed group has no live member; True when it has none.

    SIGKILL is delivered, and a killed process exits, asynchronously: the leader reaped is
    not the group gone (a busy machine took seconds), and a caller told "stopped" must find
    nothing of it left.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.001  # a group usually goes within a few ms: look again soon, then less often
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)
    return True


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
    proc = await _Child.spawn(
        argv, cwd=cwd, env=env, pass_fds=pass_fds, logs=(stdout_path, stderr_path)
    )
    t_spawned = proc.spawned_at
    if on_start is not None and not on_start.done():
        on_start.set_result(None)
    over = asyncio.Event()
    pumps = asyncio.gather(
        _pump(proc.stdout, proc.logs[0], max_log_bytes, over),
        _pump(proc.stderr, proc.logs[1], max_log_bytes, over),
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
        try:
            await _terminate(proc, waiter, kill_grace_s, graceful=(stop != "exited"))
            try:
                out = await asyncio.wait_for(pumps, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                pumps.cancel()
                out = ((0, False), (0, False))
        finally:
            proc.close()
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


async def _terminate(proc: _Child, waiter: asyncio.Future, grace: float, graceful: bool) -> None:
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
    # The leader is reaped; what else was in its group is killed but may not be gone yet.
    await _group_gone(pid)
