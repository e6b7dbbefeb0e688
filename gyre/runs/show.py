"""``gyre runs show RUN_DIR``: one self-contained HTML page about a run.

Curves are inline SVG, the timeline PNG is inlined as a data URI, the style is inline:
the page opens from a file with no network and fetches nothing. Each execution's
trajectory tree (``gyre tree show --html``, the same renderer) is written next to the
page under ``trees/`` and linked from the executions table.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from gyre.runs import safefs, sections
from gyre.runs.files import Run, read_jsonl
from gyre.runs.listing import fmt
from gyre.runs.page import page, table


def _timeline(run: Run) -> str:
    png = run.path / "timeline.png"
    why = safefs.refusal(run.path, png)
    if why is not None:
        safefs.warn(png, why)
        return f'<p class="none">timeline: skipped, timeline.png is {html.escape(why)}</p>'
    raw = safefs.read_bytes(run.path, png)
    if raw is None:
        return '<p class="none">timeline: not written (the run has not finished)</p>'
    data = base64.b64encode(raw).decode()
    return f'<img id="timeline" alt="timeline" src="data:image/png;base64,{data}">'


def _overview(run: Run) -> str:
    s = run.summary or {}
    rw = run.rewards
    ex = s.get("executions") or {}
    rows = [
        ("placement", run.placement),
        ("state", run.state),
        ("steps", f"{run.steps_done}/{run.total_steps or '?'}"),
        ("makespan", "-" if run.makespan is None else f"{run.makespan:.1f} s"),
        (
            "reward first / last step",
            f"{fmt(rw[0][1] if rw else None)} / {fmt(rw[-1][1] if rw else None)}",
        ),
        (
            "reward first / last quarter",
            f"{fmt(s.get('reward_first_quarter'))} / {fmt(s.get('reward_last_quarter'))}",
        ),
        (
            "executions finished / failed / missing",
            f"{ex.get('finished', '-')} / {ex.get('failed', '-')} / {ex.get('missing', '-')}",
        ),
        ("checkpoints", ", ".join(f"step {c}" for c in run.checkpoints) or "none"),
    ]
    return table(["", ""], [[html.escape(k), html.escape(str(v))] for k, v in rows], "overview")


def render(run: Run, out_dir: Path, max_trees: int = 200) -> str:
    """The page's HTML; trajectory trees go to ``out_dir/trees/`` (at most ``max_trees``)."""
    execs = read_jsonl(run.path / "executions.jsonl")
    trees = sections.write_trees(run, execs, out_dir / "trees", max_trees)
    body = [
        f"<h1>Run {html.escape(run.name)}</h1>",
        f'<p>{html.escape(str(run.path))}</p><section id="overview">{_overview(run)}</section>',
        '<h2>Reward and held-out scores</h2><section id="curves">',
        sections.curves(run),
        "</section>",
        '<h2>Timeline and role shares</h2><section id="timeline-section">',
        _timeline(run),
        sections.roles(run),
        "</section>",
        '<h2>Staleness</h2><section id="staleness">',
        sections.staleness(run),
        "</section>",
        '<h2>Train / inference mismatch</h2><section id="mismatch">',
        sections.mismatch(run),
        "</section>",
        '<h2>Agent: turns, tool calls, trees</h2><section id="agent">',
        sections.agent(run),
        "</section>",
        '<h2>Faults and reroutes</h2><section id="faults">',
        sections.faults(run, execs),
        "</section>",
        f'<h2>Executions ({len(execs)})</h2><section id="executions" class="scroll">',
        sections.executions(run, execs, trees, out_dir),
        "</section>",
    ]
    return page(f"Gyre run {run.name}", body)


def summary_rows(runs: list[Run]) -> list[list[Any]]:
    """Rows of the compare page's table (one per run)."""
    out = []
    for r in runs:
        rw = r.rewards
        out.append(
            [
                r.name,
                r.placement,
                f"{r.steps_done}/{r.total_steps or '?'}",
                "-" if r.makespan is None else f"{r.makespan:.1f}",
                fmt(rw[0][1] if rw else None),
                fmt(rw[-1][1] if rw else None),
                r.state,
            ]
        )
    return out
