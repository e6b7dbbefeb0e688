"""Every shipped example config loads and validates, so a renamed field cannot silently break
the commands docs/runtime.md gives for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import load_config
from gyre.runtime.cli import check_run

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_example_validates(path):
    cfg = load_config(path, [])
    assert cfg.policy.cells >= 1


def test_the_device_example_holds_each_cell_to_a_quota_below_the_cores():
    cfg = load_config(Path(EXAMPLES[0]).parent / "longtail-cells.toml", [])
    q = cfg.run.cell.cpu_quota
    assert q is not None and q * cfg.policy.cells < 2  # the host keeps part of a 2-core machine


def test_check_run_accepts_the_quickstart_example(tmp_path, tiny_model_dir):
    cfg = load_config(Path(EXAMPLES[0]).parent / "quickstart.toml", [f"model_dir={tiny_model_dir}"])
    check_run(cfg)
