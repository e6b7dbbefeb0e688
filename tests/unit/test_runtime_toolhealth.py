"""Tool-call health reaches a step's metrics.jsonl row, TensorBoard and the trackers' view,
from the traces the proxy wrote, scored and missing executions alike."""

from __future__ import annotations

import json
from types import SimpleNamespace

from gyre.config import GyreConfig
from gyre.harness.execution import ExecutionResult, HarnessRun, Timings
from gyre.harness.model_calls import ModelCalls
from gyre.harness.profiles import load_profile
from gyre.harness.reference_agent import MAIN_SUMMARY_SYSTEM, MAIN_SYSTEM, SUB_SYSTEM
from gyre.runtime.executions import ExecutionRunner
from gyre.runtime.records import Records, StepRecord
from gyre.runtime.rundir import RunDir
from gyre.runtime.tasks import TaskStream
from gyre.runtime.tracking import numeric
from gyre.trace.assessment import Missing, MissingReason, Scored
from gyre.trace.record import OutputSegment, TraceRecord
from gyre.trace.store import TraceWriter


async def _revoke(execution_id: str) -> None:
    """The proxy's revoke, as ManagedProxy.revoke answers it."""


class FakeExecutor:
    """Answers each execution from a table: what the real executor would have decided."""

    def __init__(self, outcomes, stops=None):
        self.outcomes, self.stops = outcomes, stops or {}

    async def run(self, spec):
        return ExecutionResult(
            execution_id=spec.execution_id,
            task=spec.task.name,
            profile=spec.profile.name,
            assessment=self.outcomes[spec.execution_id],
            harness=HarnessRun(
                stop=self.stops.get(spec.execution_id, "exited"),
                exit_code=0,
                model_calls=ModelCalls(1, 1, "", ""),
            ),
            workspace="",
            execution_dir="",
            timings=Timings(),
        )


def rec(eid: str, seq: int, system: str, calls: int, unparsed: int = 0, finish: str = "stop"):
    return TraceRecord(
        execution_id=eid,
        request_id=f"{eid}-{seq}",
        seq=seq,
        api="openai.chat",
        base=None,
        base_len=0,
        input_suffix=(5, 6, seq + 7),
        output_ids=(8, 9),
        output_logprobs=(-0.5, -0.25),
        segments=(OutputSegment(0, 2, "e0", 0),),
        finish_reason=finish,
        meta={
            "system_head": system,
            "n_tool_calls": calls,
            "n_tool_calls_unparsed": unparsed,
        },
    )


async def test_tool_health_reaches_metrics_tensorboard_and_trackers(tmp_path):
    cfg = GyreConfig.model_validate({"model_dir": str(tmp_path), "policy": {"group_size": 3}})
    rundir = RunDir(tmp_path / "run").create()
    proxy = SimpleNamespace(url="http://127.0.0.1:9", revoke=_revoke)  # a ManagedProxy's
    ex = ExecutionRunner(cfg, rundir, TaskStream("quickstart", ["digits"], [], seed=0), proxy)
    ex.profile = load_profile("reference")
    a0, a1, a2 = (f"r0-g00000-a0{i}" for i in range(3))
    ex.executor = FakeExecutor(
        {
            a0: Scored(reward=1.0, rule="binary"),
            a1: Scored(reward=0.0, rule="binary"),
            # one answer, a broken call, then the harness gave up: missing, still counted
            a2: Missing(reason=MissingReason.evaluator_error, detail="no reward"),
        },
        # a1 was cut at the harness timeout and scored on its workspace; a2 cut, not scored
        {a1: "harness_timeout", a2: "harness_timeout"},
    )
    w = TraceWriter(rundir.traces, fsync=False)
    for r in [
        rec(a0, 0, MAIN_SYSTEM, 1),  # delegate
        rec(a0, 1, SUB_SYSTEM, 1),
        rec(a0, 2, SUB_SYSTEM, 1, finish="length"),
        rec(a0, 3, MAIN_SUMMARY_SYSTEM, 0),
        rec(a0, 4, MAIN_SYSTEM, 1),
        rec(a1, 0, MAIN_SYSTEM, 0),  # answered in prose: no tool call at all
        rec(a2, 0, MAIN_SYSTEM, 0, unparsed=1),
    ]:
        w.append(r)
    w.close()
    for att in range(3):
        await ex.run(0, att)
    _, _, info, _ = ex.pack_group(0, step=0, start_index=0)

    records = Records(cells=1)
    records.steps.append((0.0, 1.0))
    step = StepRecord(step=0, version=0, start=0.0, groups=[(0, 0)], pack=info)
    rundir.write_step(records, step, {}, {})
    rundir.close()
    (row,) = [json.loads(x) for x in (rundir.path / "metrics.jsonl").read_text().splitlines()]
    want = {
        "calls": 4,
        "unparsed": 1,
        "truncated": 1,
        "no_call_executions": 2,
        "turns_per_execution": 7 / 3,
        "compactions": 1,
        "subagent_calls": 2,
    }
    for k, v in want.items():
        assert row[f"tools/{k}"] == v, k
        assert row[f"tools/by_profile/reference/{k}"] == v, k
    assert not any(k.startswith("toolhealth/") for k in row)  # the sums stay internal
    # agent figures: turns 5, 1, 1 per execution; 4 calls over 3 executions
    assert row["agent/tool_calls_per_exec_mean"] == 4 / 3
    assert row["agent/turns_hist"] == {"1": 2, "5": 1}
    assert (row["agent/turns_p10"], row["agent/turns_p50"], row["agent/turns_p90"]) == (1, 1, 5)
    assert row["agent/turns_max"] == 5
    assert (row["agent/harness_timeout"], row["agent/harness_timeout_scored"]) == (2, 1)
    # trees of the two scored executions: a0's 5 calls share the prompt (5, 6), a1 has one;
    # every path is admitted (j_max unset), each 3 prompt + 2 output tokens
    assert (row["tree/paths"], row["tree/paths_admitted"]) == (6, 6)
    assert (row["tree/tokens_unique"], row["tree/tokens_flat"]) == (2 + 5 * 3 + 5, 6 * 5)
    assert row["tree/flat_over_tree"] == 30 / 22
    assert not any(k.startswith("agentstats/") for k in row)
    # the trackers take the row's numbers under the same names; TensorBoard the same scalars
    assert numeric(row)["tools/by_profile/reference/subagent_calls"] == 2.0
    assert numeric(row)["agent/turns_hist/5"] == 1.0
    events = b"".join(p.read_bytes() for p in (rundir.path / "tb").glob("events.out.tfevents.*"))
    assert b"tools/no_call_executions" in events
    assert b"tools/by_profile/reference/turns_per_execution" in events
