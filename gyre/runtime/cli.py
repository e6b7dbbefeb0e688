"""``gyre run CONFIG.toml [--set k=v ...] [--resume RUN_DIR]``: train an agent end to end.

Everything a user can get wrong is checked before a single process starts, and
reported as one line naming the field (exit 2), never as a traceback.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from gyre import log
from gyre.cli_errors import UserError, error_line, first_line, make_dir
from gyre.runtime import origin
from gyre.runtime.cpulimit import CpuLimitError, check
from gyre.runtime.rundir import RunDir
from gyre.runtime.supervise import resume_state, supervise
from gyre.runtime.tracking_config import missing_packages
from gyre.validation import validation_line

# Lazy imports below: every `gyre` command imports this module (gyre/cli.py), so the
# config models, harness, policy, Ray and torch load only once `gyre run` needs them.


class ConfigProblem(Exception):
    """One line for the user: what is wrong and where."""


def load_run_config(path: Path | None, overrides: list[str]):
    """Load, override and validate; every problem becomes a :class:`ConfigProblem`."""
    from gyre.runtime.config import load_config  # lazy: see the note at the top

    try:
        cfg = load_config(path, overrides)
        md = Path(cfg.model_dir)
        if (
            not md.is_absolute()
        ):  # cells run in other processes (other nodes): give them absolute paths
            cfg = load_config(path, [*overrides, f"model_dir={md.resolve()}"])
        return cfg
    except ValidationError as e:
        raise ConfigProblem(f"invalid config: {validation_line(e)}") from None
    except FileNotFoundError as e:
        raise ConfigProblem(str(e)) from None
    except OSError as e:  # a directory, no permission
        raise ConfigProblem(f"{e.filename or path}: {e.strerror or e}") from None
    except ValueError as e:  # overrides, TOML syntax
        raise ConfigProblem(f"invalid config: {first_line(e)}") from None


def resume_config(run_dir: Path, overrides: list[str]):
    """The run's exact config (``config.json``: JSON holds the None values TOML cannot), with
    any overrides given at resume on top. ``config.toml`` is the copy for people to read."""
    return load_run_config(run_dir / "config.json", overrides)


def check_run(cfg) -> None:
    """The checks that need the file system: model, task set, harness profile, split size, placement."""
    # lazy: see the note at the top
    from gyre.harness.hostguard import HostSetupError, working_bwrap
    from gyre.harness.profiles import ProfileError, load_profile
    from gyre.harness.task import TaskError
    from gyre.runtime.engines import check_vllm
    from gyre.runtime.tasks import TaskSetError, TaskStream

    if cfg.trainer.checkpoint.dir is not None:  # resume reads them from the run directory only
        raise ConfigProblem(
            f"trainer.checkpoint.dir = {cfg.trainer.checkpoint.dir}: gyre run writes its "
            "checkpoints to the run directory's checkpoints/ (where --resume reads them); leave it "
            "unset (trainer.checkpoint.every_steps and trainer.checkpoint.keep do apply)"
        )
    md = Path(cfg.model_dir)
    if not (md / "config.json").is_file():
        raise ConfigProblem(
            f"model_dir: {md} is not a Hugging Face model directory (no config.json); "
            "build one with `gyre model tiny DIR`"
        )
    try:
        stream = TaskStream(cfg.run.taskset, cfg.run.train_tasks, cfg.run.eval_tasks, cfg.seed)
    except TaskError as e:
        raise ConfigProblem(f"run.taskset: {error_line(e)}") from None
    except TaskSetError as e:  # names its own field (run.train_tasks, run.eval_tasks)
        raise ConfigProblem(str(e)) from None
    try:
        stream.check_batch(cfg.policy.batch_groups)
    except TaskSetError as e:  # names policy.batch_groups
        raise ConfigProblem(str(e)) from None
    try:
        load_profile(cfg.run.profile)
    except ProfileError as e:
        raise ConfigProblem(f"run.profile: {error_line(e)}") from None
    try:
        check_vllm(cfg.engine, cfg.trainer.model_dir)
    except ValueError as e:
        raise ConfigProblem(str(e)) from None
    if cfg.executor.sandbox.enabled:  # on by default: a run without a working bwrap stops here
        try:
            working_bwrap(cfg.executor.sandbox)
        except HostSetupError as e:
            raise ConfigProblem(f"executor.sandbox: {e}") from None
    if (line := missing_packages(cfg.run.tracking)) is not None:
        raise ConfigProblem(line)
    _check_cells(cfg)


def _check_cells(cfg) -> None:
    """The placement's needs: enough cells and capacity, a working CPU limit, resources."""
    from gyre.policy import Placement  # lazy: see the note at the top

    p = cfg.policy
    if p.placement is Placement.ELASTIC and p.cells < 2:
        raise ConfigProblem(
            f"policy.cells: elastic placement needs at least 2 cells (core + satellite), "
            f"got {p.cells}"
        )
    quota = cfg.run.cell.cpu_quota
    if quota is not None and not cfg.run.ray.address:  # a cluster's nodes are checked by the cells
        try:
            check(quota)
        except CpuLimitError as e:
            raise ConfigProblem(str(e)) from None
    per_cell = cfg.run.cell_resources
    if per_cell and len(per_cell) != p.cells:
        raise ConfigProblem(
            f"run.cell_resources: one table per cell is needed (policy.cells = {p.cells}), "
            f"got {len(per_cell)}"
        )
    if (
        p.placement is not Placement.ASYNC
        and p.cells * p.cell_capacity + p.standalone_capacity < p.group_size
    ):
        raise ConfigProblem(
            "policy.cell_capacity: the cells cannot hold one group's executions at once"
        )


def _restore_line(plan) -> str:
    n = plan.summary()
    return (
        f"{n['groups']} groups, {n['restored']} finished executions kept, "
        f"{n['relaunched']} attempts to relaunch"
    )


def _say(text: str) -> None:
    typer.echo(f"[gyre run] {text}", err=True)


def _resumed(resume: Path, set_: list[str]) -> tuple[Any, dict[str, Any]]:
    """The config and state a ``--resume`` goes on with; one line first when this user's gyre
    run did not create the directory, whose config.json is taken as it is."""
    if not (resume / "config.json").is_file():
        raise ConfigProblem(f"--resume: {resume} is not a run directory (no config.json)")
    cfg = resume_config(resume, set_)
    if not origin.created_here(resume):
        typer.echo(origin.notice(resume), err=True)
    return cfg, resume_state(resume, cfg.policy.group_size)


def _start_logging(cfg, run_dir: Path, log_format: str | None, new: bool = False) -> None:
    """The driver's logs: stderr as ``gyre``'s options say (JSON lines when the progress is), and
    ``logs/driver.jsonl`` in the run directory at ``run.log_level``, beside the cells' own."""
    rd = RunDir(run_dir).create()  # 0700, before the log file would create it
    if new:
        origin.mark(run_dir)  # what a later --resume checks (gyre/runtime/origin.py)
    level, fmt = log.current()
    if (log_format or cfg.run.log_format) == "json":
        fmt = "json"
    log.setup(level, fmt, file=rd.logs / "driver.jsonl", file_level=cfg.run.log_level)


def run_command(
    config: Path | None = typer.Argument(None, help="TOML config (not needed with --resume)."),
    set_: list[str] = typer.Option([], "--set", help="Override: section.field=value (repeatable)."),
    resume: Path | None = typer.Option(
        None, "--resume", help="Continue a killed run from its directory."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Existing Ray cluster ('auto' or host:port)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output."),
    log_format: str | None = typer.Option(None, "--log-format", help="rich | plain | json"),
) -> None:
    """Train a policy: real harnesses through the proxy, engines and trainer replicas on Ray cells."""
    try:
        if log_format is not None and log_format not in ("rich", "plain", "json"):
            raise ConfigProblem(f"--log-format: expected rich, plain or json, got {log_format!r}")
        state = None
        if resume is not None:
            cfg, state = _resumed(resume, set_)
            run_dir = resume
        else:
            if config is None:
                raise ConfigProblem("give a config file (gyre run CONFIG.toml) or --resume RUN_DIR")
            if config.is_dir():
                raise ConfigProblem(f"{config} is a directory; give a TOML config file")
            cfg = load_run_config(config, set_)
            name = cfg.run.name or f"{cfg.policy.placement.value}-{time.strftime('%Y%m%d-%H%M%S')}"
            run_dir = Path(cfg.run.out_dir) / name
            if (run_dir / "metrics.jsonl").exists():
                raise ConfigProblem(
                    f"run.name: {run_dir} already holds a run; pick another name or --resume it"
                )
        if address:
            cfg = cfg.model_copy(
                update={
                    "run": cfg.run.model_copy(
                        update={"ray": cfg.run.ray.model_copy(update={"address": address})}
                    )
                }
            )
        check_run(cfg)
        try:
            make_dir(run_dir.parent, "run.out_dir")
        except UserError as e:
            raise ConfigProblem(str(e)) from None
    except ConfigProblem as e:
        typer.echo(f"gyre run: {e}", err=True)
        raise typer.Exit(2) from None
    if (
        state is not None
        and state["step"] >= cfg.policy.total_steps
        and (run_dir / "summary.json").is_file()
    ):  # killed after its last step but before its summary: the resume finishes it
        typer.echo(
            f"gyre run: {run_dir} already finished its {cfg.policy.total_steps} steps", err=True
        )
        raise typer.Exit(0)
    _start_logging(cfg, run_dir, log_format, new=state is None)
    # lazy, and only once the checks passed: Ray and the whole runtime take seconds to import
    from gyre.runtime.faults import FatalFault
    from gyre.runtime.publication import PublicationError
    from gyre.runtime.ray_setup import RuntimeSetupError

    if state is not None:
        typer.echo(
            f"[gyre run] resuming {run_dir} at step {state['step']} (group {state['next_group']}, "
            f"segment {state['segment']}); in flight: {_restore_line(state['restore'])}",
            err=True,
        )
    try:
        summary = supervise(
            cfg, run_dir, state, quiet=quiet, log_format=log_format, say=_say
        )  # the core's loss: a restart from the last checkpoint (gyre.runtime.supervise)
    except (RuntimeSetupError, PublicationError, FatalFault) as e:
        typer.echo(f"gyre run: {e}", err=True)
        raise typer.Exit(1) from None
    if log_format == "json":
        typer.echo(
            json.dumps({"event": "summary", **{k: summary[k] for k in ("makespan_s", "steps")}})
        )
