"""The real world: carries out the policy's actions with Ray cells, the proxy and harness processes.

The twin of :class:`gyre.sim.world.World`, in wall-clock seconds. Each action of the
table in docs/scheduling.md starts an asyncio task; when the work is done the task
puts the matching event on one queue, which the main loop (:mod:`gyre.runtime.loop`)
feeds back to the policy. The world adds no scheduling rule: it writes its own
records (:class:`gyre.runtime.records.Records`: roles over time, who computed when,
every switch, publication, execution and step) so the run can be checked against the
policy rather than trusted; the reports read those records, not the world.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gyre.policy import (
    AssignGroup,
    CellRole,
    CellSwitched,
    ClaimMicroStep,
    DispatchGroups,
    EndRun,
    EvaluationRunning,
    Event,
    ExecutionFinished,
    ExecutionsLaunched,
    FinishStep,
    LaunchExecutions,
    MicroStepDone,
    PublishWeights,
    StartStep,
    StepDone,
    SwitchCell,
    Tick,
    WakeAt,
    WeightsPublished,
)
from gyre.runtime.cluster import Cluster
from gyre.runtime.config import GyreConfig
from gyre.runtime.engines import keeps_engine
from gyre.runtime.executions import ExecutionRunner
from gyre.runtime.faults import ActorDied, CellFaults
from gyre.runtime.handles import Rig
from gyre.runtime.progress import Feed
from gyre.runtime.proxy_watchdog import ProxyWatchdog
from gyre.runtime.records import FaultRecord, Phase, Records, StepRecord
from gyre.runtime.restore import RestorePlan, group_version
from gyre.runtime.rundir import RunDir
from gyre.runtime.standalone import EngineFaults
from gyre.runtime.tasks import TaskStream
from gyre.train.stats import ObjectiveStats


class RealWorld:
    """Carries out actions; ``next_event()`` returns whatever finished first."""

    def __init__(
        self, cfg: GyreConfig, rundir: RunDir, tasks: TaskStream, *, resume: dict | None = None
    ):
        self.cfg, self.rundir, self.tasks = cfg, rundir, tasks
        self.K = cfg.policy.cells
        r = resume or {}
        self.base_step = r.get("step", 0)  # global index of the policy's step 0
        self.base_gid = r.get("next_group", 0)  # global id of the policy's first fresh group
        self.segment = r.get("segment", 0)  # how many times this run was (re)started
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cluster = Cluster(
            cfg, rundir, resume_from=r.get("checkpoint"), base_version=self.base_step
        )
        self.execs = ExecutionRunner(cfg, rundir, tasks, self.cluster.proxy, segment=self.segment)
        self.execs.on_eval_live = lambda n: self.emit(EvaluationRunning(self.now(), n))
        self.records = Records(cells=self.K, segment=self.segment)  # what the readers read
        # earlier segments' faults (faults.jsonl)
        self.records.faults.extend(FaultRecord.from_json(f) for f in r.get("faults", []))
        self.step_rec: StepRecord | None = None
        # a resume's groups in flight take the policy's first group ids (docs/runtime.md, "Resume")
        self.restore: RestorePlan = r.get("restore") or RestorePlan()
        self.exec_version: dict[tuple[int, int], int] = {}  # (global gid, att) -> dispatch version
        self.shards: dict[int, list[list[int]]] = {}  # group -> policy micro-step -> task indices
        self.group_tasks: dict[int, list[Any]] = {}  # group -> its tasks' object-store reference
        self._task_index = 0
        self._bg: set[asyncio.Task] = set()
        self.errors: list[BaseException] = []
        # the loop points this at policy.status
        self.sched_status: Callable[[], dict[str, Any]] = lambda: {}
        # the supervisors: each drives the cluster's mechanisms and tells the policy through
        # this world's bus (emit, spawn, now: gyre.runtime.handles)
        self.faults = CellFaults(  # a cell that dies or hangs (gyre.runtime.faults)
            cfg,
            self.cluster,
            self.records,
            rundir,
            self,
            base_step=self.base_step,
            errors=self.errors,
            forget_work=self.forget_cell_work,
            running=lambda: self.execs.running,
        )
        self.cluster.on_cell_lost = self.faults.lost  # a cell's engine that failed a reload
        # a standalone engine (gyre.runtime.standalone)
        self.engine_faults = EngineFaults(cfg, self.cluster, self.records, self)
        self.cluster.on_engine_lost = lambda url, e: self.engine_faults.lost(url, e, _found_by(e))
        # a dead proxy is restarted (gyre.runtime.proxy_watchdog): the proxy's ``ensure``
        self.proxy_watch = ProxyWatchdog(cfg.run.fault, self.cluster.proxy, self.records, self.now)
        self.rigs: list[Rig] = []  # test facilities attached from outside (attach)

    def attach(self, rig: Rig) -> None:
        """The one hook for a test or benchmark facility (gyre.runtime.handles.Rig): it runs
        beside the run from ``start``, reads and drives it through the world's public handles,
        and is closed by ``stop``; the product path never names one."""
        self.rigs.append(rig)

    def rig_rows(self) -> dict[str, list[dict[str, Any]]]:
        """What each attached rig recorded, by its name (``summary.json`` keys)."""
        return {r.name: r.rows() for r in self.rigs}

    # ------------------------------------------------------------------ clock and events
    def now(self) -> float:
        return self.records.now()

    @property
    def roles(self) -> list[CellRole]:
        """Each cell's role now (the records' role timeline is the one copy)."""
        return self.records.roles

    async def next_event(self, timeout: float) -> Event:
        """The next event; raises whatever a background task raised, or TimeoutError."""
        get = asyncio.ensure_future(self.events.get())
        try:
            while True:
                done, _ = await asyncio.wait({get}, timeout=0.25)
                if self.errors:
                    raise self.errors[0]
                if get in done:
                    self._last_event = self.now()
                    return get.result()
                if self.now() - self._last_event > timeout:
                    raise TimeoutError(f"no scheduling event for {timeout:.0f}s")
        finally:
            if not get.done():
                get.cancel()

    def emit(self, ev: Event) -> None:
        """Queue ``ev`` for the policy (the supervisors' bus: gyre.runtime.handles)."""
        self.events.put_nowait(ev)

    def _tick(self, at: float) -> None:
        """A WakeAt came due (never reported before the time it asked for)."""
        self.emit(Tick(max(at, self.now())))

    def _open_step(self) -> StepRecord:
        """The step the policy started; its groups, micro-steps and finish come after StartStep."""
        if self.step_rec is None:
            raise RuntimeError("no training step is open")
        return self.step_rec

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; what it raises is surfaced by ``next_event``."""

        async def guarded():
            try:
                await coro
            except asyncio.CancelledError:
                raise
            # broad on purpose: whatever a background task raises is surfaced by next_event
            # (the loop stops with the cause; a dead core's symptom becomes its loss)
            except BaseException as e:
                await self.faults.surfaced(e)  # the core's death as CoreLost, whatever found it

        t = asyncio.get_running_loop().create_task(guarded())
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, initial_roles: list[CellRole]) -> None:
        self._last_event = 0.0
        await self.cluster.start(initial_roles)
        self.records.roles[:] = initial_roles
        await self.execs.start()
        self.records.restart_clock()
        self._last_event = 0.0
        self.spawn(self.faults.heartbeat())
        self.spawn(self.proxy_watch.run())
        for rig in self.rigs:
            self.spawn(rig.run())

    async def stop(self) -> None:
        for t in list(self._bg):
            t.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        await self.execs.stop()
        await self.cluster.stop()
        for rig in self.rigs:  # last: a rig's own files never keep the run's processes up
            rig.close()

    def live(self, status: dict[str, Any]) -> Feed:
        """What the live view shows now, from what this process holds (no Ray call)."""
        load = self.cluster.proxy.load()
        engines = load["engines"]
        return Feed(
            records=self.records,
            status=status,
            rows=self.rundir.step_rows,
            evals=self.rundir.eval_rows,
            running=self.execs.running,
            version=self.cluster.trainer_version,
            published_version=self.cluster.published_version,
            cell_load=[engines.get(u.rstrip("/")) if u else None for u in self.cluster.urls],
            parks_engine=keeps_engine(self.cfg.engine),
            counters={
                "rerouted": load.get("rerouted", 0),
                "engine_errors": load.get("engine_errors", 0),
                "errors_5xx": load.get("errors_5xx", 0),
                "engines_lost": len(self.cluster.dead_engines),
                "cells_lost": sum(
                    1 for f in self.records.faults if f.kind not in ("proxy", "engine")
                ),
                "proxy_restarts": self.proxy_watch.restarts,
                "harness_failed": self.execs.failed,
            },
            rigs={k: v for r in self.rigs for k, v in r.counts().items()},
        )

    def _set_role(self, cell: int, role: CellRole) -> None:
        self.records.set_role(cell, role, self.now())

    async def finish(self, progress) -> None:
        """After EndRun: publish the final weights and evaluate them (outside the makespan)."""
        final = self.base_step + len(self.records.finished_steps)
        if self.cfg.run.eval_interval and self.records.finished_steps:
            rollout = [c for c in range(self.K) if self.roles[c] is CellRole.ROLLOUT]
            if final > self.cluster.published_version:
                await self.cluster.publish(final, rollout)
            # every cell trained last (colocate): serve the final weights on the core
            if not rollout:
                await self.cluster.to_rollout(0)
                self._set_role(0, CellRole.ROLLOUT)
            progress.message(f"final evaluation of version {final}")
            self.execs.start_eval(final)
        await self.execs.wait_evals()
        await self.cluster.close_engine_phases()  # for the run's prefix-cache figures
        # nothing trains or reloads any more: the satellites' snapshots and every published
        # directory but the final one are scratch (docs/runtime.md, "Disk")
        self.records.dropped_at_end = (
            self.rundir.clear_snapshots() + self.cluster.publications.keep_final()
        )

    # ------------------------------------------------------------------ actions
    def carry_out(self, actions: list) -> None:
        """Start each action (one method per action type); what it leads to comes back as
        events, through ``next_event``."""
        if any(type(a) is PublishWeights for a in actions):
            # satellites returning at this boundary wait for the new weights
            self.cluster.publications.begin()
        for a in actions:
            match a:
                case LaunchExecutions():
                    self._launch(a)
                case DispatchGroups():
                    self._dispatch(a)
                case SwitchCell():
                    self._switch_cell(a)
                case StartStep():
                    self._start_step(a)
                case AssignGroup():
                    self._assign(a)
                case ClaimMicroStep():
                    self.spawn(self._micro(a))
                case FinishStep():
                    self.spawn(self._finish(a.step))
                case PublishWeights():
                    self.spawn(self._publish(a.version))
                case WakeAt():
                    self._wake(a)
                case EndRun():
                    self.records.makespan = self.now()
                case _:  # pragma: no cover - a new action type must be handled here
                    raise RuntimeError(f"the runtime cannot carry out {type(a).__name__}")

    def gid(self, gid: int) -> int:
        """The run's id of the policy's group ``gid``: a resume's groups in flight first, then
        fresh ids from ``base_gid``."""
        kept = self.restore.groups
        return kept[gid] if gid < len(kept) else self.base_gid + gid - len(kept)

    def _launch(self, a: LaunchExecutions) -> None:
        restored = []
        for gid, att in a.executions:
            if (self.gid(gid), att) in self.restore.finished:
                restored.append((gid, att))  # finished before the resume: never run again
            else:
                self.spawn(self._execution(gid, att))
        self.emit(ExecutionsLaunched(time=self.now(), executions=a.executions))
        for gid, att in restored:
            self.emit(self._restored(gid, att))

    def _restored(self, gid: int, att: int) -> ExecutionFinished:
        kept = self.restore.finished[(self.gid(gid), att)]
        if kept.version is not None:
            self.exec_version[(kept.group, att)] = kept.version
        self.execs.restore(kept)
        self.records.restored += 1
        return ExecutionFinished(time=self.now(), execution=(gid, att), reward=kept.reward)

    def _dispatch(self, a: DispatchGroups) -> None:
        for gid in a.group_ids:
            for att in range(a.group_size):
                self.exec_version[(self.gid(gid), att)] = self.base_step + a.version

    def _switch_cell(self, a: SwitchCell) -> None:
        target = CellRole.TO_TRAINING if a.role is CellRole.TRAINING else CellRole.TO_ROLLOUT
        if target is CellRole.TO_ROLLOUT and self.roles[a.cell] is CellRole.TRAINING:
            self.forget_cell_work(a.cell)  # mid-step (a fault before it): its micro-steps go back
        self._set_role(a.cell, target)
        self.spawn(self._switch(a.cell, a.role))

    def forget_cell_work(self, cell: int) -> None:
        """Cell ``cell``'s part of the open step is void (the policy queued its micro-steps
        again): its stats and claims leave the step's record; its gradients left with its
        replica. A finished step's record is kept as it is."""
        rec = self.step_rec
        if rec is not None and (
            not self.records.finished_steps or rec is not self.records.finished_steps[-1]
        ):
            rec.stats.pop(cell, None)
            rec.claims.pop(cell, None)
        self.records.activity.pop(cell, None)

    def _start_step(self, a: StartStep) -> None:
        self.step_rec = StepRecord(
            step=self.base_step + a.step, version=self.base_step + a.version, start=self.now()
        )

    def _wake(self, a: WakeAt) -> None:
        delay = max(0.0, a.time - self.now())
        asyncio.get_running_loop().call_later(delay, self._tick, a.time)

    async def _execution(self, gid: int, att: int) -> None:
        t0 = self.now()
        times, g = self.records.exec_times, self.gid(gid)
        times[(g, att)] = (t0, None)
        reward = await self.execs.run(g, att, self.exec_version.get((g, att)))
        times[(g, att)] = (t0, self.now())
        self.emit(ExecutionFinished(time=self.now(), execution=(gid, att), reward=reward))

    async def _switch(self, cell: int, role: CellRole) -> None:
        t0 = self.now()
        try:
            if role is CellRole.TRAINING:
                moved = await self.cluster.to_training(cell)
            else:
                moved = 0
                await self.cluster.to_rollout(cell)
        except ActorDied as e:
            self.faults.lost(cell, e, "switch")  # no CellSwitched: the policy hears CellLost
            return
        if cell in self.faults.down:  # lost (a heartbeat) while its switch ended: CellLost stands
            return
        self.faults.back(cell)  # a restarted cell serves again (the core may go to training)
        t1 = self.now()
        # kv_migrated, kv_bytes, kv_saved_s, ...: the calls that moved with their K/V
        kv = getattr(self.cluster, "switch_kv", {}).pop(cell, {})
        self.records.switches.append(
            {
                "cell": cell,
                "to": role.value,
                "start": t0,
                "seconds": t1 - t0,
                "moved_calls": moved,
                **kv,
            }
        )
        self._set_role(cell, role)
        self.emit(CellSwitched(time=t1, cell=cell, role=role))

    def _assign(self, a: AssignGroup) -> None:
        """The packing buffer pulls the group in: traces -> trees -> admission -> micro-steps."""
        t0 = time.perf_counter()
        rec = self._open_step()
        gid = self.gid(a.group_id)
        spans: dict[str, float] = {}
        group, n_scored, pack, tasks = self.execs.pack_group(gid, rec.step, self._task_index, spans)
        self._task_index += len(tasks)
        versions = [
            self.exec_version.get((gid, att), rec.version)
            for att in range(self.cfg.policy.group_size)
        ]
        rec.groups.append((gid, group_version(versions)))  # staleness: the executions' mean
        rec.local[gid] = a.group_id
        rec.n_scored += n_scored
        for k, v in pack.items():
            rec.pack[k] = rec.pack.get(k, 0) + v
        n = a.micro_steps
        t1 = time.perf_counter()
        self.group_tasks[a.group_id] = self.cluster.put_tasks(tasks)  # once, whatever claims it
        self.shards[a.group_id] = [[t.index for t in tasks[i::n]] for i in range(n)] if n else []
        t2 = time.perf_counter()
        self.records.assigns.append({**spans, "put": t2 - t1, "all": t2 - t0, "tasks": len(tasks)})

    async def _micro(self, a: ClaimMicroStep) -> None:
        rec = self._open_step()
        shard = self.shards[a.group_id][a.index]
        t0 = self.now()
        n = len(self.shards[a.group_id])
        act = {"what": Phase.MICRO_STEP, "index": a.index, "of": n, "group": self.gid(a.group_id)}
        self.records.activity[a.cell] = act
        if shard:
            try:
                stats = await self.cluster.compute(
                    a.cell, rec.step, rec.version, a.group_id, self.group_tasks[a.group_id], shard
                )
            except ActorDied as e:
                self.faults.lost(a.cell, e, "micro_step")  # the policy queues it again
                return
        if self.roles[a.cell] is CellRole.LOST:
            return  # lost meanwhile: the policy queued this micro-step again
        # void when sent back to rollout (a fault before it) while it computed: the policy
        # ignores this report, and the step's record leaves it out
        if self.roles[a.cell] is CellRole.TRAINING:
            if shard:
                rec.stats.setdefault(a.cell, ObjectiveStats()).add(stats)  # sums and maxes
            rec.claims[a.cell] = rec.claims.get(a.cell, 0) + 1
        if self.records.activity.get(a.cell) is act:
            del self.records.activity[a.cell]
        t1 = self.now()
        if t1 > t0:
            self.records.busy[a.cell].append((t0, t1))
        self.records.micros.append(
            (a.cell, rec.version if shard else -1, t0, t1)
        )  # -1: empty share
        if shard and self.roles[a.cell] is CellRole.TRAINING:
            self.records.group_train.setdefault(self.gid(a.group_id), []).append(t1 - t0)
        self.emit(
            MicroStepDone(time=t1, cell=a.cell, step=a.step, group_id=a.group_id, index=a.index)
        )

    async def _finish(self, step: int) -> None:
        rec = self._open_step()
        k = 0
        while k < self.K and self.roles[k] is CellRole.TRAINING:
            k += 1  # participants are the prefix 0..k-1 (cells join in order)
        records = self.records
        check = {"what": Phase.REDUCE_CHECK, "cells": k}  # the ping before the reduce
        for c in range(k):
            records.activity[c] = check
        try:
            ok = await self.faults.alive(list(range(k)))
        finally:
            for c in range(k):
                if records.activity.get(c) is check:
                    del records.activity[c]
        if not ok:
            return  # a participant is lost: the policy voids this FinishStep and goes on
        t0 = self.now()
        for c in range(k):
            phase = Phase.OPTIMIZER_STEP if c == 0 else Phase.REDUCE
            records.activity[c] = {"what": phase, "cells": k}
        try:
            metrics = await self.cluster.finish_step(
                k, rec.stats, rec.n_scored, [f"g{g}" for g, _ in rec.groups]
            )
        # broad on purpose: a participant's death shows in the collective as any error (gloo's
        # RuntimeError, a RayTaskError); in_reduce pings the participants and gives CoreLost
        # for a loss, the error itself, unchanged, for anything else
        except Exception as e:
            raise await self.faults.in_reduce(rec.step, k, e) from None
        finally:
            for c in range(k):
                records.activity.pop(c, None)
        t1 = self.now()
        records.busy[0].append((t0, t1))
        records.optims.append((t0, t1))
        records.steps.append((rec.start, t1))
        metrics["train/participants"] = k
        rec.pack.update({f"actor/{m}": v for m, v in metrics.items() if "/" not in m})
        records.finished_steps.append(rec)
        self.rundir.write_step(records, rec, metrics, self.sched_status())
        for gid, _ in rec.groups:
            self.shards.pop(rec.local[gid], None)
            self.group_tasks.pop(rec.local[gid], None)
            for att in range(self.cfg.policy.group_size):
                self.exec_version.pop((gid, att), None)
        self.emit(StepDone(time=t1, step=step))

    async def _publish(self, version: int) -> None:
        t0 = self.now()
        gv = self.base_step + version
        rollout = [c for c in range(self.K) if self.roles[c] is CellRole.ROLLOUT]
        self.records.publishing = gv
        try:
            info = await self.cluster.publish(gv, rollout)
        finally:
            self.records.publishing = None
        t1 = self.now()
        self.records.publications.append({"version": gv, "time": t1, "seconds": t1 - t0, **info})
        self.execs.maybe_evaluate(gv)
        self.emit(WeightsPublished(time=t1, version=version))


def _found_by(e: BaseException) -> str:
    """What found a standalone engine dead: the proxy's heartbeat, or a failed reload."""
    return "engine_heartbeat" if str(e).startswith("heartbeat:") else "publication"
