"""What a real run records about itself, apart from what it does.

:class:`gyre.runtime.world.RealWorld` carries out the policy's actions and writes here
(roles over time, who computed when, every switch, publication, execution and step);
the readers (:mod:`gyre.runtime.report`, :mod:`gyre.runtime.workload`,
:mod:`gyre.runtime.progress`, :meth:`gyre.runtime.rundir.RunDir.write_step`) take a
:class:`Records` and never the world, so what they may read is this file. Times are
seconds on the run's clock (:meth:`Records.now`, zero when the cells were up).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
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


@dataclass(frozen=True)
class FaultRecord:
    """One loss (a cell, a standalone engine, the proxy): how it was found, what was done,
    what it cost. Built by :meth:`Records.fault` and completed by :meth:`Records.complete`
    (a new record takes the old one's place: readers never see one half-written). On disk
    (``faults.jsonl``, ``summary.json`` ``faults``) it is the JSON object :meth:`to_json` gives,
    the same keys as the dicts it replaced, so old run directories still read.

    ``time``/``back``: run time (s); ``unix_time``: wall clock, to compare with when a test
    killed it; ``back`` is None until it serves again. ``more``: keys of one kind of fault
    (``engine``, ``capacity``, ``moved_calls``, ``port``, ...), kept as they came."""

    cell: int | None
    kind: str  # died | hung | engine | proxy
    role: str
    time: float
    unix_time: float
    detected_by: str
    cause: str
    action: str  # restart | none | run stopped | restart from checkpoint step N
    back: float | None = None
    segment: int = 0
    more: Mapping[str, Any] = field(default_factory=dict)
    # completed as it is handled (absent on disk until set)
    restart_s: float | None = None
    cost_s: float | None = None
    checkpoint_step: int | None = None  # a core restarted in place: the checkpoint it loaded
    executions_cut: int | None = None  # a segment's end: executions still running
    core_restart: int | None = None  # the supervisor's restart of the run (its count)
    restart_step: int | None = None
    steps_redone: int | None = None
    restart_unix_time: float | None = None
    back_unix_time: float | None = None

    def with_(self, **changes: Any) -> FaultRecord:
        """This record with ``changes`` (fields by name; any other key goes to ``more``)."""
        known = {k: v for k, v in changes.items() if k in _FAULT_FIELDS}
        extra = {k: v for k, v in changes.items() if k not in _FAULT_FIELDS}
        if extra:
            known["more"] = {**self.more, **extra}
        return dataclasses.replace(self, **known)

    def extra(self, key: str, default: Any = None) -> Any:
        """A key of ``more`` (one kind's: ``engine``, ``port``, ...), or ``default``."""
        if key in _FAULT_FIELDS:
            raise KeyError(f"{key!r} is a field of FaultRecord: read it as an attribute")
        return self.more.get(key, default)

    def to_json(self) -> dict[str, Any]:
        """The on-disk object: the fixed keys, then ``more``, then what completion set."""
        out: dict[str, Any] = {k: getattr(self, k) for k in _FAULT_BASE}
        out.update(self.more)
        for k in _FAULT_LATER:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FaultRecord:
        """A record from its on-disk object (``faults.jsonl``; older files too: a key of
        another kind goes to ``more``, a missing optional one stays None)."""
        known = {k: d[k] for k in _FAULT_FIELDS if k in d and k != "more"}
        known.setdefault("segment", 0)
        for k in ("cell", "role", "cause", "action", "detected_by"):
            known.setdefault(k, None if k == "cell" else "")
        known.setdefault("kind", "died")
        known.setdefault("time", 0.0)
        known.setdefault("unix_time", 0.0)
        more = {k: v for k, v in d.items() if k not in _FAULT_FIELDS}
        return cls(**known, more=more)


_FAULT_FIELDS = frozenset(f.name for f in dataclasses.fields(FaultRecord))
_FAULT_BASE = (
    "cell", "kind", "role", "time", "unix_time", "detected_by", "cause", "action", "back", "segment"
)  # fmt: skip
_FAULT_LATER = tuple(
    f.name for f in dataclasses.fields(FaultRecord) if f.name not in (*_FAULT_BASE, "more")
)


# (start, end, role value) of one cell
Segment = tuple[float, float, str]


def replace_fault(faults: list[FaultRecord], old: FaultRecord, new: FaultRecord) -> FaultRecord:
    """Put ``new`` where ``old`` is in ``faults`` (by identity: a stale record is a bug)."""
    for i, f in enumerate(faults):
        if f is old:
            faults[i] = new
            return new
    raise KeyError(f"fault record not in the list: {old}")


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


def _ms_quantiles(xs: list[float]) -> dict[str, float | int | None]:
    """p50/p90/p99/max of ``xs`` (seconds) in milliseconds, their count and their sum (s)."""
    if not xs:
        return {
            "n": 0, "total_s": 0.0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None
        }  # fmt: skip
    ys = sorted(xs)

    def q(f: float) -> float:
        k = (len(ys) - 1) * f
        lo, hi = int(k), min(int(k) + 1, len(ys) - 1)
        return round((ys[lo] + (ys[hi] - ys[lo]) * (k - lo)) * 1e3, 4)

    return {
        "n": len(ys),
        "total_s": round(sum(ys), 4),
        "p50_ms": q(0.5),
        "p90_ms": q(0.9),
        "p99_ms": q(0.99),
        "max_ms": q(1.0),
    }


@dataclass
class ControllerTimes:
    """What the main loop's own work cost per event, on the driver's clock (seconds): each
    ``policy.handle(event)`` with the event's and its actions' type names, and each
    ``world.carry_out(actions)``. The first carry-out follows ``policy.start``; carry-out
    ``i + 1`` carries out what handle ``i`` returned, so an event's cost is the pair. Waiting
    for the next event is not in it: this is the overhead the controller adds to a run."""

    handled: list[tuple[float, str, tuple[str, ...]]] = field(default_factory=list)
    carried: list[float] = field(default_factory=list)

    def per_event(self) -> list[tuple[float, float, str, tuple[str, ...]]]:
        """(handle s, carry-out s, event, actions) per event handled and carried out."""
        return [(h, c, ev, acts) for (h, ev, acts), c in zip(self.handled, self.carried[1:])]

    def summary(self, assigns: list[dict[str, float]]) -> dict[str, Any]:
        """``summary.json``'s ``controller``: quantiles per event (all, handle, carry-out, the
        events whose actions assign a group and the rest), an AssignGroup's parts (from
        ``assigns``, the world's spans) and the three slowest events."""
        ev = self.per_event()
        slow = sorted(ev, key=lambda x: -(x[0] + x[1]))[:3]
        return {
            "per_event": _ms_quantiles([h + c for h, c, _, _ in ev]),
            "handle": _ms_quantiles([h for h, _, _, _ in ev]),
            "carry_out": _ms_quantiles([c for _, c, _, _ in ev]),
            "with_assign": _ms_quantiles([h + c for h, c, _, a in ev if "AssignGroup" in a]),
            "without_assign": _ms_quantiles([h + c for h, c, _, a in ev if "AssignGroup" not in a]),
            "assign": {
                k: _ms_quantiles([a[k] for a in assigns]) for k in ("all", "trees", "pack", "put")
            },
            "assign_tasks": int(sum(a["tasks"] for a in assigns)),
            "slowest": [
                {"ms": round((h + c) * 1e3, 3), "event": e, "actions": list(a)}
                for h, c, e, a in slow
            ],
        }


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
    # global group id -> seconds of each of its micro-steps that computed something (empty
    # shares and claims voided by a fault left out): a group's training is as lumpy as this
    group_train: dict[int, list[float]] = field(default_factory=dict)
    optims: list[tuple[float, float]] = field(default_factory=list)  # the core's FinishStep
    finished_steps: list[StepRecord] = field(default_factory=list)
    restored: int = 0  # executions a resume kept from the killed segment (not run again)
    makespan: float | None = None
    dropped_at_end: int = 0  # bytes of scratch removed when the run finished (RealWorld.finish)
    # what the live view shows of work under way (gyre.runtime.progress): cell -> what it
    # computes now ({"what": Phase.MICRO_STEP, "index", "of", "group"}, or another Phase),
    # and the version every rollout engine is reloading while a publication runs
    activity: dict[int, dict[str, Any]] = field(default_factory=dict)
    publishing: int | None = None
    # every loss of the run, in order (those of earlier segments first: faults.jsonl)
    faults: list[FaultRecord] = field(default_factory=list)
    # what each AssignGroup cost the driver's loop, in seconds: "trees" (traces to trees),
    # "pack" (to micro-step tasks), "put" (the tasks into Ray's object store), "all"; "tasks"
    assigns: list[dict[str, float]] = field(default_factory=list)
    # what the main loop's handle and carry-out cost per event (gyre.runtime.loop)
    controller: ControllerTimes = field(default_factory=ControllerTimes)

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
    ) -> FaultRecord:
        """A new fault, appended to ``faults`` and returned (its handler completes it with
        :meth:`complete`). ``at``: run time; ``more``: the keys of its kind."""
        rec = FaultRecord(
            cell=cell,
            kind=kind,
            role=role,
            time=round(at, 3),
            unix_time=round(time.time(), 3),
            detected_by=detected_by,
            cause=cause,
            action=action,
            segment=self.segment,
            more=more,
        )
        self.faults.append(rec)
        return rec

    def complete(self, rec: FaultRecord, **changes: Any) -> FaultRecord:
        """``rec`` with ``changes`` takes its place in ``faults``; the new record is returned
        (the handler goes on with it). ``back`` set without ``cost_s``: the cost is the time
        from the loss to ``back``."""
        new = rec.with_(**changes)
        if "back" in changes and "cost_s" not in changes and new.back is not None:
            new = new.with_(cost_s=round(new.back - new.time, 3))
        return replace_fault(self.faults, rec, new)

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
