"""Replay a real run's workload in the simulator: ``gyre sim --workload RUN_DIR/workload.json``.

``gyre run`` writes ``workload.json`` (schema: ``gyre-workload/1``, see docs/scheduling.md):
the run's policy, every training execution's realised duration and missing flag,
and the costs it measured. The simulator replays exactly those durations under
the same policy and costs, so a measured makespan and a predicted one differ only
by what one of the two worlds gets wrong. ``predict`` is what the runtime calls
in-process; the CLI prints measured and predicted side by side.

Units: the file is in real seconds; the simulator runs in hours (everything is
divided by 3600 on the way in and multiplied back on the way out).

What the file does not realise is filled, never refused: an execution the run
never launched or cut at its end (``missing == "cancelled"`` or ``interrupted``)
is drawn from the file's ``draw`` distribution (seeded by the file's seed; at
least the time a cut one had already run); without a ``draw`` (not a synthetic
run) it is taken to run past the measured end of the run. Both only matter if
the prediction runs ahead of the real run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gyre.policy.config import Placement, PolicyConfig
from gyre.policy.staleness import staleness_pairs
from gyre.sim.config import CostConfig, PlacementSpec, SimConfig, WorkloadConfig
from gyre.sim.workload import Draw, draw_workload
from gyre.validation import validation_line

FORMAT = "gyre-workload/1"
H = 1.0 / 3600.0  # one real second in the simulator's hours
CUT = "cancelled"  # the missing reason of an execution the run's end cut short
COMPARED = ("colocate", "async", "elastic")  # what ``placement="all"`` predicts


class WorkloadFileError(ValueError):
    """A workload file the simulator cannot replay; ``str(e)`` is one line."""


class ExecutionRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: int = Field(ge=0)
    attempt: int = Field(ge=0)
    cell: int | None = None
    launched_s: float | None = None
    duration_s: float = Field(ge=0)
    calls: int | None = None
    reward: float | None = None
    missing: str | None = None
    harness_timeout: bool = False
    interrupted: bool = False


class DrawSpec(BaseModel):
    """How a synthetic run drew its durations (real seconds)."""

    model_config = ConfigDict(extra="ignore")

    median_s: float = Field(gt=0)
    tail: float = Field(ge=0)
    query_sigma: float = Field(ge=0)
    harness_timeout_s: float = Field(gt=0)
    overall_timeout_s: float | None = Field(None, gt=0)
    score_mean_s: float = Field(0.0, ge=0)
    time_scale: float | None = None


class GroupTraining(BaseModel):
    """One trained group's compute (seconds of its non-empty micro-steps, and their count)."""

    model_config = ConfigDict(extra="ignore")

    group: int = Field(ge=0)
    train_s: float = Field(ge=0)
    micro_steps: int = Field(ge=0)


class MeasuredCosts(BaseModel):
    """Medians the run measured (seconds); ``None`` = not observed (replayed as 0)."""

    model_config = ConfigDict(extra="ignore")

    train_microstep_s: float | None = Field(None, ge=0)
    optim_s: float | None = Field(None, ge=0)
    publish_s: float | None = Field(None, ge=0)
    switch_to_training_s: float | None = Field(None, ge=0)
    switch_to_rollout_s: float | None = Field(None, ge=0)
    reshard_s: float | None = Field(None, ge=0)
    satellite_refresh_s: float | None = Field(None, ge=0)
    reroute_delay_s: float | None = Field(None, ge=0)
    rollout_speed: list[tuple[float, float]] = Field(default_factory=list)


class Measured(BaseModel):
    model_config = ConfigDict(extra="ignore")

    makespan_s: float | None = None
    staleness_mean: float | None = None
    interrupted: int | None = None
    segments: list[list[Any]] = Field(default_factory=list)


class WorkloadFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: Literal["gyre-workload/1"]
    seed: int = 0
    placement: Placement
    policy: PolicyConfig
    draw: DrawSpec | None = None
    executions: list[ExecutionRecord]
    costs: MeasuredCosts = Field(default_factory=MeasuredCosts)
    groups: list[GroupTraining] = Field(default_factory=list)  # older files: none
    measured: Measured | None = None


def load_workload(src: str | Path | dict[str, Any] | WorkloadFile) -> WorkloadFile:
    """Read and check a workload file (or its parsed dict); any problem is one-line
    :class:`WorkloadFileError`."""
    if isinstance(src, WorkloadFile):
        return src
    where = "workload"
    if not isinstance(src, dict):
        where = str(src)
        try:
            text = Path(src).read_text()
        except OSError as e:
            raise WorkloadFileError(f"{where}: cannot read it ({e.strerror or e})") from None
        try:
            src = json.loads(text)
        except json.JSONDecodeError as e:
            raise WorkloadFileError(
                f"{where}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})"
            ) from None
        if not isinstance(src, dict):
            raise WorkloadFileError(f"{where}: expected a JSON object, got {type(src).__name__}")
    fmt = src.get("format")
    if fmt != FORMAT:
        raise WorkloadFileError(f"{where}: format is {fmt!r}, expected {FORMAT!r}")
    try:
        wf = WorkloadFile.model_validate(src)
    except ValidationError as e:
        raise WorkloadFileError(f"{where}: {validation_line(e)}") from None
    if not wf.executions:
        raise WorkloadFileError(f"{where}: no executions to replay")
    if wf.placement is not wf.policy.placement:
        raise WorkloadFileError(
            f"{where}: placement is {wf.placement.value!r} but policy.placement is "
            f"{wf.policy.placement.value!r}"
        )
    n = wf.policy.group_size
    seen: set[tuple[int, int]] = set()
    for r in wf.executions:
        key = (r.group, r.attempt)
        if r.attempt >= n:
            raise WorkloadFileError(
                f"{where}: execution {key} has attempt {r.attempt}, but the policy's N is {n}"
            )
        if key in seen:
            raise WorkloadFileError(f"{where}: execution {key} is listed twice")
        seen.add(key)
    return wf


def _spec(name: str, run: PolicyConfig) -> PlacementSpec:
    """The run's own placement exactly; another one at the run's staleness E[d]
    (colocate phi = 0; async mu = 1; elastic the largest mu that keeps phi > 0, as the
    paper's (0.5, 3) at 1.5), with the paper's streaming choices (elastic streams)."""
    if name == run.placement.value:
        return PlacementSpec(
            placement=run.placement,
            phi=run.phi,
            mu=run.mu,
            streaming=run.streaming,
            async_train_cells=run.async_train_cells,
        )
    target = run.expected_staleness
    pairs = staleness_pairs(name, target, run.batch_groups)
    if not pairs:
        raise WorkloadFileError(
            f"{name} cannot run at this run's staleness E[d] = {target:g} with B = "
            f"{run.batch_groups}; predict the run's own placement ({run.placement.value})"
        )
    if name == "elastic":
        ahead = [p for p in pairs if p[0] > 0]
        phi, mu = ahead[-1] if ahead else pairs[-1]
    else:
        phi, mu = pairs[0]
    return PlacementSpec(
        placement=Placement(name),
        phi=phi,
        mu=mu,
        streaming=name == "elastic",
        async_train_cells=run.async_train_cells,
    )


def _s(x: float | None) -> float:
    return 0.0 if x is None else x * H


def sim_config(wf: WorkloadFile, placements: list[str]) -> SimConfig:
    """The simulator config that replays ``wf``: its policy (in hours), its measured costs."""
    for name in placements:
        if name not in COMPARED:
            raise WorkloadFileError(
                f"placement {name!r} cannot be replayed; choose one of {', '.join(COMPARED)}"
            )
    run = wf.policy
    policy = run.model_copy(update={"hold_tau": run.hold_tau * H})
    c = wf.costs
    micro = c.train_microstep_s or 0.0
    steps_cell_h = micro * run.batch_groups * run.group_size * run.micro_steps_per_execution * H
    costs = CostConfig(
        train_step_cell_h=steps_cell_h,
        optim_h=_s(c.optim_s),
        publish_h=_s(c.publish_s),
        # publish_s covers the engines' pause/reload/resume: running calls stall for all of it
        publish_stall_h=_s(c.publish_s),
        switch_to_training_h=_s(c.switch_to_training_s),
        switch_to_rollout_h=_s(c.switch_to_rollout_s),
        reshard_to_training_h=_s(c.reshard_s) / 2,  # the file has both directions summed
        reshard_to_rollout_h=_s(c.reshard_s) / 2,
        satellite_refresh_h=_s(c.satellite_refresh_s),
        reroute_delay_h=_s(c.reroute_delay_s),
    )
    d = wf.draw
    workload = (
        WorkloadConfig(
            median_h=d.median_s * H,
            tail=d.tail,
            query_sigma=d.query_sigma,
            harness_timeout_h=d.harness_timeout_s * H,
            overall_timeout_h=_s(d.overall_timeout_s) or None,
            score_mean_h=d.score_mean_s * H,
        )
        if d is not None
        else WorkloadConfig()
    )
    try:
        return SimConfig(
            name=f"replay of a {wf.placement.value} run",
            seed=wf.seed,
            policy=policy,
            workload=workload,
            costs=costs,
            placements={n: _spec(n, run) for n in placements},
        )
    except ValidationError as e:
        raise WorkloadFileError(validation_line(e)) from None


def replay_draw(wf: WorkloadFile, cfg: SimConfig) -> tuple[Draw, dict[str, int]]:
    """The realised durations as a ``Draw`` (groups in dispatch order), unrealised slots filled."""
    n = cfg.policy.group_size
    groups = max(cfg.pool_groups(), 1 + max(r.group for r in wf.executions))
    if wf.draw is not None:
        fill = draw_workload(cfg.workload, groups, n, wf.seed)
        dur, missing, timeout = fill.duration_h.copy(), fill.missing.copy(), fill.harness_timeout
        timeout = timeout.copy()
    else:
        end = (wf.measured.makespan_s if wf.measured and wf.measured.makespan_s else None) or max(
            (r.launched_s or 0.0) + r.duration_s for r in wf.executions
        )
        dur = np.full((groups, n), end * H)
        missing = np.zeros((groups, n), bool)
        timeout = np.zeros((groups, n), bool)
    realised = cut = 0
    for r in wf.executions:
        g, a = r.group, r.attempt
        if r.missing == CUT or r.interrupted:  # a lower bound: it had run this long
            dur[g, a] = max(dur[g, a], r.duration_s * H)
            cut += 1
            continue
        dur[g, a] = r.duration_s * H
        missing[g, a] = r.missing is not None
        timeout[g, a] = r.harness_timeout and r.missing is None
        realised += 1
    info = {"realised": realised, "cut": cut, "filled": groups * n - realised - cut}
    calls = None
    done = [r for r in wf.executions if not (r.missing == CUT or r.interrupted)]
    known = [r.calls for r in done if r.calls is not None]
    if done and len(known) == len(done) and sum(known) > 0:
        # tokens follow calls in the run: weigh the token mean by them (the rest: the median)
        calls = np.full((groups, n), float(np.median(known)))
        for r in done:
            calls[r.group, r.attempt] = float(r.calls or 0)
    train_h = train_k = None
    if wf.groups:  # each trained group's own compute, as the run measured it
        train_h = np.zeros(groups)
        train_k = np.full(groups, -1, dtype=np.int64)
        for gt in wf.groups:
            if gt.group < groups:
                train_h[gt.group] = gt.train_s * H
                train_k[gt.group] = gt.micro_steps
        info["groups_measured"] = len(wf.groups)
    draw = Draw(
        duration_h=dur,
        missing=missing,
        harness_timeout=timeout,
        calls=calls,
        train_h=train_h,
        train_blocks=train_k,
    )
    return draw, info


def _segments(timeline: dict[str, Any]) -> list[list[Any]]:
    """The Gantt's role segments as ``[cell, role, t0_s, t1_s]`` (the measured file's shape)."""
    out: list[list[Any]] = []
    for cell, segs in enumerate(timeline.get("segments", [])):
        for s0, s1, role in segs:
            r = "switching" if role.startswith("to_") else role
            out.append([cell, r, s0 * 3600.0, s1 * 3600.0])
    return out


def _unobserved(wf: WorkloadFile) -> list[str]:
    c = wf.costs.model_dump()
    return [k for k, v in c.items() if v is None]


def predict_all(
    src: str | Path | dict[str, Any] | WorkloadFile, placements: list[str]
) -> dict[str, dict[str, Any]]:
    """Predict each of ``placements`` on the file's one draw (see :func:`predict`)."""
    from gyre.sim.report import lower_bound, summarise
    from gyre.sim.world import World

    wf = load_workload(src)
    cfg = sim_config(wf, placements)
    draw, info = replay_draw(wf, cfg)
    lb = lower_bound(cfg, draw)
    out: dict[str, dict[str, Any]] = {}
    for name in placements:
        world = World(cfg, name, draw, record=True).run()
        r = summarise(world, lb)
        pc = cfg.policy_config(name)
        out[name] = {
            "placement": name,
            "phi": pc.phi,
            "mu": pc.mu,
            "streaming": pc.streaming,
            "makespan_s": r.makespan_h * 3600.0,
            # by the version that served each call, per trained token (weighted by each
            # execution's calls when the file has them, else by its length)
            "staleness_mean": r.serving_staleness_tokens,
            "staleness_serving_per_execution": r.serving_staleness,
            "staleness_dispatch": r.mean_staleness,
            "staleness_expected": r.expected_staleness,
            # the same three after the first burst (steady state; NaN if the run has no more)
            "staleness_mean_steady": r.serving_staleness_tokens_steady,
            "staleness_serving_per_execution_steady": r.serving_staleness_steady,
            "staleness_dispatch_steady": r.mean_staleness_steady,
            "interrupted": r.interrupted_executions,
            "segments": _segments(r.timeline),
            "busy": [[[a * 3600.0, b * 3600.0] for a, b in cell] for cell in r.timeline["busy"]],
            "steps": [[a * 3600.0, b * 3600.0] for a, b in r.timeline["steps"]],
            "publications": [t * 3600.0 for t in r.timeline["publications"]],
            "executions": info,
            "unobserved_costs": _unobserved(wf),
            "measured": wf.measured.model_dump()
            if wf.measured is not None and name == wf.placement.value
            else None,
        }
    return out


def predict(
    src: str | Path | dict[str, Any] | WorkloadFile, placement: str | None = None
) -> dict[str, Any]:
    """Predict one placement (default: the run's own) on a run's realised workload.

    Returns ``makespan_s``, ``staleness_mean`` (serving version, token-weighted),
    ``staleness_dispatch`` (each also ``*_steady``: after the first burst), ``segments`` (``[[cell, role, t0_s, t1_s], ...]``, roles
    rollout / training / switching), ``busy``, ``steps``, ``publications`` (seconds),
    ``executions`` (how many were realised, cut, filled) and ``measured`` (the file's,
    when ``placement`` is the run's own). Raises :class:`WorkloadFileError`.
    """
    wf = load_workload(src)
    name = placement or wf.placement.value
    return predict_all(wf, [name])[name]
