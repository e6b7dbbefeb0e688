"""run_process: the child is spawned off the event loop, and every stop still reaps the group."""

import asyncio
import os
import sys
import threading
import time

import pytest

from gyre.harness import process
from gyre.harness.process import run_process

PY = sys.executable


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (gone, or a zombie waiting for a parent that is not us)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


async def _wait_gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if _gone(pid):
            return True
        await asyncio.sleep(0.02)
    return _gone(pid)


async def _run(tmp_path, argv, **kw):
    kw.setdefault("timeout_s", 20.0)
    kw.setdefault("max_log_bytes", 1 << 20)
    return await run_process(
        argv,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        stdout_path=tmp_path / "out",
        stderr_path=tmp_path / "err",
        **kw,
    )


async def test_exit_code_logs_on_start_and_started_at(tmp_path):
    started = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()
    r = await _run(
        tmp_path,
        [PY, "-c", "import sys; print('hello'); sys.stderr.write('oops'); sys.exit(3)"],
        on_start=started,
    )
    assert (r.stop, r.exit_code, r.truncated) == ("exited", 3, False)
    assert (tmp_path / "out").read_text() == "hello\n"
    assert (tmp_path / "err").read_text() == "oops"
    assert (r.stdout_bytes, r.stderr_bytes) == (6, 4)
    assert started.done()
    assert t0 < r.started_at < time.monotonic()


async def test_spawn_runs_on_another_thread_and_the_loop_keeps_ticking(tmp_path, monkeypatch):
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = process._popen

    def slow_popen(*a):
        seen.append(threading.get_ident())
        time.sleep(0.4)  # a spawn stalled by a loaded machine
        return real(*a)

    monkeypatch.setattr(process, "_popen", slow_popen)
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.ensure_future(tick())
    r = await _run(tmp_path, [PY, "-c", "pass"])
    t.cancel()
    assert r.exit_code == 0
    assert seen and seen[0] != loop_thread
    assert ticks >= 10  # the loop ran during the 0.4 s spawn instead of waiting for it


async def test_timeout_kills_the_whole_group(tmp_path):
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    r = await _run(tmp_path, [PY, "-c", code], timeout_s=1.0, kill_grace_s=0.5)
    assert (r.stop, r.exit_code) == ("timeout", None)
    grandchild = int((tmp_path / "out").read_text().split()[0])
    assert await _wait_gone(grandchild)


async def test_clean_exit_still_reaps_background_children(tmp_path):
    code = "import subprocess; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True)"
    r = await _run(tmp_path, [PY, "-c", code])
    assert (r.stop, r.exit_code) == ("exited", 0)
    assert await _wait_gone(int((tmp_path / "out").read_text().split()[0]))


async def test_log_flood_is_stopped_and_truncated(tmp_path):
    code = "import sys, time\nwhile True: sys.stdout.write('x' * 4096); sys.stdout.flush()"
    r = await _run(tmp_path, [PY, "-c", code], max_log_bytes=10_000, kill_grace_s=0.5)
    assert (r.stop, r.exit_code, r.truncated, r.stdout_bytes) == ("log_limit", None, True, 10_000)
    assert (tmp_path / "out").read_bytes().startswith(b"x" * 10_000)


async def test_abort_stops_with_its_reason(tmp_path):
    abort = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.3, abort.set_result, "disk_limit")
    r = await _run(tmp_path, [PY, "-c", "import time; time.sleep(60)"], abort=abort)
    assert (r.stop, r.exit_code) == ("disk_limit", None)
    assert r.wall_s < 10


async def test_cancel_while_running_kills_the_child(tmp_path):
    started = asyncio.get_running_loop().create_future()
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    task = asyncio.ensure_future(
        _run(tmp_path, [PY, "-c", code], on_start=started, kill_grace_s=0.5)
    )
    await started
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_gone(int((tmp_path / "out").read_text().split()[0]))


async def test_cancel_during_the_spawn_kills_what_it_started(tmp_path, monkeypatch):
    pids: list[int] = []
    real = process._popen

    def popen_then_stall(*a):
        spawned = real(*a)
        pids.append(spawned[0].pid)
        time.sleep(0.4)  # the caller is cancelled while the spawn thread is still busy
        return spawned

    monkeypatch.setattr(process, "_popen", popen_then_stall)
    task = asyncio.ensure_future(_run(tmp_path, ["sleep", "60"]))
    await asyncio.sleep(0.15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)  # the spawn finishes, then its child is killed and reaped
    assert pids and await _wait_gone(pids[0])


async def test_nothing_of_the_group_is_left_when_it_returns(tmp_path, monkeypatch):
    """Issue 19 (9): "stopped" means gone, not "will be gone soon" -- an executor's stop()
    returned while a harness still ran on a busy machine. No polling after these awaits."""
    code = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']);"
        " print(p.pid, flush=True); time.sleep(60)"
    )
    r = await _run(tmp_path, [PY, "-c", code], timeout_s=1.0, kill_grace_s=0.5)
    assert r.stop == "timeout"
    assert _gone(int((tmp_path / "out").read_text().split()[0]))
    pids: list[int] = []
    real = process._popen

    def popen_then_stall(*a):
        spawned = real(*a)
        pids.append(spawned[0].pid)
        time.sleep(0.4)  # the caller is cancelled while the spawn thread is still busy
        return spawned

    monkeypatch.setattr(process, "_popen", popen_then_stall)
    task = asyncio.ensure_future(_run(tmp_path, ["sleep", "60"]))
    await asyncio.sleep(0.15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pids and _gone(pids[0])


async def test_a_missing_program_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        await _run(tmp_path, [str(tmp_path / "no-such-program")])


async def test_pass_fds_reach_the_child(tmp_path):
    r_fd, w_fd = os.pipe()
    try:
        code = f"import os; os.write({w_fd}, b'through')"
        r = await _run(tmp_path, [PY, "-c", code], pass_fds=(w_fd,))
        assert r.exit_code == 0
        assert os.read(r_fd, 100) == b"through"
    finally:
        os.close(r_fd)
        os.close(w_fd)


async def test_without_pidfds_a_thread_waits_for_the_exit(tmp_path, monkeypatch):
    def no_pidfd(pid, flags=0):
        raise OSError(38, "pidfd_open not available")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    r = await _run(tmp_path, [PY, "-c", "import sys; sys.exit(7)"])
    assert (r.stop, r.exit_code) == ("exited", 7)
    r = await _run(tmp_path, ["sleep", "60"], timeout_s=0.5, kill_grace_s=0.5)
    assert (r.stop, r.exit_code) == ("timeout", None)


async def test_many_at_once_all_exit_cleanly(tmp_path):
    rs = await asyncio.gather(
        *(
            run_process(
                [PY, "-S", "-c", f"print({i})"],
                cwd=tmp_path,
                env={},
                stdout_path=tmp_path / f"{i}.out",
                stderr_path=tmp_path / f"{i}.err",
                timeout_s=60,
                max_log_bytes=1000,
            )
            for i in range(20)
        )
    )
    assert [r.exit_code for r in rs] == [0] * 20
    assert [(tmp_path / f"{i}.out").read_text() for i in range(20)] == [f"{i}\n" for i in range(20)]
