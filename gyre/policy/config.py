"""Typed configuration of the scheduling policy.

Only *rules* live here (who may switch when, how much to dispatch). Costs (how
long a switch, a micro-step or a publication takes) belong to the world that
carries the actions out: the simulator's ``gyre.sim.config`` or the runtime's.
Times are in whatever unit the world stamps its events with (the simulator uses
hours); the only time-valued rule parameter is the supply-check hold ``hold_tau``.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Placement(str, Enum):
    """How GPUs are shared between rollout and training."""

    COLOCATE = "colocate"  # one pool, time-shared: everyone generates, then everyone trains
    ASYNC = "async"  # fixed rollout pool + fixed training pool, overlapping
    ELASTIC = "elastic"  # K cells that move between roles under the waterlevel rule


class CoreRetention(str, Enum):
    """Elastic only: when the core stays in training at a burst boundary (gyre.policy.retention)."""

    PAPER = "paper"  # rollout without the core covers w + the whole next dispatch
    ADAPTIVE = "adaptive"  # ... or covers w, when the core's last rollout stint was short


class PolicyConfig(BaseModel):
    """Everything the policy needs to decide; nothing about how long things take.

    ``phi`` and ``mu`` fix the mean scheduling staleness E[d] = phi + (mu - 1) / 2
    (see :mod:`gyre.policy.staleness`); hold it equal when comparing placements.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    placement: Placement
    cells: int = Field(
        8, ge=1, description="K: number of cells (each a training replica or an engine)"
    )
    cell_capacity: int = Field(
        8, ge=1, description="C_e: concurrent executions one rollout cell serves"
    )
    standalone_capacity: int = Field(
        0, ge=0, description="C_s: executions served by a standalone rollout pool"
    )
    group_size: int = Field(16, ge=1, description="N: executions (attempts) per group")
    batch_groups: int = Field(32, ge=1, description="B: groups consumed by one optimizer step")
    phi: float = Field(
        0.0, ge=0.0, description="extra dispatch, in batches beyond the current burst"
    )
    mu: int = Field(1, ge=1, description="optimizer steps per burst (between weight publications)")
    total_steps: int = Field(12, ge=1, description="run length in optimizer steps")
    streaming: bool = Field(
        False, description="train groups as they land instead of waiting for a full batch"
    )
    async_train_cells: int = Field(
        0,
        ge=0,
        description="Async only: cells 0..n-1 train for the whole run (0 = half of the cells)",
    )
    micro_steps_per_execution: int = Field(
        1,
        ge=1,
        description="packing granularity: micro-steps each valid execution of a group is cut into",
    )
    rho_min: float = Field(
        0.25, gt=0.0, le=1.0, description="supply check: fraction of B ready and unclaimed"
    )
    hold_tau: float = Field(
        0.0, ge=0.0, description="supply check must hold this long (world time units)"
    )
    core_retention: CoreRetention = Field(
        CoreRetention.PAPER,
        description="Elastic only: the core's retention test at a boundary (paper | adaptive; "
        "see gyre.policy.retention); other placements ignore it",
    )

    @model_validator(mode="after")
    def _check(self) -> PolicyConfig:
        extra = self.phi * self.batch_groups
        if abs(extra - round(extra)) > 1e-9:
            raise ValueError(
                f"phi * B must be a whole number of groups (phi={self.phi}, B={self.batch_groups})"
            )
        if self.placement is Placement.COLOCATE and self.phi != 0:
            raise ValueError(
                "colocate cannot dispatch extra work without interrupting executions: phi must be 0"
            )
        if self.placement is Placement.ASYNC:
            if self.cells < 2:
                raise ValueError("async needs at least 2 cells (one training, one rollout)")
            if self.train_cells >= self.cells:
                raise ValueError("async_train_cells must leave at least one rollout cell")
        if (
            self.placement is Placement.COLOCATE
            and self.standalone_capacity == 0
            and self.streaming
        ):
            # Legal, but pointless: with no standalone pool every group is ready before training starts.
            pass
        return self

    @property
    def extra_groups(self) -> int:
        """phi * B as a whole number of groups."""
        return int(round(self.phi * self.batch_groups))

    @property
    def queue_depth_groups(self) -> int:
        """Q_b = (phi + mu) B: outstanding (dispatched, not yet trained) groups after each dispatch."""
        return self.extra_groups + self.mu * self.batch_groups

    @property
    def train_cells(self) -> int:
        """Async's fixed training cells (default: half of the cells, rounded down, at least one)."""
        if self.async_train_cells:
            return self.async_train_cells
        return max(1, self.cells // 2)

    @property
    def supply_groups(self) -> int:
        """rho_min * B rounded up, at least one group."""
        return max(1, math.ceil(self.rho_min * self.batch_groups - 1e-9))

    @property
    def expected_staleness(self) -> float:
        return self.phi + (self.mu - 1) / 2.0
