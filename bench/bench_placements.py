"""Real runs of the three placements on one config, side by side (`gyre run`, not the simulator).

    python bench/bench_placements.py [--config examples/quickstart.toml] [--steps 24] [--seeds 0 1 2]
    python bench/bench_placements.py --config examples/longtail.toml --steps 24 --seeds 0 1 2


Each placement runs with the (phi, mu) pair that holds the mean scheduling staleness
E[d] = phi + (mu - 1)/2 at 1.5 (colocate (0, 4), async (1.5, 1), elastic (0.5, 3)) and the
same steps, seed, cells and groups. The baseline is Colocate (veRL's layout): the table
gives each makespan as a ratio to it. Staleness is measured from the versions of the
trained groups; interruptions from the proxy's and executor's own records.

A run directory that already holds a finished run (``summary.json``) is reused, so an
interrupted bench continues where it stopped. Every run writes ``workload.json``; with a long-tail config (``[run.longtail]``: the same
seeded duration draw for every placement) the second table sets each measured makespan
beside the simulator's replay of the same durations and measured costs
(``gyre.sim.replay.predict``), and ``<placement>-s<seed>.png`` draws the two Gantt charts
side by side (``gyre.runtime.compare``). ``compare.json`` holds every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAIRS = {"colocate": (0.0, 4), "async": (1.5, 1), "elastic": (0.5, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/quickstart.toml")
    ap.add_argument(
        "--steps", type=int, default=24, help="a multiple of 12 keeps every burst whole"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="several seeds (overrides --seed)"
    )
    ap.add_argument(
        "--placements",
        nargs="+",
        default=list(PAIRS),
        choices=list(PAIRS),
        help="default: all three",
    )
    ap.add_argument("--out", default=None, help="run directories go here (default: a temp dir)")
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="extra overrides for every run"
    )
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="gyre-placements-"))
    out.mkdir(parents=True, exist_ok=True)
    seeds = a.seeds if a.seeds is not None else [a.seed]
    all_rows, compared = [], []
    for seed in seeds:
        rows = run_seed(a, out, seed, compared)
        if rows is None:
            return 1
        all_rows += rows
        (out / "compare.json").write_text(  # after every seed: a later failure keeps these
            json.dumps({"runs": all_rows, "compared": compared}, indent=1)
        )
    print_compared(compared, a, seeds)
    print(f"\nrun directories: {out}")
    return 0


def run_seed(a, out: Path, seed: int, compared: list) -> list | None:
    """The placements on one seed (one draw); the first table; measured vs predicted rows."""
    from gyre.runtime.compare import compare_run

    rows = []
    for name in a.placements:
        phi, mu = PAIRS[name]
        run_name = f"{name}-s{seed}"
        sets = [
            f"policy.placement={name}",
            f"policy.phi={phi}",
            f"policy.mu={mu}",
            f"policy.total_steps={a.steps}",
            f"seed={seed}",
            f"run.out_dir={out}",
            f"run.name={run_name}",
            "run.eval_interval=0",
            *a.sets,
        ]
        cmd = [sys.executable, "-m", "gyre.cli", "run", a.config, "--quiet"]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.monotonic()
        done = (out / run_name / "summary.json").is_file()
        print(
            f"[bench] {run_name}: {' '.join(sets[:3])} {'(reusing the finished run)' if done else '...'}",
            file=sys.stderr,
            flush=True,
        )
        for _ in range(
            0 if done else 2
        ):  # once more if Ray missed its start-up on a loaded machine
            p = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            if p.returncode == 0 or (out / run_name / "metrics.jsonl").exists():
                break
        wall = time.monotonic() - t0
        if not (out / run_name / "summary.json").is_file():
            print(f"[bench] {run_name} failed (exit {p.returncode})", file=sys.stderr)
            return None
        s = json.loads((out / run_name / "summary.json").read_text())
        m = [json.loads(x) for x in (out / run_name / "metrics.jsonl").read_text().splitlines()]
        steady = [r["batch/staleness_mean"] for r in m[mu:]] or [
            r["batch/staleness_mean"] for r in m
        ]
        rows.append(
            {
                "placement": name,
                "phi": phi,
                "mu": mu,
                "makespan_s": s["makespan_s"],
                "wall_s": wall,
                "steps": s["steps"],
                "staleness": sum(steady) / len(steady),
                "interrupted": s["interrupted_executions"],
                "moved": s["proxy"]["moved_calls"],
                "partial": s["proxy"]["resumed_with_partial_output"],
                "switches": s["switches"]["training"]["count"] + s["switches"]["rollout"]["count"],
                "r_first": s["reward_first_quarter"],
                "r_last": s["reward_last_quarter"],
                "load": os.getloadavg()[0],
            }
        )
        compared.append(
            {**compare_run(out / run_name, out / f"{run_name}.png"), "load": rows[-1]["load"]}
        )
    base = next((r for r in rows if r["placement"] == "colocate"), rows[0])["makespan_s"]
    print(
        f"\nReal runs, {a.config}, {a.steps} steps, seed {seed}, load {os.getloadavg()[0]:.1f} "
        f"(baseline: {'colocate' if 'colocate' in a.placements else rows[0]['placement']})"
    )
    print(
        "| placement | (phi, mu) | makespan s | vs colocate | staleness (after 1st burst) | interrupted | "
        "moved calls (partial) | switches | reward 1st -> last quarter |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['placement']} | ({r['phi']}, {r['mu']}) | {r['makespan_s']:.0f} | {base / r['makespan_s']:.2f}x "
            f"| {r['staleness']:.2f} | {r['interrupted']} | {r['moved']} ({r['partial']}) | {r['switches']} | "
            f"{r['r_first']:.3f} -> {r['r_last']:.3f} |"
        )
    return rows


def print_compared(compared: list, a, seeds: list[int]) -> None:
    """Measured vs predicted makespan per seed and placement, and the realised staleness."""
    print(
        f"\nMeasured vs predicted (gyre.sim.replay on the same durations), {a.config}, "
        f"{a.steps} steps, seeds {seeds}"
    )
    print(
        "| seed | placement | (phi, mu) | measured s | predicted s | gap | staleness: expected, "
        "dispatch, served (per execution / per token), predicted served | interrupted "
        "| moved calls | load (1 min) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    for r in compared:
        pred = "-" if r["predicted_s"] is None else f"{r['predicted_s']:.1f}"
        gap = "-" if r["gap"] is None else f"{r['gap']:+.1%}"
        st = (
            f"{f(r['staleness_expected'])}, {f(r['staleness_dispatch'])}, "
            f"{f(r['staleness_executions'])} / {f(r['staleness_tokens'])}, "
            f"{f(r['staleness_predicted'])}"
        )
        print(
            f"| {r['seed']} | {r['placement']} | ({r['phi']}, {r['mu']}) | {r['measured_s']:.1f} "
            f"| {pred} | {gap} | {st} | {r['interrupted']} | {r['moved_calls']} | {r['load']:.1f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
