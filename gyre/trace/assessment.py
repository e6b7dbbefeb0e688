"""What scoring an execution yields: a reward, or a *missing* assessment.

One vocabulary for the harness (which produces assessments) and the trainer
(which turns them into advantages): both import these types from here, the
lowest package both may import, so a missing assessment crosses from one to
the other as ``Missing`` with its reason, never as ``None``.

Two distinct types on purpose. A harness that timed out still gets a real
reward (its workspace is scored by the task's rule); an assessment that never
happened (the verifier crashed or hung, the overall budget ran out, the harness
could not even be launched) is ``Missing`` and has no ``reward`` attribute at
all, so no code path can average it in as a zero by accident. Consumers drop
executions whose assessment is missing (the paper discards them).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field


class MissingReason(str, Enum):
    evaluator_error = "evaluator_error"  # verifier crashed or wrote no readable reward
    evaluator_timeout = "evaluator_timeout"  # verifier ran past its own timeout
    overall_timeout = "overall_timeout"  # the execution's overall budget ran out
    launch_failed = "launch_failed"  # the harness never started (bad command, bad template)
    infra_error = "infra_error"  # the executor itself failed (disk full, copy failed, ...)
    cancelled = "cancelled"  # the caller cancelled the execution
    model_unreachable = "model_unreachable"  # model calls made, none answered by the policy
    trace_unreadable = "trace_unreadable"  # scored, but no usable trace to train on


class Scored(BaseModel):
    kind: Literal["scored"] = "scored"
    reward: float
    rule: Literal["binary", "fraction"]
    passed: int | None = None
    total: int | None = None
    detail: str = ""


class Missing(BaseModel):
    kind: Literal["missing"] = "missing"
    reason: MissingReason
    detail: str = ""


Assessment = Annotated[Scored | Missing, Field(discriminator="kind")]


def is_scored(a: Scored | Missing) -> bool:
    return isinstance(a, Scored)


def reward_of(a: Scored | Missing) -> float | Missing:
    """What the trainer takes for one execution: the score, or the ``Missing`` itself."""
    return a.reward if isinstance(a, Scored) else a


def mean_reward(assessments: Iterable[Scored | Missing]) -> float | None:
    """Mean over *scored* executions only; ``None`` when none was scored.

    Missing assessments are excluded, never counted as zero.
    """
    rewards = [a.reward for a in assessments if isinstance(a, Scored)]
    return sum(rewards) / len(rewards) if rewards else None


def summarize(assessments: Iterable[Scored | Missing]) -> dict[str, float | int | None]:
    """Counts and the scored mean: what a user wants to see after a batch."""
    items = list(assessments)
    scored = [a for a in items if isinstance(a, Scored)]
    return {
        "executions": len(items),
        "scored": len(scored),
        "missing": len(items) - len(scored),
        "mean_reward": mean_reward(scored),
    }
