"""What a real run records about itself, apart from what it does.

:class:`gyre.runtime.world.RealWorld` carries out the policy's actions and writes here
(roles over time, who computed when, every switch, publication, execution and step);
the readers (:mod:`gyre.runtime.report`, :mod:`gyre.runtime.workload`,
:mod:`gyre.runtime.progress`, :meth:`gyre.runtime.rundir.RunDir.write_step`) take a
:class:`Records` and never the world, so what they may read is this file. Times are
seconds on the run's clock (:meth:`Records.now`, zero when the cells were up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gyre.policy import CellRole
from gyre.train.stats import ObjectiveStats


class Phase(StrEnum):
    """What a training cell computes now (``Records.activity[cell]["what"]``): the live view
    words it, the fault handler (and a test rig) judge from it whether a loss breaks the step."""

    MICRO_STEP = "micro_step"
    REDUCE_CHECK = "reduce_check"  # the ping before the reduce
    REDUCE = "reduce"  # a satellite in the step's reduce
    OPTIMIZER_STEP = "optimizer_step"  # the core: reduce and optimizer step


# a loss in these breaks the step: the core's gradients or weights may be half changed
BREAKS_STEP = frozenset({Phase.REDUCE, Phase.OPTIMIZER_STEP})


# (start, end, role value) of one cell
Segment = tuple[float, float, str]


@dataclass
class StepRecord:
    """What the world saw of one optimizer step (metrics are written from this)."""

    step: int  # global step index
    version: int  # policy version the step's gradients were taken at
    start: float
    # (group id, dispatch version: the mean of its executions' own, gyre.runtime.restore)
    groups: list[tuple[int, float]] = field(default_factory=list)
    local: dict[int, int] = field(default_factory=dict)  # group id -> the policy's id for it
    n_scored: int = 0
    pack: dict[str, float] = field(default_factory=dict)
    stats: dict[int, ObjectiveStats] = field(default_factory=dict)  # cell -> its summed stats
    claims: dict[int, int] = field(default_factory=dict)  # cell -> policy micro-steps it ran


@dataclass
class Records:
    """Everything the world recorded; ``cells`` cells, all starting in rollout."""

    cells: int
    segment: int = 0  # how many times this run was (re)started
    t0: float = field(default_factory=time.monotonic)
    # the role timeline: each cell's role now, since when, and its closed segments
    roles: list[CellRole] = field(default_factory=list)
    since: list[float] = field(default_factory=list)
    segments: list[list[Segment]] = field(default_factory=list)
    busy: list[list[tuple[float, float]]] = field(default_factory=list)  # per cell: computing
    switches: list[dict[str, Any]] = field(default_factory=list)
    publications: list[dict[str, Any]] = field(default_factory=list)
    steps: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per step
    # what workload.json is measured from (gyre.runtime.workload)
    # (gid, att) -> launch, end (None while it runs)
    exec_times: dict[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)
    micros: list[tuple[int, int, float, float]] = field(default_factory=list)  # cell, version, s, e
    optims: list[tuple[float, float]] = field(default_factory=list)  # the core's FinishStep
    finished_steps: list[StepRecord] = field(default_factory=list)
    restored: int = 0  # executions a resume kept from the killed segment (not run again)
    makespan: float | None = None
    # what the live view shows of work under way (gyre.runtime.progress): cell -> what it
    # computes now ({"what": Phase.MICRO_STEP, "index", "of", "group"}, or another Phase),
    # and the version every rollout engine is reloading while a publication runs
    activity: dict[int, dict[str, Any]] = field(default_factory=dict)
    publishing: int | None = None
    # every cell lost: {"cell", "kind": died|hung, "role", "time", "detected_by", "cause",
    # "action", "back" (time it served again, None if not), "moved_calls", "requeued"}
    faults: list[dict[str, Any]] = field(default_factory=list)
    # what each AssignGroup cost the driver's loop, in seconds: "trees" (traces to trees),
    # "pack" (to micro-step tasks), "put" (the tasks into Ray's object store), "all"; "tasks"
    assigns: list[dict[str, float]] = field(default_factory=list)

    def fault(
        self,
        *,
        cell: int | None,
        kind: str,
        role: str,
        at: float,
        detected_by: str,
        cause: str,
        action: str,
        **more: Any,
    ) -> dict[str, Any]:
        """A new fault, appended to ``faults`` and returned (its handler completes it): the
        keys every reader relies on (the report, the live view, ``faults.jsonl``, a test rig's
        audit), ``more`` after them. ``at``: run time; ``back`` is None until it serves again."""
        rec: dict[str, Any] = {
            "cell": cell,
            "kind": kind,
            "role": role,
            "time": round(at, 3),
            "unix_time": round(time.time(), 3),  # to compare with when a test killed it
            "detected_by": detected_by,
            "cause": cause,
            "action": action,
            "back": None,
            "segment": self.segment,
            **more,
        }
        self.faults.append(rec)
        return rec

    def __post_init__(self) -> None:
        K = self.cells
        self.roles = self.roles or [CellRole.ROLLOUT] * K
        self.since = self.since or [0.0] * K
        self.segments = self.segments or [[] for _ in range(K)]
        self.busy = self.busy or [[] for _ in range(K)]

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        return time.monotonic() - self.t0

    def restart_clock(self) -> None:
        """Zero the clock (the cells are up: setup is not part of the run's time)."""
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ roles
    def set_role(self, cell: int, role: CellRole, now: float) -> None:
        """``cell`` takes ``role`` at ``now``: its open segment (if it lasted) is closed."""
        if now > self.since[cell]:
            self.segments[cell].append((self.since[cell], now, self.roles[cell].value))
        self.since[cell] = now
        self.roles[cell] = role

    def role_segments(self, end: float) -> list[list[Segment]]:
        """Per cell: its closed segments and the open one, closed at ``end`` (not recorded)."""
        return [
            [*self.segments[c], (self.since[c], end, self.roles[c].value)]
            for c in range(self.cells)
        ]

    def role_shares(self, end: float | None = None) -> list[dict[str, float]]:
        """Each cell's share of the time up to ``end`` (default: now) in each role (switching
        counted apart)."""
        out = []
        for segs in self.role_segments(self.now() if end is None else end):
            acc: dict[str, float] = {}
            for s, e, role in segs:
                acc[role] = acc.get(role, 0.0) + max(0.0, e - s)
            tot = sum(acc.values()) or 1.0
            out.append({r: round(v / tot, 4) for r, v in acc.items()})
        return out

    def close_segments(self) -> None:
        """Record every cell's open segment up to now (the run is over)."""
        now = self.now()
        for c in range(self.cells):
            self.set_role(c, self.roles[c], now)

    # ------------------------------------------------------------------ derived
    def switch_seconds(self) -> dict[str, list[float]]:
        """Durations of the switches into each role: ``{"training": [...], "rollout": [...]}``."""
        return {
            d: [s["seconds"] for s in self.switches if s["to"] == d]
            for d in ("training", "rollout")
        }
