"""Sweeps: many seeds and parameter points, summarised as medians, spreads and ratios."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gyre.sim.config import SimConfig, apply_overrides
from gyre.sim.presets import NL2REPO_TRAIN_CELL_H
from gyre.sim.run import simulate

# The long seed's three observations, as override sets on the seed-toy preset.
# "training cost 0.25 h" is whole-pool hours per step: 0.25 h x 8 cells = 2 cell-hours.
STUDIES: dict[str, dict[str, dict[str, Any]]] = {
    "defaults": {"defaults": {}},
    "observations": {
        "defaults": {},
        "heavy tail 0.75, cheap training 0.25 h": {"tail": 0.75, "train_cost": 2.0},
        "light tail 0.2": {"tail": 0.2},
    },
    # Two of the paper's Table 1 ablations that our model can express (use with --preset nl2repo-122b).
    "table1": {
        "defaults": {},
        # same hardware in half as many cells: each cell serves twice as many executions and
        # trains a step in half the time
        "E2: half as many cells (4 x 288)": {
            "cells": 4,
            "cell_capacity": 288,
            "train_cost": NL2REPO_TRAIN_CELL_H / 2,
        },
        # Colocate ablations C1/C2: a standalone rollout pool carved out of the same 32 nodes
        # (assumed: one cell's worth, 4 nodes = 144 executions; "bigger" = two cells' worth)
        "C1: colocate on 7 cells + standalone pool of 144": {
            "cells": 7,
            "standalone_capacity": 144,
        },
        "C2: C1 + streaming": {
            "cells": 7,
            "standalone_capacity": 144,
            "placements.colocate.streaming": True,
        },
        "C2 with a bigger pool (6 cells + 288)": {
            "cells": 6,
            "standalone_capacity": 288,
            "placements.colocate.streaming": True,
        },
        "Async training pool 8 nodes (2 of 8 cells)": {
            "placements.async.async_train_cells": 2,
            "placements.async-streaming.async_train_cells": 2,
        },
    },
}


@dataclass
class PointSummary:
    label: str
    overrides: dict[str, Any]
    seeds: int
    makespan: dict[str, list[float]]  # per placement, one value per seed
    interrupted: int

    def median(self, name: str) -> float:
        return float(np.median(self.makespan[name]))

    def ratio(self, name: str, ref: str = "elastic") -> list[float]:
        return [a / b for a, b in zip(self.makespan[name], self.makespan[ref])]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "overrides": self.overrides,
            "seeds": self.seeds,
            "interrupted_executions": self.interrupted,
            "placements": {},
        }
        for name, xs in self.makespan.items():
            arr = np.asarray(xs)
            rat = np.asarray(self.ratio(name)) if "elastic" in self.makespan else None
            out["placements"][name] = {
                "makespan_h_median": float(np.median(arr)),
                "makespan_h_p10": float(np.percentile(arr, 10)),
                "makespan_h_p90": float(np.percentile(arr, 90)),
                "ratio_vs_elastic_median": float(np.median(rat)) if rat is not None else None,
                "ratio_of_medians_vs_elastic": float(
                    np.median(arr) / np.median(self.makespan["elastic"])
                )
                if "elastic" in self.makespan
                else None,
                "makespan_h": [float(x) for x in arr],
            }
        return out


def grid_points(grid: list[str]) -> list[dict[str, Any]]:
    """``["tail=0.2,0.5", "train_cost=1,2"]`` -> the cartesian product as override dicts."""
    import json

    axes = []
    for g in grid:
        if "=" not in g:
            raise ValueError(f"--grid expects name=v1,v2,..., got {g!r}")
        k, vs = g.split("=", 1)
        vals = []
        for v in vs.split(","):
            try:
                vals.append(json.loads(v))
            except json.JSONDecodeError:
                vals.append(v)
        axes.append([(k, v) for v in vals])
    return [dict(p) for p in itertools.product(*axes)] if axes else [{}]


def run_sweep(
    base: SimConfig,
    points: dict[str, dict[str, Any]],
    seeds: int,
    placements: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    first_seed: int = 0,
) -> list[PointSummary]:
    """For every point and seed, simulate all placements on one shared draw."""
    out = []
    for label, ov in points.items():
        cfg = apply_overrides(base, ov) if ov else base
        names = placements or list(cfg.placements)
        ms: dict[str, list[float]] = {n: [] for n in names}
        interrupted = 0
        for s in range(first_seed, first_seed + seeds):
            res = simulate(cfg.model_copy(update={"seed": s}), names, record=False)
            for n in names:
                ms[n].append(res[n].makespan_h)
                interrupted += res[n].interrupted_executions
            if progress:
                progress(label)
        out.append(
            PointSummary(
                label=label, overrides=ov, seeds=seeds, makespan=ms, interrupted=interrupted
            )
        )
    return out
