"""Spawning children off the event loop: what a burst of launches costs the loop.

    python bench/bench_spawn.py                     # 100 sleeping children at once, 3 rounds
    python bench/bench_spawn.py --executor          # 100 synthetic executions (harness + verifier)
    python bench/bench_spawn.py --executor --profile  # + cProfile of the loop thread

Bare children: two spawners, same run, rounds interleaved (asyncio, gyre, asyncio, ...):

- asyncio (the baseline: what a user of asyncio writes): ``asyncio.create_subprocess_exec`` on
  the loop thread, the two log files opened there, then waiting for the exit;
- gyre: ``gyre.harness.process.run_process`` (``subprocess.Popen`` on a spawn thread, pipes and
  exit attached to the loop afterwards; logs, deadline and group kill included).

``--executor``: whole executions through the executor (gyre's spawner only).

While the burst runs, a ticker on the loop sleeps 5 ms again and again; its overshoot is the
loop's lag (what a controller event or an admin call waits). Columns: loop stalled per launch
(the ticker's overshoot beyond 2 ms, summed over the burst / launches), lag p99 and max, launch latency
(submission until the child exists) p50/p99, ``fork_exec`` time per spawn and how much of it
ran on the loop thread (timed by wrapping ``subprocess._fork_exec``), and the loop thread's
CPU per launch. ``--ballast-mb`` grows the parent first (touched pages and threads, like a Ray
driver) to show whether the parent's size matters (it does not while CPython uses vfork).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gyre.harness import process

STALL = 0.002  # ticker overshoot up to this is timer noise, not a stall
FORKS: list[tuple[float, bool]] = []  # (seconds in fork_exec, on the loop thread)
LOOP_THREAD = threading.get_ident()
_real_fork_exec = subprocess._fork_exec  # type: ignore[attr-defined]


def _timed_fork_exec(*a: Any) -> int:
    t = time.perf_counter()
    try:
        return _real_fork_exec(*a)
    finally:
        FORKS.append((time.perf_counter() - t, threading.get_ident() == LOOP_THREAD))


async def ticker(lags: list[float], stop: asyncio.Event, period: float = 0.005) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(max(0.0, time.perf_counter() - t - period))


async def burst_processes(
    n: int, hold_s: float, root: Path, child: str, spawner: str
) -> list[float]:
    """n children at once, each sleeping ``hold_s`` (a Python, or /bin/sleep); launch latencies."""
    argv = (
        [sys.executable, "-S", "-c", f"import time; time.sleep({hold_s})"]
        if child == "python"
        else ["sleep", str(hold_s)]
    )

    async def one(i: int) -> float:
        t0 = time.monotonic()
        r = await process.run_process(
            argv,
            cwd=root,
            env={"PATH": "/usr/bin:/bin"},
            stdout_path=root / f"{i}.out",
            stderr_path=root / f"{i}.err",
            timeout_s=60,
            max_log_bytes=1 << 20,
        )
        assert r.stop == "exited" and r.exit_code == 0, r
        return r.started_at - t0

    async def base(i: int) -> float:  # the baseline: asyncio's own spawner on the loop
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(root),
            env={"PATH": "/usr/bin:/bin"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        at = time.monotonic()
        logs = [open(root / f"{i}.{x}", "wb") for x in ("out", "err")]  # noqa: ASYNC230
        try:
            await proc.communicate()
        finally:
            for f in logs:
                f.close()
        assert proc.returncode == 0, proc.returncode
        return at - t0

    run = base if spawner == "asyncio" else one
    return list(await asyncio.gather(*(run(i) for i in range(n))))


async def burst_executions(n: int, hold_s: float, root: Path, sandbox: bool) -> list[float]:
    """n synthetic executions at once through the executor (harness + verifier spawns)."""
    from bench_executor import run_synthetic, synthetic_setup

    task, prof, cfg = synthetic_setup(n, hold_s, root, sandbox, network="shared")
    rs, _ = await run_synthetic(task, prof, cfg, n)
    return [r.timings.launched_s for r in rs]


async def one_round(path: str, a: argparse.Namespace, profile: cProfile.Profile | None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="gyre-bench-spawn-"))
    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(lags, stop))
    FORKS.clear()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        if a.executor:
            launch = await burst_executions(a.n, a.hold_s, root, a.sandbox)
        else:
            launch = await burst_processes(a.n, a.hold_s, root, a.child, path)
    finally:
        if profile is not None:
            profile.disable()
        stop.set()
        await tick
        shutil.rmtree(root, ignore_errors=True)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    lags.sort()
    launch.sort()
    forks = [f for f, _ in FORKS]
    return {
        "path": path,
        "spawns": len(FORKS),
        "stalled_ms": 1000 * sum(max(0.0, x - STALL) for x in lags) / a.n,
        "lag_p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))],
        "lag_max_ms": 1000 * lags[-1],
        "launch_p50_s": statistics.median(launch),
        "launch_p99_s": launch[int(0.99 * (len(launch) - 1))],
        "fork_ms": 1000 * statistics.mean(forks),
        "fork_on_loop_ms": 1000 * sum(f for f, on in FORKS if on) / max(1, len(FORKS)),
        "loop_cpu_ms": 1000 * cpu / a.n,
        "wall_s": wall,
    }


def ballast(mb: int, threads: int) -> list[Any]:
    """A bigger parent: ``mb`` MiB of touched memory and ``threads`` idle threads."""
    keep: list[Any] = [bytearray(b"\1" * (mb << 20))] if mb else []
    ev = threading.Event()
    for _ in range(threads):
        t = threading.Thread(target=ev.wait, daemon=True)
        t.start()
        keep.append(t)
    return keep


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="launches at once")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per spawner, interleaved")
    ap.add_argument("--hold-s", type=float, default=3.0, help="how long each child lives (s)")
    ap.add_argument(
        "--child",
        choices=("python", "sleep"),
        default="python",
        help="bare children: a Python (as harnesses are) or /bin/sleep (the spawn alone)",
    )
    ap.add_argument("--executor", action="store_true", help="whole executions, not bare children")
    ap.add_argument("--sandbox", action="store_true", help="with --executor: under bubblewrap")
    ap.add_argument("--ballast-mb", type=int, default=0, help="grow the parent first (MiB)")
    ap.add_argument("--threads", type=int, default=0, help="idle threads in the parent")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile the loop thread in an extra round"
    )
    a = ap.parse_args()
    if a.n < 1 or a.rounds < 1:
        raise SystemExit("--n and --rounds must be at least 1")
    subprocess._fork_exec = _timed_fork_exec  # type: ignore[attr-defined]
    keep = ballast(a.ballast_mb, a.threads)
    prof = cProfile.Profile() if a.profile else None
    paths = ("gyre",) if a.executor else ("asyncio", "gyre")
    if prof is not None:  # a round of its own: the profiler slows the loop thread
        await one_round("gyre", a, prof)
    rows = []
    for _ in range(a.rounds):
        for path in paths:
            rows.append(await one_round(path, a, None))
    del keep
    what = "executions (harness + verifier)" if a.executor else f"sleeping children ({a.child})"
    print(
        f"\n{a.n} {what} launched at once, {a.rounds} rounds per spawner; parent ballast "
        f"{a.ballast_mb} MiB, {a.threads} extra threads\n"
    )
    cols = [
        ("path", "path", "{}"),
        ("spawns", "spawns", "{}"),
        ("loop stalled/launch ms", "stalled_ms", "{:.2f}"),
        ("lag p99 ms", "lag_p99_ms", "{:.1f}"),
        ("lag max ms", "lag_max_ms", "{:.1f}"),
        ("launch p50 s", "launch_p50_s", "{:.2f}"),
        ("launch p99 s", "launch_p99_s", "{:.2f}"),
        ("fork_exec ms", "fork_ms", "{:.2f}"),
        ("of it on loop ms", "fork_on_loop_ms", "{:.2f}"),
        ("loop CPU/launch ms", "loop_cpu_ms", "{:.2f}"),
    ]
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + " --- |" * len(cols))
    for row in rows:
        print("| " + " | ".join(f.format(row[k]) for _, k, f in cols) + " |")
    for path in paths:
        mine = [r for r in rows if r["path"] == path]
        print(
            f"{path}: median over rounds: stalled/launch {statistics.median(r['stalled_ms'] for r in mine):.2f} ms,"
            f" lag max {statistics.median(r['lag_max_ms'] for r in mine):.0f} ms,"
            f" launch p50 {statistics.median(r['launch_p50_s'] for r in mine):.2f} s"
        )
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print("\nloop thread, gyre's spawner, an extra round (cProfile, by own time):")
        print("\n".join(out.getvalue().splitlines()[:45]))


if __name__ == "__main__":
    asyncio.run(main())
