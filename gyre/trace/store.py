"""Durable per-execution traces: one JSON Lines file per execution.

Append-only with a flush (and optional fsync) per record, so a proxy that dies
loses at most the call it was writing - a call its client never saw answered.
Such a call can leave a torn last line; the writer cuts it off (into a
``.torn`` side file) before it appends again, so the next record never lands on
the fragment. Open file handles are bounded (LRU, idle close): a proxy serves an
unbounded number of executions with a fixed number of descriptors.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from .record import TraceFormatError, TraceRecord

_KEEP = frozenset(string.ascii_letters + string.digits + "-_.")
_MAX_NAME = 200  # bytes before ".jsonl"; file systems allow 255


def trace_name(execution_id: str) -> str:
    """The file stem of an execution's trace: an injective, path-safe encoding of its id.

    Characters in ``[A-Za-z0-9._-]`` are kept (a leading ``.`` is not, so no hidden
    files); every other character becomes ``%XX`` per UTF-8 byte, like URL
    percent-encoding. Distinct ids therefore never share a file (``job/1``,
    ``job_1`` and ``job 1`` are three files). A name longer than 200 bytes is cut
    and suffixed with ``~`` and 128 bits of the id's SHA-256 (``~`` never occurs
    in a short name).
    """
    if not execution_id:
        raise ValueError("execution id must be non-empty")
    raw = execution_id.encode("utf-8", "surrogatepass")
    out: list[str] = []
    for i, ch in enumerate(execution_id):
        if ch in _KEEP and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    name = "".join(out)
    if len(name) > _MAX_NAME:
        name = name[:160] + "~" + hashlib.sha256(raw).hexdigest()[:32]
    return name


def trace_path(root: str | Path, execution_id: str) -> Path:
    """Where an execution's trace lives (``<root>/<trace_name(id)>.jsonl``); none escapes root."""
    return Path(root) / f"{trace_name(execution_id)}.jsonl"


def torn_path(path: str | Path) -> Path:
    """The side file a trace's torn tails are moved to."""
    path = Path(path)
    return path.with_name(path.name + ".torn")


def repair_tail(path: str | Path) -> int:
    """Cut an unterminated last line off a trace file; returns the bytes removed.

    A record is acknowledged to its client only after its whole line (newline
    included) was written, so a line without its newline belongs to a call the
    client never saw answered. The fragment is kept, best effort, in
    :func:`torn_path` for inspection; the file is truncated after its last newline.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        keep, pos = 0, size
        while pos > 0:
            start = max(0, pos - (1 << 20))
            chunk = os.pread(fd, pos - start, start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        try:
            with open(torn_path(path), "ab") as side:
                side.write(os.pread(fd, size - keep, keep) + b"\n")
        except OSError:
            pass  # the fragment is an unanswered call; losing it is better than gluing onto it
        os.ftruncate(fd, keep)
        os.fsync(fd)
        return size - keep
    finally:
        os.close(fd)


@dataclass
class _Handle:
    fd: int
    size: int
    used: float


class TraceWriter:
    """Appends records to per-execution files under ``root``.

    Thread-safe. A handle is opened on demand (after :func:`repair_tail`), kept
    while the execution is active, and closed when the execution is closed, when
    more than ``max_open`` are open (least recently used first) or by
    :meth:`close_idle`; a later record reopens it for append. A write that fails
    (ENOSPC, EIO) is undone - the file is truncated back to its last complete
    record - and the error raised, so the caller can refuse the call instead of
    answering it unrecorded.
    """

    def __init__(self, root: str | Path, fsync: bool = True, max_open: int = 128) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.max_open = max(1, max_open)
        self._files: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()
        self.repaired_bytes = 0  # torn tails cut off since start (a crash or a full disk before)

    @property
    def open_files(self) -> int:
        return len(self._files)

    def _handle(self, execution_id: str) -> _Handle:
        h = self._files.get(execution_id)
        if h is not None:
            self._files.move_to_end(execution_id)
            return h
        while len(self._files) >= self.max_open:
            _, old = self._files.popitem(last=False)
            os.close(old.fd)
        path = trace_path(self.root, execution_id)
        self.repaired_bytes += repair_tail(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        h = self._files[execution_id] = _Handle(
            fd=fd, size=os.fstat(fd).st_size, used=time.monotonic()
        )
        return h

    def append(self, record: TraceRecord) -> None:
        data = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            h = self._handle(record.execution_id)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(h.fd, view) :]
                if self.fsync:
                    os.fsync(h.fd)
            except OSError:
                try:  # undo the partial line; if even that fails, reopening repairs it
                    os.ftruncate(h.fd, h.size)
                except OSError:
                    pass
                self._close(record.execution_id)
                raise
            h.size += len(data)
            h.used = time.monotonic()

    def _close(self, execution_id: str) -> None:
        h = self._files.pop(execution_id, None)
        if h is not None:
            os.close(h.fd)

    def close_execution(self, execution_id: str) -> None:
        with self._lock:
            self._close(execution_id)

    def close_idle(self, idle_s: float) -> int:
        """Close handles unused for ``idle_s`` seconds; returns how many were closed."""
        cutoff = time.monotonic() - idle_s
        with self._lock:
            idle = [k for k, h in self._files.items() if h.used < cutoff]
            for k in idle:
                self._close(k)
        return len(idle)

    def close(self) -> None:
        with self._lock:
            for h in self._files.values():
                os.close(h.fd)
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
