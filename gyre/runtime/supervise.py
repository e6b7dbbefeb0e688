"""The core dies: ``gyre run`` restarts its run from the last checkpoint by itself.

The core (cell 0) holds the optimizer state; a cell lost inside the step's reduce leaves the
core's gradients half reduced. Neither can be repaired in place, so the segment stops with
:class:`~gyre.runtime.faults.CoreLost` and this supervisor does what ``gyre run --resume``
does, in the same process, at most ``run.fault.core_restarts`` times:

1. the dead segment's faults go to ``faults.jsonl`` (the next segments carry them, so the
   final ``summary.json`` lists every fault of the run, the core's included);
2. the resume state is read back from the run directory (:func:`resume_state`): the last
   checkpoint, metrics lines past it dropped, finished executions kept (``restore.py``);
3. :func:`gyre.runtime.loop.run` starts a new segment on it (Ray stays up; the segment's
   actors were killed by its own teardown).

No optimizer step is applied twice: the new core loads the checkpoint, whose
``consumed_groups`` say which groups its weights hold; the steps the dead core finished after
it are dropped with it (their metrics lines too) and trained again on the same groups. With no
checkpoint yet (the core died in the first step) the run restarts from the initial weights,
finished executions kept, as ``--resume`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gyre.runtime.records import FaultRecord, replace_fault
from gyre.runtime.restore import plan_restore
from gyre.runtime.rundir import RunDir

FAULTS_FILE = "faults.jsonl"  # faults of ended segments, one line each


def resume_state(run_dir: Path, group_size: int) -> dict[str, Any]:
    """Where a stopped run stands: its checkpoint (step, data cursor, groups trained), the groups
    in flight with what they keep (``gyre.runtime.restore``), next group id, next segment, and
    the faults of the segments before."""
    from gyre.train.checkpoint import latest_checkpoint, load_state  # lazy: torch

    rd = RunDir(run_dir)
    execs = rd.read_jsonl("executions.jsonl")
    ckpt = latest_checkpoint(rd.checkpoints)
    st = load_state(ckpt) if ckpt else None
    step = st.step if st else 0
    dropped = rd.truncate_metrics(step)
    metrics = rd.read_jsonl("metrics.jsonl")
    trained = [g for r in metrics for g in r.get("groups", [])]
    # the checkpoint's own list is the one its weights were trained on (metrics may lag it)
    plan = plan_restore(execs, [*trained, *(st.consumed_groups if st else [])], group_size)
    next_group = max([e["group"] for e in execs] + [int(g[1:]) for g in trained] + [-1]) + 1
    segment = max([e.get("segment", 0) for e in execs] + [-1]) + 1
    faults = rd.read_jsonl(FAULTS_FILE)
    segment = max([segment, 1, *(FaultRecord.from_json(f).segment + 1 for f in faults)])
    return {
        "step": step,
        "checkpoint": str(ckpt) if ckpt else None,
        "next_group": next_group,
        "segment": segment,
        "dropped_metric_lines": dropped,
        "restore": plan,
        "faults": faults,
    }


def keep_faults(run_dir: Path, faults: list[FaultRecord]) -> None:
    """Write the run's faults so far (those the segment carried, as it completed them, and its
    own) to ``faults.jsonl``, for the segments after it."""
    RunDir(run_dir).replace_jsonl(FAULTS_FILE, [f.to_json() for f in faults])


def supervise(
    cfg,
    run_dir: Path,
    state: dict[str, Any] | None,
    *,
    quiet: bool,
    log_format: str | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """``loop.run`` until it finishes, restarting it from the last checkpoint on each
    :class:`CoreLost` while ``run.fault.core_restarts`` allows; the last one is raised with
    what was tried added to its line."""
    from gyre.runtime.faults import CoreLost  # lazy: Ray
    from gyre.runtime.loop import run

    limit = cfg.run.fault.core_restarts
    restarts = 0
    while True:
        segment = (state or {}).get("segment", 0)
        try:
            return run(cfg, run_dir=run_dir, resume=state, quiet=quiet, log_format=log_format)
        except CoreLost as e:
            if restarts >= limit:
                keep_faults(run_dir, e.faults)
                if limit:
                    raise CoreLost(
                        f"{e} (no core restart left: run.fault.core_restarts = {limit})",
                        e.record,
                        e.faults,
                    ) from None
                raise
            restarts += 1
            state = resume_state(run_dir, cfg.policy.group_size)
            rec = _restarted(e.faults, e.record, state, restarts)
            keep_faults(run_dir, e.faults)
            state["faults"] = RunDir(run_dir).read_jsonl(FAULTS_FILE)
            state["segment"] = max(state["segment"], segment + 1)  # ids never reused
            say(
                f"core lost ({_what(rec)}): restarting from checkpoint step "
                f"{state['step']} (restart {restarts} of {limit}, segment {state['segment']})"
            )


def _restarted(
    faults: list[FaultRecord], rec: FaultRecord, state: dict[str, Any], n: int
) -> FaultRecord:
    """What the supervisor did, in the fault's own record (``summary.json`` ``faults``), which
    takes ``rec``'s place in ``faults``."""
    new = rec.with_(
        action=f"restart from checkpoint step {state['step']}",
        core_restart=n,
        restart_step=state["step"],
        # optimizer steps the dead core applied after its last checkpoint: trained again (the
        # step open when it died, never applied, is redone too)
        steps_redone=state["dropped_metric_lines"],
        restart_unix_time=round(time.time(), 3),
    )
    return replace_fault(faults, rec, new)


def _what(rec: FaultRecord) -> str:
    text = f"cell {rec.cell} {rec.kind}"
    if rec.cell != 0 or rec.detected_by == "reduce":
        text += " in the step's reduce"
    return f"{text}, found by {rec.detected_by}"
