"""Wall time to simulate flagship-2.4t (4 cells x 48 steps x B=32 groups x N=16) for all three
placements on one core; target < 5 s. Baseline measured in the same run: drawing the workload
and computing the lower bound alone (the part that does not depend on the scheduler).

    OMP_NUM_THREADS=1 python bench/bench_sim.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from gyre.sim.presets import preset
from gyre.sim.report import lower_bound
from gyre.sim.run import make_draw, simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="flagship-2.4t")
    args = ap.parse_args()
    cfg = preset(args.preset)
    names = ["colocate", "async", "elastic"]
    base, full, per = [], [], {n: [] for n in names}
    events = {}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        draw = make_draw(cfg)
        lower_bound(cfg, draw)
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = simulate(cfg, names, record=False)
        full.append(time.perf_counter() - t0)
        for n in names:
            per[n].append(res[n].sim_wall_s)
            events[n] = res[n].executions_finished
    b, f = min(base), min(full)
    print(f"{args.preset}: best of {args.repeats}, one process")
    print(
        "baseline: drawing the workload and computing the lower bound -- a floor (the part every "
        "simulator of this workload pays), not a peer; the paper's simulator is not public"
    )
    print(f"{'what':<34}{'seconds':>10}{'x baseline':>12}")
    print(f"{'baseline: draw + lower bound':<34}{b:>10.3f}{1.0:>12.1f}")
    for n in names:
        print(
            f"{'  ' + n + f' ({events[n]} executions)':<34}{min(per[n]):>10.3f}{min(per[n]) / b:>12.1f}"
        )
    print(f"{'all three placements (target < 5 s)':<34}{f:>10.3f}{f / b:>12.1f}")


if __name__ == "__main__":
    main()
