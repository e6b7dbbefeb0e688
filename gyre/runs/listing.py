"""``gyre runs list OUT_DIR``: one line per run directory."""

from __future__ import annotations

from typing import Any

from gyre.runs.files import Run, finite
from gyre.textsafe import printable


def fmt(x: Any, digits: int = 3) -> str:
    """A reward or score as a person reads it: a few digits, '-' when absent or not a finite
    number (summary.json of a received run may hold anything)."""
    f = finite(x)
    return "-" if f is None else f"{f:.{digits}f}"


def line(run: Run) -> str:
    """name, placement, steps done/total, reward first -> last, makespan, state."""
    total = run.total_steps
    rewards = run.rewards
    first, last = (rewards[0][1], rewards[-1][1]) if rewards else (None, None)
    span = run.makespan
    return (
        f"{printable(run.name):<28} {printable(run.placement):<9} steps {run.steps_done}/{total if total else '?'}"
        f"  reward {fmt(first)} -> {fmt(last)}"
        f"  makespan {'-' if span is None else f'{span:.1f}s'}  {run.state}"
    )
