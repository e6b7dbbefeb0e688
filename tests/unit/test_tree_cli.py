"""`gyre tree stats/show/synth` through typer's test runner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gyre.trace.cli import app

runner = CliRunner()


def test_synth_stats_show(tmp_path):
    r = runner.invoke(
        app,
        ["synth", str(tmp_path), "--requests", "60", "--subagents", "2", "--execution-id", "demo"],
    )
    assert r.exit_code == 0, r.output
    trace = tmp_path / "demo.jsonl"
    assert trace.exists()
    # a truncated last line is reported, the rest still counts
    with open(trace, "a") as f:
        f.write('{"execution_id": "demo", "request_id": "half')
    r = runner.invoke(app, ["stats", str(trace), "--j-max", "3", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output.strip().splitlines()[-1])
    assert s["requests"] == 60 and s["paths"] == 7
    assert [p["role"] for p in s["admission"]["paths"]] == ["main", "main", "main-summary"]
    assert s["dedup_ratio"] > 1.0 and s["tokens_expanded"] > s["unique_tokens"]
    assert sum(s["targets_by_role"].values()) == s["targets"]
    assert any("truncated" in e for e in s["errors"])
    r = runner.invoke(app, ["stats", str(trace)])
    assert r.exit_code == 0 and "unique tokens" in r.output and "problem" in r.output
    r = runner.invoke(app, ["stats", str(trace), str(trace), "--j-max", "3"])
    assert r.exit_code == 0 and "total over 2 executions: 120 requests, 14 paths" in r.output
    html = tmp_path / "t.html"
    png = tmp_path / "t.png"
    r = runner.invoke(
        app, ["show", str(trace), "--j-max", "4", "--html", str(html), "--png", str(png)]
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r.exit_code == 0, r.output
    assert "LEAF main-summary" in r.output and "admitted #4" in r.output
    assert html.read_text().count("<details") == s["unique_nodes"]


def test_show_with_tokenizer_and_profile(tmp_path, tiny_model_dir):
    from gyre.trace.roles import all_main_profile

    runner.invoke(
        app, ["synth", str(tmp_path), "--requests", "30", "--subagents", "1", "--execution-id", "x"]
    )
    prof = tmp_path / "profile.json"
    prof.write_text(all_main_profile().model_dump_json())
    r = runner.invoke(
        app,
        [
            "show",
            str(tmp_path / "x.jsonl"),
            "--tokenizer",
            str(tiny_model_dir),
            "--profile",
            str(prof),
            "--html",
            str(tmp_path / "x.html"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "LEAF main" in r.output and "sub-agent" not in r.output
    # message-level counts (the paper's unit) need the tokenizer's message-start token
    from gyre.trace import OutputSegment, TraceRecord, TraceWriter

    ims = 1  # <|im_start|> in the tiny tokenizer
    recs = [
        TraceRecord(
            "m",
            "a",
            0,
            "x",
            None,
            0,
            (ims, 50, ims, 51),
            (52,),
            (-0.1,),
            (OutputSegment(0, 1, "e", 0),),
        ),
        TraceRecord(
            "m", "b", 1, "x", "a", 4, (ims, 60), (61,), (-0.1,), (OutputSegment(0, 1, "e", 0),)
        ),
        TraceRecord(
            "m", "c", 2, "x", "a", 4, (ims, 70), (71,), (-0.1,), (OutputSegment(0, 1, "e", 0),)
        ),
    ]
    w = TraceWriter(tmp_path, fsync=False)
    for rec in recs:
        w.append(rec)
    w.close()
    r = runner.invoke(
        app, ["stats", str(tmp_path / "m.jsonl"), "--tokenizer", str(tiny_model_dir), "--json"]
    )
    assert r.exit_code == 0, r.output
    s = json.loads(r.output.strip().splitlines()[-1])
    # messages: [ims 50], [ims 51], [ims 51 52], [ims 60 61], [ims 70 71]; paths hold 2 + 3 + 3
    assert s["unique_message_nodes"] == 5 and s["message_node_occurrences_expanded"] == 8
    assert (
        'class="tgt"' in (tmp_path / "x.html").read_text()
        or 'class="adm"' in (tmp_path / "x.html").read_text()
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"role": "boss"}]}')
    r = runner.invoke(app, ["stats", str(tmp_path / "x.jsonl"), "--profile", str(bad)])
    assert r.exit_code != 0


def test_synth_twice_replaces_the_trace(tmp_path):
    for _ in range(2):
        r = runner.invoke(
            app,
            [
                "synth",
                str(tmp_path),
                "--requests",
                "20",
                "--subagents",
                "1",
                "--execution-id",
                "again",
            ],
        )
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["stats", str(tmp_path / "again.jsonl"), "--json"])
    s = json.loads(r.output.strip().splitlines()[-1])
    assert s["requests"] == 20 and s["errors"] == []
