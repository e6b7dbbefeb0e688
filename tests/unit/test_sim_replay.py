"""Replaying a real run's workload.json: the reader, the Draw it builds, predict(), the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.sim.replay import (
    H,
    WorkloadFileError,
    load_workload,
    predict,
    predict_all,
    replay_draw,
    sim_config,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "workload" / "elastic_small.json"
runner = CliRunner()


@pytest.fixture
def wf() -> dict:
    return json.loads(FIXTURE.read_text())


def test_reader_builds_the_draw_from_realised_durations_in_dispatch_order(wf):
    w = load_workload(wf)
    cfg = sim_config(w, ["elastic"])
    draw, info = replay_draw(w, cfg)
    assert draw.groups == cfg.pool_groups() == 6 * 2 + 7
    # every realised duration lands at (group, attempt), in hours
    for r in wf["executions"]:
        if r["missing"] != "cancelled":
            assert draw.duration_h[r["group"], r["attempt"]] == pytest.approx(r["duration_s"] * H)
    assert draw.missing[3, 3] and draw.missing.sum() >= 1
    assert draw.harness_timeout[5, 1]
    # the cut execution is at least as long as it had run; groups 16..18 come from the draw
    assert draw.duration_h[15, 3] >= wf["executions"][-1]["duration_s"] * H
    assert info == {"realised": 63, "cut": 1, "filled": 19 * 4 - 64}
    # costs converted: a micro-step of 0.05 s on one cell -> train_step_cell_h = 0.05 s * B N m
    assert cfg.costs.train_step_cell_h == pytest.approx(0.05 * 2 * 4 * 1 * H)
    assert cfg.costs.publish_stall_h == pytest.approx(0.2 * H)
    assert cfg.policy.hold_tau == pytest.approx(1.0 * H)


def test_without_a_draw_unrealised_executions_outlast_the_run(wf):
    wf["draw"] = None
    w = load_workload(wf)
    draw, _ = replay_draw(w, sim_config(w, ["elastic"]))
    assert draw.duration_h[18, 0] == pytest.approx(40.0 * H)  # the measured makespan


def test_predict_returns_what_the_runtime_draws(wf):
    p = predict(wf)
    assert p["placement"] == "elastic" and p["makespan_s"] > 0 and p["interrupted"] == 0
    assert p["measured"]["makespan_s"] == 40.0
    roles = {s[1] for s in p["segments"]}
    assert roles <= {"rollout", "training", "switching"} and "training" in roles
    for cell, _role, t0, t1 in p["segments"]:
        assert 0 <= cell < 4 and 0 <= t0 <= t1 <= p["makespan_s"] + 1e-9
    assert p["staleness_mean"] == pytest.approx(p["staleness_mean"])  # a number, not NaN
    # the same file from a path gives the same answer; another placement has no measured side
    assert predict(str(FIXTURE))["makespan_s"] == pytest.approx(p["makespan_s"])
    assert predict(wf, "colocate")["measured"] is None


def test_all_placements_hold_the_runs_staleness(wf):
    out = predict_all(wf, ["colocate", "async", "elastic"])
    assert {(v["phi"], v["mu"]) for v in out.values()} == {(0.0, 4), (1.5, 1), (0.5, 3)}
    assert all(v["staleness_expected"] == 1.5 for v in out.values())


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.update(format="gyre-workload/0"), "format is"),
        (lambda d: d.pop("executions"), "executions"),
        (lambda d: d.update(executions=[]), "no executions"),
        (lambda d: d["executions"].append(dict(d["executions"][0])), "listed twice"),
        (lambda d: d["executions"][0].update(attempt=9), "N is 4"),
        (lambda d: d["executions"][0].update(duration_s=-1), "duration_s"),
        (lambda d: d["policy"].update(phi=0.25), "phi * B"),
        (lambda d: d.update(placement="hybrid"), "placement"),
        (lambda d: d.update(placement="async"), "policy.placement is 'elastic'"),
    ],
)
def test_bad_files_are_one_clear_line(wf, edit, says):
    bad = copy.deepcopy(wf)
    edit(bad)
    with pytest.raises(WorkloadFileError, match=None) as e:
        load_workload(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_cli_prints_measured_vs_predicted_and_writes_json(tmp_path):
    out, png = tmp_path / "pred.json", tmp_path / "gantt.png"
    args = ["--placement", "all", "--out", str(out), "--plot", str(png)]
    r = runner.invoke(app, ["sim", "--workload", str(FIXTURE), *args])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 10_000  # measured + three predicted panels
    for word in ("colocate", "async", "elastic", "measured", "predicted"):
        assert word in r.output
    assert "groups with their own measured compute: 0" in " ".join(r.output.split())
    rep = json.loads(out.read_text())
    el = next(x for x in rep["rows"] if x["placement"] == "elastic")
    assert el["measured_makespan_s"] == 40.0
    assert el["makespan_error"] == pytest.approx(el["predicted_makespan_s"] / 40.0 - 1)


def test_cli_several_runs_compare_ratios(tmp_path, wf):
    co = copy.deepcopy(wf)
    co["placement"] = "colocate"
    co["policy"].update(placement="colocate", phi=0.0, mu=4, streaming=False)
    co["measured"]["makespan_s"] = 52.0
    (tmp_path / "c.json").write_text(json.dumps(co))
    r = runner.invoke(
        app, ["sim", "--workload", str(FIXTURE), "--workload", str(tmp_path / "c.json"), "--json"]
    )
    assert r.exit_code == 0, r.output
    rows = {x["placement"]: x for x in json.loads(r.output)["rows"]}
    assert rows["colocate"]["measured_ratio_vs_elastic"] == pytest.approx(52.0 / 40.0)
    pr = rows["colocate"]["predicted_ratio_vs_elastic"]
    assert rows["colocate"]["ratio_error"] == pytest.approx(pr / 1.3 - 1)


@pytest.mark.parametrize(
    "content",
    ["not json", "[1, 2]", '{"format": "gyre-workload/1"}', None],
)
def test_cli_bad_files_exit_2_with_one_line(tmp_path, content):
    path = tmp_path / "workload.json"
    if content is not None:
        path.write_text(content)
    r = runner.invoke(app, ["sim", "--workload", str(path)])
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gyre sim: ")


def test_cli_refuses_options_the_run_fixes():
    r = runner.invoke(app, ["sim", "--workload", str(FIXTURE), "--set", "tail=0.2"])
    assert r.exit_code == 2 and "do not apply to --workload" in r.output
    r = runner.invoke(app, ["sim", "--workload", str(FIXTURE), "--placement", "async-streaming"])
    assert r.exit_code == 2 and "--placement" in r.output


def test_token_staleness_weighs_by_the_runs_calls(wf):
    """Every execution of the fixture made 8 calls: per token is then per execution. Without
    calls the token mean weighs executions by their length instead."""
    w = load_workload(wf)
    draw, _ = replay_draw(w, sim_config(w, ["elastic"]))
    assert draw.calls is not None and draw.calls[0, 0] == 8
    p = predict(wf)
    assert p["staleness_mean"] == pytest.approx(p["staleness_serving_per_execution"], abs=1e-12)
    for r in wf["executions"]:
        r["calls"] = None
    q = predict(wf)
    assert q["staleness_mean"] != pytest.approx(q["staleness_serving_per_execution"], abs=1e-6)
    assert q["makespan_s"] == p["makespan_s"]  # weighting never changes the schedule


def test_measured_group_compute_replays_as_indivisible_blocks(wf):
    """A run that measured each group's compute (workload.json ``groups``): its first k claims
    carry the group's seconds and the rest nothing, where the mean per micro-step would
    spread it evenly over cells. Unlisted groups keep the mean; older files have no list."""
    w = load_workload(wf)
    cfg = sim_config(w, ["elastic"])
    assert replay_draw(w, cfg)[0].train_h is None  # the fixture predates the list
    base = predict(wf)["makespan_s"]
    # every group of the run trained nothing (equal rewards): no compute, never slower
    nothing = copy.deepcopy(wf)
    nothing["groups"] = [{"group": g, "train_s": 0.0, "micro_steps": 0} for g in range(19)]
    draw, info = replay_draw(load_workload(nothing), cfg)
    assert info["groups_measured"] == 19 and (draw.train_blocks == 0).all()
    free = predict(nothing)
    assert free["makespan_s"] <= base + 1e-6
    # what is busy now is the core's optimizer steps and publications, never a claim
    rest = sum(b - a for cell in free["busy"] for a, b in cell)
    assert rest < 1.0
    # one group's compute as a single 30 s block: one cell computes it whole (it cannot be
    # split over cells), and the step that trains it lasts at least that long
    lump = copy.deepcopy(nothing)
    lump["groups"][0] = {"group": 0, "train_s": 30.0, "micro_steps": 1}
    p = predict(lump)
    blocks = sorted(b - a for cell in p["busy"] for a, b in cell)
    # one block on one cell (a busy interval may run on into the core's optimizer step)
    assert blocks[-1] == pytest.approx(30.0, abs=0.5) and blocks[-2] < 1.0
    s0, e0 = next((a, b) for a, b in p["steps"] if b - a > 1.0)  # its step waits for it
    assert e0 - s0 >= 30.0 - 1e-6 and p["makespan_s"] > free["makespan_s"] + 15.0
    # two blocks of one group share its seconds
    two = copy.deepcopy(nothing)
    two["groups"][0] = {"group": 0, "train_s": 30.0, "micro_steps": 2}
    blocks2 = sorted(b - a for cell in predict(two)["busy"] for a, b in cell)
    assert blocks2[-2:] == pytest.approx([15.0, 15.0], abs=0.5) and blocks2[-3] < 1.0
