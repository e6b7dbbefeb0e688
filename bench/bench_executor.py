"""Executor benchmark: executions started per second and executor overhead per execution,
with N (default 200) synthetic harnesses running concurrently.

    python bench/bench_executor.py [--n 200] [--harness-s 3] [--rounds R] [--no-sandbox]
    python bench/bench_executor.py --n 1 --rounds 15 --harness-s 0.5   # one at a time: no contention
    python bench/bench_executor.py --phases 20 [--no-sandbox]   # where one execution's time goes

``--phases N`` runs N executions one after another of the arithmetic example's shape (the
reference agent, one turn, no tools, ``--client stdlib``, a generated ``arith`` task and its
verifier) against a scripted endpoint in this process that answers at once, and prints the
median and p90 of each phase of an execution outside its model call:

- launch -> first call: setup (workspace, key, command line, sandbox argv) until the
  process exists; then spawn (bwrap, confine, the agent's interpreter and imports) until the
  endpoint receives the first request;
- last call -> score: the endpoint's last answer until the harness exited; the teardown
  (group killed, logs flushed, sandbox undone); the model-call count and key revoke; the
  scoring (copy, verifier start and run, result read); the result written;
- the CPU of this process per execution (executor, endpoint thread): the launcher's own
  cost, which moves less with the machine's load than the wall-clock phases. (The
  sandboxed processes' CPU is not reaped by this process, so it is not shown.)

Every mark is taken in this process (the endpoint runs on a thread here) from the result's
``Timings`` and the endpoint's clock, so the mode measures an older commit the same way.

Each synthetic harness (``gyre.harness.synthetic``, stdlib only) sleeps a fixed
real duration and writes one file; the task's verifier is a one-line shell
script, so what is measured is the executor: workspace copy, key, launch,
process-group teardown, log capture, scoring copy, result file.

Baseline, measured in the same run: the same N harness commands started
directly with ``asyncio.create_subprocess_exec`` (no workspace, no scoring) --
the floor any executor pays for a Python process.

Columns: starts/s (executions whose harness process exists, per second from
submission), launcher CPU/exec (CPU of the launching process itself -- the
executor's own cost, its threads included), children CPU/exec (harness +
verifier + bwrap processes), wall overhead/exec = wall time of the execution
minus the harness's own run time (reported by the harness). With 200 Python
processes starting at once on 2 cores, wall overhead is dominated by CPU
contention among the children (the bare baseline launches all 200 at once and
suffers most); the launcher CPU column is the executor's real cost. Noisy on a
shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import load_profile
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import load_task


def cpu() -> tuple[float, float]:
    """(this process's CPU seconds, reaped children's CPU seconds)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, ch.ru_utime + ch.ru_stime


def with_cpu(res: dict, before: tuple[float, float], n: int) -> dict:
    after = cpu()
    res["cpu_self_ms"] = 1000 * (after[0] - before[0]) / n
    res["cpu_children_ms"] = 1000 * (after[1] - before[1]) / n
    return res


def make_task(root: Path) -> Path:
    d = root / "bench-task"
    (d / "environment" / "repo" / "pkg").mkdir(parents=True)
    for i in range(20):  # a small repository: 20 files
        (d / "environment" / "repo" / "pkg" / f"m{i}.py").write_text(f"X = {i}\n" * 20)
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(
        '[ -f "$GYRE_WORKSPACE/answer.txt" ] && echo 1 > "$GYRE_REWARD_DIR/reward.txt" || echo 0 > "$GYRE_REWARD_DIR/reward.txt"\n'
    )
    (d / "instruction.md").write_text("bench\n")
    (d / "task.toml").write_text(
        '[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 120\n[gyre]\nreward = "binary"\n'
    )
    return d


def harness_args(harness_s: float) -> list[str]:
    return [
        "--calls",
        "0",
        "--dist",
        "fixed",
        "--mean-s",
        str(harness_s),
        "--time-scale",
        "1.0",
        "--write",
        "answer.txt=1",
    ]


async def baseline(n: int, harness_s: float, root: Path) -> dict:
    argv = [sys.executable, "-m", "gyre.harness.synthetic", *harness_args(harness_s)]
    starts: list[float] = []

    async def one(i: int) -> float:
        d = root / f"base{i}"
        d.mkdir(parents=True)
        t0 = time.monotonic()
        p = await asyncio.create_subprocess_exec(
            *argv, cwd=d, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        starts.append(time.monotonic())
        out, _ = await p.communicate()
        return (time.monotonic() - t0) - json.loads(out)["real_s"]

    c0 = cpu()
    t0 = time.monotonic()
    over = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - t0
    return with_cpu(
        {"wall_s": wall, "starts_per_s": n / (max(starts) - t0), "overhead_s": list(over)}, c0, n
    )


def synthetic_setup(
    n: int, harness_s: float, root: Path, sandbox: bool, network: str = "proxy-only"
) -> tuple:
    """The bench task, the synthetic profile holding ``harness_s`` and an executor config for n."""
    task = load_task(make_task(root))
    prof = load_profile("synthetic").model_copy(update={"args": harness_args(harness_s)})
    cfg = ExecutorConfig(
        workspace_root=root / "runs",
        max_concurrency=n,
        sandbox=SandboxConfig(enabled=sandbox, network=network),
        keep_workspaces=False,
    )
    cfg.scorer.max_concurrency = 16
    return task, prof, cfg


async def run_synthetic(task, prof, cfg, n: int) -> tuple[list, float]:
    """n executions at once; their results and the wall time from the first submit. Every one
    must score 1 (the harness writes the answer): anything else ends the benchmark."""
    async with HarnessExecutor(cfg) as ex:
        t0 = time.monotonic()
        rs = await ex.run_many(
            [
                ExecutionSpec(
                    execution_id=f"e{i}",
                    task=task,
                    profile=prof,
                    base_url="http://127.0.0.1:9",
                    api_key="k",
                )
                for i in range(n)
            ]
        )
        wall = time.monotonic() - t0
    bad = [r for r in rs if r.reward != 1.0]
    if bad:
        raise SystemExit(
            f"{len(bad)} executions did not score 1, e.g. {bad[0].model_dump_json()[:800]}"
        )
    return rs, wall


async def executor_run(
    n: int, harness_s: float, root: Path, sandbox: bool, network: str = "proxy-only"
) -> dict:
    task, prof, cfg = synthetic_setup(n, harness_s, root, sandbox, network)
    c0 = cpu()
    rs, wall = await run_synthetic(task, prof, cfg, n)
    launched = [r.timings.launched_s for r in rs]
    own = [json.loads(Path(r.harness.stdout_path).read_text())["real_s"] for r in rs]
    return with_cpu(
        {
            "wall_s": wall,
            "starts_per_s": n / max(launched),
            "overhead_s": [r.timings.total_s - o for r, o in zip(rs, own)],
            "overhead_no_scoring_s": [
                r.timings.total_s - r.timings.scoring_s - o for r, o in zip(rs, own)
            ],
            "setup_s": [r.timings.setup_s for r in rs],
            "teardown_s": [r.timings.teardown_s for r in rs],
            "scoring_s": [r.timings.scoring_s for r in rs],
        },
        c0,
        n,
    )


class _Endpoint:
    """A chat-completions endpoint on a thread that answers every request at once with a fixed
    reply, noting each execution's (bearer key's) first request and last answer."""

    def __init__(self, reply: str) -> None:
        import http.server
        import threading

        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "model": "policy",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": reply},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        ep = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                t = time.monotonic()
                key = self.headers.get("authorization", "").removeprefix("Bearer ")
                ep.first.setdefault(key, t)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                ep.last[key] = time.monotonic()

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


PHASES = [
    ("setup (workspace, key, argv) -> process exists", "setup"),
    ("spawn -> first call (bwrap, confine, interpreter, imports)", "start"),
    ("launch -> first call", "to_first"),
    ("last answer -> harness exited", "exit"),
    ("teardown (group gone, logs, sandbox undone)", "teardown"),
    ("call count + key revoke", "count"),
    ("scoring (copy, verifier, result read)", "scoring"),
    ("last answer -> scored", "after_last"),
    ("outside the model calls (total - calls)", "overhead"),
    ("CPU of the launcher (executor, endpoint, this process)", "cpu_self"),
    ("recorded: Timings.first_call_s (the agent's own clock)", "rec_first"),
    ("recorded: Timings.after_last_call_s", "rec_after"),
]


async def phases_run(n: int, root: Path, sandbox: bool) -> dict[str, list[float]]:
    """n executions of the arithmetic example's shape, one at a time; each one's phases."""
    from gyre.harness.families import problems
    from gyre.harness.families.write import write_taskset

    write_taskset(problems("arith", 0, "train", 1), root / "tasks")
    task = load_task(next((root / "tasks").glob("train-*")))
    prof = load_profile("reference").model_copy(
        update={
            "args": [
                *("--max-turns", "1", "--max-tokens", "64", "--no-tools", "--system", ""),
                *("--client", "stdlib"),
            ]
        }
    )
    cfg = ExecutorConfig(
        workspace_root=root / "runs",
        max_concurrency=1,
        sandbox=SandboxConfig(enabled=sandbox),
        keep_workspaces=False,
    )
    ep = _Endpoint("Answer: 7")
    out: dict[str, list[float]] = {k: [] for _, k in PHASES}
    try:
        async with HarnessExecutor(cfg) as ex:
            for i in range(n):
                key = f"key{i}"
                c0 = cpu()
                t_submit = time.monotonic()
                r = await ex.run(
                    ExecutionSpec(
                        execution_id=f"e{i}", task=task, profile=prof, base_url=ep.url, api_key=key
                    )
                )
                if r.reward is None or key not in ep.last:
                    raise SystemExit(f"execution {i} failed: {r.model_dump_json()[:800]}")
                c1 = cpu()
                t = r.timings
                t_spawn = t_submit + t.launched_s
                t_stop = t_submit + t.queued_s + t.setup_s + t.harness_s
                t_done = t_submit + t.total_s
                first, last = ep.first[key], ep.last[key]
                vals = {
                    "setup": t.launched_s - t.queued_s,
                    "start": first - t_spawn,
                    "to_first": first - t_submit - t.queued_s,
                    "exit": t_stop - last,
                    "teardown": t.teardown_s,
                    "count": (t_done - t.scoring_s) - (t_stop + t.teardown_s),
                    "scoring": t.scoring_s,
                    "after_last": t_done - last,
                    "overhead": t.total_s - t.queued_s - (last - first),
                    "cpu_self": c1[0] - c0[0],
                }
                # what result.json records (None before those fields existed)
                for k, f in (("rec_first", "first_call_s"), ("rec_after", "after_last_call_s")):
                    if getattr(t, f, None) is not None:
                        vals[k] = getattr(t, f)
                for k, v in vals.items():
                    out[k].append(v)
    finally:
        ep.close()
    return out


def print_phases(n: int, res: dict[str, list[float]], sandbox: bool) -> None:
    print(
        f"\n{n} executions one at a time, arithmetic example's shape (reference agent, stdlib "
        f"client, 1 turn; arith verifier), sandbox {'on' if sandbox else 'off'}; a scripted "
        "endpoint answering at once\n"
    )
    print("| phase | median (ms) | p90 (ms) |")
    print("|---|---|---|")
    for name, k in PHASES:
        xs = sorted(res[k])
        if not xs:
            print(f"| {name} | - | - |")
            continue
        print(f"| {name} | {1000 * med(xs):.0f} | {1000 * xs[int(0.9 * (len(xs) - 1))]:.0f} |")


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def merge(runs: list[dict]) -> dict:
    """Rounds of one row pooled: per-execution lists joined, rates and CPU averaged."""
    out: dict = {}
    for k in runs[0]:
        vs = [r[k] for r in runs]
        out[k] = sum(vs, []) if isinstance(vs[0], list) else statistics.mean(vs)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="concurrent executions per round")
    ap.add_argument("--harness-s", type=float, default=3.0)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds, each running every row once in turn (rows interleaved, so a drift in the "
        "machine's load hits all rows alike); `--n 1 --rounds 15` measures one execution at a "
        "time, without contention among the children",
    )
    ap.add_argument("--no-sandbox", action="store_true")
    ap.add_argument(
        "--keep", action="store_true", help="keep the execution folders (default: removed)"
    )
    ap.add_argument(
        "--phases",
        type=int,
        default=0,
        metavar="N",
        help="instead: N executions of the arithmetic example's shape, one at a time, and the "
        "median/p90 of each phase outside the model call",
    )
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gyre-bench-exec-"))
    if a.phases:
        sb = not a.no_sandbox and bool(bwrap_available())
        try:
            res = await phases_run(a.phases, root, sb)
        finally:
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
        print_phases(a.phases, res, sb)
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "bench_executor_phases.json").write_text(
            json.dumps({k: {"median": med(v), "values": v} for k, v in res.items() if v}, indent=1)
        )
        return
    names = ["bare subprocess (baseline: a floor, no workspace/scoring)", "executor"]
    sandboxed = not a.no_sandbox and bwrap_available()
    if sandboxed:
        names += ["executor + bwrap (shared net)", "executor + bwrap (proxy-only net)"]
    per: dict[str, list[dict]] = {n: [] for n in names}
    for k in range(a.rounds):
        per[names[0]].append(await baseline(a.n, a.harness_s, root / f"b{k}"))
        per[names[1]].append(await executor_run(a.n, a.harness_s, root / f"p{k}", sandbox=False))
        if sandboxed:
            per[names[2]].append(
                await executor_run(a.n, a.harness_s, root / f"s{k}", sandbox=True, network="shared")
            )
            per[names[3]].append(
                await executor_run(
                    a.n, a.harness_s, root / f"o{k}", sandbox=True, network="proxy-only"
                )
            )
    rows = [(n, merge(per[n])) for n in names]
    b_over = med(rows[0][1]["overhead_s"])
    print(
        f"\n{a.n} concurrent synthetic harnesses x {a.rounds} rounds, each harness running "
        f"{a.harness_s:.1f}s (medians over every execution; a shared 2-core machine is noisy)\n"
    )
    print(
        "Baseline: the same harness command started with asyncio.create_subprocess_exec, no "
        "workspace, key, sandbox or scoring -- a floor any executor pays, not a peer.\n"
    )
    print(
        "| run | starts/s | launcher CPU/exec (ms) | children CPU/exec (ms) | wall overhead/exec median (s) | p95 (s) | excl. scoring median (s) | scoring median (s) | wall/round (s) | wall overhead vs floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        nos = r.get("overhead_no_scoring_s")
        sc = r.get("scoring_s")
        print(
            f"| {name} | {r['starts_per_s']:.1f} | {r['cpu_self_ms']:.1f} | {r['cpu_children_ms']:.0f} | {med(r['overhead_s']):.3f} | {p95(r['overhead_s']):.3f} | "
            f"{med(nos) if nos else float('nan'):.3f} | {med(sc) if sc else float('nan'):.3f} | {r['wall_s']:.1f} | "
            f"{med(r['overhead_s']) / b_over:.2f}x |"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    (out / "bench_executor.json").write_text(
        json.dumps(
            {
                name: {
                    k: (v if not isinstance(v, list) else {"median": med(v), "p95": p95(v)})
                    for k, v in r.items()
                }
                for name, r in rows
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
