"""Live progress of a run: a rich panel in a terminal, plain lines, JSON lines, or nothing.

Every mode shows the same snapshot (:meth:`Progress.snapshot`): steps done of the total with
elapsed time and an ETA, the latest reward and held-out score, what each cell is doing now
(serving executions, a micro-step, the optimizer step, a switch, a weight reload), the
waterlevel, calls rerouted, faults, executions missing by reason, and the tool-call health
of the latest step when the metrics carry it. The snapshot is built from what the driver
already holds (:class:`Feed`): a refresh makes no Ray call and no request.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from gyre.runtime.records import FaultRecord, Phase, Records

_ROLE_MARK = {"rollout": "R", "training": "T", "to_training": ">T", "to_rollout": ">R", "lost": "X"}
_ROLE_NAME = {"to_training": "-> training", "to_rollout": "-> rollout"}
TOOL_KEYS = (  # the tool-call health of a step, in metrics.jsonl when the harness reports it
    "tools/unparsed",
    "tools/truncated",
    "tools/no_call_executions",
    "tools/turns_per_execution",
)
_TOOL_LABEL = {
    "tools/unparsed": "unparsed",
    "tools/truncated": "truncated",
    "tools/no_call_executions": "no-call executions",
    "tools/turns_per_execution": "turns/execution",
}
_FAULT_LABEL = {
    "engines_lost": "engines lost",
    "cells_lost": "cells lost",
    "core_restarts": "core restarts",
    "proxy_restarts": "proxy restarts",
    "harness_failed": "harness failures",
    "engine_errors": "engine errors",
    "errors_5xx": "5xx answers",
}


@dataclass
class Feed:
    """What the driver holds about the run now, in its own memory: the world's records, the
    policy's status, the metrics and evaluation rows written so far, each cell's engine load as
    the in-process proxy sees it (``(executions, calls in flight)``; None: no engine), and
    the run's counters (calls rerouted, faults)."""

    records: Records
    status: dict[str, Any]
    rows: list[dict[str, Any]]
    evals: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    version: int = 0
    published_version: int = 0
    cell_load: list[tuple[int, int] | None] = field(default_factory=list)
    parks_engine: bool = False  # a training cell keeps its engine paused (vLLM)
    counters: dict[str, int] = field(default_factory=dict)
    # what attached test rigs count (gyre.runtime.handles.Rig), by label: shown, never faults
    rigs: dict[str, int] = field(default_factory=dict)


def num(x: float | None) -> str:
    """A reward or score as a person reads it: 4 significant digits, '-' when absent."""
    if x is None:
        return "-"
    return str(x) if isinstance(x, int) else f"{x:.4g}"


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def doing(
    role: str,
    activity: dict[str, Any] | None,
    load: tuple[int, int] | None,
    *,
    publishing: int | None = None,
    published_version: int = 0,
    parks_engine: bool = False,
    done: bool = False,
) -> str:
    """What a cell does now, in words (``done``: the policy has no step left)."""
    if role == "to_training":
        return "switching to training (drain, load replica)"
    if role == "to_rollout":
        return f"switching to rollout (engine on v{published_version})"
    if role == "training":
        what = (activity or {}).get("what")
        if what == Phase.MICRO_STEP:
            a = activity or {}
            return f"training micro-step {a['index'] + 1} of {a['of']} (g{a['group']})"
        if what == Phase.OPTIMIZER_STEP:
            return f"optimizer step over {(activity or {}).get('cells', 1)} cells"
        if what == Phase.REDUCE:
            return "reducing gradients with the core"
        if what == Phase.REDUCE_CHECK:
            return "checking the step's cells are alive before the reduce"
        idle = "done" if done else "waiting for a micro-step"
        return idle + (" (engine parked)" if parks_engine else "")
    if publishing is not None:
        return f"loading weights v{publishing}"
    if load is None:
        return "no engine"
    return f"serving {_n(load[0], 'execution')}, {_n(load[1], 'call')} in flight"


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


def _missing(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Executions missing by reason over every step so far (``batch/missing/*``)."""
    out: dict[str, int] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("batch/missing/") and v:
                reason = k.removeprefix("batch/missing/")
                out[reason] = out.get(reason, 0) + int(v)
    return out


class Progress:
    def __init__(self, mode: str = "rich", total_steps: int = 0, *, quiet: bool = False):
        self.mode = "quiet" if quiet else mode
        if self.mode == "rich" and not sys.stderr.isatty():
            self.mode = "plain"
        self.total = total_steps
        self._live: Live | None = None
        self._last = 0.0
        self._last_step = -1

    def __enter__(self) -> Progress:
        if self.mode == "rich":
            live = self._live = Live(
                console=Console(stderr=True), refresh_per_second=4, transient=False
            )
            live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def message(self, text: str) -> None:
        if self.mode == "json":
            print(json.dumps({"event": "message", "text": text}), flush=True)
        elif self._live is not None:  # above the panel, which stays at the bottom
            self._live.console.print(f"[gyre run] {text}", markup=False, highlight=False)
        elif self.mode != "quiet":
            print(f"[gyre run] {text}", file=sys.stderr, flush=True)

    def snapshot(self, feed: Feed) -> dict[str, Any]:
        """The view's content, as JSON-friendly values (full precision; renderers round)."""
        rec, st, rows = feed.records, feed.status, feed.rows
        done = len(rows)
        elapsed = rec.now()
        seg_steps = len(rec.finished_steps)
        eta = elapsed / seg_steps * max(self.total - done, 0) if seg_steps else None
        last = rows[-1] if rows else {}
        ev = next((e for e in reversed(feed.evals) if "error" not in e), None)
        f = {k: int(feed.counters.get(k, 0)) for k in _FAULT_LABEL}
        f["core_restarts"] = core_restarts(rec.faults)
        cells = []
        for c, role in enumerate(rec.roles):
            r = role.value
            load = feed.cell_load[c] if c < len(feed.cell_load) else None
            cells.append(
                {
                    "cell": c,
                    "role": r,
                    "for_s": round(max(0.0, elapsed - rec.since[c]), 1),
                    "doing": doing(
                        r,
                        rec.activity.get(c),
                        load,
                        publishing=rec.publishing,
                        published_version=feed.published_version,
                        parks_engine=feed.parks_engine,
                        done=bool(st.get("done")),
                    ),
                    "executions": None if load is None else load[0],
                    "calls_in_flight": None if load is None else load[1],
                }
            )
        return {
            "step": done,
            "steps": self.total,
            "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "version": feed.version,
            "reward": last.get("reward/mean"),
            "pass_rate": last.get("reward/pass_rate"),
            "eval": None
            if ev is None
            else {
                "version": ev.get("version"),
                "score": ev.get("reward_mean"),
                "pass_rate": ev.get("pass_rate"),
                "held_out": bool(ev.get("held_out")),
            },
            "cells": cells,
            "roles": [c["role"] for c in cells],
            "waterlevel": st.get("waterlevel"),
            "capacity": st.get("capacity"),
            "running": feed.running,
            "queued": st.get("queued"),
            "rerouted": int(feed.counters.get("rerouted", 0)),
            "faults": f,
            "rigs": dict(feed.rigs),
            "last_fault": last_fault(rec.faults),
            "missing": _missing(rows),
            "tools": {k: last[k] for k in TOOL_KEYS if last.get(k) is not None},
        }

    def update(self, feed: Callable[[], Feed], steps: int, *, force: bool = False) -> None:
        """Show the run's state (at most every 0.25 s, and at each new step); ``steps``: metrics
        rows so far. ``feed`` is only called when something is shown."""
        if self.mode == "quiet":
            return
        now = time.monotonic()
        new_step = steps != self._last_step
        if not force and not new_step and now - self._last < 0.25:
            return
        if self.mode != "rich" and not (new_step or force):
            return
        self._last = now
        self._last_step = steps
        s = self.snapshot(feed())
        if self.mode == "json":
            print(json.dumps({"event": "progress", **s}), flush=True)
        elif self.mode == "plain":
            print(f"[gyre run] {line(s)}", file=sys.stderr, flush=True)
        elif self._live is not None:
            self._live.update(panel(s))


def _faults(s: dict[str, Any]) -> str:
    f = s["faults"]
    parts = [f"{_FAULT_LABEL[k]} {v}" for k, v in f.items() if v]
    parts += [f"{k} {v}" for k, v in s.get("rigs", {}).items() if v]
    # a core restart answers a cell lost (a rig's kill causes one): not a fault of its own
    n = sum(v for k, v in f.items() if k != "core_restarts")
    return f"faults {n}" + (f" ({', '.join(parts)})" if parts else "")


def last_fault(faults: list[FaultRecord]) -> str | None:
    """What died last, when, what was done and what it cost (None: nothing died)."""
    if not faults:
        return None
    f = faults[-1]
    if f.kind == "proxy":
        who = "proxy"
    elif f.kind == "engine":
        who = f"standalone engine {f.extra('engine')}"
    else:
        who = f"cell {f.cell} {f.kind}"
    if f.cost_s is not None:
        after = f"back after {f.cost_s:.1f}s"
    else:
        after = "not back yet" if f.action == "restart" else ""
    return f"last fault: {who} at {f.time:.1f}s ({f.detected_by}), {f.action} {after}"


def _missing_text(s: dict[str, Any]) -> str:
    m = s["missing"]
    parts = [f"{k} {v}" for k, v in sorted(m.items())]
    return f"missing {sum(m.values())}" + (f" ({', '.join(parts)})" if parts else "")


def _eval_parts(s: dict[str, Any]) -> tuple[str, str]:
    """The latest evaluation: its label (held-out, or eval on the training tasks) and score."""
    ev = s["eval"]
    if ev is None:
        return "held-out", "-"
    name = "held-out" if ev["held_out"] else "eval"
    return name, f"v{ev['version']} {num(ev['score'])} (pass {num(ev['pass_rate'])})"


def _tools_text(s: dict[str, Any]) -> str:
    return "tools " + ", ".join(f"{_TOOL_LABEL[k]} {num(v)}" for k, v in s["tools"].items())


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / total) if total else 0
    return "#" * filled + "-" * (width - filled)


def line(s: dict[str, Any]) -> str:
    """The snapshot as one plain line (``--log-format plain``)."""
    cells = "; ".join(
        f"{c['cell']}:{_ROLE_MARK.get(c['role'], c['role'])} {c['doing']}" for c in s["cells"]
    )
    parts = [
        f"step {s['step']}/{s['steps']} [{_bar(s['step'], s['steps'])}]",
        f"reward {num(s['reward'])}  {' '.join(_eval_parts(s))}  version {s['version']}",
        f"cells {cells}",
        f"waterlevel {s['waterlevel']}/{s['capacity']} running {s['running']} queued {s['queued']}",
        f"rerouted {s['rerouted']}  {_faults(s)}  {_missing_text(s)}",
    ]
    if s.get("last_fault"):
        parts.append(s["last_fault"])
    if s["tools"]:
        parts.append(_tools_text(s))
    parts.append(f"elapsed {duration(s['elapsed_s'])} eta {duration(s['eta_s'])}")
    return " | ".join(parts)


def panel(s: dict[str, Any]) -> RenderableType:
    """The snapshot as the rich panel: bar, scores, one row per cell, counters."""
    total = s["steps"] or 1
    head = Table.grid(padding=(0, 2))
    head.add_row(
        ProgressBar(total=total, completed=s["step"], width=40),
        f"[bold]step {s['step']}/{s['steps']}[/]",
        f"{100 * s['step'] / total:.0f}%",
        f"elapsed {duration(s['elapsed_s'])}",
        f"eta {duration(s['eta_s'])}",
    )
    scores = Table.grid(padding=(0, 3))
    scores.add_row(
        f"[bold]reward[/] {num(s['reward'])}",
        "[bold]{}[/] {}".format(*_eval_parts(s)),
        f"[bold]version[/] {s['version']}",
        f"[bold]waterlevel[/] {s['waterlevel']}/{s['capacity']}",
        f"[bold]running[/] {s['running']}  [bold]queued[/] {s['queued']}",
    )
    cells = Table(box=None, padding=(0, 2), show_edge=False, header_style="bold")
    cells.add_column("cell")
    cells.add_column("role")
    cells.add_column("for", justify="right")
    cells.add_column("doing")
    for c in s["cells"]:
        cells.add_row(
            f"{c['cell']}{' core' if c['cell'] == 0 else ''}",
            _ROLE_NAME.get(c["role"], c["role"]),
            duration(c["for_s"]),
            c["doing"],
        )
    counters = f"rerouted {s['rerouted']}   {_faults(s)}   {_missing_text(s)}"
    parts: list[RenderableType] = [head, scores, cells, counters]
    if s.get("last_fault"):
        parts.append(s["last_fault"])
    if s["tools"]:
        parts.append(_tools_text(s))
    return Group(*parts)


def core_restarts(faults: list[FaultRecord]) -> int:
    """Times the run restarted its core from a checkpoint (gyre.runtime.supervise)."""
    return sum(1 for f in faults if f.core_restart)


def closing_lines(summary: dict[str, Any], seconds: float, path: Any) -> list[str]:
    """The run's last lines: time, makespan, reward first/last quarter and the evaluations'
    first and last score, rounded as a person reads them."""
    evals = [e for e in summary.get("evals", []) if e.get("reward_mean") is not None]
    ev = ""
    if evals:
        name = "held-out" if evals[-1].get("held_out") else "eval"
        first, last = evals[0], evals[-1]
        ev = f", {name} v{first['version']} {num(first['reward_mean'])}"
        if last is not first:
            ev += f" -> v{last['version']} {num(last['reward_mean'])}"
    faults = [FaultRecord.from_json(f) for f in summary.get("faults", [])]
    restarts = [f for f in faults if f.core_restart]
    said = []
    if restarts:  # the run went on past its core's loss: say what it cost
        steps = ", ".join(str(f.restart_step) for f in restarts)
        redone = sum(f.steps_redone or 0 for f in restarts)
        said.append(
            f"core restarted {len(restarts)}x (from checkpoint step {steps}); "
            f"{redone} finished steps trained again"
        )
    return [
        *said,
        f"done in {duration(seconds)}: makespan {summary['makespan_s']:.1f}s, reward first/last "
        f"quarter {num(summary['reward_first_quarter'])} -> "
        f"{num(summary['reward_last_quarter'])}{ev}",
        f"summary: {path}/summary.json",
    ]
