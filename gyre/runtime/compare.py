"""Measured against predicted: one run's ``workload.json`` beside the simulator's replay of it.

For each placement, ``gyre.sim.replay.predict(workload, placement)`` replays exactly the
durations and measured costs of the run; this module turns the pair into a table row and
one PNG with the two Gantt charts side by side (measured left, predicted right, same axis).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.runtime import measure
from gyre.runtime.workload import read_calls
from gyre.sim.replay import predict

ROLE_COLORS = {
    "rollout": "#4C78A8",
    "training": "#F2B701",
    "switching": "#9D9D9D",
    "to_training": "#9D9D9D",
    "to_rollout": "#9D9D9D",
    "lost": "#D62728",
    "busy": "#E45756",
}


@dataclass
class Panel:
    """One Gantt chart: per cell (start, end, role) and compute intervals, steps, publications."""

    title: str
    makespan: float
    segments: list[list[tuple[float, float, str]]]
    busy: list[list[tuple[float, float]]]
    steps: list[tuple[float, float]]
    publications: list[float]


def load(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "workload.json").read_text())


def _panel(title: str, makespan: float, K: int, d: dict[str, Any]) -> Panel:
    """From the shared shape: segments ``[[cell, role, t0, t1], ...]``, busy per cell or
    ``[[cell, t0, t1], ...]``, steps ``[[t0, t1], ...]``, publications (seconds)."""
    segs: list[list[tuple[float, float, str]]] = [[] for _ in range(K)]
    for c, role, s, e in d["segments"]:
        segs[c].append((s, e, role))
    busy: list[list[tuple[float, float]]] = [[] for _ in range(K)]
    raw = d.get("busy", [])
    if len(raw) == K and all(
        isinstance(x, list) and (not x or isinstance(x[0], list)) for x in raw
    ):
        for c, ivs in enumerate(raw):
            busy[c] = [(s, e) for s, e in ivs]
    else:
        for c, s, e in raw:
            busy[c].append((s, e))
    return Panel(
        title=title,
        makespan=makespan,
        segments=segs,
        busy=busy,
        steps=[(float(s), float(e)) for s, e in d.get("steps", [])],
        publications=list(d.get("publications", [])),
    )


def measured_panel(w: dict[str, Any]) -> Panel:
    m = w["measured"]
    span = float(m["makespan_s"])
    return _panel(f"measured: makespan {span:.1f} s", span, int(w["policy"]["cells"]), m)


def predicted_panel(pred: dict[str, Any], K: int) -> Panel:
    """``gyre.sim.replay.predict``'s result (seconds, the measured file's shapes)."""
    span = float(pred["makespan_s"])
    return _panel(f"predicted (gyre sim --workload): makespan {span:.1f} s", span, K, pred)


def staleness(run_dir: str | Path, w: dict[str, Any]) -> dict[str, float | None]:
    """Steady-state staleness three ways, recomputed from the run directory itself.

    ``dispatch``: the policy's measure (trained version - dispatch version, mean over groups,
    metrics.jsonl); ``executions``: by the version that served each token, mean over the
    trained executions; ``tokens``: pooled over every trained token (long executions weigh
    more). Pooled as ``gyre.sim.replay`` pools its prediction.
    """
    rd = Path(run_dir)
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    by_exec: dict[tuple[int, int], list[measure.Call]] = {}
    for c in read_calls(rd / "traces", 0.0):  # the clock does not matter here
        by_exec.setdefault((c.gid, c.attempt), []).append(c)
    pol = w["policy"]
    k = measure.steady_from(pol["phi"], pol["mu"])
    pooled: list[tuple[int, list[measure.Call]]] = []  # (trained version, calls) per execution
    dis = []
    for r in rows[k:]:
        v = r["version"] - 1  # the version the step's gradients were taken at
        for g in r["groups"]:
            pooled += [(v, by_exec.get((int(g[1:]), a), [])) for a in range(pol["group_size"])]
        dis.append(r["batch/staleness_mean"])
    per = [measure.token_staleness(v, cs) for v, cs in pooled]
    toks = [(v - ver, k) for v, cs in pooled for c in cs for ver, k in c.versions]
    n = sum(k for _, k in toks)
    return {
        "tokens": sum(d * k for d, k in toks) / n if n else None,
        "executions": measure.mean(x for x in per if x is not None),
        "dispatch": measure.mean(dis),
    }


def plot_pair(panels: list[Panel], path: str | Path, title: str) -> Path:
    """One PNG, the panels side by side on one time axis (core on top, steps underneath)."""
    import matplotlib  # heavy: loaded only when a PNG is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    K = len(panels[0].segments)
    horizon = max(p.makespan for p in panels) * 1.02
    fig, axes = plt.subplots(
        1, len(panels), figsize=(7 * len(panels), 1.4 + 0.45 * (K + 2)), sharey=True, squeeze=False
    )
    for ax, p in zip(axes[0], panels):
        for cell in range(K):
            y = K - cell
            for s, e, role in p.segments[cell]:
                ax.broken_barh(
                    [(s, e - s)], (y - 0.4, 0.8), facecolors=ROLE_COLORS[role], linewidth=0
                )
            xs = [(s, e - s) for s, e in p.busy[cell]]
            if xs:
                ax.broken_barh(xs, (y - 0.25, 0.5), facecolors=ROLE_COLORS["busy"], linewidth=0)
        for i, (s, e) in enumerate(p.steps):
            ax.broken_barh(
                [(s, max(e - s, horizon * 0.002))],
                (-0.4, 0.8),
                facecolors="#54A24B" if i % 2 == 0 else "#88D27A",
                linewidth=0,
            )
        for t in p.publications:
            ax.plot([t], [-0.9], marker="v", color="k", ms=3)
        ax.axvline(p.makespan, color="k", lw=0.8, ls="--")
        ax.set_title(p.title, fontsize=9, loc="left")
        ax.set_xlim(0, horizon)
        ax.set_xlabel("seconds")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(range(0, K + 1))
    axes[0, 0].set_yticklabels(
        ["steps"] + [("cell 0 (core)" if c == 0 else f"cell {c}") for c in range(K - 1, -1, -1)]
    )
    handles = [
        Patch(color=ROLE_COLORS["rollout"], label="rollout"),
        Patch(color=ROLE_COLORS["training"], label="training (waiting)"),
        Patch(color=ROLE_COLORS["busy"], label="training (computing)"),
        Patch(color=ROLE_COLORS["switching"], label="switching"),
        Patch(color="#54A24B", label="optimizer step"),
    ]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare_run(run_dir: str | Path, png: str | Path) -> dict[str, Any]:
    """The table row of one run (measured, and predicted by the simulator's replay) and its PNG."""
    w = load(run_dir)
    m = w["measured"]
    panels = [measured_panel(w)]
    pred = predict(w, w["placement"])
    panels.append(predicted_panel(pred, int(w["policy"]["cells"])))
    predicted = panels[-1].makespan
    plot_pair(panels, png, f"{w['placement']}, seed {w['seed']}: measured vs predicted")
    st = staleness(run_dir, w)
    return {
        "placement": w["placement"],
        "seed": w["seed"],
        "phi": w["policy"]["phi"],
        "mu": w["policy"]["mu"],
        "measured_s": m["makespan_s"],
        "predicted_s": predicted,
        "gap": m["makespan_s"] / predicted - 1.0,
        "staleness_expected": w["policy"]["phi"] + (w["policy"]["mu"] - 1) / 2,
        "staleness_tokens": st["tokens"],
        "staleness_executions": st["executions"],
        "staleness_dispatch": st["dispatch"],
        "staleness_predicted": pred.get("staleness_mean"),
        "staleness_predicted_executions": pred.get("staleness_serving_per_execution"),
        "interrupted": m["interrupted"],
        "moved_calls": m.get("moved_calls"),
        "png": str(png),
    }
