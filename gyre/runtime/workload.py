"""``RUN_DIR/workload.json``: what the run did, for ``gyre sim --workload`` to replay.

The contract (format ``gyre-workload/1``) is documented in docs/runtime.md: every
training execution with its realised duration (launch -> scored, what the simulator
replays), calls and reward or missing reason; the costs measured in this run
(:mod:`gyre.runtime.measure`); the measured makespan, staleness and role segments for
the Gantt chart. Written at the end of a run, and with what it has when a run stops early.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.runtime import measure
from gyre.runtime.measure import Call
from gyre.trace.store import read_trace

if TYPE_CHECKING:
    from gyre.policy.config import PolicyConfig
    from gyre.runtime.cluster import Cluster
    from gyre.runtime.executions import ExecutionRunner
    from gyre.runtime.longtail import LongTail
    from gyre.runtime.records import Records
    from gyre.runtime.rundir import RunDir

FORMAT = "gyre-workload/1"
_EID = re.compile(r"^r\d+-g(\d+)-a(\d+)$")
CUT = "cancelled"  # the missing reason of an execution the run's end cut short (gyre.sim.replay)
_SWITCHING = {"to_training": "switching", "to_rollout": "switching"}


def read_calls(
    trace_dir: Path, wall_offset: float, drop: frozenset[str] | set[str] = frozenset()
) -> list[Call]:
    """Every training call the proxy recorded, on the run's clock (eval executions skipped,
    and those of the executions in ``drop``)."""
    calls = []
    for p in sorted(Path(trace_dir).rglob("*.jsonl")):
        for r in read_trace(p).records:
            m = _EID.match(r.execution_id)
            if not m or r.execution_id in drop:
                continue
            calls.append(
                Call(
                    gid=int(m.group(1)),
                    attempt=int(m.group(2)),
                    start=r.t_start - wall_offset,
                    end=r.t_end - wall_offset,
                    tokens=len(r.output_ids),
                    engines=len({s.engine_id for s in r.segments}),
                    versions=tuple((s.policy_version, s.end - s.start) for s in r.segments),
                )
            )
    return calls


def _abandoned(rundir: RunDir, lines: list[dict[str, Any]], segment: int) -> set[str]:
    """Executions of earlier segments that never finished (the driver died under them): a
    resume relaunched them under this segment's id, so their partial calls are left out."""
    done = {r["execution"] for r in lines}
    out = set()
    for p in Path(rundir.traces).rglob("*.jsonl"):
        m = re.match(r"^r(\d+)-g\d+-a\d+$", p.stem)
        if m and int(m.group(1)) < segment and p.stem not in done:
            out.add(p.stem)
    return out


def capacity_intervals(
    records: Records, policy: PolicyConfig, end: float
) -> list[tuple[float, float, float]]:
    """(start, end, executions the rollout cells can serve) from the run's role segments."""
    p = policy
    segs = records.role_segments(end)
    cuts = sorted({t for cs in segs for s, e, _ in cs for t in (s, e) if t <= end} | {0.0, end})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        if b <= a:
            continue
        mid = (a + b) / 2
        n = sum(1 for cs in segs if any(s <= mid < e and r == "rollout" for s, e, r in cs))
        out.append((a, b, float(n * p.cell_capacity + p.standalone_capacity)))
    return out


def _executions(
    records: Records, rows: dict[tuple[int, int], dict[str, Any]], lt: LongTail | None, end: float
) -> list[dict[str, Any]]:
    """Every training execution in launch order: realised duration, calls, outcome."""
    executions = []
    for (gid, att), (t0, t1) in sorted(records.exec_times.items(), key=lambda kv: kv[1][0]):
        r = rows.get((gid, att), {})
        cut = t1 is None  # still running when the run ended: cut short, not realised
        t_end = end if t1 is None else t1
        executions.append(
            {
                "group": gid,
                "attempt": att,
                "cell": None,  # serving is pooled: the proxy moves calls between engines
                "launched_s": round(t0, 4),
                "duration_s": round(t_end - t0, 4),
                "drawn_s": None if lt is None else round(lt.planned(gid, att).duration_s, 4),
                "calls": (r.get("model_calls") or {}).get("attempted"),
                "reward": r.get("reward"),
                "missing": CUT if cut else r.get("missing"),
                # capped by the draw (the harness stops itself there) or by the executor
                "harness_timeout": bool(lt and lt.planned(gid, att).harness_timeout)
                or r.get("harness_stop") == "harness_timeout",
                "interrupted": bool(r.get("failed", False)),
                "dispatch_version": r.get("dispatch_version"),
                "served_versions": r.get("served_versions"),
            }
        )
    return executions


def _costs(records: Records, policy: PolicyConfig, calls: list[Call], end: float) -> dict[str, Any]:
    """The costs this run measured (gyre.runtime.measure), in the simulator's terms."""
    sw = records.switch_seconds()
    exec_iv = [(s, end if e is None else e) for s, e in records.exec_times.values()]
    return {
        "train_microstep_s": measure.microstep_s(records.micros),
        "optim_s": measure.median(e - s for s, e in records.optims),
        "publish_s": measure.median(x["seconds"] for x in records.publications),
        "switch_to_training_s": measure.median(sw["training"]),
        "switch_to_rollout_s": measure.median(sw["rollout"]),
        "reshard_s": None,  # no resharding apart from the switch itself (engine <-> replica)
        "satellite_refresh_s": measure.refresh_s(records.micros, records.segments),
        "reroute_delay_s": measure.reroute_delay_s(calls),
        "rollout_speed": measure.rollout_speed(
            calls, exec_iv, capacity_intervals(records, policy, end)
        ),
    }


def _staleness(records: Records, policy: PolicyConfig, calls: list[Call]) -> dict[str, Any]:
    """Staleness per finished step three ways (tokens, executions, dispatch) and their
    steady-state means."""
    p = policy
    by_exec: dict[tuple[int, int], list[Call]] = {}
    for c in calls:
        by_exec.setdefault((c.gid, c.attempt), []).append(c)
    token_st, exec_st, dispatch_st = [], [], []
    for rec in records.finished_steps:
        toks = [
            c
            for gid, _ in rec.groups
            for a in range(p.group_size)
            for c in by_exec.get((gid, a), [])
        ]
        token_st.append(measure.token_staleness(rec.version, toks))
        execs = [by_exec.get((gid, a), []) for gid, _ in rec.groups for a in range(p.group_size)]
        exec_st.append(measure.serving_staleness(rec.version, execs))
        dispatch_st.append(statistics.fmean(rec.version - v for _, v in rec.groups))
    k = measure.steady_from(p.phi, p.mu)
    steady_tok = [s for s in token_st[k:] if s is not None]
    steady_exec = [s for s in exec_st[k:] if s is not None]
    return {
        "staleness_mean": statistics.fmean(steady_tok) if steady_tok else None,
        "staleness_dispatch_mean": statistics.fmean(dispatch_st[k:]) if dispatch_st[k:] else None,
        # by serving version, each execution weighing alike (E[d] counts groups, not tokens)
        "staleness_execution_mean": statistics.fmean(steady_exec) if steady_exec else None,
        "staleness_per_step": {
            "tokens": token_st,
            "executions": exec_st,
            "dispatch": dispatch_st,
            "steady_from": k,
        },
    }


def _timeline(records: Records, end: float) -> dict[str, Any]:
    """Role segments (switching as one role), compute intervals, steps and publications."""
    return {
        "segments": [
            [c, _SWITCHING.get(r, r), round(s, 4), round(min(e, end), 4)]
            for c, segs in enumerate(records.role_segments(end))
            for s, e, r in segs
            if min(e, end) > s
        ],
        "busy": [[c, round(s, 4), round(e, 4)] for c, iv in enumerate(records.busy) for s, e in iv],
        "steps": [[round(s, 4), round(e, 4)] for s, e in records.steps],
        "publications": [round(x["time"], 4) for x in records.publications],
    }


def _groups(records: Records) -> list[dict[str, Any]]:
    """Every group a finished step trained (or that computed before the run stopped), with the
    seconds of its non-empty micro-steps and their count (0 and 0: its rewards were all equal,
    so it trained nothing)."""
    trained = {g for st in records.finished_steps for g, _ in st.groups}
    return [
        {
            "group": g,
            "train_s": round(sum(records.group_train.get(g, [])), 4),
            "micro_steps": len(records.group_train.get(g, [])),
        }
        for g in sorted(trained | set(records.group_train))
    ]


def build(
    records: Records, cluster: Cluster, execs: ExecutionRunner, rundir: RunDir
) -> dict[str, Any]:
    """The workload.json document; ``cluster`` and ``execs`` give their live counters."""
    cfg = cluster.cfg
    p = cfg.policy
    end = records.makespan if records.makespan is not None else records.now()
    wall_offset = time.time() - records.now()
    lines = rundir.read_jsonl("executions.jsonl")
    rows = {(r["group"], r["attempt"]): r for r in lines}
    calls = read_calls(rundir.traces, wall_offset, _abandoned(rundir, lines, records.segment))
    lt = execs.longtail
    errors_5xx = int(cluster.proxy.stats().get("counters", {}).get("errors_5xx", 0))
    return {
        "format": FORMAT,
        "seed": cfg.seed,
        "placement": p.placement.value,
        "policy": p.model_dump(mode="json"),
        "draw": None
        if lt is None
        else {**lt.cfg.describe(), "groups": lt.groups, "group_size": p.group_size},
        "executions": _executions(records, rows, lt, end),
        "costs": _costs(records, p, calls, end),
        # each trained group's own compute: its non-empty micro-steps are indivisible blocks
        # (one packed task each), which a mean per micro-step spreads too evenly over cells
        "groups": _groups(records),
        "measured": {
            "makespan_s": records.makespan,
            "steps_done": len(records.finished_steps),
            **_staleness(records, p, calls),
            "interrupted": execs.failed + errors_5xx,
            "moved_calls": sum(1 for c in calls if c.engines > 1),
            **_timeline(records, end),
        },
    }


def write(records: Records, cluster: Cluster, execs: ExecutionRunner, rundir: RunDir) -> Path:
    path = Path(rundir.path) / "workload.json"
    path.write_text(json.dumps(build(records, cluster, execs, rundir), indent=1))
    return path


def save(
    records: Records, cluster: Cluster, execs: ExecutionRunner, rundir: RunDir, progress
) -> None:
    """Write workload.json; a failure is reported and never hides how the run itself ended."""
    try:
        write(records, cluster, execs, rundir)
    # broad on purpose: a record of the run (any error writing it) must not mask how the run
    # itself ended; it is reported in one line
    except Exception as e:
        progress.message(f"workload.json not written: {type(e).__name__}: {e}")
