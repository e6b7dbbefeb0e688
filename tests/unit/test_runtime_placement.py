"""Where cells go: per-cell Ray resources from config, and a refusal (not a hang) when the
cluster cannot give them. The two-node run itself is tests/integration/test_runtime_two_nodes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.config import load_config
from gyre.runtime.ray_setup import RuntimeSetupError, cell_resources, check_resources

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def _cfg(tmp_path, *sets: str):
    return load_config(QUICKSTART, [f"model_dir={tmp_path}", *sets])


def test_each_cell_asks_for_the_shared_resources_plus_its_own(tmp_path):
    cfg = _cfg(
        tmp_path,
        'run.cell.resources={"pool": 0.1}',
        'run.cell_resources=[{"node_a": 1}, {"node_b": 1}, {"node_b": 1, "pool": 0.5}]',
    )
    assert [cell_resources(cfg, i) for i in range(3)] == [
        {"pool": 0.1, "node_a": 1},
        {"pool": 0.1, "node_b": 1},
        {"pool": 0.5, "node_b": 1},  # a cell's own entry wins over the shared one
    ]


def test_without_per_cell_entries_every_cell_asks_the_same(tmp_path):
    cfg = _cfg(tmp_path, 'run.cell.resources={"pool": 1}')
    assert [cell_resources(cfg, i) for i in range(3)] == [{"pool": 1}] * 3


def test_asks_the_cluster_can_give_pass():
    check_resources([{"node_a": 1}, {"node_b": 1}, {"node_b": 1}, {}], {"node_a": 2, "node_b": 2})


@pytest.mark.parametrize(
    "asks, offered, name",
    [
        ([{"node_b": 1}], {"CPU": 4}, "node_b=1"),  # no node offers it at all
        ([{"node_b": 1}, {"node_b": 1.5}], {"node_b": 2}, "node_b=2.5"),  # summed over cells
    ],
)
def test_asks_the_cluster_cannot_give_are_refused_not_left_pending(asks, offered, name):
    with pytest.raises(RuntimeSetupError, match=name) as e:
        check_resources(asks, offered)
    assert "\n" not in str(e.value) and "ray start --resources" in str(e.value)
