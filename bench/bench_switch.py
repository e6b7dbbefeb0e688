"""Switch times of a cell with one rank (G=1, the baseline) and with G ranks (FSDP2 inside the
cell, ``run.cell.devices``), measured in the same run of this script on the same machine.

    python bench/bench_switch.py                 # G=1 then G=2, 10 steps each: ~8 min on 2 busy cores
    python bench/bench_switch.py --steps 6 --devices 2 4

Each G is one real ``gyre run`` of examples/quickstart.toml with 2 elastic cells (K=2, no
evaluation), the same seed. Read from the run's own records:

* the cells' ``switch`` records (``logs/cell-<i>.jsonl``: the cell's own part, timed in the cell
  from when it began to leave its role to when it holds the new one). Into training: the engine
  dropped, the sharded replica built and loaded with the core's snapshot (with G > 1 the cell's
  rank 0 reads it and broadcasts it in the cell). Back to rollout: the replica dropped and an
  engine started. The first switch into training of a cell is shown apart (cold: the training
  stack's imports in that process); the core's start is left out.
* the driver's view (``summary.json`` ``switches``), which adds the drain of the cell's engine
  through the proxy and the wait for every rank.

On CPU a cell's G ranks share the machine's cores, so G > 1 buys memory per rank, not speed;
what this shows is the cost of the multi-rank machinery in a switch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(model_dir: Path, out: Path, devices: int, steps: int, seed: int) -> Path:
    name = f"g{devices}"
    sets = [
        f"model_dir={model_dir}",
        f"run.out_dir={out}",
        f"run.name={name}",
        f"policy.total_steps={steps}",
        "policy.cells=2",
        f"seed={seed}",
        "run.eval_interval=0",
        f"run.cell.devices={devices}",
    ]
    argv = [sys.executable, "-m", "gyre.cli", "run", str(REPO / "examples" / "quickstart.toml")]
    argv += ["--log-format", "plain", "--quiet"]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"gyre run with G={devices} failed:\n{(r.stdout + r.stderr)[-3000:]}")
    return out / name


def switches(rd: Path) -> dict[str, list[float]]:
    """Per kind (cold / to_training / to_rollout): the seconds of the satellites' switches."""
    out: dict[str, list[float]] = {"cold": [], "to_training": [], "to_rollout": []}
    for cell in (1,):  # cell 0, the core, trains from the start in elastic placement
        seen = False
        for line in (rd / "logs" / f"cell-{cell}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") != "switch" or rec.get("from") is None:
                continue
            if rec["to"] == "training":
                out["to_training" if seen else "cold"].append(rec["seconds"])
                seen = True
            else:
                out["to_rollout"].append(rec["seconds"])
    return out


def fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} / {max(xs):.2f} (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if 1 not in a.devices:
        a.devices = [1, *a.devices]  # the baseline is measured in the same run
    from gyre.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-switch-") as tmp:
        out = Path(tmp)
        model_dir = Path(build_tiny_model(out / "tiny-model"))
        rows = []
        for g in a.devices:
            rd = run(model_dir, out, g, a.steps, a.seed)
            sw = switches(rd)
            summary = json.loads((rd / "summary.json").read_text())
            drv = summary.get("switches", {})
            metrics = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
            both = sum(1 for m in metrics if m.get("train/participants") == 2)
            rows.append((g, sw, drv, both, len(metrics)))
    print(f"\nswitch times, K=2 elastic cells, tiny model, {a.steps} steps, seconds p50 / max")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = (
        "G",
        "cold -> training",
        "rollout -> training",
        "training -> rollout",
        "driver ->T / ->R mean",
        "2-cell steps",
    )
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for g, sw, drv, both, n in rows:
        t, r = drv.get("training", {}), drv.get("rollout", {})
        driver = f"{t.get('mean_s', float('nan')):.2f} / {r.get('mean_s', float('nan')):.2f}"
        print(
            f"{g}{' (baseline)' if g == 1 else ''} | {fmt(sw['cold'])} | {fmt(sw['to_training'])}"
            f" | {fmt(sw['to_rollout'])} | {driver} | {both}/{n}"
        )


if __name__ == "__main__":
    main()
