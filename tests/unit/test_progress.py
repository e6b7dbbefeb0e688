"""The live view of `gyre run` (gyre.runtime.progress), from a synthetic run state: the rich panel
rendered to a recording console, the plain line, the JSON lines and the closing lines."""

from __future__ import annotations

import json
import time

import pytest
from rich.console import Console

from gyre.policy import CellRole
from gyre.runtime.progress import TOOL_KEYS, Feed, Progress, closing_lines, line, panel
from gyre.runtime.records import Records

REWARD = 0.18275158180271042
EVAL = 0.18717254008823803
TOOLS = {
    "tools/unparsed": 2,
    "tools/truncated": 1,
    "tools/no_call_executions": 3,
    "tools/turns_per_execution": 3.254901960784314,
}


def _feed(*, tools: bool = False, publishing: int | None = None) -> Feed:
    rec = Records(cells=4)
    rec.t0 = time.monotonic() - 62.0  # 62 s into the run
    rec.roles[:] = [CellRole.TRAINING, CellRole.TRAINING, CellRole.TO_TRAINING, CellRole.ROLLOUT]
    rec.since[:] = [50.0, 55.0, 60.0, 0.0]
    rec.activity[0] = {"what": "micro_step", "index": 1, "of": 4, "group": 13}
    rec.publishing = publishing
    rec.finished_steps = [object()] * 7  # type: ignore[list-item]
    rows = [{"step": i, "reward/mean": 0.1 + i / 100} for i in range(6)]
    rows[2]["batch/missing/timeout"] = 2
    rows[4]["batch/missing/timeout"] = 0
    rows[5].update({"reward/mean": REWARD, "reward/pass_rate": 0.125, "batch/missing/no_answer": 1})
    rows.append({"step": 6, "reward/mean": REWARD, **(TOOLS if tools else {})})
    evals = [
        {"version": 0, "reward_mean": 0.1, "pass_rate": 0.0, "held_out": True},
        {"version": 5, "reward_mean": EVAL, "pass_rate": 0.25, "held_out": True},
        {"version": 6, "error": "RuntimeError: boom"},  # a failed evaluation is not a score
    ]
    return Feed(
        records=rec,
        status={"waterlevel": 12, "capacity": 16, "queued": 2, "done": False},
        rows=rows,
        evals=evals,
        running=10,
        version=7,
        published_version=6,
        cell_load=[None, None, (1, 1), (6, 3)],
        counters={"rerouted": 3, "harness_failed": 1, "engines_lost": 0, "engine_errors": 0},
    )


def _snap(**kw) -> dict:
    return Progress("plain", 12).snapshot(_feed(**kw))


def _render(s: dict) -> str:
    con = Console(record=True, width=120, color_system=None)
    con.print(panel(s))
    return con.export_text()


def test_snapshot_fields():
    s = _snap()
    assert (s["step"], s["steps"], s["version"]) == (7, 12, 7)
    assert s["elapsed_s"] == pytest.approx(62.0, abs=1.0)
    assert s["eta_s"] == pytest.approx(62.0 / 7 * 5, abs=1.0)  # mean step time x steps left
    assert s["reward"] == REWARD  # full precision for machines; renderers round
    assert s["eval"] == {"version": 5, "score": EVAL, "pass_rate": 0.25, "held_out": True}
    assert s["missing"] == {"timeout": 2, "no_answer": 1}
    assert s["rerouted"] == 3 and sum(s["faults"].values()) == 1
    assert s["tools"] == {}  # the metrics carry none
    doing = [c["doing"] for c in s["cells"]]
    assert doing == [
        "training micro-step 2 of 4 (g13)",
        "waiting for a micro-step",
        "switching to training (drain, load replica)",
        "serving 6 executions, 3 calls in flight",
    ]
    assert [c["for_s"] for c in s["cells"]] == pytest.approx([12, 7, 2, 62], abs=1.0)
    assert s["roles"] == ["training", "training", "to_training", "rollout"]


def test_rollout_cells_show_a_weight_reload_and_the_end():
    s = _snap(publishing=7)
    assert s["cells"][3]["doing"] == "loading weights v7"
    f = _feed()
    f.status["done"] = True
    f.parks_engine = True
    done = Progress("plain", 12).snapshot(f)
    assert done["cells"][1]["doing"] == "done (engine parked)"


def test_panel_shows_bar_cells_digits_and_counters():
    text = _render(_snap())
    first = text.splitlines()[0]
    assert "━" in first and "step 7/12" in first and "58%" in first
    assert "elapsed 1m02s" in first and "eta 44s" in first
    assert "reward 0.1828" in text and "held-out v5 0.1872 (pass 0.25)" in text
    assert "0.18275" not in text and "0.18717" not in text  # a few digits, not seventeen
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()[:1].isdigit()}
    assert "core" in rows["0"] and "training" in rows["0"] and "micro-step 2 of 4" in rows["0"]
    assert "-> training" in rows["2"] and "switching" in rows["2"]
    assert "rollout" in rows["3"] and "serving 6 executions, 3 calls in flight" in rows["3"]
    assert "rerouted 3" in text and "faults 1 (harness failures 1)" in text
    assert "missing 3 (no_answer 1, timeout 2)" in text
    assert "tools" not in text and "unparsed" not in text  # only when the metrics carry them


def test_panel_shows_tool_health_when_present():
    text = _render(_snap(tools=True))
    assert "tools unparsed 2, truncated 1, no-call executions 3, turns/execution 3.255" in text


def test_plain_line(capsys):
    p = Progress("plain", 12)
    p.update(lambda: _feed(tools=True), 7)
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1
    ln = out[0]
    assert ln.startswith("[gyre run] step 7/12 [")
    for part in (
        "reward 0.1828",
        "held-out v5 0.1872",
        "version 7",
        "0:T training micro-step 2 of 4 (g13)",
        "2:>T switching",
        "3:R serving 6 executions, 3 calls in flight",
        "waterlevel 12/16 running 10 queued 2",
        "rerouted 3",
        "faults 1",
        "missing 3 (no_answer 1, timeout 2)",
        "tools unparsed 2",
        "elapsed 1m02s eta 44s",
    ):
        assert part in ln, part
    assert line(_snap()).count("tools") == 0


def test_plain_prints_once_per_step_and_builds_nothing_between():
    calls = []

    def feed() -> Feed:
        calls.append(1)
        return _feed()

    p = Progress("plain", 12)
    p.update(feed, 7)
    p.update(feed, 7)  # same step: nothing shown, the feed is not even built
    p.update(feed, 8)
    p.update(feed, 8, force=True)
    assert len(calls) == 3


def test_json_one_object_per_step(capsys):
    p = Progress("json", 12)
    p.update(lambda: _feed(tools=True), 7)
    p.update(lambda: _feed(tools=True), 7)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    obj = json.loads(out[0])
    assert obj["event"] == "progress"
    for k in (
        "step",
        "steps",
        "elapsed_s",
        "eta_s",
        "version",
        "reward",
        "eval",
        "cells",
        "waterlevel",
        "capacity",
        "running",
        "queued",
        "rerouted",
        "faults",
        "missing",
        "tools",
    ):
        assert k in obj, k
    assert set(obj["cells"][3]) >= {"cell", "role", "doing", "executions", "calls_in_flight"}
    assert obj["cells"][3]["calls_in_flight"] == 3 and obj["cells"][0]["executions"] is None
    assert set(obj["tools"]) == set(TOOL_KEYS)
    assert obj["eval"]["score"] == EVAL


def test_closing_lines_round():
    summary = {
        "makespan_s": 123.456,
        "reward_first_quarter": REWARD,
        "reward_last_quarter": EVAL,
        "evals": [
            {"version": 0, "reward_mean": 0.1664613194, "held_out": False},
            {"version": 12, "error": "x"},
            {"version": 12, "reward_mean": 0.19893677793658726, "held_out": False},
        ],
    }
    first, where = closing_lines(summary, 88.0, "runs/x")
    assert first == (
        "done in 1m28s: makespan 123.5s, reward first/last quarter 0.1828 -> 0.1872, "
        "eval v0 0.1665 -> v12 0.1989"
    )
    assert where == "summary: runs/x/summary.json"
    no_eval = closing_lines({**summary, "evals": [], "reward_last_quarter": None}, 5, "r")[0]
    assert no_eval.endswith("0.1828 -> -")
