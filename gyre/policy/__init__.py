"""Pure scheduling policy: placements, counters, waterlevel, staleness.

Events in (:mod:`gyre.policy.events`), actions out (:mod:`gyre.policy.actions`);
no clock, threads or I/O. Driven by ``gyre.sim`` (virtual time) and, later, by
the Ray runtime.
"""

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
from gyre.policy.cell_roles import CellRole
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
    StepDone,
    Tick,
    WeightsPublished,
)
from gyre.policy.scheduling import CORE, PolicyError, SchedulingPolicy
from gyre.policy.staleness import expected_staleness, staleness_pairs


def make_policy(config: PolicyConfig) -> SchedulingPolicy:
    """The policy object for ``config.placement`` (one class; placement picks the rules)."""
    return SchedulingPolicy(config)


__all__ = [
    "Action",
    "AssignGroup",
    "CORE",
    "CellBack",
    "CellLost",
    "EngineBack",
    "EngineLost",
    "CellSwitched",
    "ClaimMicroStep",
    "DispatchGroups",
    "EndRun",
    "Event",
    "ExecutionFinished",
    "ExecutionId",
    "ExecutionsLaunched",
    "FinishStep",
    "LaunchExecutions",
    "MicroStepDone",
    "Placement",
    "PolicyConfig",
    "PolicyError",
    "PublishWeights",
    "CellRole",
    "SchedulingPolicy",
    "StartStep",
    "StepDone",
    "SwitchCell",
    "EvaluationRunning",
    "Tick",
    "WakeAt",
    "WeightsPublished",
    "expected_staleness",
    "make_policy",
    "staleness_pairs",
]
