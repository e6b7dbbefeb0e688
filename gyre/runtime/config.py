"""Typed configuration of ``gyre run``: :class:`GyreConfig` composes each package's own section
(policy, engine, proxy, trainer, executor) with :class:`RunConfig`, what the runtime needs
beyond them. The model directory is given once at the top and copied into every section that
needs it, unless a section names its own (a different tokenizer for the proxy, say).
:mod:`gyre.config` is its public name; files and ``--set`` overrides are read by
:mod:`gyre.config_io`.

Rules live in ``policy`` (placement, K, C_e, C_s, N, B, phi, mu, rho_min, tau, steps),
the update in ``trainer``, harness processes in ``executor``; this section says
which tasks and harness to run, where the run directory is, how Ray places the
cells, and how often to evaluate. Times are wall-clock seconds (the policy's
``hold_tau`` too: the runtime stamps events with seconds since the run began).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gyre.config_io import SECTIONS_WITH_MODEL, SECTIONS_WITH_SEED, apply_overrides, read_toml
from gyre.harness.config import ExecutorConfig
from gyre.policy.config import Placement, PolicyConfig
from gyre.proxy.config import ProxyConfig
from gyre.proxy.sampling import DEFAULTS as SAMPLING_DEFAULTS
from gyre.proxy.sampling import departures
from gyre.runtime.engines import RolloutEngineConfig
from gyre.runtime.longtail import LongTailConfig
from gyre.runtime.tracking_config import TrackingConfig
from gyre.train.config import TrainerConfig


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


class GyreConfig(BaseModel):
    """The run: one model, one policy, and each component's own section."""

    model_config = ConfigDict(extra="forbid")

    model_dir: str = Field(description="HF model directory (weights, tokenizer, chat template)")
    work_dir: str = Field(
        "runs/gyre", description="traces, workspaces, checkpoints and logs go below this"
    )
    seed: int = 0
    policy: PolicyConfig  # placement defaults to elastic (_share_model_dir fills it in)
    engine: RolloutEngineConfig  # the embedded engine's settings, or kind = "vllm"
    proxy: ProxyConfig
    trainer: TrainerConfig
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="before")
    @classmethod
    def _share_model_dir(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in SECTIONS_WITH_MODEL if "model_dir" in data else ():
            section = dict(data.get(name) or {})
            section.setdefault("model_dir", data["model_dir"])
            data[name] = section
        if "seed" in data:
            for name in SECTIONS_WITH_SEED:
                section = dict(data.get(name) or {})
                section.setdefault("seed", data["seed"])
                data[name] = section
        policy = data.get("policy", {})  # the run's placement default, written once
        if isinstance(policy, dict) and "placement" not in policy:
            data["policy"] = {**policy, "placement": Placement.ELASTIC}
        return data

    @model_validator(mode="before")
    @classmethod
    def _fix_sampling(cls, data: Any) -> Any:
        """A training run's sampling distribution is its config's: every ``[proxy.sampling]``
        field left unset is the engine default, which the proxy then sends on every request
        instead of a harness's own (gyre.proxy.sampling)."""
        if not isinstance(data, dict) or not isinstance(data.get("proxy", {}), dict):
            return data
        proxy = dict(data.get("proxy") or {})
        sampling = proxy.get("sampling") or {}
        if isinstance(sampling, dict):
            proxy["sampling"] = {**SAMPLING_DEFAULTS, **sampling}
        return {**data, "proxy": proxy}

    @model_validator(mode="after")
    def _behaviour_logprob_named(self) -> GyreConfig:
        """Refuse a run whose recorded behaviour log-prob would silently not be the probability
        its tokens were drawn with: a tempered or truncated distribution needs the user to name
        the log-prob the engine records (and the trainer uses as the behaviour policy)."""
        off = departures(self.proxy.sampling.model_dump())
        mode = self.engine.logprob_mode
        cut = [d for d in off if not d.startswith("temperature=")]  # tempered is exact without
        if off and (
            "logprob_mode" not in self.engine.model_fields_set or (mode == "tempered" and cut)
        ):
            raise ValueError(
                f"proxy.sampling {', '.join(off)} is not the model's own distribution, so the "
                "raw log-probs the trainer recomputes are not the behaviour's: set "
                "engine.logprob_mode = 'processed' (exact) or 'raw' (biased); docs/engine.md"
            )
        return self

    @model_validator(mode="after")
    def _one_batch_size(self) -> GyreConfig:
        """B is declared once, in the policy (its default included); the trainer's stream
        section follows it, and a stream B the user wrote that differs is refused."""
        B, stream = self.policy.batch_groups, self.trainer.stream
        if stream.batch_groups != B:
            if "batch_groups" in stream.model_fields_set:
                raise ValueError(
                    f"trainer.stream.batch_groups ({stream.batch_groups}) differs from "
                    f"policy.batch_groups ({B}); set B once, in [policy]"
                )
            self.trainer = self.trainer.model_copy(
                update={"stream": stream.model_copy(update={"batch_groups": B})}
            )
        return self


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, **top: Any
) -> GyreConfig:
    """Read a TOML (or a run directory's JSON) file (optional), apply overrides, validate.

    Keyword arguments set top-level fields (``model_dir=...``) before overrides.
    A validation error names the offending field path.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.suffix == ".json" and p.is_file():  # a run directory's copy (gyre run --resume)
            data = json.loads(p.read_text())
        else:
            data = read_toml(p)
    data.update({k: v for k, v in top.items() if v is not None})
    data = apply_overrides(data, overrides or [])
    return GyreConfig.model_validate(data)
