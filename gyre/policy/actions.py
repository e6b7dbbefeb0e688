"""Actions: what the policy asks the world to do.

The world carries each action out and reports back with the matching event
(``LaunchExecutions`` -> ``ExecutionsLaunched``, later ``ExecutionFinished``;
``SwitchCell`` -> ``CellSwitched``; ``ClaimMicroStep`` -> ``MicroStepDone``;
``FinishStep`` -> ``StepDone``; ``PublishWeights`` -> ``WeightsPublished``;
``WakeAt`` -> ``Tick``). ``StartStep``, ``AssignGroup`` and ``EndRun`` are
notices: the world acts on them (the packing buffer pulls the group into the
step) but owes no answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.policy.cell_roles import CellRole
from gyre.policy.events import ExecutionId


@dataclass(frozen=True, slots=True)
class Action:
    pass


@dataclass(frozen=True, slots=True)
class DispatchGroups(Action):
    """Queue new groups (boundary dispatch). Group ``g`` is the g-th query of the task stream;
    every group carries the policy ``version`` the rollout engines serve at dispatch."""

    group_ids: tuple[int, ...]
    version: int
    group_size: int


@dataclass(frozen=True, slots=True)
class LaunchExecutions(Action):
    """Start these queued executions; rollout capacity has been reserved for each."""

    executions: tuple[ExecutionId, ...]


@dataclass(frozen=True, slots=True)
class SwitchCell(Action):
    """Move ``cell`` to ``role`` (TRAINING or ROLLOUT).

    Into training: the cell stops serving at once (its in-flight model calls are
    rerouted; the waterlevel rule guarantees room for them elsewhere) and the
    world answers ``CellSwitched`` when training state is loaded. Back to
    rollout: the world answers when the cell's engine serves again.
    """

    cell: int
    role: CellRole


@dataclass(frozen=True, slots=True)
class StartStep(Action):
    """Optimizer step ``step`` begins accumulating gradients on policy ``version``."""

    step: int
    version: int


@dataclass(frozen=True, slots=True)
class AssignGroup(Action):
    """Group ``group_id`` (sampled at ``version``) is trained in ``step`` as ``micro_steps`` micro-steps."""

    step: int
    group_id: int
    version: int
    micro_steps: int


@dataclass(frozen=True, slots=True)
class ClaimMicroStep(Action):
    """Training cell ``cell`` runs forward/backward on micro-step ``index`` of ``group_id``."""

    cell: int
    step: int
    group_id: int
    index: int


@dataclass(frozen=True, slots=True)
class FinishStep(Action):
    """The core reduces gradients of every participant, clips, and steps once."""

    step: int
    cell: int  # always the core


@dataclass(frozen=True, slots=True)
class PublishWeights(Action):
    """The core pushes policy ``version`` to every rollout engine (burst boundary)."""

    version: int
    cell: int  # always the core


@dataclass(frozen=True, slots=True)
class WakeAt(Action):
    """Send a ``Tick`` at ``time`` (the supply check's hold ends then)."""

    time: float


@dataclass(frozen=True, slots=True)
class EndRun(Action):
    """``steps`` optimizer steps are done; the run is complete."""

    steps: int
