"""Multi-rank cells (``run.cell.devices = G > 1``): G Ray actors per cell, seen as one.

The policy and the world see K cells; only the cluster knows a cell may be G processes. Each
is a :class:`~gyre.runtime.cell.Cell` actor with its rank ``local`` in the cell. Rank 0 is the
cell's leader: it answers the heartbeat, reports the cell's pid/node, and alone runs the
rollout engine (on CPU one engine process per cell; on GPUs an engine spanning the cell's G
devices would be started by the leader, which Gyre's embedded engine does not do). Training
is every rank's: the replica is sharded over the cell's G ranks with FSDP2
(:class:`gyre.train.sharded_trainer.ShardedCellTrainer`).

:class:`RankedCell` is the handle the cluster keeps for such a cell: a method in
:data:`ALL_RANKS` goes to every rank (they run the same collectives, so every rank must get
every such call, in the same order: Ray runs an actor's calls one at a time, in the order the
driver made them), the rest to the leader. The answer is the leader's, except ``compute``'s:
the ranks' objective counters summed. With G = 1 the cluster keeps the plain actor handle and
nothing here runs.

The gloo world has K*G ranks (global rank = cell * G + local) and fsdp.py's groups: one mesh
per cell and one prefix group per (k, shard position). Its ranks keep those groups while the
cell switches roles. A checkpoint resumes only with the G it was written with
(:func:`resume_mismatch`). Not supported with G > 1: rebuilding the world after a lost cell
(the survivors' sharded replicas live on meshes of the old world), so a lost multi-rank cell
restarts the run from its last checkpoint, as a lost core does (:mod:`gyre.runtime.supervise`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray

ALL_RANKS = frozenset(
    {
        "setup",
        "teardown",
        "load_replica",
        "drop_replica",
        "compute",
        "reduce",
        "finish_step",
        "snapshot",
        "save_hf",
        "publish_in_memory",
    }
)


def _sum_stats(results: list[Any]) -> Any:
    total = results[0]
    for r in results[1:]:
        total.add(r)
    return total


COMBINE = {"compute": _sum_stats}


async def _gather(refs: list[Any], name: str) -> Any:
    results = await asyncio.gather(*refs)
    combine = COMBINE.get(name)
    return combine(list(results)) if combine else results[0]


class _Method:
    def __init__(self, cell: RankedCell, name: str):
        self.cell, self.name = cell, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit now (the call order per actor is fixed here); await the answer."""
        if self.name not in ALL_RANKS:
            return getattr(self.cell.leader, self.name).remote(*args, **kwargs)
        refs = [getattr(a, self.name).remote(*args, **kwargs) for a in self.cell.actors]
        return _gather(refs, self.name)


class RankedCell:
    """The G actors of one cell behind the interface of one actor handle."""

    def __init__(self, actors: list[Any]):
        self.actors = actors

    @property
    def leader(self) -> Any:
        return self.actors[0]

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)


def resume_mismatch(checkpoint: str, devices: int) -> str | None:
    """Why a checkpoint cannot resume with ``devices`` ranks per cell (None: it can): the core's
    optimizer state is saved as one file per core rank, so G must stay what it was."""
    saved = 1 + sum(1 for _ in Path(checkpoint).glob("optimizer-rank*.pt"))
    if saved == devices:
        return None
    return (
        f"--resume: {checkpoint} holds the optimizer state of cells of {saved} rank(s), "
        f"run.cell.devices is {devices}; resume with run.cell.devices={saved}"
    )


def actors(handle: Any) -> list[Any]:
    """A cell's actor handles, leader first (the handle itself for a one-rank cell)."""
    return list(handle.actors) if isinstance(handle, RankedCell) else [handle]


async def pids(handle: Any) -> list[int]:
    """The pid of every rank of a cell (one for a one-rank cell), leader first."""
    return list(await asyncio.gather(*[a.pid.remote() for a in actors(handle)]))


def kill(handle: Any, **kwargs: Any) -> None:
    """``ray.kill`` of a cell: every rank of a multi-rank one."""
    for a in actors(handle):
        ray.kill(a, **kwargs)


def new_cell(make: Any, devices: int) -> Any:
    """Cell ``i``'s handle: ``make(local, node)`` starts rank ``local`` (``node``: the Ray node
    to start it on, None for the leader, which goes where its resources say). The other ranks
    go to the leader's node (a cell's devices are one node's); waiting for the leader's node
    blocks the driver for the leader's start (at the run's start, or a restart)."""
    leader = make(0, None)
    if devices == 1:
        return leader
    node = ray.get(leader.node.remote())
    return RankedCell([leader] + [make(local, node) for local in range(1, devices)])


def rank_options(node: str | None) -> dict[str, Any]:
    """Ray options pinning a non-leader rank to its leader's node."""
    if node is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


# ---------------------------------------------------------------- inside a rank's process
def sharded_setup(cell: Any, dist_port: int, host: str, store_file: str | None = None) -> Any:
    """Join the K*G-rank world as rank ``cell.index * G + cell.local`` and build the sharded
    trainer over fsdp.py's groups (once: the groups then live as long as the process)."""
    from gyre.train.fsdp import CellLayout, init_sharded_process
    from gyre.train.sharded_trainer import ShardedCellTrainer

    if cell.trainer is not None:
        raise RuntimeError(
            f"cell {cell.index}: a multi-rank cell cannot join a rebuilt world "
            "(restarting a lost cell needs run.cell.devices = 1)"
        )
    _warm(cell.tcfg.model_dir)
    cuda = cell.tcfg.device.startswith("cuda")
    groups = init_sharded_process(
        CellLayout(cells=cell.world, per_cell=cell.devices),
        cell.index * cell.devices + cell.local,
        dist_port,
        backend="nccl" if cuda else "gloo",
        device_type="cuda" if cuda else "cpu",
        device_index=cell.local if cuda else None,  # UNTESTED: one GPU per rank on the node
        host=host,
        store_file=store_file,
    )
    return ShardedCellTrainer(cell.index, cell.tcfg, groups)


def _warm(model_dir: str) -> None:
    """Build the model once on the meta device (no memory, no weights read): its modeling code
    is imported now, at the run's start, not in the rank's first switch into training (a rank
    other than 0 runs no engine, so nothing else imports it; measured ~20 s under load)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))


def leave_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
