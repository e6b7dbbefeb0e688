"""Cell faults in the policy: a cell lost, a cell back, and the async training prefix refilled.

A fault is an event like any other (``CellLost``, ``CellBack``), handled by the same pure
state machine: these functions are :class:`~gyre.policy.scheduling.SchedulingPolicy`'s
handlers for them, kept apart from the placements' rules. A lost rollout cell takes its
capacity with it; a lost training cell's micro-steps of the open step (done and in flight)
go back to the front of the queue, and every training cell past it leaves the participant
prefix. The core (cell 0) is lost like any cell (its new process starts from the checkpoint
of the last step it finished, which the world makes sure exists): every training cell is
past it, so the open step's micro-steps all go back to the queue, and a publication it had
in flight is void. A cell back goes to rollout, or (async) straight back to its fixed
training role when the prefix before it is whole; the core goes straight back to training
when it left an open step or a publication (its new process publishes that version again),
since no other cell can finish either.
"""

from __future__ import annotations

from gyre.policy.actions import Action, PublishWeights, SwitchCell
from gyre.policy.cell_roles import CORE, CellRole
from gyre.policy.config import Placement
from gyre.policy.events import CellBack, CellLost, EngineBack, EngineLost, PolicyError
from gyre.policy.state import PolicyState


def on_lost(p: PolicyState, ev: CellLost, acts: list[Action]) -> None:
    """A cell died (or hung): its capacity or its share of the open step is gone."""
    cell = ev.cell
    cur = p.roles[cell]
    if cur is CellRole.LOST:
        raise PolicyError(f"cell {cell} lost twice")
    if cell == CORE and p.boundary and p.busy[CORE]:
        # its publication is void: the new process publishes the same version (on_back)
        p.busy[CORE] = False
        p.republish = True
        if p.placement is Placement.COLOCATE:
            p.core_stays = False  # the gang left with it: the core alone does not stay
    if p.finishing and cur is CellRole.TRAINING:
        # the world reports a participant lost during FinishStep only before the reduce
        # began (it stops the run otherwise): that FinishStep is void, the step goes on
        p.finishing = False
        p.busy[CORE] = False
    p.lost += 1
    if cur is CellRole.ROLLOUT:
        p.capacity -= p.Ce  # its calls in flight resume on the other engines
    p.roles[cell] = CellRole.LOST
    if cur is not CellRole.TRAINING:
        return
    requeue(p, cell)
    for j in range(cell + 1, p.K):  # past the hole: out of the participant prefix
        if p.roles[j] is CellRole.TRAINING:
            requeue(p, j)
            p.roles[j] = CellRole.TO_ROLLOUT
            acts.append(SwitchCell(cell=j, role=CellRole.ROLLOUT))


def requeue(p: PolicyState, cell: int) -> None:
    """Cell ``cell``'s micro-steps of the open step (done and in flight) go back to the
    front of the queue: its gradients are gone."""
    back = p.done_by[cell]
    claim = p.claim[cell]
    if claim is not None:
        back.append(claim)
        p.claim[cell] = None
        p.inflight -= 1
        p.busy[cell] = False
        if p.roles[cell] is not CellRole.LOST:
            p.void.add(cell)  # it still reports; that report is ignored
    p.micro.extendleft(reversed(back))
    p.done_by[cell] = []


def on_back(p: PolicyState, ev: CellBack, acts: list[Action]) -> None:
    """A new process for a lost cell is up: rollout, or async back to its fixed role."""
    if p.roles[ev.cell] is not CellRole.LOST:
        raise PolicyError(f"cell {ev.cell} came back while {p.roles[ev.cell].value}")
    if ev.cell == CORE and (p.republish or p.step_open):
        # only the core can finish the open step or publish: it goes back now; its capacity
        # left rollout when it first did, so the waterlevel rule still holds
        p.roles[CORE] = CellRole.TO_TRAINING
        acts.append(SwitchCell(cell=CORE, role=CellRole.TRAINING))
        return
    if p.placement is Placement.ASYNC and ev.cell < p.config.train_cells:
        if all(r is CellRole.TRAINING for r in p.roles[: ev.cell]):
            p.roles[ev.cell] = CellRole.TO_TRAINING  # async: back to its fixed role
            acts.append(SwitchCell(cell=ev.cell, role=CellRole.TRAINING))
            return
    p.roles[ev.cell] = CellRole.TO_ROLLOUT
    acts.append(SwitchCell(cell=ev.cell, role=CellRole.ROLLOUT))


def on_engine_lost(p: PolicyState, ev: EngineLost) -> None:
    """A standalone engine is gone: its slots leave the rollout side (``capacity`` and the
    standalone pool the boundary's retention test counts on)."""
    if not 0 < ev.capacity <= p.standalone_live:
        raise PolicyError(
            f"a standalone engine of {ev.capacity} slots lost; {p.standalone_live} are live"
        )
    p.standalone_live -= ev.capacity
    p.capacity -= ev.capacity
    p.lost += 1


def on_engine_back(p: PolicyState, ev: EngineBack) -> None:
    """A new standalone engine serves: its slots are back."""
    if not 0 < ev.capacity <= p.config.standalone_capacity - p.standalone_live:
        raise PolicyError(
            f"a standalone engine of {ev.capacity} slots back; {p.standalone_live} of "
            f"{p.config.standalone_capacity} are live"
        )
    p.standalone_live += ev.capacity
    p.capacity += ev.capacity


def republish(p: PolicyState, acts: list[Action]) -> None:
    """The core is in training again after it was lost during a publication: it publishes
    the version its checkpoint holds (the boundary's, the one the lost process was writing)."""
    if p.republish:
        p.republish = False
        p.busy[CORE] = True
        acts.append(PublishWeights(version=p.steps_done, cell=CORE))


def async_refill(p: PolicyState, acts: list[Action]) -> None:
    """Async: once the training prefix is whole again, the next of its fixed training cells
    that a fault sent to rollout goes back to training (one at a time, in order)."""
    if p.placement is not Placement.ASYNC:
        return
    for i in range(p.config.train_cells):
        r = p.roles[i]
        if r is CellRole.TRAINING:
            continue
        if r is CellRole.ROLLOUT and p.capacity - p.Ce >= p.waterlevel:
            p.roles[i] = CellRole.TO_TRAINING
            p.capacity -= p.Ce
            acts.append(SwitchCell(cell=i, role=CellRole.TRAINING))
        return
