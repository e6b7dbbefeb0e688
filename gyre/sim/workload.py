"""One draw of the synthetic workload, shared by every placement.

Group ``g`` (the policy allocates ids in dispatch order) is query ``g`` of the
draw, so every placement sees exactly the same durations; only the scheduler
differs. The draw is sized for the deepest dispatch queue of all placements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gyre.sim.config import WorkloadConfig


@dataclass(frozen=True)
class Draw:
    """Per-execution outcomes, shape (groups, N)."""

    duration_h: np.ndarray  # wall time from launch to scored (or killed)
    missing: np.ndarray  # bool: overall timeout hit -> missing assessment
    harness_timeout: np.ndarray  # bool: harness timeout hit (workspace scored, trained on)
    # model calls per execution, when known (a replayed run): an execution's tokens then weigh
    # by its calls in the token-weighted staleness; None = by its length
    calls: np.ndarray | None = None
    # per group (shape (groups,)), when a replayed run measured it: the seconds-in-hours of its
    # non-empty micro-steps and how many there were (-1: not measured; 0: it trained nothing).
    # Its first ``train_blocks`` claims then cost ``train_h / train_blocks`` each and the rest
    # nothing, where the cost model spreads one mean per claim (gyre.sim.world._claim)
    train_h: np.ndarray | None = None
    train_blocks: np.ndarray | None = None

    @property
    def groups(self) -> int:
        return int(self.duration_h.shape[0])

    def query_h(self) -> np.ndarray:
        """Query duration = slowest attempt of each group."""
        return self.duration_h.max(axis=1)


def draw_workload(w: WorkloadConfig, groups: int, group_size: int, seed: int) -> Draw:
    """Sample ``groups`` queries of ``group_size`` (the policy's N) attempts each."""
    rng = np.random.default_rng(seed)
    n = group_size
    q = rng.standard_normal((groups, 1)) * w.query_sigma
    a = rng.standard_normal((groups, n)) * w.tail
    raw = w.median_h * np.exp(q + a)
    timed_out = raw >= w.harness_timeout_h
    agent = np.minimum(raw, w.harness_timeout_h)
    score = (
        rng.exponential(w.score_mean_h, (groups, n))
        if w.score_mean_h > 0
        else np.zeros((groups, n))
    )
    total = agent + score
    if w.overall_timeout_h is not None:
        missing = total > w.overall_timeout_h
        total = np.minimum(total, w.overall_timeout_h)
    else:
        missing = np.zeros_like(timed_out)
    return Draw(duration_h=total, missing=missing, harness_timeout=timed_out & ~missing)


def workload_stats(d: Draw, threshold_h: float = 4.0) -> dict[str, float]:
    """The statistics the paper reports, for calibration and for docs."""
    qh = d.query_h()
    long_q = qh >= threshold_h
    slowest = d.duration_h.argmax(axis=1)
    slowest_missing = d.missing[np.arange(d.groups), slowest]
    return {
        "mean_execution_h": float(d.duration_h.mean()),
        "mean_query_h": float(qh.mean()),
        "frac_queries_ge_threshold": float(long_q.mean()),
        "frac_long_queries_slowest_missing": float(slowest_missing[long_q].mean())
        if long_q.any()
        else 0.0,
        "frac_harness_timeout": float(d.harness_timeout.mean()),
        "frac_missing": float(d.missing.mean()),
    }
