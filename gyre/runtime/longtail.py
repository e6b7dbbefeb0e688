"""The long-tail synthetic workload of ``gyre run``: one seeded draw, the same for every placement.

Execution (group g, attempt a), with g the global group id the policy allocated in
dispatch order, gets entry ``[g, a]`` of :func:`gyre.sim.workload.draw_workload` (a
per-query factor, per-attempt noise, the harness timeout and the overall timeout),
drawn once per run from ``seed`` over a pool whose size depends on neither the
placement nor (phi, mu). Colocate, Async, Elastic and the simulator therefore see
the same durations; only the scheduler differs.

The draw decides, not the machine: the synthetic harness is told to run for the drawn
time (``GYRE_DURATION_S``), the harness-timeout cap included, and stops itself, so an
execution near the cap is capped (or not) in every placement alike, whatever the load.
The executor's harness timeout sits ``overrun_s`` above the cap, as a safety net for a
harness that hangs. An execution the draw made missing is told to run past the overall
timeout, so the executor's overall timeout (exactly the draw's) makes it missing. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from gyre.sim.config import WorkloadConfig
from gyre.sim.workload import Draw, draw_workload

DURATION_ENV = "GYRE_DURATION_S"
CALL_EVERY_ENV = "GYRE_CALL_EVERY_S"
POOL_EXTRA_BATCHES = 8  # groups drawn beyond total_steps * B: more than any (phi + mu) queue


class LongTailConfig(BaseModel):
    """``[run.longtail]``: durations in real seconds, as ``gyre.sim``'s workload in hours."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # `inf` seconds: a mistake

    median_s: float = Field(
        6.0, gt=0, description="median attempt duration before the query factor"
    )
    tail: float = Field(0.8, ge=0, description="sigma of the per-attempt lognormal")
    query_sigma: float = Field(0.5, ge=0, description="sigma of the per-query lognormal factor")
    harness_timeout_s: float = Field(
        30.0, gt=0, description="the executor stops the harness here; the workspace is scored"
    )
    overall_timeout_s: float | None = Field(
        None, gt=0, description="harness + scoring budget; beyond it the assessment is missing"
    )
    call_every_s: float = Field(
        1.5, gt=0, description="one model call per this many seconds of an execution (at least one)"
    )
    overrun_s: float = Field(
        2.0,
        gt=0,
        description="the executor's harness timeout is this far above the cap (a safety net); "
        "a missing execution is told to run this far past the overall timeout",
    )

    def workload(self) -> WorkloadConfig:
        """The simulator's workload config with these numbers (its unit is whatever we pass)."""
        return WorkloadConfig(
            median_h=self.median_s,
            tail=self.tail,
            query_sigma=self.query_sigma,
            harness_timeout_h=self.harness_timeout_s,
            overall_timeout_h=self.overall_timeout_s,
            score_mean_h=0.0,
        )

    def describe(self) -> dict[str, float | None]:
        """The ``draw`` entry of workload.json."""
        return {
            "median_s": self.median_s,
            "tail": self.tail,
            "query_sigma": self.query_sigma,
            "harness_timeout_s": self.harness_timeout_s,
            "overall_timeout_s": self.overall_timeout_s,
            "time_scale": 1.0,  # the draw is in real seconds of the run
        }


@dataclass(frozen=True)
class Planned:
    """What the draw says about one execution."""

    duration_s: float  # launch -> scored, as the simulator replays it
    harness_timeout: bool
    missing: bool
    run_s: float  # what the harness is told to run for (past a timeout when capped)


class LongTail:
    """The draw of one run, and the mapping (global group id, attempt) -> planned execution."""

    def __init__(self, cfg: LongTailConfig, seed: int, total_steps: int, batch_groups: int, n: int):
        self.cfg = cfg
        self.groups = batch_groups * (total_steps + POOL_EXTRA_BATCHES)
        self.draw: Draw = draw_workload(cfg.workload(), self.groups, n, seed)

    def planned(self, gid: int, attempt: int) -> Planned:
        if gid >= self.groups:
            raise ValueError(
                f"group {gid} is beyond the long-tail draw ({self.groups} groups: "
                f"B * (total_steps + {POOL_EXTRA_BATCHES})); phi + mu is too large for it"
            )
        d = float(self.draw.duration_h[gid, attempt])
        missing = bool(self.draw.missing[gid, attempt])
        capped = bool(self.draw.harness_timeout[gid, attempt])
        run_s = d + self.cfg.overrun_s if missing else d  # the executor makes it missing
        return Planned(duration_s=d, harness_timeout=capped, missing=missing, run_s=run_s)

    @property
    def executor_harness_timeout_s(self) -> float:
        """The executor's own harness timeout: above the drawn cap, which the harness keeps."""
        return self.cfg.harness_timeout_s + self.cfg.overrun_s

    def env(self, gid: int, attempt: int) -> dict[str, str]:
        """The synthetic harness's environment for this execution."""
        return {
            DURATION_ENV: f"{self.planned(gid, attempt).run_s:.4f}",
            CALL_EVERY_ENV: f"{self.cfg.call_every_s:g}",
        }
