"""Typed configuration of a simulated run: policy rules, workload, costs, placements.

Time is in hours throughout the simulator (the policy's ``hold_tau`` too). The
rules come as one embedded ``gyre.policy.PolicyConfig`` (``[policy]``: K, C_e,
C_s, N, B, steps, micro-steps, rho_min, hold_tau), declared once there; each
compared placement only says what it changes (placement, phi, mu, streaming,
async_train_cells). ``SimConfig.policy_config(name)`` is the policy config that
placement runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gyre.policy.config import Placement, PolicyConfig

SECOND_H = 1.0 / 3600.0
SIM_HOLD_TAU_H = 2.0 / 60.0  # the simulator's default supply hold: 2 minutes (the paper's tau)


def default_policy() -> PolicyConfig:
    """The shared rules when a config names none: the policy's defaults, tau = 2 min."""
    return PolicyConfig(placement=Placement.ELASTIC, hold_tau=SIM_HOLD_TAU_H)


class WorkloadConfig(BaseModel):
    """Execution durations: ``median_h * q * a``, q ~ LogNormal(0, query_sigma) per query,
    a ~ LogNormal(0, tail) per attempt, capped at the harness timeout (the workspace is
    still scored); plus an optional scoring time; an optional overall timeout turns an
    execution into a missing assessment (dropped from its group)."""

    model_config = ConfigDict(extra="forbid")

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
    speed_curve: list[tuple[float, float]] = Field(
        default_factory=list,
        description="measured [[occupancy, relative speed], ...] (occupancy = running / "
        "capacity, rising); interpolated linearly, flat beyond the ends; replaces slowdown",
    )

    @model_validator(mode="after")
    def _check_curve(self) -> WorkloadConfig:
        occ = [o for o, _ in self.speed_curve]
        if any(b <= a for a, b in zip(occ, occ[1:])):
            raise ValueError("speed_curve occupancies must rise strictly")
        if any(o < 0 for o in occ) or any(v <= 0 for _, v in self.speed_curve):
            raise ValueError("speed_curve needs occupancy >= 0 and speed > 0 at every point")
        if self.speed_curve and self.slowdown > 0:
            raise ValueError("set either slowdown or speed_curve, not both")
        return self

    def speed(self, occupancy: float) -> float:
        """Relative rollout speed of every running execution at this pooled occupancy.

        Serving is balanced (the proxy routes to the least-loaded engine), so each
        rollout cell's own occupancy equals the pooled one within one execution; one
        rate for all running executions is then each cell's own rate.
        """
        occ = min(max(occupancy, 0.0), 1.0)
        curve = self.speed_curve
        if curve:
            if occ <= curve[0][0]:
                return curve[0][1]
            for (o0, v0), (o1, v1) in zip(curve, curve[1:]):
                if occ <= o1:
                    return v0 + (v1 - v0) * (occ - o0) / (o1 - o0)
            return curve[-1][1]
        return 1.0 / (1.0 + self.slowdown * occ)


class CostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_step_cell_h: float = Field(
        2.0,
        ge=0,
        description="forward/backward of one full step on ONE cell; a micro-step costs "
        "train_step_cell_h / (B N m), m = policy.micro_steps_per_execution",
    )
    optim_h: float = Field(0.0, ge=0, description="core: reduce, clip, optimizer step")
    publish_h: float = Field(0.0, ge=0, description="core: publish weights to every rollout engine")
    switch_to_training_h: float = Field(8.52 * SECOND_H, ge=0)
    switch_to_rollout_h: float = Field(3.46 * SECOND_H, ge=0)
    # Costs measured by the runtime (issue 10) that the first model left out. Every default is 0,
    # so a preset that does not set them keeps its meaning (and its makespans) exactly.
    reshard_to_training_h: float = Field(
        0.0,
        ge=0,
        description="colocate only: resharding rollout -> training weights, added to every "
        "cell's switch into training (once per burst: the gang moves once per mu steps)",
    )
    reshard_to_rollout_h: float = Field(
        0.0,
        ge=0,
        description="colocate only: resharding training -> rollout weights, added to every "
        "cell's switch back to rollout",
    )
    publish_stall_h: float = Field(
        0.0,
        ge=0,
        description="at each publication every rollout engine pauses, reloads and resumes: "
        "running executions make no progress for this long (from the start of the publication)",
    )
    satellite_refresh_h: float = Field(
        0.0,
        ge=0,
        description="a satellite still training after an optimizer step reloads the core's new "
        "weights before its next micro-step (within a burst; Async's satellites every step)",
    )
    reroute_delay_h: float = Field(
        0.0,
        ge=0,
        description="when a cell leaves rollout, each execution it served loses this long "
        "(its in-flight call is cancelled and retried on another engine, which prefills its "
        "whole context again)",
    )
    kv_migration: bool = Field(
        False,
        description="the moved call takes its K/V along (gyre.proxy.kvmove): each execution "
        "loses migrated_reroute_delay_h instead of reroute_delay_h",
    )
    migrated_reroute_delay_h: float = Field(
        0.0,
        ge=0,
        description="with kv_migration, what a moved execution loses: the K/V transfer and one "
        "token's prefill (docs/measurements.md, KV migration: ~0.1 s at 2K tokens, 135M model)",
    )


class PlacementSpec(BaseModel):
    """One compared placement: what it changes in the shared ``[policy]``.

    Unset fields keep the shared policy's values; every value is validated by
    ``PolicyConfig`` itself (``SimConfig.policy_config``), so the rules and their
    bounds are declared once, in :mod:`gyre.policy.config`.
    """

    model_config = ConfigDict(extra="forbid")

    placement: Placement
    phi: float | None = None
    mu: int | None = None
    streaming: bool | None = None
    async_train_cells: int | None = None
    cell_capacity: int | None = Field(
        None,
        ge=1,
        description="C_e for this placement only (a colocated engine shares its GPUs with the "
        "training state, so it may serve fewer executions than an Elastic cell's engine)",
    )


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
    policy: PolicyConfig = Field(
        default_factory=default_policy,
        description="the rules every placement shares (times in hours); each placement "
        "entry overrides only placement, phi, mu, streaming, async_train_cells and cell_capacity",
    )
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    costs: CostConfig = Field(default_factory=CostConfig)
    placements: dict[str, PlacementSpec] = Field(default_factory=default_placements)

    @model_validator(mode="before")
    @classmethod
    def _policy_defaults(cls, data: Any) -> Any:
        """A partial ``[policy]`` gets the simulator's defaults for what it leaves out:
        a placement (each entry of ``placements`` sets its own) and tau = 2 min."""
        if isinstance(data, dict) and isinstance(data.get("policy"), dict):
            policy = {"placement": Placement.ELASTIC, "hold_tau": SIM_HOLD_TAU_H}
            data = {**data, "policy": {**policy, **data["policy"]}}
        return data

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        for name in self.placements:
            self.policy_config(name)  # raises a clear error for impossible combinations
        return self

    def policy_config(self, name: str) -> PolicyConfig:
        if name not in self.placements:
            raise ValueError(f"unknown placement {name!r}; have {sorted(self.placements)}")
        changes = self.placements[name].model_dump(exclude_none=True)
        return PolicyConfig.model_validate({**self.policy.model_dump(), **changes})

    def pool_groups(self) -> int:
        """Queries to draw: enough for every placement (steps * B plus the deepest queue)."""
        deepest = max(self.policy_config(n).queue_depth_groups for n in self.placements)
        return self.policy.total_steps * self.policy.batch_groups + deepest


# Short names accepted by ``--set`` (``tail=0.75`` instead of ``workload.tail=0.75``).
ALIASES: dict[str, str] = {
    "cells": "policy.cells",
    "K": "policy.cells",
    "cell_capacity": "policy.cell_capacity",
    "C_e": "policy.cell_capacity",
    "standalone_capacity": "policy.standalone_capacity",
    "C_s": "policy.standalone_capacity",
    "N": "policy.group_size",
    "group_size": "policy.group_size",
    "B": "policy.batch_groups",
    "batch_groups": "policy.batch_groups",
    "steps": "policy.total_steps",
    "total_steps": "policy.total_steps",
    "median_h": "workload.median_h",
    "tail": "workload.tail",
    "query_sigma": "workload.query_sigma",
    "harness_timeout_h": "workload.harness_timeout_h",
    "overall_timeout_h": "workload.overall_timeout_h",
    "slowdown": "workload.slowdown",
    "speed_curve": "workload.speed_curve",
    "reshard_h": "costs.reshard_to_training_h",
    "reshard_back_h": "costs.reshard_to_rollout_h",
    "publish_h": "costs.publish_h",
    "publish_stall_h": "costs.publish_stall_h",
    "refresh_h": "costs.satellite_refresh_h",
    "satellite_refresh_h": "costs.satellite_refresh_h",
    "reroute_h": "costs.reroute_delay_h",
    "reroute_delay_h": "costs.reroute_delay_h",
    "kv_migration": "costs.kv_migration",
    "migrated_reroute_h": "costs.migrated_reroute_delay_h",
    "train_cost": "costs.train_step_cell_h",
    "train_step_cell_h": "costs.train_step_cell_h",
    "micro": "policy.micro_steps_per_execution",
    "micro_steps_per_execution": "policy.micro_steps_per_execution",
    "rho_min": "policy.rho_min",
    "retention": "policy.core_retention",
    "core_retention": "policy.core_retention",
    "tau": "policy.hold_tau",
    "hold_tau": "policy.hold_tau",
    "hold_tau_h": "policy.hold_tau",
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
