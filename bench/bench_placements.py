"""Real runs of the three placements on one config, side by side (`gyre run`, not the simulator).

    python bench/bench_placements.py [--config examples/quickstart.toml] [--steps 24] [--seed 0]

Each placement runs with the (phi, mu) pair that holds the mean scheduling staleness
E[d] = phi + (mu - 1)/2 at 1.5 (colocate (0, 4), async (1.5, 1), elastic (0.5, 3)) and the
same steps, seed, cells and groups. The baseline is Colocate (veRL's layout): the table
gives each makespan as a ratio to it. Staleness is measured from the versions of the
trained groups; interruptions from the proxy's and executor's own records.
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
    ap.add_argument("--out", default=None, help="run directories go here (default: a temp dir)")
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="extra overrides for every run"
    )
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="gyre-placements-"))
    rows = []
    for name, (phi, mu) in PAIRS.items():
        sets = [
            f"policy.placement={name}",
            f"policy.phi={phi}",
            f"policy.mu={mu}",
            f"policy.total_steps={a.steps}",
            f"seed={a.seed}",
            f"run.out_dir={out}",
            f"run.name={name}",
            "run.eval_interval=0",
            *a.sets,
        ]
        cmd = [sys.executable, "-m", "gyre.cli", "run", a.config, "--quiet"]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.monotonic()
        print(f"[bench] {name}: {' '.join(sets[:3])} ...", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall = time.monotonic() - t0
        if p.returncode != 0:
            print(f"[bench] {name} failed (exit {p.returncode})", file=sys.stderr)
            return 1
        s = json.loads((out / name / "summary.json").read_text())
        m = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
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
            }
        )
    base = next(r for r in rows if r["placement"] == "colocate")["makespan_s"]
    print(
        f"\nReal runs, {a.config}, {a.steps} steps, seed {a.seed}, load {os.getloadavg()[0]:.1f} "
        "(baseline: colocate)"
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
    print(f"\nrun directories: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
