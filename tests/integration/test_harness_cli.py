"""`gyre harness run|tasks|profiles` as a user calls them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gyre.harness.cli import app
from gyre.harness.task import builtin_tasksets_dir

runner = CliRunner()


def test_run_oracle_json_and_text(tmp_path):
    task = builtin_tasksets_dir() / "pyfix" / "rle"
    r = runner.invoke(
        app,
        [
            "run",
            str(task),
            "--profile",
            "oracle",
            "--base-url",
            "http://127.0.0.1:9",
            "--workspace-root",
            str(tmp_path),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["assessment"]["kind"] == "scored" and out["assessment"]["reward"] == 1.0
    assert out["harness"]["stop"] == "exited" and out["workspace"].startswith(str(tmp_path))
    r = runner.invoke(
        app,
        [
            "run",
            str(task),
            "--profile",
            "synthetic",
            "--base-url",
            "http://127.0.0.1:9",
            "--workspace-root",
            str(tmp_path),
            "--arg=--calls",
            "--arg=0",
            "--arg=--mean-s",
            "--arg=1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "reward     0.25 (1/4 tests)  [fraction]" in r.output and "workspace" in r.output


def test_run_reports_missing_and_bad_input(tmp_path):
    task = builtin_tasksets_dir() / "pyfix" / "rle"
    r = runner.invoke(
        app,
        [
            "run",
            str(task),
            "--profile",
            "oracle",
            "--base-url",
            "http://x",
            "--workspace-root",
            str(tmp_path),
            "--overall-timeout",
            "0.001",
        ],
    )
    assert r.exit_code == 1 and "MISSING" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "nope"), "--base-url", "http://x"])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = runner.invoke(app, ["run", str(task), "--profile", "nope", "--base-url", "http://x"])
    assert r.exit_code == 2 and "unknown harness profile" in r.output


def test_help_renders():
    for cmd in (["--help"], ["run", "--help"], ["tasks", "--help"], ["profiles", "--help"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 0, (cmd, r.output, r.exception)


def test_tasks_and_profiles_listing():
    r = runner.invoke(app, ["tasks", "pyfix"])
    assert r.exit_code == 0 and len(r.output.strip().splitlines()) >= 10
    r = runner.invoke(app, ["profiles"])
    assert r.exit_code == 0 and "claude-code" in r.output and "mini-swe-agent" in r.output


TITLE = "\x1b]0;pwned\x07"  # OSC "set window title"


def test_tasks_prints_hostile_folder_names_as_visible_escapes(tmp_path):
    """Issue 37, finding 8: a task set's folder names reached the terminal raw."""
    import shutil

    src = builtin_tasksets_dir() / "pyfix"
    first = sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    shutil.copytree(first[0], tmp_path / "set" / f"ok{TITLE}\x1b[2J")
    r = runner.invoke(app, ["tasks", str(tmp_path / "set")])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output
    assert "ok\\x1b]0;pwned\\x07\\x1b[2J" in r.output
    # A bad task's name in the one-line error, likewise.
    bad = tmp_path / "set" / f"bad{TITLE}"
    bad.mkdir()
    r = runner.invoke(app, ["tasks", str(tmp_path / "set")])
    assert r.exit_code != 0 and "bad\\x1b]0;pwned\\x07" in r.output
    assert "\x1b" not in r.output and "\x07" not in r.output
