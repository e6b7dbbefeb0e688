"""Typed configuration of a simulated run: cluster, workload, costs, placements.

Time is in hours throughout the simulator. ``SimConfig.policy_config(name)``
turns one placement entry into the ``gyre.policy.PolicyConfig`` the policy runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gyre.policy.config import Placement, PolicyConfig

SECOND_H = 1.0 / 3600.0


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cells: int = Field(8, ge=1, description="K cells")
    cell_capacity: int = Field(8, ge=1, description="C_e: concurrent executions per rollout cell")
    standalone_capacity: int = Field(
        0, ge=0, description="C_s: executions of a standalone rollout pool"
    )


class WorkloadConfig(BaseModel):
    """Execution durations: ``median_h * q * a``, q ~ LogNormal(0, query_sigma) per query,
    a ~ LogNormal(0, tail) per attempt, capped at the harness timeout (the workspace is
    still scored); plus an optional scoring time; an optional overall timeout turns an
    execution into a missing assessment (dropped from its group)."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(16, ge=1, description="N executions per group")
    batch_groups: int = Field(32, ge=1, description="B groups per optimizer step")
    steps: int = Field(12, ge=1, description="optimizer steps to run")
    median_h: float = Field(
        1.5, gt=0, description="median attempt duration before the query factor"
    )
    tail: float = Field(0.5, ge=0, description="sigma of the per-attempt lognormal")
    query_sigma: float = Field(0.3, ge=0, description="sigma of the per-query lognormal factor")
    harness_timeout_h: float = Field(
        4.5, gt=0, description="agent time cap; timed-out workspaces are scored"
    )
    score_mean_h: float = Field(
        0.0, ge=0, description="mean (exponential) scoring time after the harness exits"
    )
    overall_timeout_h: float | None = Field(
        None, gt=0, description="agent + scoring budget; beyond it: missing"
    )
    slowdown: float = Field(
        0.0, ge=0, description="rollout rate = 1 / (1 + slowdown * occupancy); 0 = linear scaling"
    )


class CostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_step_cell_h: float = Field(
        2.0, ge=0, description="forward/backward of one full step on ONE cell"
    )
    optim_h: float = Field(0.0, ge=0, description="core: reduce, clip, optimizer step")
    publish_h: float = Field(0.0, ge=0, description="core: publish weights to every rollout engine")
    micro_steps_per_execution: int = Field(
        1,
        ge=1,
        description="packing granularity: micro-steps per valid execution; each costs "
        "train_step_cell_h / (B N m). 1 = one indivisible chunk per execution (coarse when an "
        "execution's training is long, as in seed-toy: 15 cell-minutes)",
    )
    switch_to_training_h: float = Field(8.52 * SECOND_H, ge=0)
    switch_to_rollout_h: float = Field(3.46 * SECOND_H, ge=0)


class SupplyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rho_min: float = Field(0.25, gt=0, le=1)
    hold_tau_h: float = Field(2.0 / 60.0, ge=0)


class PlacementSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    placement: Placement
    phi: float = 0.0
    mu: int = 1
    streaming: bool = False
    async_train_cells: int = 0


def default_placements() -> dict[str, PlacementSpec]:
    """The paper's E[d] = 1.5 pairs: Colocate (0, 4), Async (1.5, 1), Elastic (0.5, 3)."""
    return {
        "colocate": PlacementSpec(placement=Placement.COLOCATE, phi=0.0, mu=4),
        "async": PlacementSpec(placement=Placement.ASYNC, phi=1.5, mu=1),
        "async-streaming": PlacementSpec(placement=Placement.ASYNC, phi=1.5, mu=1, streaming=True),
        "elastic": PlacementSpec(placement=Placement.ELASTIC, phi=0.5, mu=3, streaming=True),
    }


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    description: str = ""
    seed: int = 0
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    costs: CostConfig = Field(default_factory=CostConfig)
    supply: SupplyConfig = Field(default_factory=SupplyConfig)
    placements: dict[str, PlacementSpec] = Field(default_factory=default_placements)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        for name in self.placements:
            self.policy_config(name)  # raises a clear error for impossible combinations
        return self

    def policy_config(self, name: str) -> PolicyConfig:
        if name not in self.placements:
            raise ValueError(f"unknown placement {name!r}; have {sorted(self.placements)}")
        p = self.placements[name]
        return PolicyConfig(
            placement=p.placement,
            cells=self.cluster.cells,
            cell_capacity=self.cluster.cell_capacity,
            standalone_capacity=self.cluster.standalone_capacity,
            group_size=self.workload.group_size,
            batch_groups=self.workload.batch_groups,
            phi=p.phi,
            mu=p.mu,
            total_steps=self.workload.steps,
            streaming=p.streaming,
            async_train_cells=p.async_train_cells,
            micro_steps_per_execution=self.costs.micro_steps_per_execution,
            rho_min=self.supply.rho_min,
            hold_tau=self.supply.hold_tau_h,
        )

    def pool_groups(self) -> int:
        """Queries to draw: enough for every placement (steps * B plus the deepest queue)."""
        deepest = max(self.policy_config(n).queue_depth_groups for n in self.placements)
        return self.workload.steps * self.workload.batch_groups + deepest


# Short names accepted by ``--set`` (``tail=0.75`` instead of ``workload.tail=0.75``).
ALIASES: dict[str, str] = {
    "cells": "cluster.cells",
    "K": "cluster.cells",
    "cell_capacity": "cluster.cell_capacity",
    "C_e": "cluster.cell_capacity",
    "standalone_capacity": "cluster.standalone_capacity",
    "C_s": "cluster.standalone_capacity",
    "N": "workload.group_size",
    "group_size": "workload.group_size",
    "B": "workload.batch_groups",
    "batch_groups": "workload.batch_groups",
    "steps": "workload.steps",
    "median_h": "workload.median_h",
    "tail": "workload.tail",
    "query_sigma": "workload.query_sigma",
    "harness_timeout_h": "workload.harness_timeout_h",
    "overall_timeout_h": "workload.overall_timeout_h",
    "slowdown": "workload.slowdown",
    "train_cost": "costs.train_step_cell_h",
    "train_step_cell_h": "costs.train_step_cell_h",
    "micro": "costs.micro_steps_per_execution",
    "micro_steps_per_execution": "costs.micro_steps_per_execution",
    "rho_min": "supply.rho_min",
    "tau": "supply.hold_tau_h",
    "hold_tau_h": "supply.hold_tau_h",
    "seed": "seed",
}


def apply_overrides(cfg: SimConfig, overrides: list[str] | dict[str, Any]) -> SimConfig:
    """Return a copy of ``cfg`` with ``name=value`` overrides (dotted paths or ALIASES) applied.

    Values are parsed as JSON where possible (``0.75``, ``true``, ``null``), else kept as
    strings; pydantic then validates the result, so a bad name or value raises ValueError.
    """
    import json

    if isinstance(overrides, dict):
        items = list(overrides.items())
    else:
        items = []
        for item in overrides:
            if "=" not in item:
                raise ValueError(f"--set expects name=value, got {item!r}")
            k, v = item.split("=", 1)
            try:
                val: Any = json.loads(v)
            except json.JSONDecodeError:
                val = v
            items.append((k.strip(), val))
    data = cfg.model_dump(mode="json")
    for key, val in items:
        path = ALIASES.get(key, key).split(".")
        node = data
        for part in path[:-1]:
            if not isinstance(node, dict) or part not in node:
                raise ValueError(
                    f"unknown setting {key!r} (no {part!r}); try one of {sorted(ALIASES)}"
                )
            node = node[part]
        if not isinstance(node, dict) or path[-1] not in node:
            raise ValueError(
                f"unknown setting {key!r}; try one of {sorted(ALIASES)} or a dotted path"
            )
        node[path[-1]] = val
    return SimConfig.model_validate(data)
