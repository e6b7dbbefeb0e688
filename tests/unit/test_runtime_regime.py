"""The regime fields of summary.json: shares, engine speed, and the calibration's pure parts."""

from __future__ import annotations

import pytest

from gyre.runtime import calibrate, measure


def test_training_share_counts_training_and_switching_into_it_up_to_the_end():
    segs = [
        [(0.0, 4.0, "rollout"), (4.0, 5.0, "to_training"), (5.0, 8.0, "training")],
        [(0.0, 10.0, "rollout")],
        [(0.0, 2.0, "training"), (2.0, 3.0, "to_rollout"), (3.0, 20.0, "rollout")],
    ]
    # cell 0: 1 s switching into training + 3 s training; cell 1 none; cell 2: 2 s
    assert measure.training_share(segs, 10.0) == pytest.approx((4.0 + 0.0 + 2.0) / 3 / 10.0)
    # a segment past the end is cut at it
    assert measure.training_share([[(0.0, 30.0, "training")]], 10.0) == pytest.approx(1.0)
    assert measure.training_share(segs, 0.0) is None and measure.training_share([], 5.0) is None


def test_compute_share_is_the_mean_busy_fraction():
    busy = [[(0.0, 1.0), (2.0, 4.0)], [], [(9.0, 12.0)]]
    assert measure.compute_share(busy, 10.0) == pytest.approx((3.0 + 0.0 + 1.0) / 3 / 10.0)


def test_tokens_per_s_weighs_by_tokens_and_skips_zero_length_calls():
    assert measure.tokens_per_s([(4, 1.0), (12, 1.0), (5, 0.0)]) == pytest.approx(8.0)
    assert measure.tokens_per_s([]) is None


def test_cpu_info_reads_the_first_processor_and_the_flags_that_matter():
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: avx512f\n"
    )
    assert calibrate.cpu_info(text) == {"cpu_model": "AMD EPYC 7B13", "cpu_flags": ["avx2"]}
    assert calibrate.cpu_info("") == {"cpu_model": None, "cpu_flags": []}


def test_calibration_summary_is_throughput_over_the_window():
    s = calibrate.summarize(iters=40, wall_s=2.0, cpu_s=0.8)
    assert s["ms_per_iteration"] == pytest.approx(50.0)
    assert s["gflops"] == pytest.approx(calibrate.flops_per_iteration() / 0.05 / 1e9, rel=1e-3)
    assert s["cpu_share"] == pytest.approx(0.4)  # what a 0.4-CPU quota allows
    assert calibrate.summarize(0, 1.0, 0.0)["gflops"] is None


def test_calibrate_records_a_failing_child_instead_of_raising(monkeypatch):
    monkeypatch.setattr(calibrate.sys, "executable", "/nonexistent/python")
    out = calibrate.calibrate(0.1, None)
    assert "error" in out and out["cpus"] >= 1 and out["load_after"] >= 0
