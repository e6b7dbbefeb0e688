"""Durable per-execution traces: one JSON Lines file per execution.

Append-only with a flush (and optional fsync) per record, so a proxy that dies
loses at most the call it was writing, and a half-written last line is detected
and reported by the reader instead of poisoning the whole file.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .record import TraceFormatError, TraceRecord

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def trace_path(root: str | Path, execution_id: str) -> Path:
    """Where an execution's trace lives; ids are sanitised so none escapes root."""
    name = _SAFE.sub("_", execution_id) or "_"
    return Path(root) / f"{name}.jsonl"


class TraceWriter:
    """Appends records to per-execution files under ``root``.

    Thread-safe; file handles are opened lazily and kept until ``close``.
    """

    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._files: dict[str, IO[str]] = {}
        self._lock = threading.Lock()

    def append(self, record: TraceRecord) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":"))
        with self._lock:
            f = self._files.get(record.execution_id)
            if f is None:
                f = open(trace_path(self.root, record.execution_id), "a", encoding="utf-8")
                self._files[record.execution_id] = f
            f.write(line + "\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())

    def close_execution(self, execution_id: str) -> None:
        with self._lock:
            f = self._files.pop(execution_id, None)
            if f is not None:
                f.close()

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


@dataclass
class TraceReadResult:
    records: list[TraceRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per unusable line/record


def read_trace(path: str | Path, vocab_size: int | None = None) -> TraceReadResult:
    """Read one execution's trace; bad records are reported, good ones kept."""
    out = TraceReadResult()
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                out.errors.append(f"{path}:{lineno}: truncated or malformed JSON ({e.msg})")
                continue
            try:
                rec = TraceRecord.from_json(d)
                rec.validate(vocab_size)
            except TraceFormatError as e:
                out.errors.append(f"{path}:{lineno}: {e}")
                continue
            out.records.append(rec)
    return out
