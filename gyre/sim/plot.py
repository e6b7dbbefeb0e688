"""Gantt chart of each cell's role over time, with step bars, one panel per placement."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class GanttPanel(Protocol):
    """What one panel reads: a simulated run (``SimResult``) or a real one
    (``gyre.runtime.report.Timeline``)."""

    @property
    def makespan_h(self) -> float: ...
    @property
    def training_share(self) -> list[float]: ...
    @property
    def lower_bound_h(self) -> float: ...
    @property
    def efficiency(self) -> float: ...
    @property
    def mean_staleness(self) -> float: ...
    @property
    def interrupted_executions(self) -> int: ...
    @property
    def timeline(self) -> dict[str, Any]: ...


COLORS = {
    "rollout": "#4C78A8",
    "training": "#F2B701",
    "busy": "#E45756",
    "to_training": "#9D9D9D",
    "to_rollout": "#9D9D9D",
    "lost": "#D62728",
}


def plot_gantt(
    results: Mapping[str, GanttPanel], path: str | Path, title: str = "", unit: str = "h"
) -> Path:
    """Write a PNG: per placement, one row per cell (role colours, compute in red) and a step row.

    ``unit`` labels the time axis: the simulator draws hours, ``gyre run`` seconds of a real run
    (its panels carry no lower bound, so that part of the title is left out).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = list(results)
    K = len(next(iter(results.values())).training_share)
    horizon = max(r.makespan_h for r in results.values())
    fig_h = 1.2 + len(names) * (0.32 * (K + 2) + 0.6)
    fig, axes = plt.subplots(len(names), 1, figsize=(12, fig_h), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        r = results[name]
        tl = r.timeline
        if not tl:
            raise ValueError("results were simulated without record=True; nothing to plot")
        for cell, segs in enumerate(tl["segments"]):
            y = K - cell  # core on top
            bars: dict[str, list[tuple[float, float]]] = {}
            for s, e, role in segs:
                bars.setdefault(role, []).append((s, e - s))
            for role, xs in bars.items():
                ax.broken_barh(xs, (y - 0.4, 0.8), facecolors=COLORS[role], linewidth=0)
            busy = [(s, e - s) for s, e in tl["busy"][cell]]
            if busy:
                ax.broken_barh(busy, (y - 0.25, 0.5), facecolors=COLORS["busy"], linewidth=0)
        # step bars
        for i, (s, e) in enumerate(tl["steps"]):
            ax.broken_barh(
                [(s, max(e - s, horizon * 0.002))],
                (-0.4, 0.8),
                facecolors="#54A24B" if i % 2 == 0 else "#88D27A",
                linewidth=0,
            )
        for _, e in tl["steps"]:
            ax.axvline(e, color="#54A24B", lw=0.4, alpha=0.5)
        for t in tl["publications"]:
            ax.plot([t], [-0.9], marker="v", color="k", ms=3)
        labels = ["steps"] + [("core" if c == 0 else f"cell {c}") for c in range(K - 1, -1, -1)][
            ::-1
        ][::-1]
        ax.set_yticks(range(0, K + 1))
        ax.set_yticklabels(
            ["steps"] + [("cell 0 (core)" if c == 0 else f"cell {c}") for c in range(K - 1, -1, -1)]
        )
        del labels
        ax.set_ylim(-1.3, K + 0.7)
        bound = (
            f"bound {r.lower_bound_h:.1f} {unit}, efficiency {r.efficiency:.0%}, "
            if r.lower_bound_h > 0
            else ""
        )
        ax.set_title(
            f"{name}: makespan {r.makespan_h:.1f} {unit}  ({bound}mean staleness {r.mean_staleness:.2f}, "
            f"interrupted {r.interrupted_executions})",
            fontsize=9,
            loc="left",
        )
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel({"h": "hours", "s": "seconds"}.get(unit, unit))
    axes[-1, 0].set_xlim(0, horizon * 1.01)
    handles = [
        Patch(color=COLORS["rollout"], label="rollout"),
        Patch(color=COLORS["training"], label="training (waiting)"),
        Patch(color=COLORS["busy"], label="training (computing)"),
        Patch(color=COLORS["to_training"], label="switching"),
        Patch(color="#54A24B", label="optimizer step span"),
    ]
    fig.legend(handles=handles, loc="upper right", ncol=5, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
