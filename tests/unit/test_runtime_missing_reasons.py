"""The runtime records an execution the policy never answered as missing, with its reason."""

from __future__ import annotations

import json
from types import SimpleNamespace

from gyre.config import GyreConfig
from gyre.harness.execution import ExecutionResult, HarnessRun, Timings
from gyre.harness.model_calls import ModelCalls
from gyre.harness.profiles import load_profile
from gyre.runtime.executions import ExecutionRunner
from gyre.runtime.rundir import RunDir
from gyre.runtime.tasks import TaskStream
from gyre.trace.assessment import Missing, MissingReason, Scored


async def _revoke(execution_id: str) -> None:
    """The proxy's revoke, as ManagedProxy.revoke answers it."""


class FakeExecutor:
    """Answers each execution from a table: what the real executor would have decided."""

    def __init__(self, outcomes):
        self.outcomes = outcomes

    async def run(self, spec):
        assessment, calls = self.outcomes[spec.execution_id]
        return ExecutionResult(
            execution_id=spec.execution_id,
            task=spec.task.name,
            profile=spec.profile.name,
            assessment=assessment,
            harness=HarnessRun(stop="exited", exit_code=2, model_calls=calls),
            workspace="",
            execution_dir="",
            timings=Timings(),
        )


async def test_unreachable_execution_is_missing_with_its_reason_in_executions_jsonl(tmp_path):
    cfg = GyreConfig.model_validate({"model_dir": str(tmp_path)})
    rundir = RunDir(tmp_path / "run").create()
    tasks = TaskStream("quickstart", ["digits"], [], seed=0)
    proxy = SimpleNamespace(url="http://127.0.0.1:9", revoke=_revoke)  # a ManagedProxy's
    ex = ExecutionRunner(cfg, rundir, tasks, proxy)
    ex.profile = load_profile("reference")
    dead = Missing(
        reason=MissingReason.model_unreachable,
        detail="1 model call attempted, none answered by the policy (at the proxy): HTTP 503",
    )
    ex.executor = FakeExecutor(
        {
            "r0-g00000-a00": (dead, ModelCalls(1, 0, "HTTP 503", "proxy")),
            "r0-g00000-a01": (Scored(reward=0.0, rule="binary"), ModelCalls(3, 3, "", "proxy")),
        }
    )
    assert await ex.run(0, 0) is None  # the policy's event: invalid, never a zero
    assert await ex.run(0, 1) == 0.0  # a real zero: the policy answered
    assert ex.results[(0, 0)] == ("r0-g00000-a00", dead)  # the trainer drops it, reason kept
    assert ex.missing == 1 and ex.missing_reasons == {"model_unreachable": 1}
    rows = [json.loads(x) for x in (rundir.path / "executions.jsonl").read_text().splitlines()]
    assert rows[0]["reward"] is None and rows[0]["missing"] == "model_unreachable"
    assert "none answered by the policy" in rows[0]["missing_detail"]
    assert rows[0]["model_calls"] == {"attempted": 1, "answered": 0}
    assert rows[1]["reward"] == 0.0 and rows[1]["missing"] is None
    assert rows[1]["model_calls"] == {"attempted": 3, "answered": 3}


async def test_missing_by_reason_reaches_the_step_metrics(tmp_path):
    """Per step (so per policy version), each missing reason gets its own count (issue 19)."""
    cfg = GyreConfig.model_validate({"model_dir": str(tmp_path), "policy": {"group_size": 2}})
    rundir = RunDir(tmp_path / "run").create()
    tasks = TaskStream("quickstart", ["digits"], [], seed=0)
    proxy = SimpleNamespace(url="http://127.0.0.1:9", revoke=_revoke)  # a ManagedProxy's
    ex = ExecutionRunner(cfg, rundir, tasks, proxy)
    ex.profile = load_profile("reference")
    dead = Missing(reason=MissingReason.model_unreachable, detail="HTTP 503")
    ex.executor = FakeExecutor(
        {
            "r0-g00000-a00": (dead, ModelCalls(1, 0, "HTTP 503", "proxy")),
            "r0-g00000-a01": (Scored(reward=0.0, rule="binary"), ModelCalls(3, 3, "", "proxy")),
        }
    )
    await ex.run(0, 0)
    await ex.run(0, 1)
    _, _, info, _ = ex.pack_group(0, step=0, start_index=0)
    assert info["missing"] == 1 and info["missing/model_unreachable"] == 1
