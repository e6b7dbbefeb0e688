"""The FSDP2 cell layout math (the sharded path itself needs GPUs and is untested here)."""

from gyre.train.fsdp import CellLayout


def test_layout_prefix_groups_cover_exactly_the_participants():
    lay = CellLayout(cells=4, per_cell=2)
    for k in range(2, 5):
        ranks = sorted(r for local in range(2) for r in lay.prefix_ranks(k, local))
        assert ranks == list(range(2 * k))  # the k cells' ranks, each once
    assert lay.prefix_ranks(3, 1) == [1, 3, 5] and lay.cell_ranks(3) == [6, 7]
    assert [lay.cell_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
