"""The runtime of ``gyre run`` on the tiny model, on this machine: switching, publication,
controller overhead per event, and how long training cells wait within a step.

    OMP_NUM_THREADS=1 python bench/bench_runtime.py            # ~2-3 min on 2 otherwise idle cores
    python bench/bench_runtime.py --quick                       # fewer repeats

1. Switch of one satellite cell (cell 1 of 3) into training and back, through the real mechanism
   (``Cluster.to_training`` / ``Cluster.to_rollout``) while the proxy carries live calls, so the
   drain moves in-flight calls to cell 2's engine. Parts are timed by wrapping the proxy's and the
   cell actor's calls from outside. Baseline measured in the same run: a cold start of the same
   thing in a fresh Ray actor process (what a design that restarts processes pays). The cold
   start is a floor for such a design: it leaves out draining and killing the old process and
   re-joining the cells' gloo world, and it runs after the cluster is stopped (nothing competing).
   The cell's first switch (imports of the training stack in that process) is shown apart.
2. Weight publication (``Cluster.publish``: the core writes HF weights; every rollout engine
   pauses, reloads from disk, resumes), under the same live load. Baseline: the cold engine
   start of (1), what restarting the engines on new weights would cost instead.
3. Controller overhead per event in a short real ``gyre run`` (examples/quickstart.toml, 3 steps,
   no evaluation): ``SchedulingPolicy.handle(event)`` plus ``RealWorld.carry_out(actions)``, and
   an AssignGroup's parts (traces to trees, packing, the tasks into the object store), all from
   the run's own record (``summary.json`` ``controller``: the main loop times both calls, the
   world its AssignGroup spans). Reference peer: the simulator's per-event cost
   (``policy.handle`` + ``World._apply``, its ``World.event_costs``) on the same policy config.
4. Per step of that run: how long each training cell computed and how long it waited (time in
   the training role within the step minus its busy intervals), from the run's own records
   (the world's role segments and busy intervals, which ``timeline.png`` draws; step windows
   from metrics.jsonl). No baseline: the ideal is zero wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAPER_SWITCH_S = {"training": 8.52, "rollout": 3.46}  # the paper's switch times at scale


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def make_cfg(model_dir: Path, out_dir: Path, steps: int):
    from gyre.config import load_config

    return load_config(
        str(REPO / "examples" / "quickstart.toml"),
        overrides=[
            f"model_dir={model_dir}",
            f"run.out_dir={out_dir}",
            f"policy.total_steps={steps}",
            "run.eval_interval=0",
            "run.log_format=plain",
        ],
    )


def start_ray(cfg, tries: int = 3) -> None:
    """``init_ray`` with retries: Ray gives its raylet 30 s to come up, which a loaded machine can miss."""
    import ray

    from gyre.runtime.ray_setup import init_ray

    for attempt in range(tries):
        try:
            init_ray(cfg)
            return
        except Exception as e:
            ray.shutdown()
            if attempt == tries - 1:
                raise
            print(f"ray.init failed ({e}); retrying", file=sys.stderr)


# ---------------------------------------------------------------------------------------- timing
class Timed:
    """Records how long each wrapped call took, by name."""

    def __init__(self) -> None:
        self.t: dict[str, list[float]] = {}

    def add(self, name: str, dt: float) -> None:
        self.t.setdefault(name, []).append(dt)

    def last(self, name: str) -> float:
        return self.t[name][-1] if self.t.get(name) else 0.0


class _TimedMethod:
    def __init__(self, method, name: str, rec: Timed):
        self.method, self.name, self.rec = method, name, rec

    def remote(self, *a, **kw):
        ref = self.method.remote(*a, **kw)
        t0 = time.perf_counter()

        async def wait():
            try:
                return await ref
            finally:
                self.rec.add(self.name, time.perf_counter() - t0)

        return wait()


class TimedActor:
    """An actor handle whose ``x.method.remote(...)`` awaits are timed as ``method``."""

    def __init__(self, actor, rec: Timed):
        self._actor, self._rec = actor, rec

    def __getattr__(self, name):
        return _TimedMethod(getattr(self._actor, name), name, self._rec)


def wrap_proxy(proxy, rec: Timed) -> None:
    """Time the pool calls the cluster makes on its ``ManagedProxy`` (instance attributes; the
    class is untouched)."""
    for name in ("drain", "add_engine", "remove_engine"):
        fn = getattr(proxy, name)

        async def timed(*a, _fn=fn, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return await _fn(*a, **kw)
            finally:
                rec.add(_name, time.perf_counter() - t0)

        setattr(proxy, name, timed)


# ---------------------------------------------------------------------------------------- load
class Load:
    """Executions calling the proxy in a loop (new key every two calls, so new executions spread
    over whichever engines are active), each call long enough to be in flight during a drain."""

    def __init__(self, proxy, workers: int, max_tokens: int):
        self.proxy, self.workers, self.max_tokens = proxy, workers, max_tokens
        self.calls = self.errors = 0
        self._stop = False
        self._tasks: list[asyncio.Task] = []

    async def _worker(self, w: int) -> None:
        import httpx

        admin = {"authorization": f"Bearer {self.proxy.admin_token}"}
        n = 0
        adm = httpx.AsyncClient(  # admin routes: the proxy's unix socket, never the API port
            transport=httpx.AsyncHTTPTransport(uds=self.proxy.admin_socket),
            base_url="http://gyre-admin",
            headers=admin,
            timeout=120,
        )
        async with adm, httpx.AsyncClient(base_url=self.proxy.url, timeout=120) as http:
            while not self._stop:
                eid = f"bench-w{w}-{n}"
                n += 1
                try:
                    r = await adm.post("/admin/executions", json={"execution_id": eid})
                    key = r.json()["api_key"]
                    msgs = [
                        {
                            "role": "user",
                            "content": f"Reply using only lowercase letters, please ({eid}).",
                        }
                    ]
                    for _ in range(2):
                        if self._stop:
                            break
                        r = await http.post(
                            "/v1/chat/completions",
                            headers={"authorization": f"Bearer {key}"},
                            json={"model": "m", "messages": msgs, "max_tokens": self.max_tokens},
                        )
                        if r.status_code != 200:
                            self.errors += 1
                            continue
                        self.calls += 1
                        msgs = msgs + [
                            r.json()["choices"][0]["message"],
                            {"role": "user", "content": "again"},
                        ]
                    await adm.delete(f"/admin/executions/{eid}")
                except httpx.HTTPError:
                    self.errors += 1
                    await asyncio.sleep(0.05)

    def start(self) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._worker(w)) for w in range(self.workers)
        ]

    async def stop(self) -> None:
        self._stop = True
        await asyncio.wait(self._tasks, timeout=60)
        for t in self._tasks:
            t.cancel()


async def wait_inflight(proxy, url: str, n: int, timeout: float = 15.0) -> int:
    """Calls in flight on ``url``'s engine, once there are ``n`` (or at ``timeout``)."""

    def inflight() -> int:
        held = proxy.load()["engines"].get(url.rstrip("/"))
        return held[1] if held is not None else 0

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (k := inflight()) >= n:
            return k
        await asyncio.sleep(0.02)
    return inflight()


# ---------------------------------------------------------------------------------------- 1 + 2
async def bench_cluster(cfg, tmp: Path, a) -> dict:
    import ray

    from gyre.policy import CellRole
    from gyre.runtime.cell import Cell
    from gyre.runtime.cluster import Cluster
    from gyre.runtime.rundir import RunDir

    out: dict = {
        "switch": [],
        "first_switch": [],
        "cold": {"training": [], "rollout": []},
        "publish": [],
    }
    rundir = RunDir(tmp / "cluster-bench").create()
    cluster = Cluster(cfg, rundir)
    t0 = time.perf_counter()
    await cluster.start([CellRole.TRAINING, CellRole.ROLLOUT, CellRole.ROLLOUT])
    out["cluster_start_s"] = time.perf_counter() - t0
    rec = Timed()
    wrap_proxy(cluster.proxy, rec)
    cluster.cells = [TimedActor(c, rec) for c in cluster.cells]
    load = Load(cluster.proxy, a.load_workers, a.max_tokens)
    load.start()
    try:
        S = 1
        await wait_inflight(cluster.proxy, cluster.urls[S], 1)
        for i in range(
            a.repeats + 1
        ):  # the first round warms up (imports, first model load in the cell)
            rec.t.clear()
            inflight = await wait_inflight(cluster.proxy, cluster.urls[S], 2)
            t0 = time.perf_counter()
            moved = await cluster.to_training(S)
            t_train = time.perf_counter() - t0
            tr = dict(
                drain=rec.last("drain"),
                remove=rec.last("remove_engine"),
                stop=rec.last("stop_engine"),
                load=rec.last("load_replica"),
            )
            await asyncio.sleep(a.dwell)
            t0 = time.perf_counter()
            await cluster.to_rollout(S)
            t_roll = time.perf_counter() - t0
            ro = dict(
                drop=rec.last("drop_replica"),
                start=rec.last("start_engine"),
                add=rec.last("add_engine"),
            )
            out["first_switch" if i == 0 else "switch"].append(
                {
                    "to_training": t_train,
                    "to_rollout": t_roll,
                    "moved": moved,
                    "inflight": inflight,
                    **{f"t.{k}": v for k, v in tr.items()},
                    **{f"r.{k}": v for k, v in ro.items()},
                }
            )
            await asyncio.sleep(a.dwell)

        # publication under the same load: core writes HF weights, engines 1 and 2 reload
        for v in range(1, a.repeats + 2):
            await wait_inflight(cluster.proxy, cluster.urls[S], 1, timeout=5)
            t0 = time.perf_counter()
            info = await cluster.publish(v, [1, 2])
            dt = time.perf_counter() - t0
            if v > 1:
                out["publish"].append(
                    {"seconds": dt, "save": info["save_seconds"], "engines": info["engines"]}
                )
            await asyncio.sleep(a.dwell)
        out["load_calls"], out["load_errors"] = load.calls, load.errors
    finally:
        await load.stop()
        cluster.cells = [c._actor for c in cluster.cells]
        await cluster.stop()

    # cold start: a fresh Ray actor process (the same Cell class and options) loading the model; measured
    # after the cluster and its load are gone, so nothing competes with it (which favours the baseline)
    res = cfg.run.cell
    actor = ray.remote(Cell).options(
        num_cpus=res.num_cpus,
        num_gpus=res.num_gpus,
        resources=res.resources or None,
        max_concurrency=1,
    )
    tcfg, ecfg = cfg.trainer, cfg.engine
    snap_version = cluster.trainer_version
    for _ in range(a.cold):
        for to in ("training", "rollout"):
            t0 = time.perf_counter()
            c = actor.remote(1, 3, tcfg, ecfg, res.torch_threads)
            await c.pid.remote()
            t_proc = time.perf_counter() - t0
            if to == "training":
                await c.load_replica.remote(snap_version, rundir.snapshots, None)
            else:
                await c.start_engine.remote(cluster.weights_dir, cluster.published_version)
            dt = time.perf_counter() - t0
            out["cold"][to].append({"seconds": dt, "process": t_proc, "load": dt - t_proc})
            if to == "rollout":
                await c.stop_engine.remote()
            ray.kill(c)
    return out


def print_switch(r: dict) -> None:
    sw, cold, first = r["switch"], r["cold"], r["first_switch"][0]
    print(
        f"\n1. switch of cell 1 (satellite) under live load: p50/max over {len(sw)} round trips; 'first' = the "
        f"warm-up round before them (the cell's first switch); cold start: {len(cold['training'])} fresh actors "
        f"each way"
    )
    hdr = f"{'what':<46}{'p50 s':>8}{'max s':>8}{'first s':>9}{'vs baseline':>13}{'paper s':>9}"
    print(hdr)
    print("-" * len(hdr))
    for to, key, parts in (
        (
            "training",
            "to_training",
            [
                ("drain (proxy moves in-flight calls)", "t.drain"),
                ("remove from proxy pool", "t.remove"),
                ("engine stop (cell)", "t.stop"),
                ("replica load + snapshot pull (cell)", "t.load"),
            ],
        ),
        (
            "rollout",
            "to_rollout",
            [
                ("replica drop (cell)", "r.drop"),
                ("engine start (cell)", "r.start"),
                ("add to proxy pool", "r.add"),
            ],
        ),
    ):
        base = [x["seconds"] for x in cold[to]]
        b = p50(base)
        xs = [x[key] for x in sw]
        print(
            f"{'into ' + to + ' (Cluster.' + key + ')':<46}{p50(xs):>8.3f}{max(xs):>8.3f}{first[key]:>9.3f}"
            f"{p50(xs) / b:>12.3f}x{PAPER_SWITCH_S[to]:>9.2f}"
        )
        for label, k in parts:
            ys = [x[k] for x in sw]
            print(f"{'  ' + label:<46}{p50(ys):>8.3f}{max(ys):>8.3f}{first[k]:>9.3f}")
        print(
            f"{'  baseline: cold start, fresh actor process':<46}{b:>8.3f}{max(base):>8.3f}{'':>9}{1.0:>12.3f}x"
        )
        print(
            f"{'    of which process up (Ray worker + __init__)':<46}{p50([x['process'] for x in cold[to]]):>8.3f}"
            f"{max(x['process'] for x in cold[to]):>8.3f}"
        )
        what = "replica load + snapshot pull" if to == "training" else "engine start"
        print(
            f"{'    of which ' + what:<46}{p50([x['load'] for x in cold[to]]):>8.3f}"
            f"{max(x['load'] for x in cold[to]):>8.3f}"
        )
    moved = [x["moved"] for x in sw]
    print(
        f"calls moved by the drain per switch: {moved} (in flight on the cell just before: "
        f"{[x['inflight'] for x in sw]}); load: {r['load_calls']} calls, {r['load_errors']} errors; "
        f"goal < 1 s each way"
    )


def print_publish(r: dict) -> None:
    pub = r["publish"]
    xs = [x["seconds"] for x in pub]
    save = [x["save"] for x in pub]
    rest = [x["seconds"] - x["save"] for x in pub]
    b = p50([x["seconds"] for x in r["cold"]["rollout"]])
    print(
        f"\n2. weight publication (Cluster.publish) to {pub[0]['engines']} rollout engines under live load, "
        f"{len(pub)} repeats after one warm-up"
    )
    hdr = f"{'what':<48}{'p50 s':>9}{'max s':>9}{'vs baseline':>13}"
    print(hdr)
    print("-" * len(hdr))
    print(
        f"{'publish (save + every engine pause/reload/resume)':<48}{p50(xs):>9.3f}{max(xs):>9.3f}"
        f"{p50(xs) / b:>12.3f}x"
    )
    print(f"{'  core writes HF weights (save_hf)':<48}{p50(save):>9.3f}{max(save):>9.3f}")
    print(f"{'  engines pause/reload/resume (in parallel)':<48}{p50(rest):>9.3f}{max(rest):>9.3f}")
    print(f"{'baseline: cold engine start, fresh actor':<48}{b:>9.3f}{'':>9}{1.0:>12.3f}x")


# ---------------------------------------------------------------------------------------- 3 + 4
class BenchRig:
    """A benchmark's rig (``gyre.runtime.handles.Rig``, attached through ``loop.run(rigs=...)``)
    that shows nothing in the live view and puts nothing in ``summary.json``; a subclass sets
    ``name`` and does its work in ``run`` (spawned once the cells are up)."""

    name = "bench"

    async def run(self) -> None:
        return None

    def counts(self) -> dict[str, int]:
        return {}

    def rows(self) -> list[dict]:
        return []

    def close(self) -> None:
        return None


class KeepRecords(BenchRig):
    """Keeps the world's records, for the per-step table; it adds nothing to the run."""

    name = "bench_records"

    def __init__(self, world) -> None:
        self.records, self.K = world.records, world.K


def bench_run(cfg, tmp: Path) -> dict:
    """A short real run; the controller's cost per event is its own record (``summary.json``
    ``controller``: the main loop times each ``policy.handle`` and ``world.carry_out``)."""
    from gyre.runtime import loop

    kept: list[KeepRecords] = []

    def keep(world) -> KeepRecords:
        kept.append(KeepRecords(world))
        return kept[-1]

    t0 = time.perf_counter()
    summary = loop.run(cfg, run_dir=tmp / "run", quiet=True, rigs=[keep])
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return {
        "controller": summary["controller"],
        "records": kept[0].records,
        "K": kept[0].K,
        "summary": summary,
        "metrics": rows,
        "wall": wall,
    }


def bench_sim(cfg) -> dict:
    """The simulator on the same policy config: per-event policy.handle + World._apply, from the
    simulator's own record (``World.event_costs``)."""
    from gyre.sim.config import SIM_HOLD_TAU_H, PlacementSpec, SimConfig
    from gyre.sim.run import run_world

    p = cfg.policy
    # the run's own rules, embedded; the simulator keeps its hours (tau = 2 min) and
    # one micro-step per execution, as this bench always measured
    scfg = SimConfig(
        name="quickstart-shape",
        policy=p.model_copy(update={"hold_tau": SIM_HOLD_TAU_H, "micro_steps_per_execution": 1}),
        placements={"x": PlacementSpec(placement=p.placement)},
    )
    costs: list[tuple[float, float]] = []
    for _ in range(3):  # repeated: the per-event figures pool over all three
        costs += run_world(scfg, "x").event_costs
    return {
        "per_event": [h + a for h, a in costs],
        "handle": [h for h, _ in costs],
        "steps": p.total_steps,
    }


def print_controller(run: dict, sim: dict) -> None:
    ctl = run["controller"]
    sv = sim["per_event"]
    print(
        f"\n3. controller overhead per event: policy.handle(event) + world.carry_out(actions); real run "
        f"{ctl['per_event']['n']} events ({run['summary']['steps']} steps, {run['wall']:.0f} s wall; "
        f"the run's own record, summary.json 'controller'); "
        f"simulator {len(sv)} events (3 x {sim['steps']} steps, World.event_costs)"
    )
    hdr = f"{'what':<52}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'vs baseline':>13}"
    print(hdr)
    print("-" * len(hdr))
    b = p50(sv) * 1e3

    def row(label, q, base=None):
        if not q["n"]:
            print(f"{label:<52}{'none':>9}")
            return
        ratio = f"{q['p50_ms'] / base:>12.1f}x" if base else f"{'':>13}"
        print(
            f"{label:<52}{q['p50_ms']:>9.3f}{q['p90_ms']:>9.3f}{q['p99_ms']:>9.3f}{q['max_ms']:>9.3f}{ratio}"
        )

    row("gyre run: handle + carry_out (goal p50 < 1 ms)", ctl["per_event"], b)
    row("  policy.handle", ctl["handle"])
    row("  world.carry_out", ctl["carry_out"])
    a = ctl["assign"]
    if a["all"]["n"]:
        row(f"  of which AssignGroup (pack one group, {a['all']['n']}x)", a["all"])
        row("    trees from traces (group_from_traces)", a["trees"])
        row("    packing (pack_groups)", a["pack"])
        row(f"    tasks into the object store ({ctl['assign_tasks']} in all)", a["put"])
    row("  events whose actions hold no AssignGroup", ctl["without_assign"], b)
    ms = sorted(x * 1e3 for x in sv)
    sim_q = {
        "n": len(ms),
        "p50_ms": pct(ms, 0.5),
        "p90_ms": pct(ms, 0.9),
        "p99_ms": pct(ms, 0.99),
        "max_ms": max(ms, default=float("nan")),
    }
    row("baseline: simulator handle + _apply (same policy)", sim_q, b)
    print(
        "slowest real events: "
        + "; ".join(
            f"{x['event']} -> {','.join(sorted(set(x['actions']))) or 'no action'} {x['ms']:.1f} ms"
            for x in ctl["slowest"]
        )
    )


def print_idle(run: dict) -> None:
    """Per step: each training cell's compute vs wait inside the step window."""
    records, rows, K = run["records"], run["metrics"], run["K"]

    def overlap(iv, s, e):
        return sum(max(0.0, min(b, e) - max(a, s)) for a, b in iv)

    print(
        "\n4. training cells per step: computing vs waiting (step window = StartStep .. optimizer step done;"
        " 'wait' = in the training role, not computing)"
    )
    hdr = (
        f"{'step':>4}{'window s':>10}"
        + "".join(f"{f'c{c} train':>10}{f'c{c} busy':>9}{f'c{c} wait':>9}" for c in range(K))
        + f"{'switching s':>13}{'wait share':>12}"
    )
    print(hdr)
    print("-" * len(hdr))
    tot_train = tot_wait = 0.0
    for i, (s, e) in enumerate(records.steps):
        cells = ""
        train_all = wait_all = switching = 0.0
        for c in range(K):
            segs = records.segments[c]
            tr = overlap([(a, b) for a, b, r in segs if r == "training"], s, e)
            sw = overlap([(a, b) for a, b, r in segs if r.startswith("to_")], s, e)
            busy = overlap(records.busy[c], s, e)
            wait = max(0.0, tr - busy)
            train_all += tr
            wait_all += wait
            switching += sw
            cells += f"{tr:>10.2f}{busy:>9.2f}{wait:>9.2f}"
        tot_train += train_all
        tot_wait += wait_all
        step = rows[i]["step"] if i < len(rows) else i
        share = wait_all / train_all if train_all else 0.0
        print(f"{step:>4}{e - s:>10.2f}{cells}{switching:>13.2f}{share:>11.0%}")
    print(
        "groups per step (metrics.jsonl batch/groups): "
        + str([r["batch/groups"] for r in rows])
        + f"; AssignGroup carried out {run['controller']['assign']['all']['n']}x"
    )
    print(
        f"all steps: training cells waited {tot_wait:.2f} s of {tot_train:.2f} s in the training role "
        f"({tot_wait / tot_train if tot_train else 0:.0%}); metrics.jsonl timing/step: "
        f"{[round(r['timing/step'], 2) for r in rows]}; finish_step: "
        f"{[round(r['timing/finish_step'], 3) for r in rows]}"
    )
    sh = run["summary"]["role_shares"]
    print(
        "role shares over the whole run (summary.json): "
        + "; ".join(
            f"c{c} " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(s.items()))
            for c, s in enumerate(sh)
        )
    )
    swi = run["summary"]["switches"]
    print(
        "switches in the run (summary.json): "
        + "; ".join(
            f"to {d}: {v['count']}x mean {v['mean_s'] or 0:.2f} s max {v['max_s'] or 0:.2f} s"
            for d, v in swi.items()
        )
    )


# ---------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer repeats (2 switches, 1 cold start, 2 steps)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="switch round trips and publications (after a warm-up)",
    )
    ap.add_argument("--cold", type=int, default=2, help="cold starts each way")
    ap.add_argument("--steps", type=int, default=3, help="steps of the real run")
    ap.add_argument(
        "--load-workers", type=int, default=6, help="concurrent executions of live load"
    )
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per live call")
    ap.add_argument("--dwell", type=float, default=0.3, help="seconds between switches")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: cluster,run,sim")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (run dir, traces)")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.cold, a.steps = 2, 1, 2
    skip = set(filter(None, a.skip.split(",")))
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from gyre.models.tiny import build_tiny_model

    t_all = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gyre-bench-runtime-"))
    la0 = load_avg()
    model = build_tiny_model(tmp / "tiny")
    cfg = make_cfg(model, tmp / "runs", a.steps)
    t0 = time.perf_counter()
    start_ray(cfg)
    t_ray = time.perf_counter() - t0
    cl = asyncio.run(bench_cluster(cfg, tmp, a)) if "cluster" not in skip else None
    run = bench_run(cfg, tmp) if "run" not in skip else None
    sim = bench_sim(cfg) if "sim" not in skip else None
    print(
        f"gyre runtime on the tiny model ({os.cpu_count()} CPUs; load average at start {la0}, at end "
        f"{load_avg()}; ray.init {t_ray:.1f} s; total {time.perf_counter() - t_all:.0f} s)"
    )
    if cl:
        print(
            f"cluster of 3 cells up in {cl['cluster_start_s']:.1f} s (core training, cells 1-2 serving); "
            f"{a.load_workers} executions of live load, {a.max_tokens} tokens per call"
        )
        print_switch(cl)
        print_publish(cl)
    if run and sim:
        print_controller(run, sim)
    if run:
        print_idle(run)
    if not a.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
