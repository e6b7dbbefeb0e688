"""The simulated world: a discrete-event loop that carries out the policy's actions.

Virtual time in hours. Everything the policy asks for takes the time the cost
model says, then comes back as an event. The world keeps its *own* view of the
cluster (roles, capacity, running executions) so it can check the policy rather
than trust it: an execution is counted as *interrupted* whenever a cell leaves
rollout while the capacity left is below the executions running (serving is
pooled, as the proxy reroutes in-flight calls to any rollout engine).

Rollout progress runs on a shared *progress clock*: every running execution
advances at rate r(t) = speed(occupancy) (1 / (1 + slowdown * occupancy), or a
measured curve), so an execution with work x launched at progress P0 finishes
when P(t) = P0 + x. Only the earliest target matters, so the loop never ticks
over executions (O(log n) per event). A publication stalls the clock (every
engine pauses and reloads); a cell leaving rollout pushes back the targets of the
executions it served (their calls are rerouted), which is the only time the world
tracks which cell serves which execution.

Staleness is measured two ways: by dispatch version (per trained group, the
policy's E[d]) and by *serving* version: the version each token was sampled
with, booked by :class:`gyre.sim.serving.ServingStaleness`.

Faults are scheduled like any completion (the twin of :mod:`gyre.runtime.faults`): a dead
cell's scheduled work is void (:class:`gyre.sim.cell_faults.CellFaults` keeps whose is
whose), its capacity leaves, and the policy hears ``CellLost``, then ``CellBack``.
"""

from __future__ import annotations

import heapq
import math
import time as _time

from gyre.policy import (
    AssignGroup,
    CellBack,
    CellLost,
    CellRole,
    CellSwitched,
    ClaimMicroStep,
    DispatchGroups,
    EndRun,
    EngineBack,
    EngineLost,
    Event,
    ExecutionFinished,
    ExecutionsLaunched,
    FinishStep,
    LaunchExecutions,
    MicroStepDone,
    PolicyError,
    PublishWeights,
    SchedulingPolicy,
    StartStep,
    StepDone,
    SwitchCell,
    Tick,
    WakeAt,
    WeightsPublished,
)
from gyre.sim.cell_faults import CellFaults
from gyre.sim.config import SimConfig
from gyre.sim.routing import Routing
from gyre.sim.scheduled import (
    Back,
    Launched,
    Lost,
    MicroDone,
    OptimDone,
    Published,
    Scheduled,
    Switched,
    Wake,
)
from gyre.sim.serving import ServingStaleness
from gyre.sim.timeline import Trace
from gyre.sim.workload import Draw


class World:
    """Runs one placement of ``cfg`` on ``draw``; ``run()`` returns the raw trace and counters."""

    def __init__(
        self,
        cfg: SimConfig,
        placement: str,
        draw: Draw,
        *,
        record: bool = True,
        drain: bool = False,
        faults: tuple[tuple[int, float, float | None, int], ...] = (),
        spare_reduce: bool = False,
    ) -> None:
        """``faults``: ``(cell, at_h, restart_h, slots)`` each: the cell's process (cell -1: a
        standalone engine of ``slots``) dies at ``at_h`` and is back ``restart_h`` later (None:
        never), as :mod:`gyre.sim.faults` parses them. ``spare_reduce``: a fault that
        lands on a training cell in the step's reduce waits for the step to end (a fault
        injector that spares the reduce); otherwise such a loss stops the run."""
        self.cfg = cfg
        self.name = placement
        self.pcfg = cfg.policy_config(placement)
        self.policy = SchedulingPolicy(self.pcfg)
        self.record = record
        self.drain = drain
        self._dur = draw.duration_h.tolist()
        self._missing = draw.missing.tolist()
        self._groups_drawn = draw.groups
        self._calls = draw.calls.tolist() if draw.calls is not None else None
        # a replayed run's own compute per group (see _claim_h), or none
        self._train: tuple[list[float], list[int]] | None = None
        if draw.train_h is not None and draw.train_blocks is not None:
            self._train = (draw.train_h.tolist(), draw.train_blocks.tolist())
        self._init_costs(cfg)
        self.serving = ServingStaleness(steady_from_step=self.pcfg.mu)  # gyre.sim.serving
        K = self.pcfg.cells
        self.K = K
        self.Ce = self.pcfg.cell_capacity
        self.roles: list[CellRole] = list(self.policy.roles)
        self.capacity = self.pcfg.standalone_capacity + self.Ce * self.roles.count(CellRole.ROLLOUT)
        self.running = 0
        self.now = 0.0
        self._heap: list[tuple[float, int, Scheduled]] = []
        self._seq = 0
        # progress clock
        self._P = 0.0
        self._P_t = 0.0
        self._rate = 1.0
        self._run_heap: list[tuple[float, int, int]] = []  # (progress target, group, attempt)
        self._init_accounting(K)
        self.trace = Trace(cells=K, segments=[[] for _ in range(K)], busy=[[] for _ in range(K)])
        # record: what each event cost on the host's clock (s), policy.handle and _apply, the
        # twin of the runtime's ``Records.controller`` (bench_runtime compares the two)
        self.event_costs: list[tuple[float, float]] = []
        # which serving unit runs each execution: only kept when a reroute costs something
        self.routing: Routing | None = None
        if self._reroute_h > 0:
            self.routing = Routing(K, self.Ce, self.pcfg.standalone_capacity)
        self._reducing = False  # in the step's reduce: a participant lost there stops the run
        self._reduce_end = 0.0  # when the reduce under way ends
        self.spare_reduce = spare_reduce
        self.faults = CellFaults(K)  # whose work is void once it dies (gyre.sim.cell_faults)
        for cell, at_h, restart_h, slots in faults:
            self._push(at_h, Lost(cell, restart_h, slots))

    def _init_costs(self, cfg: SimConfig) -> None:
        """What each action costs, in hours (the cost model of this placement)."""
        p = self.pcfg
        self._micro_h = cfg.costs.train_step_cell_h / (
            p.batch_groups * p.group_size * p.micro_steps_per_execution
        )
        self._workload = cfg.workload
        self._varspeed = cfg.workload.slowdown > 0 or bool(cfg.workload.speed_curve)
        c = cfg.costs
        colocate = self.pcfg.placement.value == "colocate"
        self._to_training_h = c.switch_to_training_h + (c.reshard_to_training_h if colocate else 0)
        self._to_rollout_h = c.switch_to_rollout_h + (c.reshard_to_rollout_h if colocate else 0)
        self._stall_h = c.publish_stall_h
        self._stall_until = -math.inf
        self._refresh_h = c.satellite_refresh_h
        self._fresh_at = [-math.inf] * self.pcfg.cells
        # a moved call prefills its context again, or (kv_migration) takes its K/V along
        self._reroute_h = c.migrated_reroute_delay_h if c.kv_migration else c.reroute_delay_h
        self.rerouted = 0  # executions moved off a leaving cell (each lost _reroute_h)

    def _init_accounting(self, K: int) -> None:
        """The world's own counters (it checks the policy rather than trusting it)."""
        self.interrupted = 0
        self.order_violations = 0
        self.overbooked = 0
        self.protocol_errors: list[str] = []
        self.makespan: float | None = None
        self.idle_slot_h = 0.0
        self._acct_t = 0.0
        self._role_since = [0.0] * K
        self.role_h: list[dict[str, float]] = [
            dict.fromkeys((r.value for r in CellRole), 0.0) for _ in range(K)
        ]
        self.idle_slot_h_at_end: float | None = None
        self._busy_since: list[float | None] = [None] * K
        self.busy_h = [0.0] * K
        self.dispatched_execs = 0
        self.finished_execs = 0
        self.missing_execs = 0
        self._step_start: dict[int, float] = {}
        self._group_finished: dict[int, int] = {}

    # ------------------------------------------------------------------ helpers
    def _push(self, t: float, what: Scheduled) -> int:
        self._seq += 1  # ties pop in push order
        heapq.heappush(self._heap, (t, self._seq, what))
        return self._seq

    def _account(self) -> None:
        """Integrate idle rollout slots and advance the progress clock up to ``now``."""
        dt = self.now - self._acct_t
        if dt > 0:
            self.idle_slot_h += max(0, self.capacity - self.running) * dt
            if self._stall_until > self._acct_t:  # engines paused for a publication
                dt = max(0.0, self.now - self._stall_until)
            self._P += self._rate * dt
            self._acct_t = self.now

    def _rerate(self) -> None:
        if self._varspeed:
            occ = self.running / self.capacity if self.capacity > 0 else 1.0
            self._rate = self._workload.speed(occ)
        if self.record:
            self.trace.utilisation.append((self.now, self.running, self.capacity))

    def _progress_now(self) -> float:
        """The progress clock at ``now`` without booking it (booking splits the float sums)."""
        start = max(self._acct_t, self._stall_until)
        return self._P + self._rate * max(0.0, self.now - start)

    def _reroute(self, cell: int) -> None:
        """``cell`` left rollout: every execution it served loses ``reroute_delay_h`` and moves."""
        if self.routing is None:
            return
        moved = self.routing.leave(cell)
        if not moved:
            return
        self.rerouted += len(moved)
        d = self._reroute_h * self._rate  # the lost time, in progress units
        heap = self._run_heap
        heap[:] = [(p + d, g, a) if (g, a) in moved else (p, g, a) for p, g, a in heap]
        heapq.heapify(heap)
        for key in moved:
            self.routing.place(key, self.roles)

    def _book_role(self, cell: int, t: float) -> None:
        """Close ``cell``'s open role segment at ``t``: its hours, and its trace segment."""
        since, role = self._role_since[cell], self.roles[cell].value
        self.role_h[cell][role] += max(0.0, t - since)
        if self.record and t > since:
            self.trace.segments[cell].append((since, t, role))

    def _set_role(self, cell: int, role: CellRole) -> None:
        self._book_role(cell, self.now)
        self._role_since[cell] = self.now
        self.roles[cell] = role

    def _busy_start(self, cell: int) -> None:
        if self.roles[cell] is not CellRole.TRAINING:
            self.protocol_errors.append(
                f"t={self.now:.3f}: cell {cell} asked to compute while {self.roles[cell].value}"
            )
        self._busy_since[cell] = self.now

    def _busy_end(self, cell: int) -> None:
        s = self._busy_since[cell]
        if s is None:
            return
        self._busy_since[cell] = None
        self.busy_h[cell] += self.now - s
        if self.record:
            iv = self.trace.busy[cell]
            if iv and iv[-1][1] >= s - 1e-12:
                iv[-1] = (iv[-1][0], self.now)
            else:
                iv.append((s, self.now))

    def _check_order(self, cell: int) -> None:
        """Cells join in fixed order (all earlier cells already training) and one at a time
        (colocate's gang moves together, so earlier cells may be mid-switch with it)."""
        gang = self.pcfg.placement.value == "colocate"
        for j in range(self.K):
            r = self.roles[j]
            if j < cell and not (r is CellRole.TRAINING or (gang and r is CellRole.TO_TRAINING)):
                self.order_violations += 1
            if j != cell and r is CellRole.TO_TRAINING and not gang:
                self.order_violations += 1

    # ------------------------------------------------------------------ actions
    def _apply(self, acts: list) -> None:
        """Carry out each action (one method per action type); what takes time is scheduled."""
        for a in acts:
            match a:
                case LaunchExecutions():
                    self._launch(a)
                case DispatchGroups():
                    self.dispatched_execs += len(a.group_ids) * a.group_size
                case AssignGroup():
                    self._assign(a)
                case ClaimMicroStep():
                    self._claim(a)
                case SwitchCell():
                    self._switch(a)
                case StartStep():
                    self._step_start[a.step] = self.now
                case FinishStep():
                    self._finish_step(a)
                case PublishWeights():
                    self._publish(a)
                case WakeAt():
                    self._push(max(a.time, self.now), Wake())
                case EndRun():
                    self._account()
                    self.makespan = self.now
                    self.idle_slot_h_at_end = self.idle_slot_h
                case _:  # pragma: no cover - new action types must be handled here
                    raise RuntimeError(f"world cannot carry out {type(a).__name__}")

    def _launch(self, a: LaunchExecutions) -> None:
        self._account()
        n = len(a.executions)
        self.running += n
        if self.running > self.capacity:
            self.overbooked += self.running - self.capacity
        P = self._progress_now()
        dur = self._dur
        P0 = self.serving.P0
        for gid, att in a.executions:
            if gid >= self._groups_drawn:
                raise RuntimeError("workload draw too small for this run (pool_groups is wrong)")
            heapq.heappush(self._run_heap, (P + dur[gid][att], gid, att))
            P0[(gid, att)] = P
        if self.routing is not None:
            for key in a.executions:
                self.routing.place(key, self.roles)
        self._rerate()
        self._push(self.now, Launched(a.executions))

    def _assign(self, a: AssignGroup) -> None:
        self.trace.consumed.append((a.step, a.group_id, a.version))
        self.serving.assigned(a.step, a.group_id)
        if self.record:
            self.trace.group_assigned[a.group_id] = self.now

    def _claim(self, a: ClaimMicroStep) -> None:
        self._busy_start(a.cell)
        done = MicroDone(cell=a.cell, step=a.step, group_id=a.group_id, micro_index=a.index)
        start = self.now
        if a.cell and self._refresh_h:  # a satellite first loads the core's new weights
            start = max(start, self._fresh_at[a.cell])
        self.faults.track(a.cell, self._push(start + self._claim_h(a.group_id, a.index), done))

    def _claim_h(self, group: int, index: int) -> float:
        """One claim's compute: the mean per micro-step, or, where a replayed run measured the
        group, its first k claims share its measured seconds and the rest cost nothing (the
        runtime packs a group into k indivisible tasks; a group with equal rewards is k = 0)."""
        if self._train is None or group >= len(self._train[1]) or self._train[1][group] < 0:
            return self._micro_h
        train_h, blocks = self._train
        k = blocks[group]
        return train_h[group] / k if index < k else 0.0

    def _switch(self, a: SwitchCell) -> None:
        self.trace.switch_order.append((self.now, a.cell, a.role.value))
        if a.role is CellRole.TRAINING:
            self._to_training(a.cell)
            return
        if self.roles[a.cell] not in (CellRole.TRAINING, CellRole.LOST):
            self.protocol_errors.append(
                f"cell {a.cell} switched to rollout from {self.roles[a.cell]}"
            )
        self._set_role(a.cell, CellRole.TO_ROLLOUT)
        switched = Switched(cell=a.cell, role=CellRole.ROLLOUT)
        self.faults.track(a.cell, self._push(self.now + self._to_rollout_h, switched))

    def _to_training(self, cell: int) -> None:
        """``cell`` stops serving now: executions beyond the capacity left are interrupted."""
        self._check_order(cell)
        self._account()
        if self.roles[cell] is CellRole.LOST:  # a restarted cell held no capacity
            self._set_role(cell, CellRole.TO_TRAINING)
            switched = Switched(cell=cell, role=CellRole.TRAINING)
            self.faults.track(cell, self._push(self.now + self._to_training_h, switched))
            return
        if self.roles[cell] is not CellRole.ROLLOUT:
            self.protocol_errors.append(f"cell {cell} switched to training from {self.roles[cell]}")
        self.capacity -= self.Ce
        slack = self.capacity - self.running
        self.trace.min_slack = min(self.trace.min_slack, slack)
        if slack < 0:
            self.interrupted += -slack  # these executions lost their model mid-run
        self._set_role(cell, CellRole.TO_TRAINING)
        self._reroute(cell)
        self._rerate()
        switched = Switched(cell=cell, role=CellRole.TRAINING)
        self.faults.track(cell, self._push(self.now + self._to_training_h, switched))

    def _finish_step(self, a: FinishStep) -> None:
        self._reducing = True  # the reduce is part of the optimizer step's cost here
        self._reduce_end = self.now + self.cfg.costs.optim_h
        self.trace.optimizer_cells.add(a.cell)
        self._busy_start(a.cell)
        self._push(self._reduce_end, OptimDone(cell=a.cell, step=a.step))

    def _publish(self, a: PublishWeights) -> None:
        self.trace.optimizer_cells.add(a.cell)
        self._busy_start(a.cell)
        if self._stall_h > 0:  # every engine pauses, reloads, resumes
            self._account()
            self._stall_until = max(self._stall_until, self.now + self._stall_h)
        done = Published(cell=a.cell, version=a.version)
        self.faults.track(a.cell, self._push(self.now + self.cfg.costs.publish_h, done))

    def _arrive(self, t: float, what: Scheduled) -> Event:
        """A scheduled completion is due: update the world, and return the policy's event."""
        match what:
            case Launched():
                return ExecutionsLaunched(time=t, executions=what.executions)
            case MicroDone():
                self._busy_end(what.cell)
                return MicroStepDone(
                    time=t,
                    cell=what.cell,
                    step=what.step,
                    group_id=what.group_id,
                    index=what.micro_index,
                )
            case Switched():
                return self._switched(t, what)
            case OptimDone():
                return self._optim_done(t, what)
            case Lost():
                return self._lose(t, what)
            case Back():
                return self._back(t, what)
            case Published():
                self._busy_end(what.cell)
                self.serving.published(self._progress_now(), what.version)
                if self.record:
                    self.trace.publications.append(t)
                return WeightsPublished(time=t, version=what.version)
        return Tick(time=t)

    def _lose(self, t: float, what: Lost) -> CellLost | EngineLost | Tick:
        """A cell's process dies: what it had scheduled is void, its capacity leaves, and it
        comes back ``restart_h`` later. A standalone engine's slots leave alike (its calls
        move to the other engines: no execution is cut)."""
        cell = what.cell
        if cell < 0:
            self._account()
            self.capacity -= what.slots
            self._rerate()
            self.faults.log.append({"engine": 0, "lost_h": t, "slots": what.slots})
            if what.restart_h is not None:
                self._push(t + what.restart_h, Back(cell, what.slots))
            return EngineLost(time=t, capacity=what.slots)
        if self._reducing and self.roles[cell] is CellRole.TRAINING:
            if self.spare_reduce:  # the fault waits for the step's end (its OptimDone
                self._push(self._reduce_end, what)  # was pushed first, so it pops first)
                return Tick(time=t)
            # as the runtime: a participant lost in the reduce stops the run
            raise PolicyError(f"cell {cell} was lost during the step's reduce: the run stops")
        self._account()
        self.faults.void(cell)
        self._busy_end(cell)
        if self.roles[cell] is CellRole.ROLLOUT:
            self.capacity -= self.Ce
            self._reroute(cell)
        self.faults.log.append({"cell": cell, "lost_h": t, "role": self.roles[cell].value})
        self._set_role(cell, CellRole.LOST)
        self._rerate()
        if what.restart_h is not None:
            self._push(t + what.restart_h, Back(cell))
        return CellLost(time=t, cell=cell)

    def _back(self, t: float, what: Back) -> CellBack | EngineBack:
        if what.cell < 0:
            self._account()
            self.capacity += what.slots
            self._rerate()
            self.faults.log.append({"engine": 0, "back_h": t})
            return EngineBack(time=t, capacity=what.slots)
        self.faults.log.append({"cell": what.cell, "back_h": t})
        return CellBack(time=t, cell=what.cell)

    def _switched(self, t: float, what: Switched) -> CellSwitched:
        self._account()
        self._set_role(what.cell, what.role)
        self._fresh_at[what.cell] = -math.inf  # joining pulls the core's current weights
        if what.role is CellRole.ROLLOUT:
            self.capacity += self.Ce
        self._rerate()
        return CellSwitched(time=t, cell=what.cell, role=what.role)

    def _optim_done(self, t: float, what: OptimDone) -> StepDone:
        self._reducing = False
        self._busy_end(what.cell)
        if self._refresh_h:
            for c in range(1, self.K):
                if self.roles[c] is CellRole.TRAINING:
                    self._fresh_at[c] = t + self._refresh_h
        if self.record:
            self.trace.steps.append((self._step_start.get(what.step, t), t))
        return StepDone(time=t, step=what.step)

    def _execution_done(self, t_fin: float) -> ExecutionFinished:
        """The earliest running execution reaches its progress target at ``t_fin``."""
        self.now = max(t_fin, self.now)
        self._account()
        _, gid, att = heapq.heappop(self._run_heap)
        self.running -= 1
        self.finished_execs += 1
        key = (gid, att)
        fc = self.trace.finish_count
        fc[key] = fc.get(key, 0) + 1
        if self.record:
            gf = self._group_finished
            gf[gid] = gf.get(gid, 0) + 1
            if gf[gid] == self.pcfg.group_size:
                self.trace.group_ready[gid] = self.now
        missing = self._missing[gid][att]
        if missing:
            self.missing_execs += 1
        calls = None if self._calls is None else self._calls[gid][att]
        self.serving.finished(key, self._P, calls, scored=not missing)
        if self.routing is not None:
            self.routing.finished(key)
        self._rerate()
        return ExecutionFinished(time=self.now, execution=key, reward=None if missing else 1.0)

    # ------------------------------------------------------------------ loop
    def run(self) -> World:
        t0 = _time.perf_counter()
        pol = self.policy
        self._rerate()
        self._apply(pol.start(0.0))
        heap = self._heap
        run_heap = self._run_heap
        while True:
            if self.makespan is not None and not self.drain:
                break
            t_ev = heap[0][0] if heap else math.inf
            if run_heap:
                t_fin = (
                    max(self._acct_t, self._stall_until) + (run_heap[0][0] - self._P) / self._rate
                )
            else:
                t_fin = math.inf
            if t_ev == math.inf and t_fin == math.inf:
                break
            ev: Event
            if t_fin < t_ev:
                ev = self._execution_done(t_fin)
            else:
                t, seq, what = heapq.heappop(heap)
                if not self.faults.due(seq, what):  # scheduled by a cell that died since
                    continue
                self.now = t
                ev = self._arrive(t, what)
            if self.record:
                t1 = _time.perf_counter()
                acts = pol.handle(ev)
                t2 = _time.perf_counter()
                self._apply(acts)
                self.event_costs.append((t2 - t1, _time.perf_counter() - t2))
            else:
                self._apply(pol.handle(ev))
        self._close()
        self.wall_s = _time.perf_counter() - t0
        return self

    def _close(self) -> None:
        """Close open role segments and compute intervals at the makespan."""
        self.end_time = self.now if self.makespan is None else self.makespan
        for cell in range(self.K):
            self._book_role(cell, self.end_time)
            s = self._busy_since[cell]
            if s is not None:
                self.busy_h[cell] += max(0.0, self.end_time - s)
        if self.idle_slot_h_at_end is None:
            self._account()
            self.idle_slot_h_at_end = self.idle_slot_h
