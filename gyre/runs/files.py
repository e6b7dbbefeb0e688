"""A run directory as its files say it is: summary.json, metrics.jsonl, evals.jsonl,
executions.jsonl, config.json, checkpoints/, workload.json.

``gyre runs`` reads only these files (never a live world), so it works on a run that is
still going, one that was killed, and one written by an older Gyre. Anything missing or
torn reads as absent rather than failing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The file's rows; torn or non-object lines are skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def is_run_dir(path: Path) -> bool:
    """``gyre run`` writes config.toml first (a model directory has a config.json too)."""
    return (path / "config.toml").is_file()


def checkpoint_steps(path: Path) -> list[int]:
    """Steps of the checkpoints that finished writing (``step-N/trainer_state.json``)."""
    root = path / "checkpoints"
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = re.fullmatch(r"step-(\d+)", d.name)
        if m and (d / "trainer_state.json").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


@dataclass
class Run:
    """What one run directory holds."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any] | None
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def placement(self) -> str:
        pol = self.config.get("policy") or {}
        return str((self.summary or {}).get("placement") or pol.get("placement") or "?")

    @property
    def total_steps(self) -> int | None:
        t = (self.config.get("policy") or {}).get("total_steps")
        return t if isinstance(t, int) else None

    @property
    def steps_done(self) -> int:
        """Steps with a metrics line (a killed run may have lines past its last checkpoint)."""
        steps = [r["step"] for r in self.metrics if isinstance(r.get("step"), int)]
        return max(steps) + 1 if steps else 0

    @property
    def rewards(self) -> list[tuple[int, float]]:
        return [
            (r["step"], float(r["reward/mean"]))
            for r in self.metrics
            if isinstance(r.get("step"), int) and isinstance(r.get("reward/mean"), (int, float))
        ]

    @property
    def makespan(self) -> float | None:
        m = (self.summary or {}).get("makespan_s")
        return float(m) if isinstance(m, (int, float)) else None

    @property
    def state(self) -> str:
        """finished: summary.json written; resumable: a checkpoint to go on from; stopped:
        ended before its first checkpoint (a resume starts it again from step 0)."""
        if self.summary is not None:
            return "finished"
        return "resumable" if self.checkpoints else "stopped"


def load_run(path: Path) -> Run:
    return Run(
        path=path,
        config=read_json(path / "config.json") or {},
        summary=read_json(path / "summary.json"),
        metrics=read_jsonl(path / "metrics.jsonl"),
        evals=read_jsonl(path / "evals.jsonl"),
        checkpoints=checkpoint_steps(path),
    )


def find_runs(out_dir: Path) -> list[Path]:
    """Run directories directly below ``out_dir`` (or ``out_dir`` itself), by name."""
    if is_run_dir(out_dir):
        return [out_dir]
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and is_run_dir(p))
