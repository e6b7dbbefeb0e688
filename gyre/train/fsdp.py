"""FSDP2 inside a cell: K cells of G ranks, each cell's replica sharded over its own mesh.

On CPU every cell is one process holding a whole replica (:mod:`gyre.train.demo.core`). A cell
of G devices shards its replica with FSDP2 (``fully_shard``) over an intra-cell mesh.
Cells still join in fixed order, so the cross-cell reduce stays a prefix reduce, now done
per shard position: ranks with the same local index ``l`` in cells 0..k-1 hold the same
gradient shard and sum it over their own prefix group. Layout (global rank =
``cell * G + local``)::

    intra-cell group of cell c : [c*G, ..., c*G + G-1]          (FSDP mesh)
    prefix group (k, l)        : [l, G + l, ..., (k-1)*G + l]     k = 2..K, one per l

All groups are created by every rank in the same order at start (``new_group`` is
collective) and kept for the life of the processes, so a cell that misses steps and
joins again uses the groups it has. One step, after the seal froze k participants::

    every participant: backward per micro-step (FSDP2 sums the cell's G ranks into shards)
    reduce_sharded_grads  shard l summed over cells 0..k-1 into the core's rank l
    core cell only:       divide by E, clip, optimizer.step (the core holds the sharded
                          optimizer state; satellites hold none)
    broadcast_shards      the core's rank l sends its updated shard to rank l of cells 1..k-1

A cell that did not take part holds older weights; before its next join it loads the
published full snapshot (:func:`load_full_state`, the sharded twin of ``load_params``).
Device type and backend are arguments: ``cpu``/``gloo`` is what the tests run,
``cuda``/``nccl`` the GPU path.

Tested on CPU only (gloo, float64, 2 cells x 2 ranks, tests/integration/test_train_fsdp_cells.py):
the step is the same as one process's for every split of the micro-steps, a cell rejoins
after missing a step, and a full snapshot loads into a sharded cell. UNTESTED: CUDA/NCCL
(``init_sharded_process`` with ``device_index``), mixed-precision policies (``mp_policy``),
and the flex-attention packed forward under FSDP2. ``gyre run`` wires it in with ``run.cell.devices = G``
(:mod:`gyre.train.sharded_trainer`, :mod:`gyre.runtime.ranks`): each rank computes every G-th
of its cell's micro-steps between :func:`begin_accumulation` and :func:`sync_cell_grads`.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass(frozen=True)
class CellLayout:
    cells: int  # K
    per_cell: int  # G devices per cell

    @property
    def world(self) -> int:
        return self.cells * self.per_cell

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

    @property
    def cell(self) -> int:
        return self.layout.cell_of(self.rank)

    @property
    def local(self) -> int:
        return self.layout.local_of(self.rank)

    @property
    def core_rank(self) -> int:
        """The core cell's rank holding this rank's shard position (global rank = local)."""
        return self.local

    def group(self, k: int) -> dist.ProcessGroup:
        if not 2 <= k <= self.layout.cells:
            raise ValueError(f"no prefix group of {k} cells in a run of {self.layout.cells}")
        if self.cell >= k:
            raise RuntimeError(f"cell {self.cell} did not take part in a step of {k} cells")
        return self.prefix[k]


def build_groups(
    layout: CellLayout, rank: int, device_type: str = "cuda", backend: str | None = None
) -> ShardedGroups:
    """Create every intra-cell group and every (k, local) prefix group, in one fixed order.

    ``backend=None`` gives the default process group's backend to every new group.
    """
    mine: dist.ProcessGroup | None = None
    for c in range(layout.cells):
        g = dist.new_group(layout.cell_ranks(c), backend=backend)
        if c == layout.cell_of(rank):
            mine = g
    if mine is None:
        raise ValueError(f"rank {rank} is outside the layout's {layout.cells} cells")
    prefix: dict[int, dist.ProcessGroup] = {}
    for k in range(2, layout.cells + 1):
        for local in range(layout.per_cell):
            g = dist.new_group(layout.prefix_ranks(k, local), backend=backend)
            if local == layout.local_of(rank):
                prefix[k] = g
    mesh = DeviceMesh.from_group(mine, device_type)
    return ShardedGroups(layout=layout, rank=rank, mesh=mesh, prefix=prefix)


def init_sharded_process(
    layout: CellLayout,
    rank: int,
    port: int,
    *,
    backend: str = "nccl",
    device_type: str = "cuda",
    device_index: int | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 120.0,
    store_file: str | None = None,
) -> ShardedGroups:
    """Join the world of ``layout.world`` ranks and build the groups: the rendezvous is a
    FileStore at ``store_file`` (one machine), else a TCPStore on ``host:port``
    (:func:`gyre.ports.world_store`).

    On CUDA pass ``device_index`` (the rank's GPU on its node), set before any group exists.
    """
    from gyre.ports import world_store

    if device_type == "cuda" and device_index is not None:
        torch.cuda.set_device(device_index)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = world_store(host, port, layout.world, rank == 0, timeout=timeout, store_file=store_file)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=layout.world, timeout=timeout
    )
    return build_groups(layout, rank, device_type, backend)


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(
    model: torch.nn.Module, groups: ShardedGroups, *, mp_policy: Any = None
) -> torch.nn.Module:
    """FSDP2: shard every decoder layer, then the root (embeddings, norm, head).

    Gradients are *summed* over the cell's ranks (divide factor 1, not FSDP's mean): each
    rank computes its own part of a micro-step's summed loss, and the 1/E factor is applied
    once to the reduced gradient. ``mp_policy`` (a ``MixedPrecisionPolicy``) is passed
    through untested.
    """
    kw: dict[str, Any] = {"mesh": groups.mesh}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    # a Hugging Face causal LM: its decoder stack holds the layers (untyped: HF attributes)
    hf: Any = model
    decoder = hf.get_decoder() if hasattr(hf, "get_decoder") else getattr(hf, "model", hf)
    for layer in decoder.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        # a plain SUM: for float32 FSDP2 would fold the factor into PREMUL_SUM, which gloo lacks
        m.set_force_sum_reduction_for_comms(True)
    return model


def begin_accumulation(model: torch.nn.Module) -> None:
    """Unshard every FSDP module once (collective within the cell) and keep it unsharded, with
    gradient sync off, until :func:`sync_cell_grads`.

    Why: ``gyre run`` splits a cell's micro-steps over its ranks (rank ``l`` takes every G-th),
    and a micro-step is one forward per packed row plus the pre-pass's no-grad forwards, so the
    ranks of a cell run different numbers of forwards and backwards. With the parameters
    already unsharded and no reduce-scatter per backward, those passes issue no collective at
    all; the cell's one reduce-scatter happens in :func:`sync_cell_grads`, on every rank alike.
    Gradients accumulate locally on the unsharded parameters meanwhile (FSDP2's own gradient
    accumulation path).
    """
    mods = fsdp_modules(model)
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
        m.set_requires_gradient_sync(False, recurse=False)
    for m in mods:
        m.unshard()


def sync_cell_grads(model: torch.nn.Module, device: str | torch.device) -> None:
    """Sum the cell's ranks' accumulated gradients into each rank's shard (the FSDP2
    reduce-scatter, divide factor 1), then reshard: one zero-loss forward/backward of one token
    with gradient sync on, run by every rank of the cell (a rank that computed nothing adds
    zeros). Parameters are sharded again afterwards, as the optimizer and the cross-cell
    reduce want them."""
    mods = fsdp_modules(model)
    for m in mods:
        m.set_requires_gradient_sync(True, recurse=False)
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    (model(input_ids=ids).logits.sum() * 0.0).backward()
    for m in mods:
        m.reshard()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (shares its storage), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def reduce_sharded_grads(model: torch.nn.Module, groups: ShardedGroups, k: int) -> None:
    """Sum each local gradient shard over the k participating cells (result on the core cell).

    A participant that ran no micro-step sends zeros; a core without gradients gets them.
    """
    if k < 2:
        return
    g, dst = groups.group(k), groups.core_rank
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is None:
                if groups.cell == 0:
                    p.grad = torch.zeros_like(p)
                else:
                    dist.reduce(torch.zeros_like(_local(p)), dst=dst, group=g)
                    continue
            dist.reduce(_local(p.grad), dst=dst, op=dist.ReduceOp.SUM, group=g)


def sharded_optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    n_scored: int,
    grad_clip: float | None,
) -> float:
    """The core cell's step on its shards: divide by E, clip (norm over the whole model), step.

    Mirrors :func:`gyre.train.step.optimizer_step`; returns the gradient norm before clipping.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    with torch.no_grad():
        for p in params:
            p.grad.div_(n_scored)  # type: ignore[union-attr]
    norm: Any = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else math.inf)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def broadcast_shards(model: torch.nn.Module, groups: ShardedGroups, k: int) -> None:
    """The core's rank l sends its parameter shards to rank l of cells 1..k-1."""
    if k < 2:
        return
    g, src = groups.group(k), groups.core_rank
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(_local(p), src=src, group=g)


def finish_step(
    model: torch.nn.Module,
    groups: ShardedGroups,
    k: int,
    optimizer: torch.optim.Optimizer | None,
    *,
    n_scored: int,
    grad_clip: float | None,
) -> float | None:
    """Reduce, step on the core, send the new shards back: every participant of a k-cell step
    calls this; the core passes its optimizer. Returns the gradient norm on the core."""
    reduce_sharded_grads(model, groups, k)
    norm = None
    if groups.cell == 0:
        if optimizer is None:
            raise ValueError("the core cell steps its sharded optimizer: pass it")
        norm = (
            sharded_optimizer_step(model, optimizer, n_scored=n_scored, grad_clip=grad_clip)
            if n_scored
            else None
        )
    model.zero_grad(set_to_none=True)
    broadcast_shards(model, groups, k)
    return norm


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole tensors of every parameter on every rank of the cell (collective within the cell):
    what a core publishes as its snapshot."""
    with torch.no_grad():
        return {
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()
        }


def load_full_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a full snapshot into a sharded model: each rank keeps its own shard of every
    tensor (``distribute_tensor`` with no source rank, so no communication: every rank of
    the cell loaded the same snapshot)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n not in state:
                raise KeyError(f"the snapshot has no tensor {n!r}")
            full = state[n].to(device=_local(p).device, dtype=p.dtype)
            if isinstance(p, DTensor):
                shard = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(shard.to_local())
            else:
                p.copy_(full)
