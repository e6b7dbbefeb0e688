"""Trainer throughput on the tiny model: 1 replica vs 2 joined replicas; streaming vs one packed batch.

Every configuration runs in the same two spawned cell processes (gloo on 127.0.0.1, one
torch thread each), on synthetic groups (named as such) of the same shape, so the
ratios compare like with like. Reported: packed tokens per second of wall-clock step
time (publish, claims, forward/backward, reduce, optimizer step included), median over
the steps after the first (warm-up).

    OMP_NUM_THREADS=1 python bench/bench_train.py            # ~1-2 min on 2 cores
    python bench/bench_train.py --steps 3 --groups 2          # quicker

Also reported: tokens per CPU-second summed over the cells that took part, which isolates
the work added by joining (snapshot publish/pull, reduce) or by streaming (less full
micro-steps) from contention with other processes on a shared machine.

Rows:
  one replica            core alone, all groups ready at the start, packed per step
  two joined replicas    a satellite joins every step at its start and claims micro-steps
  one packed batch       core alone, waits for the B groups, packs them in one go
  streaming              core alone, groups land one at a time and are packed as they land
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--rounds", type=int, default=2, help="repeat all configurations, interleaved (noise)"
    )
    ap.add_argument("--groups", type=int, default=8, help="B: groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512, help="token budget per micro-step")
    ap.add_argument(
        "--model-dir", default=None, help="HF causal LM dir (default: build the tiny model)"
    )
    ap.add_argument("--out", default="bench/results/bench_train.json")
    a = ap.parse_args(argv)

    from gyre.train.config import OptimConfig, StreamConfig, TrainerConfig
    from gyre.train.demo.local import JoinPlan, LocalRun, SyntheticData, run_local

    tmp = Path(tempfile.mkdtemp(prefix="gyre-bench-train-"))
    model_dir = a.model_dir
    if model_dir is None:
        from gyre.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tmp / "tiny"))
    cfg = TrainerConfig(
        model_dir=model_dir,
        dtype="float32",
        optim=OptimConfig(lr=1e-5),
        stream=StreamConfig(batch_groups=a.groups, token_budget=a.budget, stall_timeout_s=300),
    )
    data = SyntheticData(
        n_groups=a.groups * a.steps,
        group_size=a.group_size,
        seed=0,
        context_len=(64, 192),
        target_len=(32, 96),
    )

    def make(r):
        return {
            "one replica": LocalRun(name=f"one-r{r}", cfg=cfg, data=data, steps=a.steps),
            "two joined replicas": LocalRun(
                name=f"two-r{r}", cfg=cfg, data=data, steps=a.steps, joins={1: JoinPlan()}
            ),
            "one packed batch": LocalRun(
                name=f"whole-r{r}", cfg=cfg, data=data, steps=a.steps, whole_batch=True
            ),
            "streaming": LocalRun(
                name=f"stream-r{r}", cfg=cfg, data=data, steps=a.steps, source="one_per_pump"
            ),
        }

    rounds = [make(r) for r in range(a.rounds)]
    t0 = time.time()
    order = [
        run
        for i, rd in enumerate(rounds)
        for run in (list(rd.values())[::-1] if i % 2 else rd.values())
    ]
    run_local(
        2, order, tmp / "out", timeout_s=1800
    )  # odd rounds in reverse order: no position bias
    rows = {}
    for label in rounds[0]:
        use = []
        for rd in rounds:
            d = tmp / "out" / rd[label].name
            lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            sat = d / "cell1.json"
            sat_cpu = (
                {x["step"]: x["cpu_s"] for x in json.loads(sat.read_text())} if sat.exists() else {}
            )
            for x in lines:
                x["cpu_all"] = x["timing/step_cpu"] + sat_cpu.get(x["step"], 0.0)
            use += lines[1:] or lines
        rows[label] = {
            "tokens_per_step": statistics.median(x["train/tokens"] for x in use),
            "step_s": statistics.median(x["timing/step"] for x in use),
            "micro_steps": statistics.median(x["train/micro_steps"] for x in use),
            "tokens_per_s": statistics.median(x["train/tokens_per_s"] for x in use),
            "tokens_per_cpu_s": statistics.median(x["train/tokens"] / x["cpu_all"] for x in use),
            "participants": use[0]["train/participants"],
        }
    base = {
        "one replica": "one replica",
        "two joined replicas": "one replica",
        "one packed batch": "one packed batch",
        "streaming": "one packed batch",
    }
    print(
        f"\ntrainer throughput, tiny model ({a.rounds} rounds x {a.steps} steps x {a.groups} groups x "
        f"{a.group_size} executions, budget {a.budget}; median of steps 2..{a.steps} of every round; "
        f"total wall {time.time() - t0:.0f}s)"
    )
    hdr = (
        f"{'configuration':<22}{'cells':>6}{'tokens/step':>13}{'micro-steps':>13}{'step s':>9}{'tokens/s':>10}"
        f"{'ratio':>8}{'tokens/cpu-s':>14}{'ratio':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for label, x in rows.items():
        ratio = x["tokens_per_s"] / rows[base[label]]["tokens_per_s"]
        cratio = x["tokens_per_cpu_s"] / rows[base[label]]["tokens_per_cpu_s"]
        x["ratio_vs_" + base[label].replace(" ", "_")] = ratio
        x["cpu_ratio_vs_" + base[label].replace(" ", "_")] = cratio
        print(
            f"{label:<22}{x['participants']:>6}{x['tokens_per_step']:>13.0f}{x['micro_steps']:>13.0f}"
            f"{x['step_s']:>9.3f}{x['tokens_per_s']:>10.0f}{ratio:>8.2f}{x['tokens_per_cpu_s']:>14.0f}{cratio:>8.2f}"
        )
    print("ratios: 'two joined replicas' vs 'one replica'; 'streaming' vs 'one packed batch'.")
    print(
        "tokens/cpu-s: packed tokens per CPU-second summed over the participating cells (overhead of joining or"
    )
    print(
        "streaming, insensitive to other load on the machine); tokens/s: per wall-clock second of the step."
    )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
