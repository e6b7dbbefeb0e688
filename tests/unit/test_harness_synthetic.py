"""Synthetic harness: duration distributions and an offline run."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from gyre.harness.synthetic import draw_duration, main


@pytest.mark.parametrize("dist", ["lognormal", "exponential", "fixed"])
def test_duration_means(dist):
    rng = random.Random(0)
    xs = [draw_duration(rng, dist, 5400.0, 0.6, 0.0, float("inf")) for _ in range(20000)]
    assert statistics.fmean(xs) == pytest.approx(5400.0, rel=0.05)


def test_clipping_and_errors():
    rng = random.Random(1)
    xs = [draw_duration(rng, "uniform", 0, 0, 10.0, 20.0) for _ in range(1000)]
    assert min(xs) >= 10.0 and max(xs) <= 20.0
    assert draw_duration(rng, "fixed", 50.0, 0, 0.0, 16.2) == 16.2  # the harness-timeout-like clip
    with pytest.raises(ValueError, match="unknown distribution"):
        draw_duration(rng, "pareto", 1, 1, 0, 1)


def test_offline_run_writes_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "--calls",
                "0",
                "--dist",
                "fixed",
                "--mean-s",
                "10",
                "--time-scale",
                "0.001",
                "--write",
                "a.txt=4\\n2",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["virtual_s"] == 10.0 and out["calls"] == 0
    assert (tmp_path / "a.txt").read_text() == "4\n2"
    # Unreachable endpoint: every call fails -> exit status 1, failures on stderr.
    assert (
        main(
            [
                "--calls",
                "2",
                "--mean-s",
                "1",
                "--time-scale",
                "0",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--request-timeout",
                "2",
            ]
        )
        == 1
    )


def test_query_factor_is_shared_within_a_query(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def run(query: str, seed: int) -> dict:
        main(
            [
                "--calls",
                "0",
                "--dist",
                "fixed",
                "--mean-s",
                "100",
                "--time-scale",
                "0",
                "--query-sigma",
                "1.0",
                "--query-id",
                query,
                "--seed",
                str(seed),
            ]
        )
        return json.loads(capsys.readouterr().out)

    a1, a2, b = run("q-a", 1), run("q-a", 2), run("q-b", 1)
    assert a1["query_factor"] == a2["query_factor"] != b["query_factor"]
    assert a1["virtual_s"] == a2["virtual_s"] == pytest.approx(100 * a1["query_factor"], abs=0.01)
