"""bench/bench_regimes.py's pure parts: per-seed ratios and a predicted Gantt's training share."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("bench_regimes", ROOT / "bench" / "bench_regimes.py")
assert spec is not None and spec.loader is not None
br = importlib.util.module_from_spec(spec)
spec.loader.exec_module(br)


def _row(regime, placement, seed, s):
    return {"regime": regime, "placement": placement, "seed": seed, "measured_s": s}


def test_ratios_are_per_seed_and_skip_a_seed_missing_a_placement():
    rows = [
        _row("paper", "colocate", 0, 120.0),
        _row("paper", "async", 0, 90.0),
        _row("paper", "elastic", 0, 100.0),
        _row("paper", "colocate", 1, 110.0),  # seed 1 has no elastic run
        _row("light", "colocate", 0, 50.0),
    ]
    r = br.ratios(rows, "paper", "measured_s")
    assert r == {"colocate": [pytest.approx(1.2)], "async": [pytest.approx(0.9)]}


def test_predicted_share_counts_switching_only_when_it_leads_into_training():
    segs = [
        [0, "rollout", 0.0, 4.0],
        [0, "switching", 4.0, 5.0],
        [0, "training", 5.0, 8.0],
        [0, "switching", 8.0, 9.0],
        [0, "rollout", 9.0, 10.0],
        [1, "rollout", 0.0, 10.0],
    ]
    assert br._share(segs, 2, 10.0) == pytest.approx((1.0 + 3.0) / 2 / 10.0)
