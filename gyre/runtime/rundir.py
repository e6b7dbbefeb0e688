"""One directory per run: the resolved config, metrics, TensorBoard events, traces, checkpoints.

Layout::

    config.toml          the resolved config, to read
    config.json          the same, exactly (TOML cannot hold None): what --resume reads back
    metrics.jsonl        one line per optimizer step (veRL-style names: actor/*, timing/*, batch/*,
                         sched/*, tools/*)
    evals.jsonl          one line per evaluation (apart from training rewards)
    executions.jsonl     one line per finished execution (reward or missing reason, harness outcome)
    tb/                  TensorBoard event files (the same scalars)
    traces/              the proxy's per-execution token-in/token-out traces
    workspaces/          harness workspaces (kept: a timeout is scored on it)
    checkpoints/         the core's checkpoints (weights, optimizer, step, data cursor)
    weights/             published HF weights the engines reload
    logs/                JSON-lines logs: driver.jsonl, cell-<i>.jsonl, standalone-<j>.jsonl (gyre.log)
    summary.json, timeline.png   written at the end
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.trace.agentstats import agent_metrics
from gyre.trace.toolhealth import tool_metrics

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from gyre.runtime.records import Records, StepRecord


def to_toml(data: dict[str, Any]) -> str:
    """A small TOML writer for configs (tables, scalars, lists of scalars or inline tables); None
    values are left out."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):  # inline table: a list of tables (run.cell_resources)
            return "{" + ", ".join(f"{key(k)} = {val(x)}" for k, x in v.items()) + "}"
        return json.dumps(str(v))

    def key(k: str) -> str:  # free-form keys (Ray resources such as "node:10.0.0.1") must be quoted
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)

    lines: list[str] = []

    def table(prefix: str, d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
        tables = {k: v for k, v in d.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{key(k)} = {val(v)}")
        for k, v in tables.items():
            table(f"{prefix}.{key(k)}" if prefix else key(k), v)

    table("", data)
    return "\n".join(lines).lstrip() + "\n"


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON: a non-finite float (a diverged loss, a 0/0 ratio) is written as null.
    ``json.dumps`` writes ``Infinity``/``NaN`` by default, which no other JSON reader takes
    and which a reader must then treat as missing anyway."""
    return json.dumps(_finite(obj), allow_nan=False, **kw)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 if it is gone)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(
            path
        ).resolve()  # cells (other processes, maybe other nodes) get absolute paths
        self.traces = self.path / "traces"
        self.workspaces = self.path / "workspaces"
        self.checkpoints = self.path / "checkpoints"
        self.weights = self.path / "weights"
        self.snapshots = str(self.path / "weights" / "snapshots")
        self.tb_dir = self.path / "tb"
        self.logs = self.path / "logs"
        self._tb: SummaryWriter | None = None
        self.step_rows: list[dict[str, Any]] = []
        self.eval_rows: list[dict[str, Any]] = []  # evals.jsonl as written (the live view reads it)

    def create(self) -> RunDir:
        for p in (
            self.path,
            self.traces,
            self.workspaces,
            self.checkpoints,
            self.weights,
            Path(self.snapshots),
            self.logs,
        ):
            # 0700: workspaces hold what harnesses wrote, traces the policy's calls; no other
            # local user has business in either (an existing folder is left as it is).
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self

    def clear_snapshots(self) -> int:
        """At the end of a run: the core's weight snapshots (what joining satellites pulled;
        two models) are scratch, and a resumed run writes its own. The bytes removed."""
        freed = 0
        for f in Path(self.snapshots).glob("*"):
            if f.is_file():
                freed += f.stat().st_size
                f.unlink(missing_ok=True)
        return freed

    # ------------------------------------------------------------------ writers
    def write_config(self, cfg) -> None:
        data = cfg.model_dump(mode="json")
        (self.path / "config.toml").write_text(to_toml(data))
        # TOML has no null: the exact copy lets --resume restore values set to None (e.g. trainer.j_max)
        (self.path / "config.json").write_text(json.dumps(data, indent=1))

    def _append(self, name: str, row: dict[str, Any], durable: bool = True) -> None:
        with open(self.path / name, "a") as f:
            f.write(dumps(row) + "\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())

    def replace_jsonl(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Write ``rows`` as the whole of ``name``, atomically (a reader sees the old file or
        the new one, never half of it): what a segment hands to the next."""
        tmp = self.path / f".{name}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(self.path / name)

    def log_execution(self, row: dict[str, Any]) -> None:
        """Flushed, not fsynced: the line survives a killed driver (it is in the page cache),
        and only a machine crash could lose it, which costs nothing on resume (execution ids
        carry the segment). An fsync here blocked the event loop once per execution: ~20 ms
        each on a loaded disk, seconds per burst at 100+ concurrent executions
        (bench/bench_scale.py)."""
        self._append("executions.jsonl", row, durable=False)

    def tb(self) -> SummaryWriter:
        if self._tb is None:
            # lazy: torch and tensorboard load once scalars are written, not when `gyre run`
            # only checks a config or reads a run directory to resume it
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.tb_dir))
        return self._tb

    def _scalars(self, prefix: str, row: dict[str, Any], step: int) -> None:
        w = self.tb()
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                w.add_scalar(f"{prefix}{k}", v, step)
        w.flush()

    def write_step(
        self, records: Records, rec: StepRecord, metrics: dict[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        """One metrics line for a finished step (and the same scalars to TensorBoard);
        ``status``: the scheduling policy's (waterlevel, capacity, running, queued)."""
        p = rec.pack
        scored = p.get("scored", 0)
        stale = [rec.version - v for _, v in rec.groups]
        dt = records.steps[-1][1] - records.steps[-1][0]
        now = records.now()
        row: dict[str, Any] = {
            "step": rec.step,
            "version": rec.version + 1,
            "time": round(now, 3),
            "reward/mean": p.get("reward_sum", 0.0) / scored if scored else None,
            "reward/pass_rate": p.get("passed", 0) / scored if scored else None,
            "batch/groups": len(rec.groups),
            "batch/executions_scored": scored,
            "batch/executions_missing": p.get("missing", 0),
            **{f"batch/{k}": v for k, v in p.items() if k.startswith("missing/")},  # by reason
            "batch/groups_all_equal": p.get("groups_all_equal", 0),
            "batch/executions_trained": p.get("executions_trained", 0),
            "batch/unreadable_traces": p.get("unreadable_traces", 0),
            "batch/staleness_mean": sum(stale) / len(stale) if stale else 0.0,
            "batch/staleness_max": max(stale) if stale else 0,
            **tool_metrics(p),  # tools/* and tools/by_profile/<profile>/*
            **agent_metrics(p),  # agent/* and tree/*
            "train/tokens": p.get("tokens", 0),
            "train/target_tokens": p.get("targets", 0),
            "train/micro_steps": p.get("micro_steps", 0),
            "train/tokens_per_s": p.get("tokens", 0) / dt if dt > 0 else 0.0,
            "train/claims": {str(c): n for c, n in sorted(rec.claims.items())},
            "timing/step": dt,
            **metrics,
            "groups": [f"g{g}" for g, _ in rec.groups],
        }
        row.update(
            {
                "sched/waterlevel": status.get("waterlevel"),
                "sched/capacity": status.get("capacity"),
                "sched/running": status.get("running"),
                "sched/queued": status.get("queued"),
            }
        )
        for c, share in enumerate(records.role_shares()):
            for role, s in share.items():
                row[f"cells/{c}/{role}_share"] = s
        self.step_rows.append(row)
        self._append("metrics.jsonl", row)
        self._scalars("", {k: v for k, v in row.items() if v is not None}, rec.step)
        return row

    def write_eval(self, row: dict[str, Any]) -> None:
        self.eval_rows.append(row)
        self._append("evals.jsonl", row)
        self._scalars(
            "eval/",
            {k: v for k, v in row.items() if k in ("reward_mean", "pass_rate") and v is not None},
            row["version"],
        )

    def write_cells(self, placement: list[dict[str, Any]]) -> None:
        """Where each cell (and standalone engine) runs: pid and Ray node, for operators and fault tests."""
        (self.path / "cells.json").write_text(json.dumps(placement, indent=2))

    def write_summary(self, summary: dict[str, Any]) -> None:
        (self.path / "summary.json").write_text(dumps(summary, indent=2))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    # ------------------------------------------------------------------ readers (resume)
    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        """Rows of a JSONL file; a torn last line (a crash mid-write) is dropped."""
        p = self.path / name
        if not p.exists():
            return []
        rows = []
        for line in p.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows

    def truncate_metrics(self, steps_done: int) -> int:
        """Keep only metrics of steps the checkpoint holds; returns how many lines were dropped."""
        rows = self.read_jsonl("metrics.jsonl")
        keep = [r for r in rows if r.get("step", 0) < steps_done]
        seen, uniq = set(), []
        for r in keep:
            if r["step"] not in seen:
                seen.add(r["step"])
                uniq.append(r)
        (self.path / "metrics.jsonl").write_text("".join(dumps(r) + "\n" for r in uniq))
        self.step_rows = uniq
        return len(rows) - len(uniq)
