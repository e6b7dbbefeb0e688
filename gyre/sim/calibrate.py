"""Fit workload parameters to the statistics the paper reports (and nothing else).

Used to derive the numbers frozen into :mod:`gyre.sim.presets`; rerun with
``python -m gyre.sim.calibrate`` to check them. Durations are fitted with a small
Nelder-Mead on common random numbers; the training cost is fitted by bisection
on the simulator so Elastic's mean training share matches the paper's 23.0 %.
Neither fit looks at makespans or speedups.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gyre.sim.config import SimConfig
from gyre.sim.workload import draw_workload, workload_stats


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.2, iters: int = 400
) -> np.ndarray:
    """Minimal Nelder-Mead (no scipy dependency)."""
    n = len(x0)
    pts = [np.array(x0, float)] + [np.array(x0, float) + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def fit_durations(
    cfg: SimConfig,
    targets: dict[str, float],
    free: list[str],
    groups: int = 20000,
    seed: int = 12345,
) -> dict[str, float]:
    """Fit ``free`` workload fields (log-parametrised) so ``workload_stats`` hits ``targets``."""
    base = cfg.workload

    def stats_for(x: np.ndarray) -> dict[str, float]:
        upd = {k: float(np.exp(v)) for k, v in zip(free, x)}
        w = base.model_copy(update=upd)
        return workload_stats(draw_workload(w, groups, cfg.policy.group_size, seed))

    def loss(x: np.ndarray) -> float:
        s = stats_for(x)
        return sum(((s[k] - t) / max(t, 1e-3)) ** 2 for k, t in targets.items())

    x0 = np.log([getattr(base, k) or 1.0 for k in free])
    best = nelder_mead(loss, x0)
    return {k: float(np.exp(v)) for k, v in zip(free, best)}


def fit_train_cost(
    cfg: SimConfig, target_share: float = 0.23, seeds: int = 3, lo: float = 0.01, hi: float = 200.0
) -> float:
    """Bisect ``costs.train_step_cell_h`` so Elastic's mean training share hits ``target_share``."""
    from gyre.sim.run import simulate

    def share(tc: float) -> float:
        vals = []
        for s in range(seeds):
            c = cfg.model_copy(
                update={"seed": s, "costs": cfg.costs.model_copy(update={"train_step_cell_h": tc})}
            )
            vals.append(simulate(c, ["elastic"], record=False)["elastic"].mean_training_share)
        return float(np.mean(vals))

    for _ in range(30):
        mid = (lo * hi) ** 0.5
        if share(mid) < target_share:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return (lo * hi) ** 0.5


if __name__ == "__main__":  # pragma: no cover - a maintenance script
    from gyre.sim.presets import FLAGSHIP_TARGETS, NL2REPO_TARGETS, preset

    for name, targets, free in (
        ("nl2repo-122b", NL2REPO_TARGETS, ["median_h", "tail", "query_sigma"]),
        (
            "flagship-2.4t",
            FLAGSHIP_TARGETS,
            ["median_h", "tail", "query_sigma", "overall_timeout_h"],
        ),
    ):
        cfg = preset(name)
        fit = fit_durations(cfg, targets, free)
        print(name, "durations:", {k: round(v, 4) for k, v in fit.items()})
        cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update=fit)})
        print(
            name,
            "stats:",
            {
                k: round(v, 4)
                for k, v in workload_stats(
                    draw_workload(cfg.workload, 20000, cfg.policy.group_size, 1)
                ).items()
            },
        )
        print(name, "train_step_cell_h:", round(fit_train_cost(cfg), 3))
