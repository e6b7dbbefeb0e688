"""``gyre runs compare DIR DIR...``: several runs' curves and makespans side by side."""

from __future__ import annotations

import html

from gyre.runs.files import Run
from gyre.runs.page import page, table
from gyre.runs.sections import held_out, per_step
from gyre.runs.show import summary_rows
from gyre.runs.svg import bar_rows, line_chart


def render_compare(runs: list[Run]) -> str:
    """One page: a table of the runs, their reward, held-out and staleness curves on shared
    charts, and their makespans as bars (the longest run's bar full width)."""
    head = ["run", "placement", "steps", "makespan (s)", "reward first", "reward last", "state"]
    rows = [[html.escape(str(c)) for c in r] for r in summary_rows(runs)]
    label = [f"{r.name} ({r.placement})" for r in runs]
    spans = [r.makespan for r in runs]
    longest = max((s for s in spans if s), default=0.0)
    bars = [
        (r.name[:20], {"makespan": (s or 0.0) / longest})
        for r, s in zip(runs, spans, strict=True)
        if longest
    ]
    body = [
        f"<h1>Gyre runs compared ({len(runs)})</h1>",
        f'<section id="overview">{table(head, rows, "overview")}</section>',
        '<h2>Training reward</h2><section id="curves">',
        line_chart(
            "reward/mean per step",
            [(n, per_step(r, "reward/mean")) for n, r in zip(label, runs, strict=True)],
            "step",
        ),
        line_chart(
            "held-out reward_mean per version",
            [(n, held_out(r, "reward_mean")) for n, r in zip(label, runs, strict=True)],
            "version",
        ),
        '</section><h2>Staleness</h2><section id="staleness">',
        line_chart(
            "batch/staleness_mean per step",
            [(n, per_step(r, "batch/staleness_mean")) for n, r in zip(label, runs, strict=True)],
            "step",
        ),
        '</section><h2>Makespan</h2><section id="makespan">',
        bar_rows(f"makespan (longest {longest:.1f} s = full bar)", bars, {"makespan": "#4C78A8"}),
        "</section>",
    ]
    return page("Gyre runs compared", body)
