"""One cell's training role in ``gyre run``: the replica, and on the core the optimizer state.

The runtime's :class:`~gyre.runtime.cell.Cell` is role plumbing (an engine, or this); all
training state lives here, in one object the cell builds once and keeps across switches:

* every cell in training holds a :class:`~gyre.train.replica.ReplicaWorker`; a satellite's is
  built on each switch into training and dropped on the way out, and pulls the core's weight
  snapshot of the step's policy version;
* the core (cell 0) also holds the optimizer, the :class:`~gyre.train.checkpoint.TrainerState`
  (step, policy version, data cursor) and the authoritative weights, and keeps all of them in
  host memory while it serves rollouts;
* the micro-step tasks of the open step, decoded once per group however many of its
  micro-steps this cell computes.

The step itself is :mod:`gyre.train.step`, the same one ``gyre train demo``'s core runs.
Nothing here knows Ray: the cell hands tasks in and stats out as plain objects.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gyre.train.checkpoint import TrainerState, load_optimizer, load_state, write_hf
from gyre.train.comm import PrefixCommunicators
from gyre.train.config import TrainerConfig
from gyre.train.replica import ReplicaWorker
from gyre.train.stats import ObjectiveStats
from gyre.train.step import build_optimizer, checkpoint_if_due, optimizer_step, reduce_step
from gyre.train.tasks import MicroStepTask
from gyre.train.weights import FileWeightChannel, load_params, named_params


class CellTrainer:
    """The training state of cell ``cell`` (0: the core)."""

    def __init__(self, cell: int, cfg: TrainerConfig):
        self.cell, self.cfg = cell, cfg
        self.worker: ReplicaWorker | None = None  # while training (the core keeps it)
        self.optimizer: torch.optim.Optimizer | None = None  # core only
        self.state: TrainerState | None = None  # core only
        self.version = -1  # policy version of the replica's weights
        self._step = -1  # the step whose tasks are cached
        self._tasks: dict[int, dict[int, MicroStepTask]] = {}  # group -> task index -> task

    @property
    def is_core(self) -> bool:
        return self.cell == 0

    def replica(self) -> ReplicaWorker:
        if self.worker is None:
            raise RuntimeError(f"cell {self.cell} has no training replica")
        return self.worker

    def _core(self) -> tuple[torch.optim.Optimizer, TrainerState]:
        """The core's optimizer and trainer state (built by its first load)."""
        if self.optimizer is None or self.state is None:
            raise RuntimeError(f"cell {self.cell} holds no optimizer (only the core does)")
        return self.optimizer, self.state

    # ---------------------------------------------------------------- into and out of training
    def load(self, version: int, snapshot_dir: str, resume_from: str | None = None) -> None:
        """Become a training replica at ``version``. The core builds its optimizer once (from a
        checkpoint on resume) and publishes a snapshot for joining satellites; a satellite
        pulls the core's snapshot of ``version``."""
        if self.is_core:
            if self.worker is None:
                self._start_core(resume_from)
            self.snapshot(snapshot_dir)
        else:
            worker = self.worker = ReplicaWorker(self.cfg)
            worker.start(self.cfg.model_dir)
            self.version = -1
            self._pull(version, snapshot_dir)

    def _start_core(self, resume_from: str | None) -> None:
        torch.manual_seed(self.cfg.seed)
        worker = self.worker = ReplicaWorker(self.cfg)
        worker.start(resume_from or self.cfg.model_dir)
        self.optimizer = build_optimizer(worker.params, self.cfg.optim)
        self.state = TrainerState(model_source=self.cfg.model_dir)
        if resume_from:
            load_optimizer(Path(resume_from), self.optimizer)
            self.state = load_state(Path(resume_from))
        self.version = self.state.policy_version

    def _pull(self, version: int, snapshot_dir: str) -> None:
        if version == self.version:
            return
        load_params(self.replica().live_model, FileWeightChannel(snapshot_dir).pull(version))
        self.version = version

    def drop(self) -> None:
        """Satellites drop their replica; the core keeps weights and optimizer state."""
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
        """Forward/backward of tasks ``indices`` of ``group``; gradients accumulate. ``fetch``
        returns the group's tasks, called only for the first of its micro-steps this cell
        computes in ``step`` (a pre-pass may read any task of the group). Returns summed stats."""
        worker = self.replica()
        if not self.is_core:
            self._pull(version, snapshot_dir)
        elif self.version != version:
            raise RuntimeError(f"core holds version {self.version}, step {step} needs {version}")
        by_index = self._group_tasks(step, group, fetch)
        stats = ObjectiveStats()
        for i in indices:
            stats.add(
                worker.compute(
                    by_index[i], step=step, get_task=by_index.__getitem__, version=version
                )
            )
        return stats

    def _group_tasks(
        self, step: int, group: int, fetch: Callable[[], Sequence[MicroStepTask]]
    ) -> dict[int, MicroStepTask]:
        if step != self._step:  # a new step: the last one's tasks are done with
            self._tasks.clear()
            self._step = step
        if group not in self._tasks:
            self._tasks[group] = {t.index: t for t in fetch()}
        return self._tasks[group]

    def reduce(self, comm: PrefixCommunicators | None, k: int, stats: ObjectiveStats) -> None:
        """A satellite's part of the step's reduce over cells 0..k-1; its gradients are cleared."""
        worker = self.replica()
        reduce_step(worker, comm, k, stats)
        worker.zero_grad()
        worker.new_step()
        self._tasks.clear()

    def finish_step(
        self,
        comm: PrefixCommunicators | None,
        k: int,
        stats: ObjectiveStats,
        n_scored: int,
        groups: list[str],
        snapshot_dir: str,
        checkpoint_dir: str | None,
        total_steps: int | None,
    ) -> dict[str, float]:
        """Core: reduce over cells 0..k-1, the optimizer step, snapshot, checkpoint when due."""
        worker = self.replica()
        optimizer, state = self._core()
        t0 = time.perf_counter()
        total = reduce_step(worker, comm, k, stats)
        t_reduce = time.perf_counter() - t0
        m = optimizer_step(
            worker,
            optimizer,
            state,
            total,
            n_scored=n_scored,
            groups=groups,
            grad_clip=self.cfg.optim.grad_clip,
        )
        self.version = state.policy_version
        self._tasks.clear()
        t1 = time.perf_counter()
        self.snapshot(snapshot_dir)
        m["timing/snapshot"] = time.perf_counter() - t1
        ck = self.cfg.checkpoint
        t_ck = checkpoint_if_due(ck, checkpoint_dir, worker, optimizer, state, total_steps)
        if t_ck is not None:
            m["timing/checkpoint"] = t_ck
        m["timing/reduce"] = t_reduce
        m["timing/finish_step"] = time.perf_counter() - t0
        return m

    # ---------------------------------------------------------------- weights out
    def snapshot(self, snapshot_dir: str) -> int:
        """Core: publish the current weights for joining satellites."""
        FileWeightChannel(snapshot_dir).publish(
            self.version, named_params(self.replica().live_model)
        )
        return self.version

    def whole_model(self) -> torch.nn.Module:
        """Core: the model holding the whole current weights (what publication reads; a
        sharded cell's twin gathers them first)."""
        return self.replica().live_model

    def save_hf(self, out_dir: str) -> None:
        """Core: the current weights as a Hugging Face directory (what engines reload from disk)."""
        write_published(self.replica().live_model, self.cfg.model_dir, out_dir)


def write_published(model: torch.nn.Module, model_source: str, out_dir: str) -> None:
    """``model`` as a Hugging Face directory, written aside and renamed into place."""
    tmp = Path(out_dir + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf(model, model_source, tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
