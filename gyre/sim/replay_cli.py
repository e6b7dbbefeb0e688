"""`gyre sim --workload RUN_DIR/workload.json`: measured vs predicted, side by side.

One file predicts its run's placement (``--placement all``: colocate, async and
elastic on that run's draw; only the run's own has a measured column). Several
files (one run per placement on the same draw, as ``gyre run --placement all``
writes them) each predict their own placement, so measured and predicted ratios
to Elastic can be compared too.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.cli_errors import fail
from gyre.sim.replay import COMPARED, WorkloadFileError, load_workload, predict_all


@dataclass
class _Panel:
    """A Gantt panel (``gyre.sim.plot.GanttPanel``) from ``[cell, role, t0_s, t1_s]`` rows."""

    makespan_h: float
    training_share: list[float]
    mean_staleness: float
    interrupted_executions: int
    timeline: dict[str, Any] = field(default_factory=dict)
    lower_bound_h: float = 0.0
    efficiency: float = math.nan


def _panel(
    rows: list[list[Any]], cells: int, makespan: float, stale: float, inter: int, extra: dict
) -> _Panel:
    segs: list[list[tuple[float, float, str]]] = [[] for _ in range(cells)]
    train = [0.0] * cells
    for cell, role, t0, t1 in rows:
        if not 0 <= int(cell) < cells:
            continue
        r = "to_training" if role == "switching" else str(role)
        if r not in ("rollout", "training", "to_training", "to_rollout"):
            continue
        segs[int(cell)].append((float(t0), float(t1), r))
        if r == "training":
            train[int(cell)] += float(t1) - float(t0)
    tl = {
        "segments": segs,
        "busy": extra.get("busy") or [[] for _ in range(cells)],
        "steps": extra.get("steps") or [],
        "publications": extra.get("publications") or [],
    }
    share = [t / makespan if makespan > 0 else 0.0 for t in train]
    return _Panel(makespan, share, stale, inter, tl)


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{(a / b - 1) * 100:+.1f} %"


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def replay_command(
    paths: list[Path], placement: str | None, *, as_json: bool, out: Path | None, plot: Path | None
) -> None:
    """Predict every run in ``paths``, print (or write) measured vs predicted."""
    if out is not None and not out.parent.is_dir():
        fail("sim", f"--out {out}: cannot write it (no directory {out.parent})")
    if plot is not None and not plot.parent.is_dir():
        fail("sim", f"--plot {plot}: cannot write it (no directory {plot.parent})")
    if len(paths) > 1 and placement is not None:
        fail(
            "sim",
            "with several --workload files each run predicts its own placement; drop --placement",
        )
    if placement not in (None, "all", *COMPARED):
        fail("sim", f"--placement with --workload must be one of {', '.join(COMPARED)}, all")
    rows = _predict_rows(paths, placement)
    _compare(rows)
    report = {
        "rows": [{k: v for k, v in r.items() if k not in ("prediction", "cells")} for r in rows],
        "predictions": {r["placement"]: r["prediction"] for r in rows},
    }
    if out is not None:
        out.write_text(json.dumps(report))
    if plot is not None:
        _plot(rows, plot)
    if as_json:
        print(json.dumps(report))
        return
    _table(rows)
    if out is not None:
        print(f"written: {out}")
    if plot is not None:
        print(f"plot: {plot}")


def _predict_rows(paths: list[Path], placement: str | None) -> list[dict[str, Any]]:
    """One row per (run, predicted placement): measured and predicted makespans."""
    rows: list[dict[str, Any]] = []
    try:
        files = [(p, load_workload(p)) for p in paths]
        own = [wf.placement.value for _, wf in files]
        if len(set(own)) < len(own):
            fail("sim", f"two --workload files are runs of the same placement ({', '.join(own)})")
        for p, wf in files:
            if len(files) > 1 or placement is None:
                names = [wf.placement.value]
            else:
                names = list(COMPARED) if placement == "all" else [placement]
            for name, pred in predict_all(wf, names).items():
                m = pred["measured"] or {}
                rows.append(
                    {
                        "file": str(p),
                        "cells": wf.policy.cells,
                        "placement": name,
                        "measured_makespan_s": m.get("makespan_s"),
                        "predicted_makespan_s": pred["makespan_s"],
                        "measured_staleness": m.get("staleness_mean"),
                        "prediction": pred,
                    }
                )
    except WorkloadFileError as e:
        fail("sim", str(e))
    return rows


def _compare(rows: list[dict[str, Any]]) -> None:
    """Add each row's errors and ratios to Elastic (measured and predicted)."""
    by = {r["placement"]: r for r in rows}
    ref = by.get("elastic")
    for r in rows:
        p = r["prediction"]
        r["makespan_error"] = (
            r["predicted_makespan_s"] / r["measured_makespan_s"] - 1
            if r["measured_makespan_s"]
            else None
        )
        r["predicted_ratio_vs_elastic"] = (
            r["predicted_makespan_s"] / ref["predicted_makespan_s"] if ref else None
        )
        r["measured_ratio_vs_elastic"] = (
            r["measured_makespan_s"] / ref["measured_makespan_s"]
            if ref and r["measured_makespan_s"] and ref["measured_makespan_s"]
            else None
        )
        mr, pr = r["measured_ratio_vs_elastic"], r["predicted_ratio_vs_elastic"]
        r["ratio_error"] = pr / mr - 1 if mr and pr else None
        r["predicted_staleness"] = p["staleness_mean"]
        r["predicted_staleness_dispatch"] = p["staleness_dispatch"]


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title="measured (gyre run) vs predicted (gyre sim), same durations", title_justify="left"
    )
    for col in (
        "placement",
        "phi,mu",
        "measured s",
        "predicted s",
        "error",
        "x elastic meas.",
        "x elastic pred.",
        "ratio error",
        "E[d] meas.",
        "E[d] pred. serving/dispatch",
        "interrupted",
    ):
        t.add_column(col.replace("[", "\\["), justify="left" if col == "placement" else "right")
    for r in rows:
        p = r["prediction"]
        t.add_row(
            r["placement"],
            f"{p['phi']:g},{p['mu']}",
            _f(r["measured_makespan_s"]),
            _f(r["predicted_makespan_s"]),
            _pct(r["predicted_makespan_s"], r["measured_makespan_s"]),
            _f(r["measured_ratio_vs_elastic"], ".2f"),
            _f(r["predicted_ratio_vs_elastic"], ".2f"),
            "-" if r["ratio_error"] is None else f"{r['ratio_error'] * 100:+.1f} %",
            _f(r["measured_staleness"], ".2f"),
            f"{p['staleness_mean']:.2f}/{p['staleness_dispatch']:.2f}",
            str(p["interrupted"]),
        )
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(t)
    ex = rows[0]["prediction"]["executions"]
    unobs = rows[0]["prediction"]["unobserved_costs"]
    console.print(
        f"[dim]executions replayed as measured: {ex['realised']}, cut by the run's end: {ex['cut']}, "
        f"filled from the draw: {ex['filled']}; groups with their own measured compute: "
        f"{ex.get('groups_measured', 0)} (others: the mean micro-step); costs not observed (0 used): "
        f"{', '.join(unobs) or 'none'}. E\\[d]: serving version per trained token / dispatch "
        "version per group.[/dim]"
    )


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    from gyre.sim.plot import plot_gantt

    panels: dict[str, Any] = {}
    for r in rows:
        p, k = r["prediction"], r["cells"]
        m = p["measured"]
        if m and m.get("segments") and m.get("makespan_s"):
            panels[f"{r['placement']} measured (s)"] = _panel(
                m["segments"],
                k,
                m["makespan_s"],
                m.get("staleness_mean") or 0.0,
                m.get("interrupted") or 0,
                {},
            )
        panels[f"{r['placement']} predicted (s)"] = _panel(
            p["segments"], k, p["makespan_s"], p["staleness_mean"], p["interrupted"], p
        )
    try:
        plot_gantt(panels, path, title="measured vs predicted", unit="s")
    except OSError as e:
        fail("sim", f"--plot {path}: cannot write it ({e.strerror or e})")
    except ValueError as e:
        fail("sim", f"--plot {path}: {e}; use a .png, .pdf or .svg name")
