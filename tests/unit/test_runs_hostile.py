"""``gyre runs`` on a run directory received from someone else (issue 37, finding 2): planted
links are neither written through nor read out of the run directory."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.rundirs import make_run
from test_runs import gyre, parse

import gyre as gyre_pkg

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlanted attacker@elsewhere"


def _hostile(tmp_path):
    """A finished run whose task name carries a newline and a public key."""
    rd = make_run(tmp_path, "recv", steps=3, total=3, finished=True, ckpt=True)
    rows = [json.loads(x) for x in (rd / "executions.jsonl").read_text().splitlines()]
    rows[0]["task"] = f"t1\n{KEY}\n"
    (rd / "executions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rd


def test_show_replaces_a_planted_report_link_and_leaves_its_target(tmp_path):
    rd = _hostile(tmp_path)
    victim = tmp_path / "home" / ".ssh" / "authorized_keys"
    victim.parent.mkdir(parents=True)
    victim.write_text("ssh-ed25519 AAAA mine@here\n")
    (rd / "report.html").symlink_to(victim)
    r = gyre("runs", "show", str(rd))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "ssh-ed25519 AAAA mine@here\n"
    report = rd / "report.html"
    assert not report.is_symlink() and report.is_file()
    assert KEY in parse(report).text  # the task name is in the page, as text
    assert [p.name for p in rd.iterdir() if p.name.endswith(".tmp")] == []


def test_show_writes_no_tree_through_planted_links(tmp_path):
    rd = _hostile(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (rd / "trees").symlink_to(elsewhere)  # the trees folder itself a link
    r = gyre("runs", "show", str(rd))
    assert r.exit_code == 0, r.output
    assert list(elsewhere.iterdir()) == [] and "trees" in r.output
    (rd / "trees").unlink()
    (rd / "trees").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (rd / "trees" / "r0-g00000-a00.html").symlink_to(victim)  # one tree a link
    assert gyre("runs", "show", str(rd)).exit_code == 0
    assert victim.read_text() == "mine"
    assert not (rd / "trees" / "r0-g00000-a00.html").is_symlink()


def test_show_does_not_inline_a_linked_timeline(tmp_path):
    rd = _hostile(tmp_path)
    secret = tmp_path / "id_ed25519"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n")
    (rd / "timeline.png").symlink_to(secret)
    r = gyre("runs", "show", str(rd))
    assert r.exit_code == 0, r.output
    assert "timeline.png: a link out of the run directory" in r.output
    page = (rd / "report.html").read_text()
    assert base64.b64encode(secret.read_bytes()).decode()[:16] not in page
    p = parse(rd / "report.html")
    assert not p.srcs and "timeline: skipped" in p.text


def test_inputs_linked_out_of_the_run_read_as_absent(tmp_path):
    rd = _hostile(tmp_path)
    other = make_run(tmp_path, "other", steps=5, total=9, finished=False, ckpt=False)
    (rd / "metrics.jsonl").unlink()
    (rd / "metrics.jsonl").symlink_to(other / "metrics.jsonl")
    trace = rd / "traces" / "r0-g00000-a00.jsonl"
    trace.unlink()
    trace.symlink_to(other / "traces" / "r0-g00000-a00.jsonl")
    r = gyre("runs", "list", str(rd))
    assert r.exit_code == 0 and "steps 0/3" in r.output, r.output  # not the other run's 5
    assert gyre("runs", "show", str(rd)).exit_code == 0
    assert not (rd / "trees").exists()  # the linked trace drew no tree
    # a link that stays inside the run is a file of the run
    (rd / "metrics.jsonl").unlink()
    (rd / "m.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    os.symlink("m.jsonl", rd / "metrics.jsonl")
    assert "steps 1/3" in gyre("runs", "list", str(rd)).output


def test_compare_output_link_is_replaced(tmp_path):
    a = make_run(tmp_path, "a", steps=2, total=2, finished=True, ckpt=True)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    out = tmp_path / "compare.html"
    out.symlink_to(victim)
    r = gyre("runs", "compare", str(a), str(a), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "mine" and not out.is_symlink() and out.is_file()


# ---------------------------------------------------------------- finding 8: smaller ones
def test_non_finite_numbers_read_as_missing(tmp_path):
    """Python's json writes Infinity and NaN; a received run may hold them anywhere."""
    rd = make_run(tmp_path, "numbers", steps=3, total=3, finished=True, ckpt=True)
    rows = [
        '{"step": 0, "reward/mean": 0.5, "batch/staleness_mean": 0.0}',
        '{"step": 1, "reward/mean": Infinity, "batch/staleness_mean": Infinity}',
        '{"step": 2, "reward/mean": NaN, "batch/staleness_mean": 1e999, "cells/0/x_share": NaN}',
        '{"step": 3, "reward/mean": -Infinity, "batch/staleness_mean": ' + str(10**400) + "}",
        '{"step": 4, "reward/mean": 0.25, "batch/staleness_mean": -1e308, "mismatch/kl": 1e308}',
    ]
    (rd / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    summary = json.loads((rd / "summary.json").read_text())
    summary |= {"makespan_s": float("inf"), "reward_first_quarter": "x",
                "role_shares": [{"rollout": "a", "training": float("nan")}]}  # fmt: skip
    (rd / "summary.json").write_text(json.dumps(summary))
    (rd / "executions.jsonl").write_text(
        '{"execution": 7, "task": 1, "reward": Infinity, "seconds": NaN, "missing": [1]}\n'
    )
    for cmd in (["show", str(rd)], ["compare", str(rd), str(rd), "-o", str(tmp_path / "c.html")]):
        r = gyre("runs", *cmd)
        assert r.exit_code == 0 and r.exception is None, (cmd, r.output)
    r = gyre("runs", "list", str(rd))
    assert r.exit_code == 0 and "reward 0.500 -> 0.250  makespan -" in r.output, r.output
    p = parse(rd / "report.html")
    assert re.search(r"\b(inf|nan)\b", p.text.lower()) is None, p.text


def test_metrics_are_written_as_strict_json(tmp_path):
    from gyre.runtime.rundir import RunDir

    rd = RunDir(tmp_path / "r").create()
    rd._append("metrics.jsonl", {"step": 0, "actor/loss": float("nan"),
                                 "x": [float("inf"), 1.5], "t": {"a": float("-inf")}})  # fmt: skip
    rd.write_summary({"makespan_s": float("inf")})

    def strict(name: str) -> object:
        return json.loads(name, parse_constant=lambda c: pytest.fail(f"{c} written"))

    line = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert strict(line) == {"step": 0, "actor/loss": None, "x": [None, 1.5], "t": {"a": None}}
    assert strict((tmp_path / "r" / "summary.json").read_text()) == {"makespan_s": None}


@pytest.mark.parametrize("cmd", ["list", "show"])
def test_a_fifo_in_a_run_dir_does_not_block(tmp_path, cmd):
    rd = make_run(tmp_path, "fifo", steps=2, total=3, finished=True, ckpt=True)
    for name in ("metrics.jsonl", "summary.json", "timeline.png", "executions.jsonl"):
        (rd / name).unlink(missing_ok=True)
        os.mkfifo(rd / name)
    (rd / "traces" / "r0-g00000-a00.jsonl").unlink()
    os.mkfifo(rd / "traces" / "r0-g00000-a00.jsonl")
    env = {**os.environ, "PYTHONPATH": str(Path(gyre_pkg.__file__).parent.parent)}
    try:
        r = subprocess.run([sys.executable, "-m", "gyre.cli", "runs", cmd, str(rd)], env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"gyre runs {cmd} blocked on a FIFO")
    assert r.returncode == 0, r.stderr
    assert "metrics.jsonl: not a regular file" in r.stderr


def test_run_names_print_without_terminal_escapes(tmp_path):
    name = "run\x1b]0;pwned\x07\x1b[2J"
    make_run(tmp_path, name, steps=1, total=1, finished=False, ckpt=False)
    r = gyre("runs", "list", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output
    assert r.output.startswith("run\\x1b]0;pwned\\x07\\x1b[2J ")
