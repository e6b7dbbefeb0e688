"""One execution as the executor takes and leaves it: its spec, and its ``result.json``.

:class:`ExecutionSpec` is what a caller hands :class:`gyre.harness.executor.HarnessExecutor`;
:class:`ExecutionResult` (the assessment, how the harness stopped, the timings) is what
``run`` returns and writes into the execution's folder. The runtime and the reports read
results without starting an executor, so these models live apart from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gyre.trace.assessment import Assessment, Scored

from .model_calls import ModelCalls
from .profiles import HarnessProfile
from .task import Task

HarnessStop = Literal[
    "exited",
    "harness_timeout",
    "overall_timeout",
    "log_limit",
    "disk_limit",
    "launch_failed",
    "not_run",
]


class ExecutionError(RuntimeError):
    """A caller error (executor not started, duplicate execution id)."""


class ExecutionSpec(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    execution_id: str
    task: Task
    profile: HarnessProfile
    base_url: str
    api_key: str | None = None  # None: obtained from the executor's ``register`` hook
    model: str | None = None  # overrides the profile's model name
    overall_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # overrides the task's
    harness_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # overrides the task's
    deadline: float | None = Field(None, allow_inf_nan=False)  # absolute time.monotonic() deadline
    extra_env: dict[str, str] = Field(default_factory=dict)
    label: str | None = None


class HarnessRun(BaseModel):
    argv: list[str] = Field(default_factory=list)
    stop: HarnessStop = "not_run"
    exit_code: int | None = None
    error: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    log_truncated: bool = False
    model_calls: ModelCalls | None = None  # None: nobody counted (no proxy hook, no harness file)


class Timings(BaseModel):
    queued_s: float = 0.0  # waiting for a slot
    setup_s: float = 0.0  # workspace copy, key, command line
    launched_s: float = (
        0.0  # from submission until the harness process existed (queue + setup + spawn)
    )
    harness_s: float = 0.0
    teardown_s: float = 0.0  # process-group kill and log flush after the harness stopped
    scoring_s: float = 0.0
    total_s: float = 0.0
    # Around the model calls, from the harness's own report (GYRE_MODEL_CALLS_FILE: the
    # reference agent writes its first call's and last answer's time); None when it wrote
    # none. first_call_s: launch (after the queue) -> the first call was sent: workspace,
    # sandbox, the harness's start-up. after_last_call_s: the last answer -> this result:
    # the harness's exit, teardown, scoring. bench/bench_executor.py --phases splits both.
    first_call_s: float | None = None
    after_last_call_s: float | None = None


class ExecutionResult(BaseModel):
    execution_id: str
    task: str
    profile: str
    assessment: Assessment
    harness: HarnessRun
    workspace: str
    execution_dir: str
    timings: Timings

    @property
    def reward(self) -> float | None:
        """The reward, or None when the assessment is missing (never 0 for missing)."""
        return self.assessment.reward if isinstance(self.assessment, Scored) else None


def load_result(path: str | Path) -> ExecutionResult:
    """Read a ``result.json`` written by the executor."""
    return ExecutionResult.model_validate(json.loads(Path(path).read_text()))
