"""What a finished run says about itself: ``summary.json`` and ``timeline.png``.

Interruptions and reroutes are counted from the proxy's and executor's own records
(answers that failed, harnesses that failed, trace records whose output spans engines),
never from what the policy believed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.runtime import measure
from gyre.runtime.rundir import tree_bytes
from gyre.sim.plot import plot_gantt
from gyre.trace.store import read_trace

if TYPE_CHECKING:
    from gyre.runtime.cluster import Cluster
    from gyre.runtime.executions import ExecutionRunner
    from gyre.runtime.records import Records
    from gyre.runtime.rundir import RunDir


def trace_reroutes(trace_dir: Path) -> dict[str, Any]:
    """Calls whose output was sampled on more than one engine (moved mid-generation, partial
    output kept); ``engine_tokens_per_s`` over every call (see :func:`measure.tokens_per_s`)."""
    records = multi = 0
    calls: list[tuple[int, float]] = []
    for p in Path(trace_dir).rglob("*.jsonl"):
        for r in read_trace(p).records:
            records += 1
            calls.append((len(r.output_ids), r.t_end - r.t_start))
            if len({s.engine_id for s in r.segments}) > 1:
                multi += 1
    return {
        "records": records,
        "resumed_with_partial_output": multi,
        "engine_tokens_per_s": measure.tokens_per_s(calls),
    }


def regime(records: Records, engine_tokens_per_s: float | None, calibration: dict | None) -> dict:
    """What fixes a placement comparison's outcome (docs/measurements.md, "Regimes"): how much
    of the cells' time training takes, what a micro-step and an optimizer step cost, how fast
    the engines answer, and how fast this machine was at a cell's CPU share when the run began."""
    end = records.makespan if records.makespan is not None else records.now()
    return {
        "training_share": measure.training_share(records.role_segments(end), end),
        "compute_share": measure.compute_share(records.busy, end),
        "microstep_s": measure.microstep_s(records.micros),
        "optim_s": measure.median(e - s for s, e in records.optims),
        "engine_tokens_per_s": engine_tokens_per_s,
        "calibration": calibration,
    }


def _in_memory(sent: list[dict]) -> dict[str, int]:
    """Publications sent in memory, how many as deltas, bytes sent (per engine) and the raw
    bytes of the same tensors."""
    return {
        "count": len(sent),
        "deltas": sum(s["encoding"] != "raw" for s in sent),
        "bytes": sum(s["bytes"] for s in sent),
        "raw_bytes": sum(s["raw_bytes"] for s in sent),
    }


def disk_bytes(rundir) -> dict[str, int]:
    """Bytes the run directory holds, by what holds them (checkpoints and published weights are
    one model each; their number is bounded by trainer.checkpoint.keep and run.keep_published)."""

    snaps = tree_bytes(Path(rundir.snapshots))
    out = {
        "checkpoints": tree_bytes(rundir.checkpoints),
        "published_weights": tree_bytes(rundir.weights) - snaps,
        "snapshots": snaps,
        "traces": tree_bytes(rundir.traces),
    }
    out["total"] = tree_bytes(rundir.path)
    return out


def _quarters(values: list[float]) -> tuple[float | None, float | None]:
    q = max(1, len(values) // 4)
    if len(values) < 2:
        return None, None
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


def execution_counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Finished / failed / missing training executions in ``executions.jsonl`` rows: every
    segment of a resumed run, not only the last one (whose counters start at zero)."""
    reasons: dict[str, int] = {}
    for r in rows:
        if r.get("missing") is not None:
            reasons[str(r["missing"])] = reasons.get(str(r["missing"]), 0) + 1
    return {
        "finished": len(rows),
        "failed": sum(1 for r in rows if r.get("failed")),
        "missing": sum(reasons.values()),
        "missing_by_reason": reasons,
    }


# the summary's name of each engine count a cell logs (gyre.runtime.cell.SERVED)
_ENGINE_COUNTS = {
    "hits": "prefix_cache_hits",
    "misses": "prefix_cache_misses",
    "hit_tokens": "prefix_cache_hit_tokens",
    "prefill_tokens": "prefill_tokens",
}


def prefix_cache(rundir: RunDir) -> dict[str, Any]:
    """The embedded engines' prefix cache over the run, from the cells' switch records (each
    rollout phase's engine, counted when it leaves) and the phases the run's end closed
    (``engine_phase``). ``hit_rate`` is the share of admitted prompts that found a shared
    prefix (another turn of their conversation, or the system prompt of another);
    ``token_share`` the share of prompt tokens served from the cache instead of prefilled.
    Empty when no engine reported (vLLM, SGLang, a run still going)."""
    got = dict.fromkeys(_ENGINE_COUNTS, 0)
    phases = 0
    for log in sorted(rundir.logs.glob("cell-*.jsonl")):
        for r in rundir.read_jsonl(f"{rundir.logs.name}/{log.name}"):
            e = r.get("engine") if r.get("event") in ("switch", "engine_phase") else None
            if isinstance(e, dict):
                phases += 1
                for k, stat in _ENGINE_COUNTS.items():
                    got[k] += int(e.get(stat, 0))
    if not phases:
        return {}
    lookups, prompt = got["hits"] + got["misses"], got["hit_tokens"] + got["prefill_tokens"]
    return {
        "engine_phases": phases,
        **got,
        "hit_rate": round(got["hits"] / lookups, 4) if lookups else None,
        "token_share": round(got["hit_tokens"] / prompt, 4) if prompt else None,
    }


def summarize(
    records: Records,
    cluster: Cluster,
    execs: ExecutionRunner,
    rundir: RunDir,
    policy,
    calibration: dict | None = None,
) -> dict[str, Any]:
    """``policy``: this segment's scheduling policy; None for a segment that only finished a
    run whose steps were all done before it was killed. ``cluster`` and ``execs`` give their
    live counters (proxy, engines, executions of this segment); ``calibration`` is
    :func:`gyre.runtime.calibrate.calibrate`'s record from this segment's start."""
    stats = cluster.proxy.stats()
    counters = stats.get("counters", {})
    pool = stats.get("pool", {}).get("counters", {})
    rows = rundir.read_jsonl("metrics.jsonl")
    rewards = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    first, last = _quarters(rewards)
    sw = records.switch_seconds()
    ex = execs
    pubs = records.publications
    every = execution_counts(rundir.read_jsonl("executions.jsonl"))
    reroutes = trace_reroutes(rundir.traces)
    tok_s = reroutes.pop("engine_tokens_per_s")
    return {
        "placement": cluster.cfg.policy.placement.value,
        "makespan_s": records.makespan,
        "steps": len(rows),
        "steps_this_segment": len(records.finished_steps),
        "segment": records.segment,
        "reward_first_quarter": first,
        "reward_last_quarter": last,
        "executions": {  # the whole run, all segments
            **every,
            "this_segment": {
                "finished": ex.finished,
                "failed": ex.failed,
                "missing": ex.missing,
                "missing_by_reason": dict(ex.missing_reasons),
                # finished in the killed segment, kept for their groups, not run again
                "restored": records.restored,
            },
        },
        # failed harnesses of the whole run; 5xx answers of this segment's proxy (a killed
        # segment's proxy counters die with it)
        "interrupted_executions": every["failed"] + int(counters.get("errors_5xx", 0)),
        "proxy": {
            "answered": counters.get("answered", 0),
            "errors_5xx": counters.get("errors_5xx", 0),
            "moved_calls": pool.get("moved", 0),
            # of those, moved with their K/V (gyre.proxy.kvmove): bytes, and the prefill
            # time the targets estimate they skipped, less the transfers
            "kv_migrated_calls": pool.get("kv_migrated", 0),
            "kv_bytes": pool.get("kv_bytes", 0),
            "kv_saved_s": pool.get("kv_saved_s", 0.0),
            "engine_errors": pool.get("engine_errors", 0),
            **reroutes,
        },
        "prefix_cache": prefix_cache(rundir),
        "switches": {
            d: {
                "count": len(v),
                "mean_s": statistics.fmean(v) if v else None,
                "max_s": max(v) if v else None,
            }
            for d, v in sw.items()
        },
        "publications": {
            "count": len(pubs),
            "mean_s": statistics.fmean([p["seconds"] for p in pubs]) if pubs else None,
            # engine loads of published weights checked against the core's (publications, the
            # final one too, and cells returning to rollout)
            "engines_checked": cluster.publications.checked,
            # engine loads sent in memory (run.publication = "distributed"), and what was sent
            "engines_in_memory": cluster.publications.in_memory,
            "in_memory": _in_memory([p["memory"] for p in pubs if "memory" in p]),
        },
        "role_shares": records.role_shares(),
        # the main loop's own cost per event (policy.handle + world.carry_out), ms
        "controller": records.controller.summary(records.assigns),
        "regime": regime(records, tok_s, calibration),
        "evals": rundir.read_jsonl("evals.jsonl"),
        "cells": cluster.placement,
        # this segment's start-up, seconds per phase: Ray, the cell actors and their gloo
        # world, the first engines, the standalone pool, the proxy
        "startup": cluster.startup,
        "engine_urls": cluster.engine_urls,  # per cell, every URL its engines served at
        "dead_engines": cluster.dead_engines,
        "faults": [
            f.to_json() for f in records.faults
        ],  # every cell lost: when, how found, what was done, its cost
        "disk_bytes": disk_bytes(rundir),  # at the end, after the scratch below went
        "disk_dropped_at_end": records.dropped_at_end,
        "policy": policy.status() if policy is not None else {"steps_done": 0, "done": True},
    }


@dataclass
class Timeline:
    """The real run in the shape :func:`gyre.sim.plot.plot_gantt` draws (seconds on the axis)."""

    makespan_h: float
    training_share: list[float]
    lower_bound_h: float
    efficiency: float
    mean_staleness: float
    interrupted_executions: int
    timeline: dict[str, Any]


def write_timeline(records: Records, rundir: RunDir, summary: dict[str, Any]) -> Path:
    end = records.makespan or records.now()
    rows = rundir.read_jsonl("metrics.jsonl")
    stale = [r["batch/staleness_mean"] for r in rows]
    tl = Timeline(
        makespan_h=end,
        training_share=[s.get("training", 0.0) for s in records.role_shares()],
        lower_bound_h=0.0,
        efficiency=float("nan"),
        mean_staleness=statistics.fmean(stale) if stale else 0.0,
        interrupted_executions=summary["interrupted_executions"],
        timeline={
            "segments": records.segments,
            "busy": records.busy,
            "steps": records.steps,
            "publications": [p["time"] for p in records.publications],
        },
    )
    path = rundir.path / "timeline.png"
    plot_gantt(
        {f"{summary['placement']} (real run, seconds)": tl},
        path,
        title=f"gyre run: {summary['steps']} steps, makespan {end:.0f} s",
        unit="s",
    )
    return path
