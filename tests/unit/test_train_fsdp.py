"""The FSDP2 cell layout math (the sharded step runs in tests/integration/test_train_fsdp_cells.py)."""

import pytest

from gyre.train.fsdp import CellLayout, ShardedGroups


def test_layout_prefix_groups_cover_exactly_the_participants():
    lay = CellLayout(cells=4, per_cell=2)
    for k in range(2, 5):
        ranks = sorted(r for local in range(2) for r in lay.prefix_ranks(k, local))
        assert ranks == list(range(2 * k))  # the k cells' ranks, each once
    assert lay.prefix_ranks(3, 1) == [1, 3, 5] and lay.cell_ranks(3) == [6, 7]
    assert [lay.cell_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_rank_reduces_only_over_a_step_it_took_part_in():
    lay = CellLayout(cells=3, per_cell=2)
    g = ShardedGroups(layout=lay, rank=5, mesh=None, prefix={2: "p2", 3: "p3"})  # type: ignore[arg-type]
    assert (g.cell, g.local, g.core_rank) == (2, 1, 1)
    assert g.group(3) == "p3"
    with pytest.raises(RuntimeError, match="did not take part"):
        g.group(2)  # cell 2 is outside a 2-cell step
    with pytest.raises(ValueError, match="no prefix group"):
        g.group(4)
