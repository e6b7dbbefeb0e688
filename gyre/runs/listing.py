"""``gyre runs list OUT_DIR``: one line per run directory."""

from __future__ import annotations

from gyre.runs.files import Run


def fmt(x: float | None, digits: int = 3) -> str:
    """A reward or score as a person reads it: a few digits, '-' when absent."""
    return "-" if x is None else f"{x:.{digits}f}"


def line(run: Run) -> str:
    """name, placement, steps done/total, reward first -> last, makespan, state."""
    total = run.total_steps
    rewards = run.rewards
    first, last = (rewards[0][1], rewards[-1][1]) if rewards else (None, None)
    span = run.makespan
    return (
        f"{run.name:<28} {run.placement:<9} steps {run.steps_done}/{total if total else '?'}"
        f"  reward {fmt(first)} -> {fmt(last)}"
        f"  makespan {'-' if span is None else f'{span:.1f}s'}  {run.state}"
    )
