"""One rank of a multi-rank cell's training role in ``gyre run`` (``run.cell.devices = G > 1``).

The sharded twin of :class:`gyre.train.trainer.CellTrainer`, with the same methods, so the
runtime's :class:`~gyre.runtime.cell.Cell` drives either. Every rank of a cell gets every call
(:mod:`gyre.runtime.ranks` fans them out) and they run the same collectives in the same order:

* the replica is sharded with FSDP2 over the cell's mesh (:mod:`gyre.train.fsdp`); a
  satellite's is built on each switch into training and dropped on the way out, the process
  groups stay;
* rank ``l`` computes every G-th of the micro-steps its cell claimed, with the parameters
  unsharded once per step (``begin_accumulation``), so ranks may run different numbers of
  forwards; the cell's gradient sum is one reduce-scatter at the reduce (``sync_cell_grads``);
* the cross-cell reduce is the prefix reduce per shard position, the core's G ranks hold the
  sharded optimizer state and step it, and send the new shards to the step's satellites;
* weights leave the cell whole: the core's ranks gather every tensor (collective) and its
  rank 0 loads them into a plain host copy of the model (``shell``), which publishes (HF
  directory, in-memory group, fingerprints) and checkpoints exactly as a one-rank core does.
  That copy is the memory price of publishing from rank 0.

Checkpoints hold the whole weights, the trainer state and each core rank's optimizer shard
(``optimizer.pt`` for rank 0, ``optimizer-rank<l>.pt`` for the others, local tensors); a resumed
core rank loads its own file back into DTensors (same G only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from gyre.train import fsdp
from gyre.train.checkpoint import TrainerState, load_state, save_checkpoint
from gyre.train.config import TrainerConfig
from gyre.train.objective import N_SUM
from gyre.train.replica import ReplicaWorker
from gyre.train.stats import ObjectiveStats
from gyre.train.step import build_optimizer, step_metrics
from gyre.train.tasks import MicroStepTask
from gyre.train.weights import FileWeightChannel, load_params, named_params


class _LocalOptimizer:
    """An optimizer's state with DTensors as this rank's local shards (what a checkpoint holds)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        sd = self.optimizer.state_dict()
        sd["state"] = {
            k: {n: fsdp._local(v) if isinstance(v, torch.Tensor) else v for n, v in s.items()}
            for k, s in sd["state"].items()
        }
        return sd


def load_sharded_optimizer(
    path: Path, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
) -> None:
    """This rank's optimizer shards (:class:`_LocalOptimizer`'s local tensors) back into
    DTensors shaped like their parameters; needs the G the checkpoint was written with."""
    from torch.distributed.tensor import DTensor

    sd = torch.load(path, weights_only=True)
    for i, st in sd["state"].items():
        p = params[int(i)]
        for name, t in st.items():
            if (
                isinstance(p, DTensor)
                and isinstance(t, torch.Tensor)
                and t.shape == p.to_local().shape
                and t.dim()
            ):
                st[name] = DTensor.from_local(
                    t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
                )
    optimizer.load_state_dict(sd)


class ShardedCellTrainer:
    """Rank ``groups.local`` of cell ``cell`` (0: the core) in a world of K cells x G ranks."""

    def __init__(self, cell: int, cfg: TrainerConfig, groups: fsdp.ShardedGroups):
        self.cell, self.cfg, self.groups = cell, cfg, groups
        self.worker: ReplicaWorker | None = None
        self.optimizer: torch.optim.Optimizer | None = None  # the core's ranks: their shards
        self.state: TrainerState | None = None  # the core's ranks (kept alike on each)
        self.shell: ReplicaWorker | None = None  # the core's rank 0: whole weights, host
        self.version = -1
        self._step = -1
        self._tasks: dict[int, dict[int, MicroStepTask]] = {}
        self._accumulating = False

    @property
    def is_core(self) -> bool:
        return self.cell == 0

    @property
    def local(self) -> int:
        return self.groups.local

    def replica(self) -> ReplicaWorker:
        if self.worker is None:
            raise RuntimeError(f"cell {self.cell} rank {self.local} has no training replica")
        return self.worker

    def _sharded_worker(self, model_dir: str) -> ReplicaWorker:
        worker = ReplicaWorker(self.cfg)
        worker.start(model_dir)
        fsdp.shard_model(worker.live_model, self.groups)
        return worker

    # ---------------------------------------------------------------- into and out of training
    def load(self, version: int, snapshot_dir: str, resume_from: str | None = None) -> None:
        if self.is_core:
            if self.worker is None:
                self._start_core(resume_from)
            self.snapshot(snapshot_dir)
        else:
            self.worker = self._sharded_worker(self.cfg.model_dir)
            self.version = -1
            self._pull(version, snapshot_dir)

    def _start_core(self, resume_from: str | None) -> None:
        """The core's rank: its shards of the weights (from a checkpoint on resume), its shards
        of the optimizer state (that checkpoint's file of this rank), the trainer state."""
        torch.manual_seed(self.cfg.seed)
        source = resume_from or self.cfg.model_dir
        worker = self.worker = self._sharded_worker(source)
        self.optimizer = build_optimizer(worker.params, self.cfg.optim)
        self.state = TrainerState(model_source=self.cfg.model_dir)
        if resume_from:
            name = f"optimizer-rank{self.local}.pt" if self.local else "optimizer.pt"
            load_sharded_optimizer(Path(resume_from) / name, self.optimizer, worker.params)
            self.state = load_state(Path(resume_from))
        if self.local == 0:
            self.shell = ReplicaWorker(self.cfg)
            self.shell.start(source)
        self.version = self.state.policy_version

    def _pull(self, version: int, snapshot_dir: str) -> None:
        """Load the core's published snapshot of ``version`` into this rank's shards. The
        cell's rank 0 reads it and broadcasts it in the cell: the core keeps only the newest
        snapshots (``SNAPSHOTS_KEPT``), and a rank that started later (a first model load
        in a fresh process takes seconds) could find its version pruned."""
        if version == self.version:
            return
        if self._accumulating:
            raise RuntimeError(f"cell {self.cell} must not load weights mid-step")
        model = self.replica().live_model
        if self.local == 0:
            state = FileWeightChannel(snapshot_dir).pull(version)
        else:
            state = {
                n: torch.empty(p.shape, dtype=p.dtype, device=fsdp._local(p).device)
                for n, p in model.named_parameters()
            }
        src = self.groups.layout.cell_ranks(self.cell)[0]
        intra = self.groups.mesh.get_group()
        for n in sorted(state):
            dist.broadcast(state[n], src=src, group=intra)
        fsdp.load_full_state(model, state)
        self.version = version

    def drop(self) -> None:
        self._tasks.clear()
        if not self.is_core:
            self.worker = None
            self.version = -1

    # ---------------------------------------------------------------- the step
    def compute(
        self,
        step: int,
        version: int,
        group: int,
        indices: Sequence[int],
        snapshot_dir: str,
        fetch: Callable[[], Sequence[MicroStepTask]],
    ) -> ObjectiveStats:
        """This rank's every G-th of ``indices``; the driver sums the ranks' stats."""
        worker = self.replica()
        if not self.is_core:
            self._pull(version, snapshot_dir)
        elif self.version != version:
            raise RuntimeError(f"core holds version {self.version}, step {step} needs {version}")
        if step != self._step:
            self._tasks.clear()
            self._step = step
        self._begin()
        mine = list(indices)[self.local :: self.groups.layout.per_cell]
        stats = ObjectiveStats()
        if not mine:
            return stats
        if group not in self._tasks:
            self._tasks[group] = {t.index: t for t in fetch()}
        by_index = self._tasks[group]
        for i in mine:
            stats.add(
                worker.compute(
                    by_index[i], step=step, get_task=by_index.__getitem__, version=version
                )
            )
        return stats

    def _begin(self) -> None:
        if not self._accumulating:
            fsdp.begin_accumulation(self.replica().live_model)
            self._accumulating = True

    def _cell_grads(self) -> None:
        """The cell's ranks' gradients summed into each rank's shard (every rank, every step)."""
        self._begin()
        fsdp.sync_cell_grads(self.replica().live_model, self.cfg.device)
        self._accumulating = False

    def _reduce_stats(self, k: int, stats: ObjectiveStats) -> ObjectiveStats:
        """Counters over cells 0..k-1 on each shard position's prefix group: every rank gets
        its cell's stats from the driver, so every core rank ends with the same total."""
        vec = torch.tensor(stats.as_list(), dtype=torch.float64)
        if k > 1:
            g, dst = self.groups.group(k), self.groups.core_rank
            dist.reduce(vec[:N_SUM], dst=dst, op=dist.ReduceOp.SUM, group=g)
            dist.reduce(vec[N_SUM:], dst=dst, op=dist.ReduceOp.MAX, group=g)
        return ObjectiveStats.from_list(vec.tolist())

    def reduce(self, comm: Any, k: int, stats: ObjectiveStats) -> None:
        """A satellite rank's part of the step; it receives the new shards from the core."""
        model = self.replica().live_model
        self._cell_grads()
        self._reduce_stats(k, stats)
        fsdp.reduce_sharded_grads(model, self.groups, k)
        model.zero_grad(set_to_none=True)
        if self._share_signal(k, False):
            fsdp.broadcast_shards(model, self.groups, k)
        self.version += 1  # the core's version after the step (weights moved only with signal)
        self._tasks.clear()

    def finish_step(
        self,
        comm: Any,
        k: int,
        stats: ObjectiveStats,
        n_scored: int,
        groups: list[str],
        snapshot_dir: str,
        checkpoint_dir: str | None,
        total_steps: int | None,
    ) -> dict[str, float]:
        """A core rank: sync, reduce, the sharded optimizer step, new shards out, snapshot,
        checkpoint when due. Returns the step's metrics (rank 0's are the ones reported)."""
        model = self.replica().live_model
        optimizer, state = self.optimizer, self.state
        if optimizer is None or state is None:
            raise RuntimeError(f"cell {self.cell} holds no optimizer (only the core does)")
        t0 = time.perf_counter()
        self._cell_grads()
        total = self._reduce_stats(k, stats)
        fsdp.reduce_sharded_grads(model, self.groups, k)
        t_reduce = time.perf_counter() - t0
        m = step_metrics(total, n_scored)
        signal = bool(n_scored and total.tokens)
        if signal:
            m["actor/grad_norm"] = fsdp.sharded_optimizer_step(
                model, optimizer, n_scored=n_scored, grad_clip=self.cfg.optim.grad_clip
            )
        model.zero_grad(set_to_none=True)
        if self._share_signal(k, signal):
            fsdp.broadcast_shards(model, self.groups, k)
        state.step += 1
        state.policy_version += 1
        state.consumed_groups.extend(groups)
        self.version = state.policy_version
        self._tasks.clear()
        t1 = time.perf_counter()
        self.snapshot(snapshot_dir)
        m["timing/snapshot"] = time.perf_counter() - t1
        if checkpoint_dir is not None and self.cfg.checkpoint.due(state.step, total_steps):
            t_ck = time.perf_counter()
            self._checkpoint(checkpoint_dir, optimizer, state)
            m["timing/checkpoint"] = time.perf_counter() - t_ck
        m["timing/reduce"] = t_reduce
        m["timing/finish_step"] = time.perf_counter() - t0
        m["train/cell_ranks"] = float(self.groups.layout.per_cell)
        return m

    def _share_signal(self, k: int, signal: bool) -> bool:
        """Whether the core stepped: the core's ranks say it to the step's satellites (a
        one-element broadcast in each shard position's prefix group), so the new shards are
        sent only when the weights moved."""
        flag = torch.tensor([1.0 if signal else 0.0])
        if k > 1:
            dist.broadcast(flag, src=self.groups.core_rank, group=self.groups.group(k))
        return bool(flag[0])

    # ---------------------------------------------------------------- weights out
    def _gather(self) -> torch.nn.Module | None:
        """Every core rank gathers the whole weights (collective in the cell); rank 0 loads
        them into its host copy and returns it, the others return None."""
        full = fsdp.full_state_dict(self.replica().live_model)
        if self.shell is None:
            return None
        model = self.shell.live_model
        load_params(model, full)
        return model

    def snapshot(self, snapshot_dir: str) -> int:
        model = self._gather()
        if model is not None:
            FileWeightChannel(snapshot_dir).publish(self.version, named_params(model))
        dist.barrier(group=self.groups.mesh.get_group())  # written before any rank returns
        return self.version

    def whole_model(self) -> torch.nn.Module | None:
        """Collective on the core's ranks: rank 0's host copy holding the current weights."""
        return self._gather()

    def _checkpoint(self, root: str, optimizer: torch.optim.Optimizer, state: TrainerState) -> None:
        """Every core rank: the other ranks stage their optimizer shard in ``root``, then rank 0
        writes the checkpoint with them inside, so ``latest`` never names one without them."""
        intra = self.groups.mesh.get_group()
        G = self.groups.layout.per_cell
        staged = {
            f"optimizer-rank{r}.pt": Path(root) / f".stage-step-{state.step}-rank{r}.pt"
            for r in range(1, G)
        }
        local = _LocalOptimizer(optimizer)
        if self.local:
            Path(root).mkdir(parents=True, exist_ok=True)
            torch.save(local.state_dict(), staged[f"optimizer-rank{self.local}.pt"])
        model = self._gather()  # collective: after it every rank's shard file is written
        if model is not None:
            opt = cast(torch.optim.Optimizer, local)  # its state_dict only
            save_checkpoint(root, model, opt, state, keep=self.cfg.checkpoint.keep, extra=staged)
        dist.barrier(group=intra)
