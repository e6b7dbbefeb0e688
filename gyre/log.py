"""One logging setup for every Gyre process: each ``gyre`` command and each Ray actor of a run.

Two formats on stderr: ``text``, the message alone (what a ``gyre`` command has always
printed), and ``json``, one object per line for a log pipeline::

    {"ts": "2026-12-01T03:15:00.123Z", "level": "info", "logger": "gyre.runtime.cell",
     "msg": "cell 1: rollout -> training in 0.29 s (v3)", "event": "switch", "cell": 1, ...}

Every field a caller passes with ``extra=`` is a key of its own, so a message stays short and
the numbers stay machine-readable. A log *file* (a run's ``logs/*.jsonl``) is always JSON
lines, whatever the terminal shows: a run directory is read by programs (``jq``, ``gyre runs``),
like its ``metrics.jsonl``.

Gyre's own loggers (``gyre.*``) log at the level asked; every other library at WARNING or
above, so a chatty dependency (httpx logs each request at INFO) never floods a terminal.
Calling :func:`setup` again replaces what the last call installed, nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMAT_ENV = "GYRE_LOG_FORMAT"
LEVEL_ENV = "GYRE_LOG_LEVEL"

LogFormat = Literal["text", "json"]

# The attributes every LogRecord has: anything else on a record came in through ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}
_MARK = "_gyre_log"  # set on the handlers setup() installs, so a second call replaces them
_current: tuple[str, LogFormat] = ("warning", "text")  # setup()'s last stderr level and format


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts, level, logger, msg, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        out: dict[str, Any] = {
            "ts": ts.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_") and k not in out:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)  # json escapes newlines: one record, one line


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, not as it was at setup: ``gyre run``'s
    live panel swaps stderr for a proxy that prints lines above the panel instead of through it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use text or json")
    return JsonFormatter() if fmt == "json" else logging.Formatter("%(message)s")


def level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[level.upper()]


def problem(level: str, fmt: str) -> str | None:
    """What is wrong with a ``--log-level`` / ``--log-format`` pair, as one line (None: fine)."""
    if fmt not in FORMATS:
        return f"--log-format {fmt!r}: use text or json"
    if level.lower() not in LEVELS:
        return f"--log-level {level!r}: use one of {', '.join(LEVELS)}"
    return None


def setup(
    level: str | int = "warning",
    fmt: str = "text",
    *,
    file: str | Path | None = None,
    file_level: str | int | None = None,
) -> None:
    """Log ``gyre.*`` records at ``level`` and above to stderr in ``fmt``; with ``file``, also
    append JSON lines there at ``file_level`` (default ``level``). Other libraries: WARNING and
    above, to the same places. Raises ValueError naming a bad level or format."""
    global _current
    stderr_no, form = level_number(level), formatter(fmt)
    file_no = stderr_no if file_level is None else level_number(file_level)
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(h)
        h.close()
    handlers: list[logging.Handler] = [_Stderr()]
    handlers[0].setLevel(stderr_no)
    handlers[0].setFormatter(form)
    if file is not None:
        path = Path(file)
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(path, encoding="utf-8")  # flushed after every record
        fh.setLevel(file_no)
        fh.setFormatter(JsonFormatter())
        handlers.append(fh)
    for h in handlers:
        setattr(h, _MARK, True)
        root.addHandler(h)
    root.setLevel(logging.WARNING)
    gyre_no = min(stderr_no, file_no) if file is not None else stderr_no
    logging.getLogger("gyre").setLevel(gyre_no)
    _current = (logging.getLevelName(stderr_no).lower(), "json" if fmt == "json" else "text")


def current() -> tuple[str, LogFormat]:
    """(level, format) of stderr as the last :func:`setup` left it: what a command that adds a
    log file of its own (``gyre run``) or starts actors keeps."""
    return _current


@dataclass(frozen=True)
class LogSpec:
    """How a process Gyre starts logs (a run's Ray actors get one as a constructor argument):
    :func:`setup`'s arguments, applied in that process by :meth:`apply`."""

    level: str = "warning"
    fmt: str = "text"
    file: str | None = None
    file_level: str | None = None

    def apply(self) -> None:
        setup(self.level, self.fmt, file=self.file, file_level=self.file_level)


def from_env() -> tuple[str, str]:
    """(level, format) from ``GYRE_LOG_LEVEL`` / ``GYRE_LOG_FORMAT`` (defaults warning, text):
    how a process Gyre starts (a local trainer cell) inherits its parent's choice."""
    return os.environ.get(LEVEL_ENV, "warning"), os.environ.get(FORMAT_ENV, "text")


def setup_from_env() -> None:
    """:func:`setup` with :func:`from_env`'s choice; a bad value falls back to the defaults
    (a child process has no user to tell)."""
    level, fmt = from_env()
    try:
        setup(level, fmt)
    except ValueError:
        setup()
