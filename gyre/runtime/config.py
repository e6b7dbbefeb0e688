"""Typed configuration of ``gyre run``: what the runtime needs beyond each package's own section.

Rules live in ``policy`` (placement, K, C_e, C_s, N, B, phi, mu, rho_min, tau, steps),
the update in ``trainer``, harness processes in ``executor``; this section says
which tasks and harness to run, where the run directory is, how Ray places the
cells, and how often to evaluate. Times are wall-clock seconds (the policy's
``hold_tau`` too: the runtime stamps events with seconds since the run began).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gyre.runtime.longtail import LongTailConfig
from gyre.runtime.tracking_config import TrackingConfig


class CellResources(BaseModel):
    """Ray resources one cell actor asks for (CPU here; ``num_gpus`` in GPU configs)."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(
        0.0,
        ge=0,
        description="0 on small machines: long-lived actors holding every logical "
        "CPU make Ray tasks hang",
    )
    num_gpus: float = Field(0.0, ge=0)
    devices: int = Field(
        1,
        ge=1,
        description="G: ranks (processes, a device each) per cell; > 1 shards each cell's "
        "training replica with FSDP2 over its ranks (rank 0 also runs the engine; "
        "docs/runtime.md); each rank asks num_cpus and num_gpus",
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources (e.g. a node tag)"
    )
    torch_threads: int = Field(
        1, ge=1, description="torch threads inside each cell (engine and trainer)"
    )
    cpu_quota: float | None = Field(
        None,
        gt=0,
        description="hold each cell (and what it starts) to this many CPUs through a cgroup, so "
        "a cell is a fixed compute partition like a GPU (Linux, root; docs/runtime.md); None: "
        "cells share the machine's cores",
    )
    calibrate_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="seconds of fixed compute timed at the start, at cpu_quota when set, for "
        "summary.json's regime (gyre/runtime/calibrate.py); 0: skip",
    )


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="existing cluster ('auto' or host:port); None: local ray.init"
    )
    num_cpus: int | None = Field(4, ge=1, description="logical CPUs of a local Ray instance")
    node_ip: str = Field("127.0.0.1", description="keep a local Ray instance on loopback")
    include_dashboard: bool = False


class FaultConfig(BaseModel):
    """The ``[run.fault]`` section: how a dead or hung cell is found and replaced."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    heartbeat_s: float = Field(
        10.0,
        gt=0,
        description="ping every cell this often; one that does not answer within this bound "
        "(hung) or whose actor died is lost: a dead one is found at its next call or ping, a "
        "hung one within 2 x heartbeat_s",
    )
    restart: bool = Field(
        True, description="restart a lost cell (a new actor, same cell id) and let it rejoin"
    )
    core_restarts: int = Field(
        2,
        ge=0,
        description="when a loss cannot be repaired in place (any cell inside the step's reduce, "
        "or the core when its last step has no checkpoint), restart "
        "the run from its last checkpoint in the same `gyre run`, at most this many times "
        "(0: stop with one line, `gyre run --resume` continues); steps the core finished after "
        "that checkpoint are trained again, none applied twice",
    )


ChaosKind = Literal[
    "rollout_cell", "satellite", "core", "engine", "proxy", "harness", "cell_hang", "engine_hang"
]
DEFAULT_CHAOS_KINDS: list[ChaosKind] = [
    "rollout_cell", "satellite", "core", "engine", "proxy", "harness"
]  # fmt: skip


class ChaosConfig(BaseModel):
    """The ``[run.chaos]`` section: a test and benchmark facility (Jepsen's nemesis), never for
    training runs. It kills real parts of the running run at seeded random moments
    (:mod:`gyre.runtime.chaos`); off unless ``kills`` > 0."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = Field(0, description="seeds the kill times and the order of kinds")
    kills: int = Field(0, ge=0, description="how many kills (0: the nemesis is off)")
    kinds: list[ChaosKind] = Field(
        default_factory=lambda: list(DEFAULT_CHAOS_KINDS),
        min_length=1,
        description="what it may kill, taken in a seeded shuffled cycle (so kills >= len(kinds) "
        "hits each): a rollout cell, a satellite (a training cell other than the core), the "
        "core (cell 0, restarted in place from its last step's checkpoint), a standalone engine, "
        "the proxy, "
        "a harness process (all SIGKILL or ProxyServer.kill), a hung cell or engine (SIGSTOP)",
    )
    window_s: tuple[float, float] = Field(
        (5.0, 60.0), description="kill times are drawn uniformly in this span of run time"
    )
    patience_s: float = Field(
        30.0, gt=0, description="a kill with no target yet (e.g. no satellite) waits this long"
    )


class RunConfig(BaseModel):
    """The ``[run]`` section."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # `inf` seconds: a mistake

    taskset: str = Field(
        "quickstart", description="task set: built-in name or a folder of Harbor-layout tasks"
    )
    train_tasks: list[str] = Field(
        default_factory=list, description="task names to train on (empty: all)"
    )
    eval_tasks: list[str] = Field(
        default_factory=list,
        description="held-out task names for evaluation "
        "(empty: the training tasks, fresh attempts)",
    )
    profile: str = Field("reference", description="harness profile: built-in name or a .toml file")
    harness_args: list[str] = Field(
        default_factory=list, description="extra arguments appended to the profile's command"
    )
    harness_timeout_s: float | None = Field(
        None, gt=0, description="override the tasks' harness timeout"
    )
    overall_timeout_s: float | None = Field(
        None, gt=0, description="override the tasks' overall timeout"
    )
    out_dir: str = Field("runs", description="run directories are created below this")
    name: str | None = Field(
        None, description="run directory name (default: placement + timestamp)"
    )
    eval_interval: int = Field(0, ge=0, description="evaluate every this many steps (0: never)")
    eval_attempts: int = Field(2, ge=1, description="attempts per evaluation task")
    standalone_engines: int = Field(
        1,
        ge=1,
        description="engines of the standalone rollout pool (serving "
        "policy.standalone_capacity executions), when that capacity is > 0",
    )
    longtail: LongTailConfig | None = Field(
        None,
        description="a seeded long-tail duration per execution for the synthetic harness, the "
        "same draw for every placement (docs/runtime.md); its timeouts are the executor's",
    )
    cell: CellResources = Field(default_factory=CellResources)
    cell_resources: list[dict[str, Annotated[float, Field(ge=0)]]] = Field(
        default_factory=list,
        description="custom Ray resources per cell, one table per cell (cell 0, the core, first), "
        "added to run.cell.resources: pins cells to nodes, e.g. [{node_a = 1}, {node_b = 1}] "
        "(empty: every cell asks for run.cell.resources alone)",
    )
    ray: RayConfig = Field(default_factory=RayConfig)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    chaos: ChaosConfig = Field(default_factory=ChaosConfig)
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="W&B / MLflow sinks (docs/runtime.md)"
    )
    log_format: Literal["rich", "plain", "json"] = Field(
        "rich",
        description="progress on the terminal: a rich panel, plain lines, or JSON lines (then "
        "the driver's logs on stderr are JSON lines too)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="level of the run's logs/*.jsonl (the driver's and each cell's: role "
        "switches, micro-steps, optimizer steps at info)",
    )
    step_timeout_s: float = Field(
        1800.0, gt=0, description="abort the run if no event arrives this long"
    )
    publication: Literal["disk", "distributed"] = Field(
        "disk",
        description="how rollout engines get each published version: reload the HF directory "
        "(disk), or in memory over a weight group with the core (distributed: SGLang's "
        "update_weights_from_distributed, deltas between Gyre engines; the directory is still "
        "written for engines that start later, and reloaded if the in-memory path fails)",
    )
    keep_published: int = Field(
        2,
        ge=1,
        description="published weight directories (weights/v<N>, one model each) kept on disk: "
        "the newest this many versions",
    )
