"""Prefix communicators: one process group per prefix {0..k-1} of cells, k = 2..K.

Cells join a step in fixed order, so the participants are always a prefix and one
of these groups covers exactly them; the reduce never waits for a cell that did
not take part. ``new_group`` is collective over the whole world, so every rank
builds all K-1 groups at start, in the same order, and keeps them (the paper keeps
processes and groups alive while cells switch roles).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from gyre.ports import world_store


class PrefixCommunicators:
    """Holds the groups; ``reduce_sum(k, t)`` sums ``t`` over cells 0..k-1 into cell 0."""

    def __init__(self, world_size: int, rank: int):
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed must be initialised before building prefix communicators"
            )
        self.world_size, self.rank = world_size, rank
        self.groups: dict[int, dist.ProcessGroup] = {}
        for k in range(2, world_size + 1):  # same order on every rank
            self.groups[k] = dist.new_group(ranks=list(range(k)))

    def reduce_sum(self, k: int, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over cells 0..k-1 (result valid on cell 0). No-op for k == 1."""
        return self._reduce(k, tensor, dist.ReduceOp.SUM)

    def reduce_max(self, k: int, tensor: torch.Tensor) -> torch.Tensor:
        """In-place element-wise max over cells 0..k-1 (result valid on cell 0)."""
        return self._reduce(k, tensor, dist.ReduceOp.MAX)

    def _reduce(self, k: int, tensor: torch.Tensor, op) -> torch.Tensor:
        if k < 1 or k > self.world_size:
            raise ValueError(f"{k} participants but {self.world_size} cells")
        if self.rank >= k:
            raise RuntimeError(f"cell {self.rank} did not take part in a step of {k} cells")
        if k >= 2:
            dist.reduce(tensor, dst=0, op=op, group=self.groups[k])
        return tensor


def init_cell_process(
    rank: int,
    world_size: int,
    port: int,
    *,
    backend: str = "gloo",
    host: str = "127.0.0.1",
    timeout_s: float = 120.0,
    store_file: str | None = None,
) -> PrefixCommunicators:
    """Join the cells' process group and build the prefix groups.

    The rendezvous store is a FileStore at ``store_file`` (cells of one machine: see
    :func:`gyre.ports.world_store`), else a TCPStore on ``host:port`` (what
    ``init_method="tcp://host:port"`` builds, except that rank 0 listens on ``host`` only)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = world_store(host, port, world_size, rank == 0, timeout=timeout, store_file=store_file)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return PrefixCommunicators(world_size, rank)


def flat_grads(params: list[torch.Tensor]) -> torch.Tensor:
    """All gradients in one contiguous vector (zeros where a parameter got none)."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def unflatten_grads(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    off = 0
    for p in params:
        n = p.numel()
        g = flat[off : off + n].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        off += n
