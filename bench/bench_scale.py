"""``gyre run`` at 100+ concurrent executions: where the controller, the proxy and the executor
stand when the synthetic harness keeps the cells full.

    OMP_NUM_THREADS=1 python bench/bench_scale.py                  # ~3.5 min on 2 cores
    python bench/bench_scale.py --profile                          # + cProfile of the driver loop

One real run (``examples/quickstart.toml`` with the tiny model, reshaped: K=4 elastic cells,
C_e=40, N=8, B=4; harness profile ``synthetic``: each execution is one stdlib Python process
making a few model calls over a long-tailed virtual duration, scaled to seconds), read from its
own records and sampled by a probe attached through the run's rig hook (``loop.run(rigs=...)``):

1. Controller: ``SchedulingPolicy.handle(event)`` + ``RealWorld.carry_out(actions)`` per event,
   as the main loop records them (``summary.json`` ``controller``); events per second over the
   makespan.
   Baseline (peer): the simulator's per-event cost, ``policy.handle`` + ``World._apply``, on the
   same policy config (bench_runtime's ``bench_sim``). The driver's event-loop lag (a 50 ms
   sleep's overshoot, sampled all run) says whether the loop itself keeps up.
2. Proxy: answered calls per second (mean over the makespan, peak over 5 s windows) and calls in
   flight, from the proxy's own counters sampled every 0.25 s. No baseline in this run;
   bench_proxy measures the proxy alone (a ceiling).
3. Executor: launch latency (submission until the harness process exists: queue + workspace
   setup + spawn), from each execution's own Timings (its ``result.json`` in the run's
   workspaces), and the launch rate of the run's first burst (submission times from the run's
   ``workload.json``) (the policy dispatches in bursts; a burst's launches finish together). Peer:
   bench_executor's executor alone, 200 synthetic harnesses at once on this machine,
   12.7-20.5 starts/s (docs/harness.md).
4. Peak concurrent executions (the world's count, sampled every 0.1 s) and time spent at 100+.
5. Where time goes: CPU seconds per thread of the driver (main loop = controller + executor +
   world; the proxy's thread; helper threads), of the cell processes (engines, trainers) and of
   the harness processes (reaped children), against wall time x cores. With ``--profile``, the
   top functions of the driver's main thread (cProfile; it slows that thread, so the per-event
   figures of a profiled run are not comparable and are marked).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import BenchRig, bench_sim, load_avg, p50, pct

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def make_cfg(model_dir: Path, out_dir: Path, a: argparse.Namespace):
    from gyre.config import load_config

    harness = [
        *("--calls", str(a.calls)),
        *("--dist", "lognormal", "--mean-s", str(a.mean_s), "--sigma", "0.6"),
        *("--query-sigma", "0.3", "--max-s", str(a.mean_s * 4)),
        *("--time-scale", str(a.time_scale), "--max-tokens", "8"),
        "--write",
        "answer.txt=aab",
    ]
    return load_config(
        str(REPO / "examples" / "quickstart.toml"),
        overrides=[
            f"model_dir={model_dir}",
            f"run.out_dir={out_dir}",
            "run.name=scale",
            f"policy.cells={a.cells}",
            f"policy.cell_capacity={a.capacity}",
            f"policy.group_size={a.group_size}",
            f"policy.batch_groups={a.batch_groups}",
            f"policy.total_steps={a.steps}",
            f"engine.max_batch={a.max_batch}",
            "executor.max_concurrency=512",
            'run.train_tasks=["letter-a", "vowels", "digits", "upper"]',
            "run.profile=synthetic",
            f"run.harness_args={json.dumps(harness)}",
            "run.eval_interval=0",
            "run.log_format=plain",
        ],
    )


# ------------------------------------------------------------------------------ CPU accounting
def _cpu_s(stat_path: str) -> float:
    """utime + stime of one process or thread, in seconds (/proc/.../stat fields 14, 15)."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def driver_threads() -> dict[str, float]:
    """CPU seconds of each live thread of this process, named by its Python thread if it has one."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            cpu = _cpu_s(f"/proc/self/task/{tid}/stat")
        except OSError:
            continue
        name = names.get(int(tid))
        if name is None:
            kind = "native threads (Ray core, torch, gRPC)"
        elif name == "MainThread":
            kind = "main loop (controller, executor, world)"
        elif name.startswith("gyre-proxy"):
            kind = "proxy thread (HTTP server, routing, traces)"
        else:
            kind = "helper threads (to_thread: proxy admin calls, file I/O)"
        out[kind] = out.get(kind, 0.0) + cpu
    return out


def proc_cpu(pids: list[int]) -> float:
    tot = 0.0
    for p in pids:
        try:
            tot += _cpu_s(f"/proc/{p}/stat")
        except OSError:
            pass
    return tot


def ray_system_pids() -> list[int]:
    """The local Ray instance's processes: children of this driver that run Ray's code."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me and b"/ray/" in Path(f"/proc/{d}/cmdline").read_bytes():
                out.append(int(d))
        except (OSError, ValueError):
            continue
    return out


# ------------------------------------------------------------------------------ the instrumented run
class Probe(BenchRig):
    """Samples the live run from inside the driver's event loop (never from another thread): a
    rig (``gyre.runtime.handles.Rig``) attached through ``loop.run(rigs=...)``, started once the
    cells are up; the world cancels it first when the run stops, before the cells go, so its
    last act reads their CPU. With ``profile``, cProfile covers the driver's main thread over
    the same span."""

    name = "bench_scale_probe"

    def __init__(self, world, profile: cProfile.Profile | None = None) -> None:
        self.world = world
        self.profile = profile
        self.running: list[tuple[float, int]] = []
        self.answered: list[tuple[float, int]] = []
        self.inflight: list[int] = []
        self.lag: list[float] = []
        self.cell_cpu: dict[str, float] = {}
        self.threads: dict[str, float] = {}

    async def run(self) -> None:
        if self.profile is not None:
            self.profile.enable()
        try:
            await asyncio.gather(self._fast(), self._slow())
        finally:  # cancelled by the world's stop, before the cells go
            if self.profile is not None:
                self.profile.disable()
            self._last()

    async def _fast(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.05)
            self.lag.append(time.perf_counter() - t0 - 0.05)
            self.running.append((time.monotonic(), self.world.execs.running))

    async def _slow(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            proxy = self.world.cluster.proxy
            if not proxy.started:
                continue
            try:
                st = proxy.stats()
            except RuntimeError:  # the pool changed size under the copy: next sample
                continue
            self.answered.append((time.monotonic(), int(st["counters"].get("answered", 0))))
            self.inflight.append(sum(e["inflight"] for e in st["pool"]["engines"]))

    def _last(self) -> None:
        """Before the cells go: their processes' CPU so far, and the driver's threads."""
        pids = [c["pid"] for c in self.world.cluster.placement if "pid" in c]
        self.cell_cpu = {
            "cell processes (engines, trainers)": proc_cpu(pids),
            "Ray's own processes (raylet, GCS, agents)": proc_cpu(ray_system_pids()),
        }
        self.threads = driver_threads()


def launches_of(run_dir: Path) -> list[tuple[float | None, dict]]:
    """(submitted at, Timings) of every execution, from the run's own records: the executor's
    ``result.json`` in each execution's folder under ``workspaces/`` (evaluations included), and
    the world's submission time (run clock) from ``workload.json``, joined through
    ``executions.jsonl``; None for an execution the workload does not list (an evaluation)."""
    rows = [json.loads(x) for x in (run_dir / "executions.jsonl").read_text().splitlines() if x]
    wl = json.loads((run_dir / "workload.json").read_text())
    submitted = {(e["group"], e["attempt"]): e["launched_s"] for e in wl["executions"]}
    at = {r["execution"]: submitted.get((r["group"], r["attempt"])) for r in rows}
    out = []
    for res in sorted((run_dir / "workspaces").glob("*/result.json")):
        doc = json.loads(res.read_text())
        out.append((at.get(doc["execution_id"]), doc["timings"]))
    return out


def instrumented_run(cfg, tmp: Path, profile: bool) -> dict:
    """The run, with the probe attached; the controller's figures are the run's own record
    (``summary.json`` ``controller``)."""
    from gyre.runtime import loop

    prof = cProfile.Profile() if profile else None
    probes: list[Probe] = []

    def attach(world) -> Probe:
        probes.append(Probe(world, prof))
        return probes[-1]

    c0 = os.times()
    t0 = time.perf_counter()
    summary = loop.run(cfg, run_dir=tmp / "scale", quiet=True, rigs=[attach])
    wall = time.perf_counter() - t0
    c1 = os.times()
    return {
        "summary": summary,
        "wall": wall,
        "controller": summary["controller"],
        "launches": launches_of(tmp / "scale"),
        "probe": probes[0],
        "children_cpu": (c1.children_user + c1.children_system)
        - (c0.children_user + c0.children_system),
        "profile": prof,
    }


# ------------------------------------------------------------------------------ report
def report(r: dict, sim: dict | None, a: argparse.Namespace, cfg) -> None:
    s, probe = r["summary"], r["probe"]
    mk = s["makespan_s"]
    p = cfg.policy
    ctl = r["controller"]
    ev = ctl["per_event"]
    peak = max((n for _, n in probe.running), default=0)
    at100 = sum(0.05 for _, n in probe.running if n >= 100)
    print(
        f"gyre run at scale: K={p.cells} {p.placement.value} cells, C_e={p.cell_capacity}, "
        f"N={p.group_size}, B={p.batch_groups}, {s['steps']} steps; synthetic harness, {a.calls} "
        f"calls per execution over a lognormal duration (mean {a.mean_s:g} virtual s x "
        f"{a.time_scale:g}); {os.cpu_count()} CPUs, load average at end {load_avg()}"
    )
    print(
        f"makespan {mk:.1f} s (wall {r['wall']:.0f} s with start and stop); executions finished "
        f"{s['executions']['finished']}, failed {s['executions']['failed']}, missing "
        f"{s['executions']['missing']}; interrupted {s['interrupted_executions']}; proxy 5xx "
        f"{s['proxy']['errors_5xx']}; calls moved {s['proxy']['moved_calls']}"
        + (" [cProfile on: per-event figures inflated]" if r["profile"] else "")
    )
    print(f"\n{'what':<58}{'value':>12}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}\n{'-' * 110}")

    def row(label: str, value: str, xs: list[float] | None = None, scale: float = 1e3) -> None:
        q = (
            "".join(f"{pct(xs, x) * scale:>10.3f}" for x in (0.5, 0.9, 0.99))
            + f"{max(xs) * scale:>10.3f}"
            if xs
            else ""
        )
        print(f"{label:<58}{value:>12}{q}")

    def qrow(label: str, value: str, q: dict) -> None:
        """A row from the run's own quantiles (ms)."""
        if not q["n"]:
            return row(label, value)
        cols = "".join(f"{q[k]:>10.3f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
        print(f"{label:<58}{value:>12}{cols}")

    row("peak concurrent executions (sampled every 0.1 s)", f"{peak}")
    row("  seconds with 100+ running", f"{at100:.1f}")
    row("controller events handled", f"{ev['n']}")
    row("controller events per second (over the makespan)", f"{ev['n'] / mk:.1f}")
    qrow(
        "controller overhead per event, ms: handle + carry_out",
        f"{ev['total_s'] / max(ev['n'], 1) * 1e3:.3f}",
        ev,
    )
    qrow("  policy.handle, ms", "", ctl["handle"])
    qrow("  world.carry_out, ms", "", ctl["carry_out"])
    row("  controller busy share of the makespan", f"{ev['total_s'] / mk:.1%}")
    if sim:
        sv = sim["per_event"]
        row(
            "baseline: simulator handle + _apply, same policy, ms",
            f"{sum(sv) / len(sv) * 1e3:.3f}",
            sv,
        )
        print(f"{'  runtime / simulator (p50)':<58}{ev['p50_ms'] / (p50(sv) * 1e3):>11.1f}x")
    row("driver event-loop lag (50 ms sleep overshoot), ms", "", probe.lag)
    ans = probe.answered
    rates = []
    for i in range(len(ans)):
        j = next((k for k in range(i, len(ans)) if ans[k][0] - ans[i][0] >= 5.0), None)
        if j is None:
            break
        rates.append((ans[j][1] - ans[i][1]) / (ans[j][0] - ans[i][0]))
    row("proxy calls answered", f"{s['proxy']['answered']}")
    row("proxy calls per second (mean over the makespan)", f"{s['proxy']['answered'] / mk:.1f}")
    row("  peak over 5 s windows", f"{max(rates, default=0):.1f}")
    row("  calls in flight at the proxy (sampled)", "", [float(x) for x in probe.inflight], 1)
    la = r["launches"]
    row("executor launch latency, ms", f"n={len(la)}", [t["launched_s"] for _, t in la])
    subs = [(t0, t) for t0, t in la if t0 is not None]
    t_first = min((t0 for t0, _ in subs), default=0.0)
    burst = [t0 + t["launched_s"] for t0, t in subs if t0 - t_first < 0.5]
    if burst:
        dt = max(burst) - t_first
        row(
            f"  first burst: {len(burst)} launches done in {dt:.1f} s, per second",
            f"{len(burst) / dt:.1f}",
        )
    for k in ("queued_s", "setup_s", "teardown_s", "scoring_s"):
        row(f"  {k[:-2]}, ms", "", [t[k] for _, t in la])

    print(
        "\nwhere time goes: CPU seconds during the run (wall x cores = "
        f"{r['wall'] * (os.cpu_count() or 1):.0f} CPU s available)"
    )
    parts = {
        **{f"driver: {k}": v for k, v in probe.threads.items()},
        **probe.cell_cpu,
        "harness processes (reaped children of the driver)": r["children_cpu"],
    }
    tot = sum(parts.values())
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<70}{v:>8.1f} s{v / tot:>7.0%}")
    print(f"  {'all of the above':<70}{tot:>8.1f} s")
    if r["profile"]:
        buf = io.StringIO()
        st = pstats.Stats(r["profile"], stream=buf).sort_stats("tottime")
        st.print_stats(18)
        print("\ndriver main thread, cProfile, top functions by own time:")
        print("\n".join(buf.getvalue().splitlines()[:50]))
        buf = io.StringIO()
        st = pstats.Stats(r["profile"], stream=buf).sort_stats("cumulative")
        st.print_stats(r"/gyre/(runtime|harness|policy|proxy/admin|train|trace)/", 25)
        print("\ndriver main thread, Gyre's functions by cumulative time (a coroutine counts only")
        print("while it runs, not while it awaits):")
        print("\n".join(x for x in buf.getvalue().splitlines()[6:] if x.strip()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=40, help="C_e per cell")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--calls", type=int, default=4, help="model calls per execution")
    ap.add_argument("--mean-s", type=float, default=600.0, help="mean virtual duration (s)")
    ap.add_argument("--time-scale", type=float, default=0.02, help="real s per virtual s")
    ap.add_argument("--max-batch", type=int, default=64, help="engine.max_batch")
    ap.add_argument("--profile", action="store_true", help="cProfile the driver's main thread")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulator baseline")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (run dir, traces)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from gyre.models.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="gyre-bench-scale-"))
    try:
        cfg = make_cfg(build_tiny_model(tmp / "tiny"), tmp / "runs", a)
        r = instrumented_run(cfg, tmp / "runs", a.profile)
        sim = None if a.no_sim else bench_sim(cfg)
        report(r, sim, a, cfg)
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
