"""The scheduling policy: one deterministic state machine for all three placements.

``policy.start(time)`` and ``policy.handle(event)`` return the actions the world
must carry out. The policy owns no clock, thread or I/O, so the simulator and
the Ray runtime drive the very same object. All three placements share the
bookkeeping (counters, groups, boundary dispatch, streaming micro-steps); they
differ only in who may train when:

* **elastic**: cells leave rollout one at a time, in order, core (cell 0) first,
  when the *waterlevel rule* ((capacity without the next cell) >= w(t)) and the
  *supply check* (>= rho_min B ready, unclaimed groups for ``hold_tau``) both
  hold; they stay for the burst; at the boundary satellites return and the core
  stays only if the *retention test* passes.
* **colocate**: the same rules applied to the whole pool as one gang: with no
  standalone pool the waterlevel rule means "every execution finished" (w = 0).
* **async**: cells 0..n-1 train for the whole run, the rest serve rollouts.

Only the core ever runs ``FinishStep`` or ``PublishWeights``: it alone holds
optimizer state and the authoritative weights.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from gyre.policy import faults, retention
from gyre.policy.actions import (
    Action,
    AssignGroup,
    ClaimMicroStep,
    DispatchGroups,
    EndRun,
    FinishStep,
    LaunchExecutions,
    PublishWeights,
    StartStep,
    SwitchCell,
    WakeAt,
)
from gyre.policy.cell_roles import CORE, CellRole
from gyre.policy.config import Placement, PolicyConfig
from gyre.policy.events import (
    CellBack,
    CellLost,
    CellSwitched,
    EngineBack,
    EngineLost,
    EvaluationRunning,
    Event,
    ExecutionFinished,
    ExecutionId,
    ExecutionsLaunched,
    MicroStepDone,
    PolicyError,
    StepDone,
    Tick,
    WeightsPublished,
)
from gyre.policy.state import PolicyState


@dataclass(slots=True)
class _Group:
    version: int
    launched_mask: int = 0
    finished_mask: int = 0
    finished: int = 0
    valid: int = 0


class SchedulingPolicy(PolicyState):
    """Pure placement policy. Feed events, carry out the returned actions."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        c = config
        self._N = c.group_size
        self._B = c.batch_groups
        self._mu = c.mu
        self._steps = c.total_steps
        # counters (executions)
        self.launched = 0
        self.evaluating = 0  # live evaluation executions (outside every group)
        self._reserved = 0  # launch requested, not yet finished: occupies capacity
        self._queue: deque[ExecutionId] = deque()
        self._groups: dict[int, _Group] = {}
        self._next_gid = 0
        self._ready_seq = 0
        self.outstanding_groups = 0  # dispatched, not yet assigned to a step
        self.version = 0  # published policy version (= optimizer steps published)
        self._step_groups = 0
        self._left_at = [0] * c.cells  # the version each cell last left rollout at
        self._supply_since: float | None = None
        self._started = False
        self.done = False
        self.now = 0.0

    # ------------------------------------------------------------------ views
    @property
    def running(self) -> int:
        """Executions holding rollout capacity (launch requested, not finished)."""
        return self._reserved

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def ready_groups(self) -> int:
        """Scored groups not yet assigned to a step."""
        return len(self.ready)

    @property
    def step_active(self) -> bool:
        return self.step_open

    def training_cells(self) -> list[int]:
        return [i for i, r in enumerate(self.roles) if r is CellRole.TRAINING]

    def status(self) -> dict[str, object]:
        """A JSON-friendly snapshot for logs and metrics (``sched/*`` in the runtime)."""
        return {
            "time": self.now,
            "placement": self.placement.value,
            "roles": [r.value for r in self.roles],
            "capacity": self.capacity,
            "standalone_live": self.standalone_live,
            "waterlevel": self.waterlevel,
            "dispatched": self.dispatched,
            "launched": self.launched,
            "finished": self.finished,
            "running": self._reserved,
            "queued": len(self._queue),
            "ready_groups": len(self.ready),
            "outstanding_groups": self.outstanding_groups,
            "version": self.version,
            "steps_done": self.steps_done,
            "step_active": self.step_open,
            "done": self.done,
            "lost": self.lost,
        }

    # ------------------------------------------------------------------ entry points
    def start(self, time: float = 0.0) -> list[Action]:
        """Begin the run: the first boundary dispatch at policy version 0."""
        if self._started:
            raise PolicyError("policy already started")
        self._started = True
        self.now = time
        acts: list[Action] = []
        self._dispatch(acts)
        self._react(acts)
        return acts

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; return the actions it triggers (possibly none)."""
        self._check(event)
        acts: list[Action] = []
        # exact types (no subclass is an event); mypy narrows `type(event) is X`
        if type(event) is ExecutionFinished:
            self._on_finished(event)
        elif type(event) is ExecutionsLaunched:
            self.launched += len(event.executions)
        elif type(event) is MicroStepDone:
            self._on_micro_done(event)
        elif type(event) is StepDone:
            self._on_step_done(event, acts)
        elif type(event) is WeightsPublished:
            self._on_published(event, acts)
        elif type(event) is CellSwitched:
            self._on_switched(event, acts)
        elif type(event) is CellLost:
            faults.on_lost(self, event, acts)
        elif type(event) is CellBack:
            faults.on_back(self, event, acts)
        elif type(event) is EngineLost:
            faults.on_engine_lost(self, event)
        elif type(event) is EngineBack:
            faults.on_engine_back(self, event)
        elif type(event) is EvaluationRunning:
            self.evaluating = event.executions
        elif type(event) is Tick:
            pass
        else:
            raise PolicyError(f"unknown event type {type(event).__name__}")
        self.now = event.time  # only once the event was accepted
        self._react(acts)
        return acts

    def _check(self, event: Event) -> None:
        """Refuse an event the policy cannot apply, before any state changes."""
        if not self._started:
            raise PolicyError("call start() before handle()")
        if event.time < self.now - 1e-9:
            raise PolicyError(f"event time {event.time} is before the last event's time {self.now}")
        cell = getattr(event, "cell", None)
        if cell is not None and not 0 <= cell < self.K:
            raise PolicyError(
                f"{type(event).__name__} names cell {cell}; cells are 0..{self.K - 1}"
            )
        if type(event) is EvaluationRunning and event.executions < 0:
            raise PolicyError(f"EvaluationRunning with {event.executions} executions")

    # ------------------------------------------------------------------ event handlers
    def _on_finished(self, ev: ExecutionFinished) -> None:
        gid, attempt = ev.execution
        g = self._groups.get(gid)
        if g is None or not 0 <= attempt < self._N:
            raise PolicyError(
                f"finished execution {ev.execution} was never dispatched (or its group was trained)"
            )
        bit = 1 << attempt
        if g.finished_mask & bit:
            raise PolicyError(f"execution {ev.execution} finished twice")
        if not g.launched_mask & bit:
            raise PolicyError(f"execution {ev.execution} finished but was never launched")
        g.finished_mask |= bit
        g.finished += 1
        if ev.reward is not None:
            g.valid += 1
        self.finished += 1
        self._reserved -= 1
        if g.finished == self._N:  # group scored: ready for training
            heapq.heappush(self.ready, (g.version, self._ready_seq, gid))
            self._ready_seq += 1

    def _on_micro_done(self, ev: MicroStepDone) -> None:
        if ev.cell in self.void:  # its claim went back to the queue when a cell before it died
            self.void.discard(ev.cell)
            return
        if not self.busy[ev.cell] or ev.step != self.steps_done:
            raise PolicyError(f"unexpected micro-step completion {ev}")
        self.busy[ev.cell] = False
        self.inflight -= 1
        claim = self.claim[ev.cell]
        if claim is not None:
            self.done_by[ev.cell].append(claim)
            self.claim[ev.cell] = None

    def _on_step_done(self, ev: StepDone, acts: list[Action]) -> None:
        if not self.finishing or ev.step != self.steps_done:
            raise PolicyError(f"unexpected step completion {ev}")
        c = self.config
        self.finishing = False
        self.step_open = False
        self.busy[CORE] = False
        self.steps_done += 1
        if self.steps_done >= c.total_steps:
            self.done = True
            acts.append(EndRun(self.steps_done))
            return
        if self.steps_done % c.mu:
            return  # mid-burst: the next step starts when supply allows
        # ---- burst boundary: satellites return, core publishes (and maybe stays)
        self.boundary = True
        next_dispatch = (c.queue_depth_groups - self.outstanding_groups) * self._N
        if self.placement is Placement.ASYNC:
            self.core_stays = True
        else:
            satellites = [i for i in range(1, self.K) if self.roles[i] is CellRole.TRAINING]
            if self.placement is Placement.COLOCATE:
                cap_without_core = self.standalone_live  # the pool moves as one gang
            else:
                alive = sum(r is not CellRole.LOST for r in self.roles[1:])
                cap_without_core = self.standalone_live + self.Ce * alive
            self.core_stays = retention.core_stays(self, cap_without_core, next_dispatch)
            # colocate moves as one gang: if the pool stays, every cell stays
            if not (self.placement is Placement.COLOCATE and self.core_stays):
                for i in satellites:
                    self.roles[i] = CellRole.TO_ROLLOUT
                    acts.append(SwitchCell(cell=i, role=CellRole.ROLLOUT))
        self.busy[CORE] = True
        acts.append(PublishWeights(version=self.steps_done, cell=CORE))

    def _on_published(self, ev: WeightsPublished, acts: list[Action]) -> None:
        if not self.boundary or ev.version != self.steps_done:
            raise PolicyError(f"unexpected publication {ev}")
        self.version = ev.version
        self.boundary = False
        self.busy[CORE] = False
        self._dispatch(acts)
        if self.roles[CORE] is not CellRole.TRAINING:
            # the core died after it wrote the weights (the engines took them): that is the
            # publication; its new process (lost, or on its way back) stays where it goes
            self.republish = False
            return
        if not self.core_stays:
            self.core_clock.left_training(ev.time)
            self.roles[CORE] = CellRole.TO_ROLLOUT
            acts.append(SwitchCell(cell=CORE, role=CellRole.ROLLOUT))

    def _on_switched(self, ev: CellSwitched, acts: list[Action]) -> None:
        cur = self.roles[ev.cell]
        if ev.role is CellRole.TRAINING and cur is CellRole.TO_TRAINING:
            if CellRole.LOST in self.roles[: ev.cell] or self._late_join(ev.cell):
                self.roles[ev.cell] = CellRole.TO_ROLLOUT
                acts.append(SwitchCell(cell=ev.cell, role=CellRole.ROLLOUT))
                return
            self.roles[ev.cell] = CellRole.TRAINING
            if ev.cell == CORE:
                self.core_clock.in_training(ev.time)
                faults.republish(self, acts)
        elif ev.role is CellRole.ROLLOUT and cur is CellRole.TO_ROLLOUT:
            self.roles[ev.cell] = CellRole.ROLLOUT
            if ev.cell == CORE:
                self.core_clock.in_rollout(ev.time)
            self.capacity += self.Ce
        else:
            raise PolicyError(f"cell {ev.cell} reported {ev.role.value} while {cur.value}")

    def _late_join(self, cell: int) -> bool:
        """An Elastic satellite whose switch into training straddled a burst boundary: the
        other satellites went back at it, so it goes back too (else it would train past a
        cell in rollout, outside the participant prefix, holding its capacity)."""
        if self.placement is not Placement.ELASTIC or cell == CORE:
            return False
        return self.boundary or self._left_at[cell] != self.version

    # ------------------------------------------------------------------ decisions
    def _react(self, acts: list[Action]) -> None:
        if not self.done:
            self._train(acts)
            self._update_supply(acts)
            self._switch(acts)
        self._launch(acts)

    def _dispatch(self, acts: list[Action]) -> None:
        """Boundary dispatch: top the outstanding queue up to Q_b = (phi + mu) B groups."""
        n = self.config.queue_depth_groups - self.outstanding_groups
        if n <= 0:
            return
        gids = tuple(range(self._next_gid, self._next_gid + n))
        self._next_gid += n
        for gid in gids:
            self._groups[gid] = _Group(self.version)
            self._queue.extend((gid, a) for a in range(self._N))
        self.outstanding_groups += n
        self.dispatched += n * self._N
        acts.append(DispatchGroups(group_ids=gids, version=self.version, group_size=self._N))

    def _launch(self, acts: list[Action]) -> None:
        room = self.capacity - self._reserved
        if room <= 0 or not self._queue:
            return
        k = min(room, len(self._queue))
        q = self._queue
        batch = tuple(q.popleft() for _ in range(k))
        groups = self._groups
        for gid, att in batch:
            groups[gid].launched_mask |= 1 << att
        self._reserved += k
        acts.append(LaunchExecutions(batch))

    def _burst_need(self) -> int:
        """Groups the current burst still has to assign (its remaining steps' batches)."""
        done = self.steps_done
        steps_left = min(self._mu - done % self._mu, self._steps - done)
        return steps_left * self._B - (self._step_groups if self.step_open else 0)

    def _supply(self) -> int:
        return min(len(self.ready), self._burst_need())

    def _update_supply(self, acts: list[Action]) -> None:
        if self.placement is Placement.ASYNC:
            return
        if not self.boundary and self._supply() >= self.supply_groups:
            if self._supply_since is None:
                self._supply_since = self.now
                if self.config.hold_tau > 0:
                    acts.append(WakeAt(self.now + self.config.hold_tau))
        else:
            self._supply_since = None

    def _switch(self, acts: list[Action]) -> None:
        """Move the next cell into training if the waterlevel rule and the supply check allow."""
        if self.placement is Placement.ASYNC:
            faults.async_refill(self, acts)
            return
        if self.boundary:
            return
        if (
            self._supply_since is None
            or self.now - self._supply_since < self.config.hold_tau - 1e-12
        ):
            return
        roles = self.roles
        if self.placement is Placement.COLOCATE:  # the gang: every cell before a lost one
            hole = roles.index(CellRole.LOST) if CellRole.LOST in roles else self.K
            # those of it in rollout; the rest must be training (a fault sent them back while
            # the core went on: they rejoin it, as the gang would have stayed)
            leaving = [i for i in range(hole) if roles[i] is CellRole.ROLLOUT]
            if not leaving or any(
                roles[i] not in (CellRole.ROLLOUT, CellRole.TRAINING) for i in range(hole)
            ):
                return
            if roles[CORE] is not CellRole.ROLLOUT and not self.step_open:
                return
        else:
            nxt = 0
            while nxt < self.K and roles[nxt] is CellRole.TRAINING:
                nxt += 1
            if nxt >= self.K or roles[nxt] is not CellRole.ROLLOUT:
                return  # all cells training, or the next one is mid-switch: one at a time, in order
            leaving = [nxt]
        cap_after = self.capacity - self.Ce * len(leaving)
        if cap_after < self.waterlevel:
            return  # waterlevel rule: what stays must cover every queued or running execution
        if self.evaluating and cap_after <= 0:
            return  # an evaluation in flight keeps one engine serving it (EvaluationRunning)
        for i in leaving:
            roles[i] = CellRole.TO_TRAINING
            self._left_at[i] = self.version
            acts.append(SwitchCell(cell=i, role=CellRole.TRAINING))
        if leaving[0] == CORE:
            self.core_clock.left_rollout(self.now)
        self.capacity = cap_after
        # The hold window is NOT restarted here: the rule is "supply >= rho_min B continuously
        # for tau". If the joining cell drains supply below that, _update_supply restarts the
        # window; if supply stays up, the next cell may go once this switch completes.

    def _train(self, acts: list[Action]) -> None:
        c = self.config
        if self.roles[CORE] is not CellRole.TRAINING or self.boundary:
            return
        if not self.step_open:
            if self.steps_done >= c.total_steps:
                return
            if len(self.ready) < (1 if c.streaming else self._B):
                return
            self.step_open = True
            self._step_groups = 0
            self.done_by = [[] for _ in range(self.K)]
            acts.append(StartStep(step=self.steps_done, version=self.steps_done))
            if not c.streaming:
                for _ in range(self._B):
                    self._assign(acts)
        step = self.steps_done
        micro = self.micro
        for cell in range(self.K):
            if self.roles[cell] is not CellRole.TRAINING or self.busy[cell]:
                continue
            while not micro and self._step_groups < self._B and self.ready:
                self._assign(acts)  # streaming: pull the oldest-version ready group into the step
            if not micro:
                break
            gid, idx = micro.popleft()
            self.busy[cell] = True
            self.claim[cell] = (gid, idx)
            self.inflight += 1
            acts.append(ClaimMicroStep(cell=cell, step=step, group_id=gid, index=idx))
        if self._step_groups == self._B and not micro and self.inflight == 0 and not self.finishing:
            self.finishing = True
            self.busy[CORE] = True
            acts.append(FinishStep(step=step, cell=CORE))

    def _assign(self, acts: list[Action]) -> None:
        version, _, gid = heapq.heappop(self.ready)
        g = self._groups.pop(gid)
        self._step_groups += 1
        self.outstanding_groups -= 1
        n = g.valid * self.config.micro_steps_per_execution
        acts.append(AssignGroup(step=self.steps_done, group_id=gid, version=version, micro_steps=n))
        self.micro.extend((gid, i) for i in range(n))
