"""``gyre runs health``: one line per execution from its trace, totals per harness profile."""

from __future__ import annotations

import json

from test_trace_toolhealth import rec
from typer.testing import CliRunner

from gyre.cli import app
from gyre.harness.reference_agent import MAIN_SYSTEM, SUB_SYSTEM
from gyre.trace.store import TraceWriter


def _lines(out: str) -> dict[str, list[str]]:
    return {ln.split()[0]: ln.split() for ln in out.splitlines()[2:]}


def test_run_dir_uses_its_own_profile_and_trace_folders_take_harness(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "config.toml").write_text("")
    (run / "config.json").write_text(json.dumps({"run": {"profile": "reference"}}))
    w = TraceWriter(run / "traces", fsync=False)
    w.append(rec(0, eid="x", n_tool_calls=1, system_head=MAIN_SYSTEM))
    w.append(rec(1, eid="x", n_tool_calls=2, system_head=SUB_SYSTEM))
    w.append(rec(0, eid="y", finish="length", n_tool_calls_unparsed=1, system_head=MAIN_SYSTEM))
    w.close()
    r = CliRunner().invoke(app, ["runs", "health", str(run)])
    assert r.exit_code == 0, r.output
    rows = _lines(r.output)
    # execution profile turns calls unparsed truncated no_call compactions subagent
    assert rows["x"] == ["x", "reference", "2", "3", "0", "0", "0", "0", "1"]
    assert rows["y"] == ["y", "reference", "1", "0", "1", "1", "1", "0", "0"]
    assert "1.50 turns/exec" in r.output
    # a bare trace folder: the rules named by --harness (claude-code's see no sub-agent here)
    r = CliRunner().invoke(app, ["runs", "health", str(run / "traces"), "--harness", "codex"])
    assert r.exit_code == 0 and _lines(r.output)["x"][1:3] == ["codex", "2"], r.output
    assert _lines(r.output)["x"][-1] == "0"


def test_mistakes_are_one_line(tmp_path):
    for args, want in [
        ([str(tmp_path / "none")], "no such file or directory"),
        ([str(tmp_path)], "no trace files"),
        ([str(tmp_path), "--harness", "nope"], "no trace files"),
        (
            [str(tmp_path), str(tmp_path), "--harness", "a", "--harness", "b", "--harness", "c"],
            "3 times",
        ),
    ]:
        r = CliRunner().invoke(app, ["runs", "health", *args])
        assert r.exit_code == 2 and want in r.output, r.output
        assert "Traceback" not in r.output
    (tmp_path / "t.jsonl").write_text("not json\n")
    r = CliRunner().invoke(app, ["runs", "health", str(tmp_path), "--harness", "nope"])
    assert r.exit_code == 2 and "unknown harness profile 'nope'" in r.output
    r = CliRunner().invoke(app, ["runs", "health", str(tmp_path)])
    assert r.exit_code == 2 and "not a Gyre trace" in r.output
