"""Costs and staleness measured from a run's own records (pure functions, no I/O).

``workload.json`` hands these to the simulator (``gyre sim --workload``), so every
number here is taken from what the run did (the world's micro-step, optimizer,
switch and publication intervals; the proxy's trace records), never from a constant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def median(xs: Iterable[float]) -> float | None:
    v = list(xs)
    return statistics.median(v) if v else None


def mean(xs: Iterable[float]) -> float | None:
    v = list(xs)
    return statistics.fmean(v) if v else None


def microstep_s(micros: Sequence[tuple[int, int, float, float]]) -> float | None:
    """Compute time per policy micro-step: the mean over every claim, empty shares included.

    The policy cuts a group into N m micro-steps; the runtime packs the group's tokens into
    fewer real micro-steps (by token budget), so some claims carry no work. The simulator
    charges each policy micro-step the same, so the mean (not the median) keeps its total
    compute per step equal to the run's.
    """
    return mean(e - s for _, _, s, e in micros)


def refresh_s(
    micros: Sequence[tuple[int, int, float, float]],
    segments: Sequence[Sequence[tuple[float, float, str]]],
) -> float | None:
    """A satellite's weight refresh between steps within one training stint.

    A satellite's micro-step at a version other than its previous one in the same stint
    pulls the core's new snapshot first; the refresh is the median of those micro-steps
    minus the median of its other (non-empty) micro-steps. None if none was observed.
    """
    by_cell: dict[int, list[tuple[int, float, float]]] = {}
    for c, v, s, e in micros:
        if c != 0 and v >= 0:
            by_cell.setdefault(c, []).append((v, s, e))
    pulls: list[float] = []
    plain: list[float] = []
    for c, ms in by_cell.items():
        stints = [(a, b) for a, b, r in segments[c] if r == "training"]
        prev: tuple[int, int] | None = None  # (stint index, version)
        for v, s, e in sorted(ms, key=lambda m: m[1]):
            stint = next((i for i, (a, b) in enumerate(stints) if a <= s <= b), -1)
            if prev is not None and prev[0] == stint and prev[1] != v:
                pulls.append(e - s)
            else:
                plain.append(e - s)
            prev = (stint, v)
    if not pulls or not plain:
        return None
    return max(0.0, statistics.median(pulls) - statistics.median(plain))


@dataclass(frozen=True)
class Call:
    """One proxy trace record, on the run's clock."""

    gid: int
    attempt: int
    start: float
    end: float
    tokens: int
    engines: int  # distinct engines that sampled its output (>1: moved mid-generation)
    versions: tuple[tuple[int, int], ...]  # (weights version, output tokens) per segment


def reroute_delay_s(calls: Sequence[Call]) -> float | None:
    """Extra latency of calls moved off a leaving engine: median(moved) - median(not moved)."""
    moved = [c.end - c.start for c in calls if c.engines > 1]
    other = [c.end - c.start for c in calls if c.engines <= 1]
    if not moved or not other:
        return None
    return max(0.0, statistics.median(moved) - statistics.median(other))


def occupancy_at(
    t: float, exec_times: Iterable[tuple[float, float]], capacity_at: float
) -> float | None:
    """Running executions / rollout capacity at time t."""
    if capacity_at <= 0:
        return None
    return sum(1 for s, e in exec_times if s <= t < e) / capacity_at


def rollout_speed(
    calls: Sequence[Call],
    exec_times: Sequence[tuple[float, float]],
    capacity: Sequence[tuple[float, float, float]],
    bins: int = 4,
) -> list[list[float]]:
    """[occupancy, relative tokens/s] per occupancy bin, relative to the least loaded bin.

    ``capacity`` holds (start, end, executions the rollout cells can serve) intervals.
    """
    pts: list[tuple[float, float]] = []
    for c in calls:
        dt = c.end - c.start
        cap = next((k for s, e, k in capacity if s <= c.start < e), 0.0)
        occ = occupancy_at(c.start, exec_times, cap)
        if dt > 0 and c.tokens > 0 and occ is not None:
            pts.append((min(occ, 1.0), c.tokens / dt))
    if not pts:
        return []
    acc: dict[int, list[tuple[float, float]]] = {}
    for occ, v in pts:
        acc.setdefault(min(bins - 1, int(occ * bins)), []).append((occ, v))
    rows = [
        (statistics.fmean(o for o, _ in acc[b]), statistics.median(v for _, v in acc[b]))
        for b in sorted(acc)
    ]
    base = rows[0][1]
    return [[round(o, 3), round(v / base, 3)] for o, v in rows]


def token_staleness(trained_version: int, calls: Iterable[Call]) -> float | None:
    """Token-weighted mean of (trained version - version that served the token)."""
    n = tot = 0
    for c in calls:
        for v, k in c.versions:
            n += k
            tot += k * (trained_version - v)
    return tot / n if n else None


def serving_staleness(trained_version: int, executions: Iterable[Sequence[Call]]) -> float | None:
    """Mean over executions of each one's token-mean serving staleness.

    Unlike :func:`token_staleness` a long execution (more calls, more tokens) weighs as much
    as a short one, as in the policy's E[d] = phi + (mu - 1)/2, which counts groups.
    """
    per = [s for s in (token_staleness(trained_version, e) for e in executions) if s is not None]
    return statistics.fmean(per) if per else None


def steady_from(phi: float, mu: int) -> int:
    """Steps before the steady state: the first dispatches start at version 0 for everyone."""
    return math.ceil(phi) + mu


def training_share(
    segments: Sequence[Sequence[tuple[float, float, str]]], end: float
) -> float | None:
    """The cells' mean share of ``[0, end]`` in the training role or switching into it (the
    simulator's ``mean_training_share``; the paper's regime is about 23 % for Elastic)."""
    if end <= 0 or not segments:
        return None
    per_cell = [
        sum(max(0.0, min(e, end) - s) for s, e, r in segs if r in ("training", "to_training"))
        for segs in segments
    ]
    return statistics.fmean(per_cell) / end


def compute_share(busy: Sequence[Sequence[tuple[float, float]]], end: float) -> float | None:
    """The cells' mean share of ``[0, end]`` spent computing training (micro-steps, optimizer)."""
    if end <= 0 or not busy:
        return None
    return statistics.fmean(sum(max(0.0, min(e, end) - s) for s, e in iv) for iv in busy) / end


def tokens_per_s(calls: Iterable[tuple[int, float]]) -> float | None:
    """Output tokens per second of model calls, token-weighted: total tokens over the calls'
    total time (``(tokens, seconds)`` pairs), queueing at a busy engine included."""
    n = t = 0.0
    for k, dt in calls:
        if dt > 0:
            n += k
            t += dt
    return n / t if t > 0 else None
