"""The core cell: authoritative weights, the optimizer, and the step loop.

One step (= one batch = one optimizer step)::

    publish weight snapshot (version v)  ->  open step on the coordinator
    loop: pump the packing buffer; claim a micro-step; forward/backward; mark done
    seal (all micro-steps done; membership frozen at k cells)
    reduce gradients over the prefix communicator of k cells
    scale by 1/E, clip, optimizer.step, v -> v+1, commit the data cursor, checkpoint
      (gyre.train.step: the same optimizer step as gyre run's core cell)

Satellites (:mod:`gyre.train.demo.satellite`) can join at any point before the seal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gyre.train.buffer import (
    Packer,
    PackingBuffer,
    PackStats,
    ReadyGroup,
    pack_groups,
    pack_rows,
)
from gyre.train.checkpoint import TrainerState, latest_checkpoint, load_optimizer, load_state
from gyre.train.comm import PrefixCommunicators
from gyre.train.config import ObjectiveConfig, StreamConfig, TrainerConfig
from gyre.train.demo.coordinator import StepCoordinator, StepSeal
from gyre.train.objective import ObjectiveStats
from gyre.train.replica import ReplicaWorker
from gyre.train.step import build_optimizer, checkpoint_if_due, optimizer_step, reduce_step
from gyre.train.weights import WeightChannel, named_params


@dataclass
class StepFeeder:
    """Feeds one step: pulls landed groups from ``source``, packs them, puts tasks, closes at B groups.

    ``pump()`` is cheap and idempotent; the core calls it between micro-steps and while
    it waits, so the queue fills as groups land (streaming). With ``whole_batch=True`` it
    waits for all B groups and packs them in one go (the non-streaming baseline).
    """

    buffer: PackingBuffer
    coordinator: StepCoordinator
    step: int
    stream: StreamConfig
    objective: ObjectiveConfig
    source: Callable[[], list[ReadyGroup]] | None = None
    packer: Packer = pack_rows
    whole_batch: bool = False
    taken: list[ReadyGroup] = field(default_factory=list)
    stats: PackStats = field(default_factory=PackStats)
    next_index: int = 0
    closed: bool = False

    def pump(self) -> None:
        if self.closed:
            return
        if self.source is not None:
            for g in self.source():
                self.buffer.add(g)
        need = self.stream.batch_groups - len(self.taken)
        if self.whole_batch and len(self.buffer) < need:
            return
        groups = self.buffer.take(need)
        if groups:
            try:
                chunk = pack_groups(
                    groups, self.next_index, self.stream, self.objective, self.packer
                )
            except Exception:
                self.buffer.give_back(groups)  # lose nothing: the groups stay ready
                raise
            for t in chunk.tasks:
                self.coordinator.put(self.step, t)
            self.next_index += len(chunk.tasks)
            self.stats.add(chunk.stats)
            self.taken.extend(groups)
        if len(self.taken) >= self.stream.batch_groups:
            self.closed = True
            self.coordinator.close(
                self.step,
                self.stats.executions_scored,
                {"groups": [g.group_id for g in self.taken], "pack": self.stats.__dict__},
            )


@dataclass
class StepResult:
    step: int
    policy_version: int  # after the step
    seal: StepSeal
    metrics: dict[str, float] = field(default_factory=dict)


def claim_microsteps(
    coord: StepCoordinator,
    worker: ReplicaWorker,
    cell: int,
    step: int,
    max_claims: int | None,
    on_microstep: Callable[[int], None] | None,
    pump: Callable[[], None] | None = None,
    version: int | None = None,
) -> tuple[ObjectiveStats, int, float]:
    """The claim loop every participant of a step runs (core and satellites alike).

    Returns the summed objective stats, the number of micro-steps done and the
    compute seconds. ``pump`` (the core's) moves newly landed groups onto the
    queue while waiting and after each micro-step.
    """
    stats, n, t_compute = ObjectiveStats(), 0, 0.0
    while max_claims is None or n < max_claims:
        task = coord.claim(step, idle=pump)
        if task is None:
            break
        t0 = time.perf_counter()
        stats.add(
            worker.compute(task, step=step, get_task=lambda i: coord.get(step, i), version=version)
        )
        t_compute += time.perf_counter() - t0
        coord.done(step, task.index, cell)
        n += 1
        if on_microstep is not None:
            on_microstep(n)
        if pump is not None:
            pump()
    return stats, n, t_compute


class Core:
    """Cell 0. Explicit ``start``/``stop``; no global state (a Ray actor can own one)."""

    cell = 0

    def __init__(
        self,
        cfg: TrainerConfig,
        coordinator: StepCoordinator,
        weights: WeightChannel | None = None,
        comm: PrefixCommunicators | None = None,
    ):
        self.cfg, self.coord, self.weights, self.comm = cfg, coordinator, weights, comm
        self.worker = ReplicaWorker(cfg)
        self.optimizer: torch.optim.Optimizer | None = None
        self.state = TrainerState(model_source=cfg.model_dir)
        self.buffer = PackingBuffer()

    # lifecycle --------------------------------------------------------------------------
    def start(self, *, resume: bool = True) -> None:
        torch.manual_seed(self.cfg.seed)
        ckpt = latest_checkpoint(self.cfg.checkpoint.dir) if resume else None
        self.worker.start(str(ckpt) if ckpt else self.cfg.model_dir)
        self.optimizer = build_optimizer(self.worker.params, self.cfg.optim)
        if ckpt is not None:
            load_optimizer(ckpt, self.optimizer)
            self.state = load_state(ckpt)
        self.buffer = PackingBuffer(consumed=self.state.consumed_groups)

    def stop(self) -> None:
        self.worker.stop()
        self.optimizer = None

    @property
    def policy_version(self) -> int:
        return self.state.policy_version

    @property
    def model(self) -> torch.nn.Module:
        return self.worker.live_model

    @property
    def live_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer between ``start()`` and ``stop()``."""
        if self.optimizer is None:
            raise RuntimeError("core is not started (call start() first)")
        return self.optimizer

    def add_groups(self, groups: list[ReadyGroup]) -> int:
        """Groups that became ready; returns how many were new (not consumed, not queued)."""
        return sum(self.buffer.add(g) for g in groups)

    # the step -----------------------------------------------------------------------------
    def run_step(
        self,
        *,
        source: Callable[[], list[ReadyGroup]] | None = None,
        whole_batch: bool = False,
        max_claims: int | None = None,
        packer: Packer = pack_rows,
        on_microstep: Callable[[int], None] | None = None,
    ) -> StepResult:
        """Run one batch to its optimizer step.

        ``source`` is polled for newly landed groups (streaming); ``whole_batch`` waits for
        all B groups before packing (baseline). ``max_claims`` caps how many micro-steps the
        core itself processes (benchmarks/tests that fix the split); ``on_microstep(n)`` is
        called after the core's n-th micro-step.
        """
        B = self.cfg.stream.batch_groups
        if source is None and len(self.buffer) < B:
            raise ValueError(
                f"a step needs {B} ready groups and {len(self.buffer)} are in the buffer; add more "
                "with add_groups() or pass source= to stream groups as they land"
            )
        t0, c0 = time.perf_counter(), time.process_time()
        step, version = self.state.step, self.state.policy_version
        if self.weights is not None:
            self.weights.publish(version, named_params(self.model))
        self.coord.open_step(step, version)
        feeder = StepFeeder(
            buffer=self.buffer,
            coordinator=self.coord,
            step=step,
            stream=self.cfg.stream,
            objective=self.cfg.objective,
            source=source,
            packer=packer,
            whole_batch=whole_batch,
        )
        self.worker.zero_grad()
        self.worker.new_step()
        try:
            seal, stats, n, t_compute = self._accumulate(step, feeder, max_claims, on_microstep)
        except BaseException:
            # the step is abandoned: its groups go back to the buffer (not consumed), no update
            self.buffer.give_back(feeder.taken)
            self.worker.zero_grad()
            raise
        stale = [version - g.version() for g in feeder.taken]
        t_reduce = time.perf_counter()
        total = reduce_step(self.worker, self.comm, seal.participants, stats)
        t_reduce = time.perf_counter() - t_reduce
        groups = seal.meta.get("groups", [])
        metrics = optimizer_step(
            self.worker,
            self.live_optimizer,
            self.state,
            total,
            n_scored=seal.n_scored,
            groups=groups,
            grad_clip=self.cfg.optim.grad_clip,
        )
        self.buffer.commit(groups)
        ck = self.cfg.checkpoint
        checkpoint_if_due(ck, ck.dir, self.worker, self.live_optimizer, self.state)
        dt = time.perf_counter() - t0
        pack = seal.meta.get("pack", {})
        metrics.update(
            {
                "timing/step": dt,
                "timing/step_cpu": time.process_time() - c0,
                "timing/reduce": t_reduce,
                "timing/core_compute": t_compute,
                "train/participants": seal.participants,
                "train/micro_steps": seal.n_items,
                "train/core_micro_steps": n,
                "train/tokens": float(pack.get("tokens", 0)),
                "train/tokens_per_s": float(pack.get("tokens", 0)) / dt if dt > 0 else 0.0,
                "batch/groups": pack.get("groups", 0),
                "batch/groups_all_equal": pack.get("groups_all_equal", 0),
                "batch/executions_scored": seal.n_scored,
                "batch/executions_missing": pack.get("executions_missing", 0),
                "batch/executions_split": pack.get("executions_split", 0),
                "batch/staleness_mean": sum(stale) / len(stale) if stale else 0.0,
                "batch/staleness_max": float(max(stale)) if stale else 0.0,
            }
        )
        return StepResult(
            step=step, policy_version=self.state.policy_version, seal=seal, metrics=metrics
        )

    def _accumulate(self, step, feeder, max_claims, on_microstep):
        """Claim and compute micro-steps until the queue is closed and empty (or the cap); seal."""
        feeder.pump()
        stats, n, t_compute = claim_microsteps(
            self.coord,
            self.worker,
            self.cell,
            step,
            max_claims,
            on_microstep,
            pump=feeder.pump,
            version=self.state.policy_version,
        )
        seal = self.coord.seal(step, idle=feeder.pump)
        return seal, stats, n, t_compute
