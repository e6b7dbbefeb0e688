"""gyre.log: text stays the bare message, json is one object per line with the extra fields,
a log file is JSON lines, and the ``gyre`` options choose between them."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre import log
from gyre.cli import app

KEYS = {"ts", "level", "logger", "msg"}


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch):
    """Each test starts and ends with no handler of gyre.log's, the levels as they were, and the
    exported choice undone (the CLI's callback writes os.environ)."""
    monkeypatch.setenv(log.FORMAT_ENV, "text")
    monkeypatch.setenv(log.LEVEL_ENV, "warning")
    root, gyre = logging.getLogger(), logging.getLogger("gyre")
    levels = root.level, gyre.level
    yield
    log.setup()  # current() back to the defaults; then its handlers go too
    for h in [h for h in root.handlers if getattr(h, "_gyre_log", False)]:
        root.removeHandler(h)
        h.close()
    root.setLevel(levels[0])
    gyre.setLevel(levels[1])


def _lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines()]


def test_json_formatter_one_object_per_line_with_extra_fields():
    rec = logging.LogRecord("gyre.runtime.cell", logging.INFO, __file__, 1, "a\nb %d", (3,), None)
    rec.cell, rec.seconds, rec.to = 1, 0.25, "training"
    rec.path = Path("/x")  # not JSON-native: written as its str
    line = log.JsonFormatter().format(rec)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["msg"] == "a\nb 3" and obj["level"] == "info" and obj["logger"] == rec.name
    assert obj["ts"].endswith("Z") and obj["ts"][:2] == "20"
    assert obj["cell"] == 1 and obj["seconds"] == 0.25 and obj["to"] == "training"
    assert obj["path"] == "/x"
    assert not {"args", "levelno", "pathname", "created", "msecs"} & set(obj)


def test_json_records_an_exception_in_one_line():
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("gyre.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    obj = json.loads(log.JsonFormatter().format(rec))
    assert "ValueError: boom" in obj["exc"] and obj["msg"] == "failed"


def test_json_on_stderr_carries_extra(capsys):
    log.setup("info", "json")
    logging.getLogger("gyre.runtime.cell").info("cell %d up", 2, extra={"event": "x", "cell": 2})
    logging.getLogger("gyre.proxy").debug("not at info")
    (obj,) = _lines(capsys.readouterr().err)
    assert KEYS <= set(obj) and obj["msg"] == "cell 2 up" and obj["cell"] == 2
    assert obj["event"] == "x" and obj["logger"] == "gyre.runtime.cell"


def test_text_is_the_bare_message_at_warning(capsys):
    log.setup()
    g = logging.getLogger("gyre.proxy.pool")
    g.warning("engine %s failed; trying again", "http://e", extra={"cell": 1})
    g.info("quiet by default")
    assert capsys.readouterr().err == "engine http://e failed; trying again\n"


def test_other_libraries_stay_at_warning(capsys):
    log.setup("debug", "text")
    logging.getLogger("httpx").info("HTTP Request: POST ...")
    logging.getLogger("gyre.x").debug("mine")
    logging.getLogger("httpx").warning("theirs")
    assert capsys.readouterr().err == "mine\ntheirs\n"


def test_file_is_json_lines_at_its_own_level(tmp_path, capsys):
    f = tmp_path / "logs" / "cell-0.jsonl"
    log.setup("warning", "text", file=f, file_level="info")
    g = logging.getLogger("gyre.runtime.cell")
    g.info("switch", extra={"event": "switch", "version": 3})
    g.warning("careful")
    g.debug("below both")
    assert capsys.readouterr().err == "careful\n"
    rows = _lines(f.read_text())
    assert [r["msg"] for r in rows] == ["switch", "careful"]
    assert rows[0]["version"] == 3 and all(KEYS <= set(r) for r in rows)


def test_setup_again_replaces_its_handlers(tmp_path, capsys):
    log.setup("info", "json", file=tmp_path / "a.jsonl")
    log.setup("info", "text")
    logging.getLogger("gyre.x").info("once")
    assert capsys.readouterr().err == "once\n"
    assert (tmp_path / "a.jsonl").read_text() == ""
    assert log.current() == ("info", "text")


def test_stderr_is_looked_up_per_record(monkeypatch):
    """gyre run's live panel swaps sys.stderr after setup: lines must go where it points."""
    log.setup()
    swapped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", swapped)
    logging.getLogger("gyre.x").warning("above the panel")
    assert swapped.getvalue() == "above the panel\n"


def test_spec_applies_in_another_process_the_same_way(tmp_path):
    spec = log.LogSpec("warning", "json", str(tmp_path / "s.jsonl"), "info")
    spec.apply()
    logging.getLogger("gyre.x").info("to the file only", extra={"step": 1})
    assert _lines((tmp_path / "s.jsonl").read_text())[0]["step"] == 1
    assert log.current() == ("warning", "json")


def test_bad_values_are_one_line():
    with pytest.raises(ValueError, match="log format 'xml'"):
        log.setup("info", "xml")
    assert log.problem("loud", "text") == (
        "--log-level 'loud': use one of debug, info, warning, error, critical"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--log-format", "xml", "version"], "gyre: --log-format 'xml': use text or json"),
        (["--log-level", "loud", "version"], "gyre: --log-level 'loud': use one of"),
    ],
)
def test_cli_rejects_a_bad_choice_in_one_line(args, line):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.output.startswith(line), r.output
    assert "Traceback" not in r.output


def test_cli_options_set_up_and_export(monkeypatch):
    monkeypatch.setenv(log.FORMAT_ENV, "json")  # the env var is the option's default
    r = CliRunner().invoke(app, ["--log-level", "INFO", "version"])
    assert r.exit_code == 0, r.output
    assert log.current() == ("info", "json")
    assert os.environ[log.LEVEL_ENV] == "info" and os.environ[log.FORMAT_ENV] == "json"


@pytest.mark.parametrize("flag, fmt", [("json", "json"), ("plain", "text"), (None, "text")])
def test_gyre_run_adds_its_driver_file(tmp_path, capsys, flag, fmt):
    """`gyre run`: stderr JSON when its progress is (--log-format json), text otherwise; the
    driver's own JSON-lines file in the run directory, which stays private (0700)."""
    from gyre.config import load_config
    from gyre.runtime.cli import _start_logging

    cfg = load_config(None, ["run.log_level=debug"], model_dir=str(tmp_path))
    _start_logging(cfg, tmp_path / "run", flag)
    assert log.current() == ("warning", fmt)
    logging.getLogger("gyre.proxy").debug("aborted a call", extra={"url": "http://e"})
    logging.getLogger("gyre.proxy").warning("engine failed")
    err = capsys.readouterr().err
    assert (json.loads(err)["msg"] if fmt == "json" else err) == (
        "engine failed" if fmt == "json" else "engine failed\n"
    )
    rows = _lines((tmp_path / "run" / "logs" / "driver.jsonl").read_text())
    assert [r["msg"] for r in rows] == ["aborted a call", "engine failed"]
    assert rows[0]["url"] == "http://e"
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
