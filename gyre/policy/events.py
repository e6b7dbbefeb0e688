"""Events: what the world tells the policy happened.

Every event carries ``time``, the world's clock when it happened (the simulator's
virtual hours, the runtime's wall-clock seconds). The policy never reads a clock
of its own; it only compares these stamps (for the supply-check hold).

Executions are named by ``(group_id, attempt)`` tuples: the policy allocates group
ids in dispatch order (0, 1, 2, ...), so the world can map group ``g`` to the
``g``-th query of its task stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.policy.cell_roles import CellRole

ExecutionId = tuple[int, int]  # (group_id, attempt index 0..N-1)


class PolicyError(ValueError):
    """An event the policy cannot accept (unknown id, duplicate, out of order)."""


@dataclass(frozen=True, slots=True)
class Event:
    time: float


@dataclass(frozen=True, slots=True)
class ExecutionsLaunched(Event):
    """The world started these executions' harnesses (answer to ``LaunchExecutions``)."""

    executions: tuple[ExecutionId, ...]


@dataclass(frozen=True, slots=True)
class ExecutionFinished(Event):
    """A harness exited and its workspace was scored.

    ``reward`` is the task score; ``None`` means a *missing assessment* (the
    evaluator crashed or the overall timeout hit): the execution is dropped from
    its group, which is distinct from a valid zero. A group is *scored* (ready for
    training) once all of its N executions finished.
    """

    execution: ExecutionId
    reward: float | None


@dataclass(frozen=True, slots=True)
class CellSwitched(Event):
    """Cell ``cell`` finished moving and now has ``role`` (ROLLOUT or TRAINING)."""

    cell: int
    role: CellRole


@dataclass(frozen=True, slots=True)
class CellLost(Event):
    """Cell ``cell``'s process died or stopped answering: it serves and trains nothing.

    Whatever it held is gone: its rollout capacity leaves at once (its in-flight model
    calls resume on the other engines), and a satellite's micro-steps of the open step
    (claimed or done: its gradients went with it) go back to the queue. Cells training
    past it leave the step's participant prefix and return to rollout. The core is lost
    recoverably only while it serves rollouts: its optimizer state is not the policy's.
    A participant lost after ``FinishStep`` voids that FinishStep (the policy issues it again
    once the step's micro-steps are done): the world reports such a loss only before the
    reduce began, and stops the run if the reduce had begun.
    """

    cell: int


@dataclass(frozen=True, slots=True)
class CellBack(Event):
    """Lost cell ``cell`` has a live process again, holding nothing: the policy sends it to
    rollout (``SwitchCell``), and it may join training later in order like any cell."""

    cell: int


@dataclass(frozen=True, slots=True)
class EngineLost(Event):
    """A standalone engine serving ``capacity`` executions died or hung: its capacity leaves
    the rollout side (its calls resume on the other engines, as a lost cell's do)."""

    capacity: int


@dataclass(frozen=True, slots=True)
class EngineBack(Event):
    """A new standalone engine serving ``capacity`` executions is in the pool again."""

    capacity: int


@dataclass(frozen=True, slots=True)
class MicroStepDone(Event):
    """Cell ``cell`` finished the forward/backward of one claimed micro-step."""

    cell: int
    step: int
    group_id: int
    index: int


@dataclass(frozen=True, slots=True)
class StepDone(Event):
    """The core reduced gradients, clipped and applied optimizer step ``step``."""

    step: int


@dataclass(frozen=True, slots=True)
class WeightsPublished(Event):
    """Every rollout engine now serves policy ``version``."""

    version: int


@dataclass(frozen=True, slots=True)
class EvaluationRunning(Event):
    """``executions`` evaluation executions are live (0: none). They belong to no group, so
    the waterlevel does not count them; while any runs, the last cell serving rollouts stays,
    or they would wait without an engine until their harness timeout scored them 0."""

    executions: int


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passed (answer to ``WakeAt``, or any periodic poke from the world)."""
