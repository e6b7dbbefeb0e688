"""``gyre run``: the main loop. The simulator's ``World.run`` is its virtual-time twin.

    policy   = SchedulingPolicy(cfg.policy)         # the same object the simulator drives
    world    = RealWorld(cfg, rundir, tasks)        # Ray cells, the proxy, harness processes
    actions  = policy.start(now)
    while not policy.done:
        world.carry_out(actions)                    # launch, switch, claim, step, publish ...
        event   = await world.next_event()          # whatever finished first
        actions = policy.handle(event)

Everything that decides lives in the policy; everything that acts lives in the world.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gyre.policy import CellRole, SchedulingPolicy
from gyre.runtime import chaos, workload
from gyre.runtime.calibrate import calibrate
from gyre.runtime.config import GyreConfig
from gyre.runtime.handles import Rig
from gyre.runtime.progress import Progress, closing_lines
from gyre.runtime.records import ControllerTimes
from gyre.runtime.report import summarize, write_timeline
from gyre.runtime.rundir import RunDir
from gyre.runtime.tasks import TaskStream
from gyre.runtime.tracking import open_tracker
from gyre.runtime.world import RealWorld

RigFactory = Callable[[RealWorld], Rig]


async def train(
    cfg: GyreConfig,
    rundir: RunDir,
    progress: Progress,
    resume: dict[str, Any] | None = None,
    rigs: Sequence[RigFactory] = (),
) -> dict:
    """Run the steps left (all of them, or those after ``resume``'s checkpoint), then finish:
    final weights and evaluation, ``summary.json``, ``timeline.png``. A run killed after its
    last step but before its summary has no step left: this segment only finishes it.
    ``rigs``: test or benchmark facilities, each built on the world and attached before the
    cells start (``RealWorld.attach``)."""
    tasks = TaskStream(cfg.run.taskset, cfg.run.train_tasks, cfg.run.eval_tasks, cfg.seed)
    done = (resume or {}).get("step", 0)
    left = cfg.policy.total_steps - done
    policy = SchedulingPolicy(
        cfg.policy.model_copy(update={"total_steps": max(left, 1)})  # left 0: never started
    )
    calibration = await _calibrate(cfg, progress)
    world = RealWorld(cfg, rundir, tasks, resume=resume)
    world.sched_status = policy.status
    chaos.attach(cfg.run.chaos, world)  # a test facility, off by default ([run.chaos])
    for make in rigs:
        world.attach(make(world))
    progress.message(
        f"starting {cfg.policy.cells} cells ({cfg.policy.placement.value}) in {rundir.path}"
    )
    await world.start(list(policy.roles) if left > 0 else [CellRole.ROLLOUT] * cfg.policy.cells)
    up = world.cluster.startup
    phases = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in up.items())
    progress.message(
        f"cells up in {sum(up.values()):.1f} s ({phases}); proxy at {world.cluster.proxy.url}; "
        f"training steps {done}..{cfg.policy.total_steps}"
    )
    if cfg.run.eval_interval and not _evaluated(rundir, world.base_step):
        world.execs.start_eval(world.base_step)  # the starting policy, for comparison
    try:
        if left > 0:
            clock = world.records.controller  # the loop's own cost per event
            actions = policy.start(world.now())
            while not policy.done:
                _carry_out(world, actions, clock)
                event = await world.next_event(timeout=cfg.run.step_timeout_s)
                actions = _handle(policy, event, clock)
                _show(progress, world, policy)
            _carry_out(world, actions, clock)  # EndRun: the makespan is taken here
        else:  # the engines serve the last checkpoint; its evaluation (above) is the final one
            world.records.makespan = 0.0
            progress.message(f"all {done} steps were done before the restart: finishing the run")
        await world.finish(progress)  # final weights, final evaluation
        _show(progress, world, policy, force=True)  # with the final evaluation's score
        records = world.records
        records.close_segments()
        summary = summarize(
            records, world.cluster, world.execs, rundir, policy if left > 0 else None, calibration
        )
        summary.update(world.rig_rows())  # what attached test rigs recorded, by their name
        rundir.write_summary(summary)
        write_timeline(records, rundir, summary)
        return summary
    finally:  # workload.json also when the run stops early, with what it has
        workload.save(world.records, world.cluster, world.execs, rundir, progress)
        await world.stop()
        rundir.close()


async def _calibrate(cfg: GyreConfig, progress: Progress) -> dict[str, Any] | None:
    """This machine's speed at a cell's CPU share, before the cells start (nothing of the run
    competes with it); on a Ray cluster the cells' nodes may differ, so no quota is applied."""
    cell = cfg.run.cell
    if cell.calibrate_s <= 0:
        return None
    quota = cell.cpu_quota if not cfg.run.ray.address else None
    cal = await asyncio.to_thread(calibrate, cell.calibrate_s, quota)
    progress.message(
        f"calibration: {cal.get('gflops')} GFLOP/s at {quota or 'no'} CPU quota "
        f"({cal.get('cpu_model')}, load {cal.get('load_before')})"
    )
    return cal


def _carry_out(world: RealWorld, actions: list, clock: ControllerTimes) -> None:
    t0 = time.perf_counter()
    world.carry_out(actions)
    clock.carried.append(time.perf_counter() - t0)


def _handle(policy: SchedulingPolicy, event, clock: ControllerTimes) -> list:
    t0 = time.perf_counter()
    actions = policy.handle(event)
    names = tuple(type(a).__name__ for a in actions)
    clock.handled.append((time.perf_counter() - t0, type(event).__name__, names))
    return actions


def _show(progress: Progress, world: RealWorld, policy, *, force: bool = False) -> None:
    progress.update(lambda: world.live(policy.status()), len(world.rundir.step_rows), force=force)


def _evaluated(rundir: RunDir, version: int) -> bool:
    """Whether an earlier segment already evaluated ``version`` (a resumed run does not repeat
    an evaluation it has)."""
    return any(
        r.get("version") == version and "error" not in r for r in rundir.read_jsonl("evals.jsonl")
    )


def run(
    cfg: GyreConfig,
    *,
    run_dir: Path,
    resume: dict[str, Any] | None = None,
    quiet: bool = False,
    log_format: str | None = None,
    rigs: Sequence[RigFactory] = (),
) -> dict:
    """``gyre run``'s body: the run directory, the progress view, the tracker around
    :func:`train`; returns the summary. ``rigs``: as :func:`train` (benchmarks, tests)."""
    rundir = RunDir(run_dir).create()
    if resume is None:
        rundir.write_config(cfg)
    else:  # progress counts steps of the whole run, not of this segment
        rundir.step_rows = rundir.read_jsonl("metrics.jsonl")
        rundir.eval_rows = rundir.read_jsonl("evals.jsonl")
    t0 = time.monotonic()
    with Progress(
        log_format or cfg.run.log_format, cfg.policy.total_steps, quiet=quiet
    ) as progress:
        tracker = open_tracker(
            cfg.run.tracking, rundir.path, cfg.model_dump(mode="json"), progress.message
        )
        try:
            summary = asyncio.run(train(cfg, rundir, progress, resume, rigs))
        # broad on purpose (cleanup, re-raised): the tracked run is marked stopped however the
        # run ended (an error, Ctrl-C); a --resume continues it
        except BaseException:
            if tracker is not None:
                tracker.close(None)
            raise
        if tracker is not None:  # it tails metrics.jsonl / evals.jsonl; now the summary too
            tracker.close(summary)
        for text in closing_lines(summary, time.monotonic() - t0, rundir.path):
            progress.message(text)
    return summary
