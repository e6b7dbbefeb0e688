"""FSDP2 inside a cell (GPU path). UNTESTED: written without a GPU; treat as a sketch to verify.

On CPU every cell is one process holding a whole replica (:mod:`gyre.train.core`). On
GPUs a cell of G devices shards its replica with FSDP2 (``fully_shard``). Cells still
join in fixed order, so the cross-cell reduce stays a prefix reduce, now done per
shard position: ranks with the same local index ``l`` in cells 0..k-1 hold the same
gradient shard and sum it over their own prefix group. Layout (global rank =
``cell * G + local``)::

    intra-cell group of cell c : [c*G, ..., c*G + G-1]          (FSDP mesh)
    prefix group (k, l)        : [l, G + l, ..., (k-1)*G + l]     k = 2..K, one per l

All groups are created by every rank in the same order at start (``new_group`` is
collective). The core cell's G ranks hold the (sharded) optimizer state.

Not covered here (needs a device to get right): pulling a full snapshot into a
sharded satellite (load the full tensors, then ``distribute_tensor`` onto the
cell's mesh), mixed-precision policies, and flex-attention packed forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class CellLayout:
    cells: int  # K
    per_cell: int  # G devices per cell

    def cell_of(self, rank: int) -> int:
        return rank // self.per_cell

    def local_of(self, rank: int) -> int:
        return rank % self.per_cell

    def cell_ranks(self, cell: int) -> list[int]:
        return [cell * self.per_cell + i for i in range(self.per_cell)]

    def prefix_ranks(self, k: int, local: int) -> list[int]:
        return [c * self.per_cell + local for c in range(k)]


@dataclass
class ShardedGroups:
    layout: CellLayout
    rank: int
    mesh: DeviceMesh  # this cell's
    prefix: dict[int, dist.ProcessGroup]  # k -> process group of this rank's shard position


def build_groups(layout: CellLayout, rank: int, device_type: str = "cuda") -> ShardedGroups:
    """Create every intra-cell group and every (k, local) prefix group, in one fixed order."""
    from torch.distributed.device_mesh import DeviceMesh

    mine: dist.ProcessGroup | None = None
    for c in range(layout.cells):
        g = dist.new_group(layout.cell_ranks(c))
        if c == layout.cell_of(rank):
            mine = g
    assert mine is not None, f"rank {rank} is outside the layout's {layout.cells} cells"
    prefix: dict[int, dist.ProcessGroup] = {}
    for k in range(2, layout.cells + 1):
        for local in range(layout.per_cell):
            g = dist.new_group(layout.prefix_ranks(k, local))
            if local == layout.local_of(rank):
                prefix[k] = g
    mesh = DeviceMesh.from_group(mine, device_type)
    return ShardedGroups(layout=layout, rank=rank, mesh=mesh, prefix=prefix)


def shard_model(model: torch.nn.Module, groups: ShardedGroups) -> torch.nn.Module:
    """FSDP2: shard every decoder layer, then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import fully_shard

    # a Hugging Face causal LM: its decoder stack holds the layers (untyped: HF attributes)
    hf: Any = model
    decoder = hf.get_decoder() if hasattr(hf, "get_decoder") else hf.model
    for layer in decoder.layers:
        fully_shard(layer, mesh=groups.mesh)
    fully_shard(model, mesh=groups.mesh)
    return model


def reduce_sharded_grads(model: torch.nn.Module, groups: ShardedGroups, k: int) -> None:
    """Sum each local gradient shard over the k participating cells (result on the core cell)."""
    if k < 2:
        return
    g = groups.prefix[k]
    dst = groups.layout.local_of(groups.rank)  # the core cell's rank with this shard position
    for p in model.parameters():
        if p.grad is None:
            continue
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.reduce(local, dst=dst, op=dist.ReduceOp.SUM, group=g)
