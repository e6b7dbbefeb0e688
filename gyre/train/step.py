"""The optimizer step: one implementation for every trainer.

``gyre train demo``'s :class:`~gyre.train.demo.core.Core` and ``gyre run``'s core cell
(:class:`~gyre.train.trainer.CellTrainer`) both end a batch here::

    reduce gradients and counters over cells 0..k-1   (reduce_step)
    scale by 1/E, clip, optimizer.step, v -> v+1     (optimizer_step)
    checkpoint every trainer.checkpoint.every_steps  (checkpoint_if_due)

**A step without signal** (no scored execution, or no target token: every group all-equal
or missing) consumes its groups and leaves the weights as they are (``optimizer.step()`` is
not called: AdamW would still decay the weights no gradient asked to move), and the policy
version **advances** all the same. So policy versions and optimizer steps (= batches) stay
one count: the scheduling policy and the simulator number versions by steps
(``StartStep(version=steps_done)``), and ``gyre run`` resumes at version = the checkpoint's
step. The only cost is a publication of unchanged weights.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from gyre.train.checkpoint import TrainerState, save_checkpoint
from gyre.train.comm import PrefixCommunicators, flat_grads, unflatten_grads
from gyre.train.config import CheckpointConfig, OptimConfig
from gyre.train.objective import N_SUM, ObjectiveStats
from gyre.train.replica import ReplicaWorker


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name == "adamw":
        return torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
        )
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def reduce_step(
    worker: ReplicaWorker, comm: PrefixCommunicators | None, k: int, stats: ObjectiveStats
) -> ObjectiveStats:
    """Sum gradients and objective counters over cells 0..k-1 (result on the core)."""
    if k > 1:
        if comm is None:
            raise RuntimeError(f"{k} cells took part but this replica has no communicators")
        params = worker.params
        flat = flat_grads(params)
        comm.reduce_sum(k, flat)
        vec = torch.tensor(stats.as_list(), dtype=torch.float64, device=flat.device)
        comm.reduce_sum(k, vec[:N_SUM])  # counters sum, the max fields max
        comm.reduce_max(k, vec[N_SUM:])
        if comm.rank == 0:
            unflatten_grads(params, flat)
        return ObjectiveStats.from_list(vec.cpu().tolist())
    return stats


def step_metrics(total: ObjectiveStats, n_scored: int) -> dict[str, float]:
    """The ``actor/*`` and ``mismatch/*`` scalars of a step (``actor/grad_norm`` is set by the step)."""
    return {
        "actor/loss": total.loss_sum / n_scored if n_scored else 0.0,
        "actor/token_capfrac": total.tokens_capped / total.tokens if total.tokens else 0.0,
        "actor/pg_clipfrac": total.exec_clipped_weight / total.exec_weight
        if total.exec_weight
        else 0.0,
        "actor/executions_clipped": total.exec_clipped_weight,
        "actor/target_tokens": float(total.tokens),
        "actor/grad_norm": 0.0,
        **total.mismatch_metrics(),
    }


def optimizer_step(
    worker: ReplicaWorker,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    total: ObjectiveStats,
    *,
    n_scored: int,
    groups: list[str],
    grad_clip: float | None,
) -> dict[str, float]:
    """Apply the reduced gradient of one batch: divide by E = ``n_scored``, clip, step once.

    Then (signal or not, see the module docstring) the gradients are cleared, the step and
    the policy version advance by one, and ``groups`` join the data cursor. Returns the
    step's ``actor/*`` metrics.
    """
    m = step_metrics(total, n_scored)
    if n_scored and total.tokens:
        params = worker.params
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.div_(n_scored)
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else math.inf)
        m["actor/grad_norm"] = float(norm)
        optimizer.step()
    worker.zero_grad()
    worker.new_step()
    state.step += 1
    state.policy_version += 1
    state.consumed_groups.extend(groups)
    return m


def checkpoint_if_due(
    ck: CheckpointConfig,
    root: str | Path | None,
    worker: ReplicaWorker,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    total_steps: int | None = None,
) -> float | None:
    """Checkpoint into ``root`` (None: no checkpoints) when ``ck`` says the step that brought the
    trainer to ``state.step`` steps is due (every ``ck.every_steps`` and the run's last); keeps
    the newest ``ck.keep``. Returns the seconds it took, or None when none was written."""
    if root is None or not ck.due(state.step, total_steps):
        return None
    t0 = time.perf_counter()
    save_checkpoint(root, worker.live_model, optimizer, state, keep=ck.keep)
    return time.perf_counter() - t0
