"""A run directory as its files say it is: summary.json, metrics.jsonl, evals.jsonl,
executions.jsonl, config.json, checkpoints/, workload.json.

``gyre runs`` reads only these files (never a live world), so it works on a run that is
still going, one that was killed, and one written by an older Gyre. Anything missing or
torn reads as absent rather than failing, and so does a number that is not finite
(``Infinity``, ``NaN``, an integer past a float): a chart or a table has no place for one. A
received run directory is untrusted input: its files are read through :mod:`gyre.runs.safefs`
(regular files inside the run directory only).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.runs import safefs


def finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (not a bool); None otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def read_json(path: Path, root: Path | None = None) -> Any | None:
    """``root``: the run directory the file must lie in (default: the file's folder)."""
    text = safefs.read_text(root or path.parent, path)
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return None


def read_jsonl(path: Path, root: Path | None = None) -> list[dict[str, Any]]:
    """The file's rows; torn or non-object lines are skipped. ``root`` as for read_json."""
    text = safefs.read_text(root or path.parent, path)
    if text is None:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
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
    def policy(self) -> dict[str, Any]:
        pol = self.config.get("policy")
        return pol if isinstance(pol, dict) else {}

    @property
    def placement(self) -> str:
        pol = self.policy
        return str((self.summary or {}).get("placement") or pol.get("placement") or "?")

    @property
    def total_steps(self) -> int | None:
        t = self.policy.get("total_steps")
        return t if isinstance(t, int) else None

    @property
    def steps_done(self) -> int:
        """Steps with a metrics line (a killed run may have lines past its last checkpoint)."""
        steps = [r["step"] for r in self.metrics if isinstance(r.get("step"), int)]
        return max(steps) + 1 if steps else 0

    @property
    def rewards(self) -> list[tuple[int, float]]:
        out = []
        for r in self.metrics:
            v = finite(r.get("reward/mean"))
            if isinstance(r.get("step"), int) and v is not None:
                out.append((r["step"], v))
        return out

    @property
    def makespan(self) -> float | None:
        return finite((self.summary or {}).get("makespan_s"))

    @property
    def state(self) -> str:
        """finished: summary.json written; resumable: a checkpoint to go on from; stopped:
        ended before its first checkpoint (a resume starts it again from step 0)."""
        if self.summary is not None:
            return "finished"
        return "resumable" if self.checkpoints else "stopped"


def load_run(path: Path) -> Run:
    config, summary = read_json(path / "config.json"), read_json(path / "summary.json")
    return Run(
        path=path,
        config=config if isinstance(config, dict) else {},
        summary=summary if isinstance(summary, dict) else None,
        metrics=read_jsonl(path / "metrics.jsonl"),
        evals=read_jsonl(path / "evals.jsonl"),
        checkpoints=checkpoint_steps(path),
    )


def find_runs(out_dir: Path) -> list[Path]:
    """Run directories directly below ``out_dir`` (or ``out_dir`` itself), by name."""
    if is_run_dir(out_dir):
        return [out_dir]
    return sorted(p for p in out_dir.iterdir() if p.is_dir() and is_run_dir(p))
