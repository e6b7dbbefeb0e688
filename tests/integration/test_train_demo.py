"""`gyre train demo --cells 3`: every step says who joined, and why a planned cell did not.

Satellites whose join point lies beyond the step (``--join-after 50``; a step has ~12
micro-steps) can never join before the seal: the deterministic stand-in for satellites
held up by load. The core must not wait for them (the policy), and the output and the
metrics file must say that the steps ran with the core alone.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gyre.train.cli import app

pytestmark = pytest.mark.slow


def test_demo_reports_cells_that_missed_each_step(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    r = CliRunner().invoke(
        app,
        [
            "demo",
            "--cells",
            "3",
            "--steps",
            "2",
            "--join-after",
            "50",
            "--model-dir",
            str(tiny_model_dir),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    steps = [x for x in lines if x.startswith("step ")]
    assert len(steps) == 2 and all(" cells 1/3 [0] " in x for x in steps), r.output
    for s in (0, 1):
        for c, point in ((1, 50), (2, 100)):
            assert (
                f"    cell {c} missed step {s}: the step sealed before this cell joined "
                f"(its join point: {point} micro-steps done)"
            ) in lines, r.output
    assert any(x.startswith("2 of 2 steps ran with fewer than the planned cells") for x in lines)
    rows = [json.loads(x) for x in (out / "demo" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["cells_joined"], m["cells_missed"]) for m in rows] == [([0], [1, 2])] * 2
    for c in (1, 2):
        acc = json.loads((out / "demo" / f"cell{c}.json").read_text())
        assert [a["joined"] for a in acc] == [False, False] and all(a["why"] for a in acc)
