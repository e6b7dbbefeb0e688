"""Prediction bands: the grid over unstated parameters and the band arithmetic."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.sim.bands import FLAGSHIP_BAND_FITS, NL2REPO_BAND_FITS, PRESET_LABEL, band_points, bands
from gyre.sim.config import apply_overrides
from gyre.sim.presets import FLAGSHIP_TARGETS, NL2REPO_TARGETS, preset
from gyre.sim.sweep import PointSummary
from gyre.sim.workload import draw_workload, workload_stats


def test_toy_grid_starts_with_the_preset_and_spans_tail_and_query_sigma():
    pts = band_points("seed-toy", 8)
    assert next(iter(pts)) == PRESET_LABEL and pts[PRESET_LABEL] == {}
    assert len(pts) == 8
    assert {p.get("tail") for p in list(pts.values())[1:]} == {0.3, 0.4, 0.5, 0.6}


@pytest.mark.parametrize("name", ["nl2repo-122b", "flagship-2.4t"])
def test_paper_grids_apply_cleanly(name):
    cfg = preset(name)
    pts = band_points(name, cfg.policy.cell_capacity)
    # 3 timeouts x 3 tails x 3 colocated concurrencies; the flagship's free fit at 5 h lands on
    # tail 0.55, a point it already has (same label), so it has 24
    assert len(pts) == {"nl2repo-122b": 27, "flagship-2.4t": 24}[name]
    for ov in pts.values():
        c = apply_overrides(cfg, ov) if ov else cfg
        assert c.policy_config("colocate").cell_capacity <= cfg.policy.cell_capacity
        assert c.policy_config("elastic").cell_capacity == cfg.policy.cell_capacity


def test_refitted_points_still_match_the_papers_statistics():
    """Every (timeout, tail) of both grids reproduces the reported statistics within 7 % (the presets' tolerance)."""
    for name, fits, targets in (
        ("nl2repo-122b", NL2REPO_BAND_FITS, NL2REPO_TARGETS),
        ("flagship-2.4t", FLAGSHIP_BAND_FITS, FLAGSHIP_TARGETS),
    ):
        cfg = preset(name)
        assert len(fits) == 9
        for fit in fits.values():
            w = cfg.workload.model_copy(update=fit)
            s = workload_stats(draw_workload(w, 20000, 16, seed=7))
            for k, target in targets.items():
                assert s[k] == pytest.approx(target, rel=0.07), (fit, k, s[k])


def test_band_is_the_range_of_median_ratios():
    def point(label, co):
        return PointSummary(
            label=label,
            overrides={},
            seeds=3,
            makespan={"elastic": [10.0, 10.0, 10.0], "colocate": co},
            interrupted=0,
        )

    b = {
        x.placement: x
        for x in bands(
            [point("preset", [12.0, 13.0, 14.0]), point("b", [11.0, 11.0, 20.0])],
            {"elastic": 10.0, "colocate": 12.5},
        )
    }
    co = b["colocate"]
    assert co.preset_ratio == pytest.approx(1.3) and (co.lo, co.hi) == pytest.approx((1.1, 1.3))
    assert co.published == pytest.approx(1.25) and co.inside is True
    assert co.envelope_hi == pytest.approx(1.82)  # p90 of (1.1, 1.1, 2.0)
    assert b["elastic"].published is None and b["elastic"].inside is None


def test_cli_bands_json():
    r = CliRunner().invoke(
        app, ["sim", "sweep", "--preset", "seed-toy", "--study", "bands", "--seeds", "1", "--json"]
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output[r.output.index("{") :])
    assert len(obj["points"]) == 8
    names = {b["placement"] for b in obj["bands"]}
    assert names == {"colocate", "async", "async-streaming", "elastic"}
    for b in obj["bands"]:
        assert b["lo"] <= b["preset_ratio"] <= b["hi"]
    assert all(p["interrupted_executions"] == 0 for p in obj["points"])
