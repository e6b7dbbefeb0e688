"""`gyre sim` end to end through the real typer app (what scripts/quickstart.sh runs)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gyre.cli import app

runner = CliRunner()


def test_sim_all_placements_prints_comparison_table():
    r = runner.invoke(app, ["sim", "--preset", "seed-toy", "--placement", "all"])
    assert r.exit_code == 0, r.output
    for name in ("colocate", "async", "async-streaming", "elastic", "interrupted"):
        assert name in r.output


def test_sim_json_all_has_required_fields():
    r = runner.invoke(
        app, ["sim", "--preset", "seed-toy", "--placement", "all", "--seed", "3", "--json"]
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    assert set(obj) == {"colocate", "async", "async-streaming", "elastic"}
    for v in obj.values():
        for k in ("makespan_h", "interrupted_executions", "mean_staleness", "lower_bound_h"):
            assert k in v
        assert v["interrupted_executions"] == 0
        assert v["lower_bound_h"] <= v["makespan_h"]


def test_sim_single_placement_json_with_override_and_plot(tmp_path):
    png = tmp_path / "g.png"
    r = runner.invoke(
        app,
        [
            "sim",
            "--preset",
            "seed-toy",
            "--placement",
            "elastic",
            "--set",
            "tail=0.2",
            "--json",
            "--plot",
            str(png),
        ],
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    assert obj["placement"] == "elastic" and obj["makespan_h"] > 0
    assert png.stat().st_size > 10_000


def test_sim_bad_input_gives_clear_errors():
    r = runner.invoke(app, ["sim", "--preset", "nope"])
    assert r.exit_code == 2 and "unknown preset" in r.output
    r = runner.invoke(app, ["sim", "--preset", "seed-toy", "--set", "bogus=1"])
    assert r.exit_code == 2 and "unknown setting" in r.output
    r = runner.invoke(app, ["sim", "--preset", "seed-toy", "--placement", "hybrid"])
    assert r.exit_code == 2 and "--placement" in r.output


def test_sim_sweep_json():
    r = runner.invoke(
        app,
        [
            "sim",
            "sweep",
            "--preset",
            "seed-toy",
            "--seeds",
            "2",
            "--grid",
            "tail=0.2,0.75",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = r.stdout if hasattr(r, "stdout") else r.output
    obj = json.loads(out[out.index("{") :])
    assert len(obj["points"]) == 2
    assert obj["points"][0]["placements"]["elastic"]["makespan_h_median"] > 0


def test_quickstart_command_runs_as_a_process():
    """What scripts/quickstart.sh runs, through the real entry point and a pipe (no TTY)."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "sim", "--preset", "seed-toy", "--placement", "all"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any(line.startswith("│ elastic") for line in lines)
    assert not any("…" in line for line in lines if line.startswith("│"))  # no truncated cells


def test_sim_pairs_lists_staleness_pairs():
    r = runner.invoke(app, ["sim", "pairs", "--target", "1.5", "-B", "32"])
    assert r.exit_code == 0, r.output
    assert "colocate  (0, 4)" in r.output and "(0.5, 3)" in r.output


def test_sim_bursts_prints_breakdown_and_json_has_totals():
    r = runner.invoke(app, ["sim", "--preset", "seed-toy", "--placement", "elastic", "--bursts"])
    assert r.exit_code == 0, r.output
    assert "gather" in r.output and "overhang" in r.output
    r = runner.invoke(app, ["sim", "--preset", "seed-toy", "--placement", "elastic", "--json"])
    obj = json.loads(r.output)
    assert len(obj["bursts"]) == 4  # 12 steps / mu = 3
    assert obj["gather_h"] + obj["overhang_h"] == pytest.approx(obj["makespan_h"])
