"""``gyre runs`` on a run directory received from someone else (issue 37, finding 2): planted
links are neither written through nor read out of the run directory."""

from __future__ import annotations

import base64
import json
import os

from helpers.rundirs import make_run
from test_runs import gyre, parse

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
