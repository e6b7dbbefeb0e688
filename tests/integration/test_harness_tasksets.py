"""Every shipped task is solvable and not solved already: its reference solution scores 1
through the executor and its untouched starting repository scores below 1 (0 for binary)."""

from __future__ import annotations

import pytest

from gyre.harness.config import ExecutorConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.profiles import HarnessProfile, load_profile
from gyre.harness.task import load_taskset


@pytest.mark.slow
async def test_shipped_tasks_oracle_scores_one_untouched_below_one(tmp_path):
    tasks = load_taskset("pyfix") + load_taskset("quickstart")
    oracle, noop = load_profile("oracle"), HarnessProfile(name="untouched", command=["true"])
    specs = [
        ExecutionSpec(
            execution_id=f"{t.root.parent.name}-{t.name}-{p.name}",
            task=t,
            profile=p,
            base_url="http://127.0.0.1:9",
            api_key="k",
        )
        for t in tasks
        for p in (oracle, noop)
    ]
    cfg = ExecutorConfig(workspace_root=tmp_path / "runs", keep_workspaces=False)
    cfg.scorer.max_concurrency = 2
    async with HarnessExecutor(cfg) as ex:
        results = await ex.run_many(specs)
    bad = []
    for r in results:
        want_one = r.profile == "oracle"
        rule = next(t.reward_rule for t in tasks if t.name == r.task)
        ok = (
            r.reward == 1.0
            if want_one
            else (r.reward is not None and r.reward < 1.0 and (rule != "binary" or r.reward == 0.0))
        )
        if not ok:
            bad.append(f"{r.execution_id}: {r.assessment}")
    assert not bad, "\n".join(bad)
