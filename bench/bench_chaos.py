"""Chaos benchmark: small real `gyre run`s under the nemesis, against the same seed without it.

For each seed: one run without faults (the baseline, measured in the same session) and one
with ``[run.chaos]`` killing every kind (rollout cell, satellite, standalone engine, proxy,
harness; a hung cell and a hung engine by SIGSTOP). From the runs' own files
(:func:`gyre.runtime.chaos_audit.audit`) it prints kills by kind, how many were survived,
executions relaunched, finished executions lost (goal 0), groups trained twice (goal 0),
detection times of the hung cell and engine, and the extra makespan per fault against the
simulator's prediction: the baseline's realised workload replayed without and with the
chaos run's cell and standalone-engine faults (:func:`gyre.sim.faults.replay_fault_cost`: one
draw, every execution its own measured duration, so the pair differs by the faults alone).
The proxy (back in well under a second) and harness kills are not in its prediction.

    python bench/bench_chaos.py --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gyre.runtime.chaos_audit import audit  # noqa: E402
from gyre.sim.faults import Fault, replay_fault_cost  # noqa: E402

N = 4
# a cell's ping bound: 2 s finds a hang fast, but at load 50 on 2 cores a busy core missed it
# (a fault no nemesis caused, ending a baseline run): $GYRE_CHAOS_HEARTBEAT_S raises it
HEARTBEAT_S = float(os.environ.get("GYRE_CHAOS_HEARTBEAT_S", "2.0"))
KINDS = [
    "rollout_cell",
    "satellite",
    "core",
    "engine",
    "proxy",
    "harness",
    "cell_hang",
    "engine_hang",
]

CONFIG = ROOT / "examples" / "chaos.toml"


def _run(
    out: Path, model: Path, seed: int, steps: int, kills: int, window: float
) -> tuple[Path, float]:
    """The run's directory and its wall time: a core restart starts a new segment, whose
    ``makespan_s`` is that segment's alone, so the extra time is taken from outside."""
    name = f"s{seed}-{'chaos' if kills else 'base'}"
    sets = [f"model_dir={model}", f"seed={seed}", f"policy.total_steps={steps}"]
    sets += [f"run.out_dir={out}", f"run.name={name}", f"run.fault.heartbeat_s={HEARTBEAT_S}"]
    sets += [f"run.chaos.seed={seed}", f"run.chaos.kills={kills}"]
    sets += [f"run.chaos.kinds={json.dumps(KINDS)}", f"run.chaos.window_s=[2.0, {window}]"]
    argv = [sys.executable, "-m", "gyre.cli", "run", str(CONFIG)]
    for x in sets:
        argv += ["--set", x]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        print(f"{name}: gyre run exited {rc} (see {out / name}.log)")
    return out / name, wall


def _cell_faults(a: dict) -> list[Fault]:
    """The chaos run's cell and standalone-engine faults as the simulator's schedule (seconds
    -> hours); the proxy, a harness and a segment restart from a checkpoint are not modelled."""
    out = []
    for f in a["faults"]:
        if f.get("core_restart") or f["kind"] not in ("died", "hung", "engine"):
            continue
        back = f.get("back")
        restart = None if back is None else (back - f["time"]) / 3600.0
        if f["kind"] == "engine":
            out.append(Fault(-1, f["time"] / 3600.0, restart, int(f["capacity"])))
        else:
            out.append(Fault(int(f["cell"]), f["time"] / 3600.0, restart))
    return out


def _seed(out: Path, model: Path, seed: int, steps: int, kills: int, window: float) -> dict:
    base, base_wall = _run(out, model, seed, steps, 0, window)
    hit, hit_wall = _run(out, model, seed, steps, kills, window)
    try:
        b = json.loads((base / "summary.json").read_text())
    except OSError:  # the baseline did not finish (its log says why)
        b = {"makespan_s": float("nan")}
    try:
        a = audit(hit, N)
    except (OSError, ValueError, KeyError):  # the run did not finish: no summary
        a = {"steps": 0, "kills": {}, "handled": 0, "relaunched": 0, "finished_lost": 0}
        a |= {"trained_twice": 0, "interrupted_other": 0, "answered_missing": 0}
        a |= {"cut_by_core_restart": 0}
        a |= {"answered_counter_gap": 0, "makespan_s": float("nan"), "faults": [], "chaos": []}
    faults = _cell_faults(a)
    pred: dict = {"cost_s": 0.0}
    if faults and (base / "workload.json").exists():
        pred = replay_fault_cost(base / "workload.json", faults, spare_reduce=True)
    n = sum(a["kills"].values())
    det = {k["kind"]: k.get("detected_s") for k in a["chaos"] if k["kind"].endswith("_hang")}
    return {
        "seed": seed,
        "audit": a,
        "base_makespan_s": b["makespan_s"],
        "extra_s": hit_wall - base_wall if a["steps"] else float("nan"),
        "kills": n,
        "predicted_s": pred.get("cost_s"),
        "cell_faults": len(faults),
        "hung_cell_s": det.get("cell_hang"),
        "hung_engine_s": det.get("engine_hang"),
    }


def _pending(a: dict) -> str:
    n = a.get("restarting_at_end", 0)
    return f" (+{n} restarting at end)" if n else ""


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _table(rows: list[dict]) -> None:
    print(
        "| seed | kills by kind | survived | relaunched | finished lost | trained twice | "
        "interrupted (other) | cut by core restart | answered missing | hung cell found (s) | "
        "hung engine found (s) | makespan base (s) | extra wall (s) | per fault (s) | "
        "sim, cell + engine faults (s) |"
    )
    print("|" + " --- |" * 15)
    for r in rows:
        a = r["audit"]
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(a["kills"].items()))
        print(
            f"| {r['seed']} | {kinds} | {a['handled']}/{r['kills']}"
            f"{_pending(a)}"
            f"{'' if a['steps'] else ' (run failed)'} | {a['relaunched']} | "
            f"{a['finished_lost']} | {a['trained_twice']} | {a['interrupted_other']} | "
            f"{a['cut_by_core_restart']} | "
            f"{a['answered_missing'] + max(0, a['answered_counter_gap'])} | "
            f"{_f(r['hung_cell_s'], '.2f')} | {_f(r['hung_engine_s'], '.2f')} | "
            f"{_f(r['base_makespan_s'])} | {_f(r['extra_s'])} | "
            f"{_f(r['extra_s'] / max(1, r['kills']))} | "
            f"{_f(r['predicted_s'])} ({r['cell_faults']}) |"
        )
    extra = [r["extra_s"] for r in rows]
    pred = [r["predicted_s"] for r in rows if r["predicted_s"] is not None]
    print(
        f"\nmean extra makespan {statistics.fmean(extra):.1f} s measured, "
        f"{statistics.fmean(pred) if pred else float('nan'):.1f} s predicted for the cell and engine faults"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kills", type=int, default=len(KINDS))
    ap.add_argument("--window", type=float, default=30.0, help="kills drawn in [2, WINDOW] s")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-chaos"))
    ap.add_argument("--model", type=Path, default=None, help="default: a tiny model built here")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from gyre.models.tiny import build_tiny_model

        model = out / "tiny-model"
        if not (model / "config.json").exists():
            build_tiny_model(model)
    rows = []
    t0 = time.monotonic()
    for s in range(args.first_seed, args.first_seed + args.seeds):
        rows.append(_seed(out, model.resolve(), s, args.steps, args.kills, args.window))
        print(f"seed {s} done ({time.monotonic() - t0:.0f} s)", flush=True)
        (out / "rows.json").write_text(json.dumps(rows, default=str, indent=1))
    _table(rows)


if __name__ == "__main__":
    main()
