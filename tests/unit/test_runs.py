"""``gyre runs list|show|compare`` on run directories written here file by file, in the
layout ``gyre run`` writes (gyre/runtime/rundir.py). The HTML is checked with a parser:
its sections, charts and links, and that it references nothing outside itself."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers.rundirs import make_run
from typer.testing import CliRunner

from gyre.cli import app


def gyre(*args: str):
    return CliRunner().invoke(app, list(args))


def test_list_one_line_per_run(tmp_path):
    make_run(tmp_path, "a-done", steps=3, total=3, finished=True, ckpt=True)
    make_run(
        tmp_path, "b-killed", steps=2, total=5, finished=False, ckpt=True, placement="colocate"
    )
    make_run(tmp_path, "c-early", steps=0, total=4, finished=False, ckpt=False)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # an HF model dir is not a run
    r = gyre("runs", "list", str(tmp_path))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 3
    assert re.fullmatch(
        r"a-done +elastic +steps 3/3 +reward 0\.183 -> 0\.203 +makespan 123\.5s +finished", lines[0]
    ), lines[0]
    assert re.fullmatch(
        r"b-killed +colocate +steps 2/5 +reward 0\.183 -> 0\.193 +makespan - +resumable", lines[1]
    ), lines[1]
    assert re.fullmatch(
        r"c-early +elastic +steps 0/4 +reward - -> - +makespan - +stopped", lines[2]
    )


@pytest.mark.parametrize("cmd", ["list", "show"])
def test_not_a_run_dir_is_one_line(tmp_path, cmd):
    r = gyre("runs", cmd, str(tmp_path / "nope"))
    assert r.exit_code == 2 and "no such directory" in r.output and "Traceback" not in r.output
    if cmd == "show":
        r = gyre("runs", cmd, str(tmp_path))
        assert r.exit_code == 2 and "not a run directory" in r.output


class Page(HTMLParser):
    """Tags, ids, links and every attribute that could fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.srcs: list[str] = []
        self.text = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.ids |= {a["id"]} if "id" in a else set()
        self.hrefs += [a["href"]] if "href" in a else []
        self.srcs += [a["src"]] if "src" in a else []

    def handle_data(self, data):
        self.text += data


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text())
    return p


def test_show_writes_a_self_contained_page(tmp_path):
    rd = make_run(tmp_path, "a-done", steps=3, total=3, finished=True, ckpt=True)
    (rd / "timeline.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    out = tmp_path / "out" / "page.html"
    out.parent.mkdir()
    r = gyre("runs", "show", str(rd), "-o", str(out))
    assert r.exit_code == 0, r.output
    p = parse(out)
    assert {
        "overview",
        "curves",
        "staleness",
        "mismatch",
        "faults",
        "executions",
        "timeline",
    } <= p.ids
    assert "script" not in p.tags and "link" not in p.tags  # no JS, no stylesheet to fetch
    assert p.srcs and all(s.startswith("data:image/png;base64,") for s in p.srcs)
    # charts: training reward, held-out, staleness, mismatch (kl) and the role-share bars
    assert p.tags.count("svg") == 5 and p.tags.count("polyline") == 2 + 2 + 2 + 2
    for label in ("held-out score per policy version", "mismatch: kl", "time share of each role"):
        assert label in p.text
    # executions: the reward or the missing reason, the serving version, the tree a click away
    assert "0.500" in p.text and "missing: model_unreachable" in p.text
    assert "t1<b>" in p.text and "t1&lt;b&gt;" in out.read_text()  # escaped
    assert p.hrefs == ["trees/r0-g00000-a00.html"]
    tree = out.parent / p.hrefs[0]
    assert tree.is_file() and "<details" in tree.read_text()
    assert "calls moved to another engine (reroutes)" in p.text and "engine <gone>" in p.text


def test_show_a_run_still_going(tmp_path):
    """No summary, no timeline, no mismatch metrics: each section says so, nothing breaks."""
    rd = make_run(tmp_path, "b", steps=2, total=5, finished=False, ckpt=False, mismatch=False)
    r = gyre("runs", "show", str(rd))
    assert r.exit_code == 0, r.output
    p = parse(rd / "report.html")
    assert "mismatch: not recorded in this run" in p.text
    assert "timeline: not written" in p.text
    assert "agent figures: not recorded in this run" in p.text
    assert "time share of each role, per cell" in p.text  # from the last step's cells/* shares


def test_show_plots_the_agent_figures(tmp_path):
    """A run whose steps carry agent/* and tree/* figures gets one chart per family."""
    rd = make_run(tmp_path, "c", steps=3, total=3, finished=True, ckpt=True)
    lines = (rd / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines[:-1]]  # the torn last line left out
    for r in rows:
        s = r["step"]
        r |= {"agent/turns_p10": 1, "agent/turns_p50": 2 + s, "agent/turns_p90": 4 + s,
              "agent/turns_max": 6, "agent/turns_hist": {"1": 2, "6": 1},
              "agent/tool_calls_per_exec_mean": 1.5, "tools/unparsed": 3 - s,
              "agent/harness_timeout": 1, "agent/harness_timeout_scored": 1,
              "tree/flat_over_tree": 1.8}  # fmt: skip
    (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = gyre("runs", "show", str(rd))
    assert r.exit_code == 0, r.output
    p = parse(rd / "report.html")
    assert "agent" in p.ids
    for title in (
        "turns per execution",
        "tool calls",
        "executions cut at the harness timeout",
        "trees: flat tokens over tree tokens",
    ):
        assert title in p.text
    assert "agent figures: not recorded" not in p.text
    # 5 charts as above, 4 more here; series: turns 4, tool calls 2, cuts 2, trees 1
    assert p.tags.count("svg") == 5 + 4
    assert p.tags.count("polyline") == 8 + 4 + 2 + 2 + 1


def test_compare_puts_runs_side_by_side(tmp_path):
    a = make_run(tmp_path, "elastic-1", steps=3, total=3, finished=True, ckpt=True)
    b = make_run(tmp_path, "colocate-1", steps=2, total=3, finished=True, ckpt=True,
                 placement="colocate")  # fmt: skip
    out = tmp_path / "cmp.html"
    r = gyre("runs", "compare", str(a), str(b), "-o", str(out))
    assert r.exit_code == 0, r.output
    p = parse(out)
    assert "script" not in p.tags and not p.srcs
    assert "elastic-1 (elastic)" in p.text and "colocate-1 (colocate)" in p.text
    assert p.tags.count("polyline") == 2 * 3  # reward, held-out, staleness: one line per run
    assert "makespan (longest 123.5 s = full bar)" in p.text
