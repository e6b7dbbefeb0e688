"""Experiment trackers (W&B, MLflow) fed from the run directory's own metric files.

The tracker does not hook into the world: a background thread tails ``metrics.jsonl``
and ``evals.jsonl`` (the files ``gyre run`` already writes, fsynced per line) and
forwards each new line, under the same names, to every configured sink. So a tracker
sees exactly what the run directory holds, and a slow or failing tracker can never
stall or kill training (its error is reported once and the run goes on).

``RUN_DIR/tracking.json`` keeps each sink's run id and the last step forwarded: a
``--resume`` reopens the same tracked run and forwards only the steps after it. Steps a
resume re-runs (those after the checkpoint) keep their first values in the trackers,
since W&B cannot rewrite a logged step; ``metrics.jsonl`` holds the re-run values.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from gyre.runtime.tracking_config import TrackingConfig
from gyre.runtime.tracking_sinks import Sink, open_sink

STATE = "tracking.json"


def numeric(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The row's numbers under their metrics.jsonl names; nested tables (``train/claims``)
    become ``train/claims/<key>``; lists, strings, None and booleans are left out."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(numeric(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


def _step(sink: Sink, step: int, values: dict[str, float]) -> None:
    sink.log_step(step, values)


def _eval(sink: Sink, version: int, values: dict[str, float]) -> None:
    sink.log_eval(version, values)


class _Tail:
    """New complete lines of a JSONL file since the last read (a rewrite starts over)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.lines = path, 0, 0  # lines: complete lines read so far

    def read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated (resume) or rewritten: read it again
            self.offset = self.lines = 0
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        rows: list[dict[str, Any]] = []
        for line in data[:end].splitlines():
            self.lines += 1
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                rows.append({})  # keeps the line count; forwards nothing
        return rows


class Tracker:
    """The run's sinks, their persisted state, and the thread that feeds them."""

    def __init__(
        self,
        cfg: TrackingConfig,
        run_dir: Path,
        config: dict[str, Any],
        warn: Callable[[str], None] = print,
    ):
        self.cfg, self.run_dir, self.warn = cfg, Path(run_dir).resolve(), warn
        state_path = self.run_dir / STATE
        self.state: dict[str, Any] = (
            json.loads(state_path.read_text()) if state_path.is_file() else {}
        )
        self.sinks: list[Sink] = []
        for name in cfg.sinks:
            prior = self.state.get(name, {}).get("run_id")
            sink = open_sink(name, cfg, self.run_dir, config, prior)
            self.state.setdefault(name, {})["run_id"] = sink.run_id
            self.sinks.append(sink)
        self._metrics = _Tail(self.run_dir / "metrics.jsonl")
        self._evals = _Tail(self.run_dir / "evals.jsonl")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed: set[str] = set()
        self._save()
        self._thread = threading.Thread(target=self._loop, name="gyre-tracking", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        (self.run_dir / STATE).write_text(json.dumps(self.state, indent=1))

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.interval_s):
            self.poll()

    def _each(self, what: str, fn: Callable[[Sink], None]) -> None:
        for sink in self.sinks:
            if sink.name in self._failed:
                continue
            try:
                fn(sink)
            # broad on purpose: a tracker (a third-party SDK, raising anything) never stops
            # training; it is reported and gets no more data
            except Exception as e:
                self._failed.add(sink.name)
                self.warn(f"tracking: {sink.name} failed ({what}: {e}); it gets no more data")

    def poll(self) -> int:
        """Forward the lines written since the last poll; returns how many steps went out."""
        with self._lock:
            last = self.state.get("last_step", -1)
            steps = [r for r in self._metrics.read() if r.get("step", -1) > last]
            first = self._evals.lines  # evals.jsonl only grows: forward lines past the count
            done = self.state.get("evals", 0)
            evals = self._evals.read()
            new_evals = [r for i, r in enumerate(evals, first) if i >= done and r]
            for row in steps:
                step, values = int(row["step"]), numeric(row)
                self._each("metrics", partial(_step, step=step, values=values))
                last = step
            for row in new_evals:
                version, values = int(row.get("version", 0)), numeric(row)
                self._each("evals", partial(_eval, version=version, values=values))
            self.state.update(last_step=last, evals=max(done, self._evals.lines))
            if steps or new_evals:
                self._save()
            return len(steps)

    def close(self, summary: dict[str, Any] | None) -> None:
        """Last lines, the summary (None: the run stopped early), and finish each sink."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.poll()
        if summary is not None:
            self._each("summary", lambda s: s.log_summary(summary))
        self._each("finish", lambda s: s.finish(ok=summary is not None))
        self._save()


def open_tracker(
    cfg: TrackingConfig, run_dir: Path, config: dict[str, Any], warn: Callable[[str], None]
) -> Tracker | None:
    """A tracker for the configured sinks (None when there are none)."""
    return Tracker(cfg, run_dir, config, warn) if cfg.sinks else None
