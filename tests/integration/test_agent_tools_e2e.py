"""Both harnesses on a ``calc`` task through the fenced-bash protocol, end to end.

Real harness processes -> real proxy (``parser = "bash"``, the shared tool-call template of
``gyre.harness.families.toolproto`` on the tiny model's real tokenizer) -> scripted engine
(a test double: it replays the text a model would write) -> the family's verifier. The
reference agent gets the block back as a ``run_command`` tool call, runs it, and answers
from its output; mini-swe-agent (no tools offered, so the proxy leaves its text alone)
parses the block itself through our config and submits. Both must score 1, and a reply that
computes nothing must score 0 through the same path.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from helpers.servers import scripted_proxy_stack

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.families import problems, toolproto
from gyre.harness.families.write import write_taskset
from gyre.harness.profiles import find_mini, load_profile
from gyre.harness.task import load_task
from gyre.trace.store import read_trace, trace_path

ROOT = Path(__file__).resolve().parents[2]
P_REF, P_MINI, P_NOOP = problems("calc", 0, "held-out", 3)
UNUSED = {"text": "(the worked exchange's turns: never generated)"}


def _block(cmd: str) -> dict:
    return {"text": f"```bash\n{cmd}\n```"}


BOOK = {
    "scripts": [
        {  # the reference agent offers tools: the template's worked exchange holds 2 turns
            "name": "ref",
            "match": P_REF.data["expression"],
            "turns": [
                UNUSED,
                UNUSED,
                _block(f"echo $(({P_REF.data['expression']}))"),
                {"text": f"Answer: {P_REF.answer}"},
            ],
        },
        {
            "name": "ref-noop",
            "match": P_NOOP.data["expression"],
            "turns": [UNUSED, UNUSED, {"text": "I think it is 12."}],
        },
        {
            "name": "mini",
            "match": P_MINI.data["expression"],
            "turns": [
                _block(f"echo $(({P_MINI.data['expression']}))"),
                _block(
                    f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo 'Answer: {P_MINI.answer}'"
                ),
            ],
        },
        {"name": "fallback", "turns": [{"text": "OK."}], "exhausted": {"text": "OK."}},
    ]
}


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    model = toolproto.install_template(tiny_model_dir, tmp_path_factory.mktemp("tools-model"))
    with scripted_proxy_stack(
        str(model), BOOK, tmp_path_factory.mktemp("traces"), parser="bash"
    ) as s:
        yield s


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("calc")
    write_taskset([P_REF, P_MINI, P_NOOP], root)
    return {p.name: load_task(root / f"{p.split}-{p.name}") for p in (P_REF, P_MINI, P_NOOP)}


async def _run(tmp_path, register, specs):
    cfg = ExecutorConfig(sandbox=SandboxConfig(enabled=False), workspace_root=tmp_path / "runs")
    async with HarnessExecutor(cfg, register=register) as ex:
        return await ex.run_many(specs)


def _diag(r) -> str:
    return (
        f"{r.execution_id}: {r.assessment} stop={r.harness.stop} exit={r.harness.exit_code}\n"
        + Path(r.harness.stdout_path).read_text()[-1500:]
        + Path(r.harness.stderr_path).read_text()[-1500:]
    )


async def test_reference_agent_runs_the_block_and_answers(stack, tasks, tmp_path):
    url, register, traces = stack
    args = tomllib.loads((ROOT / "examples" / "smollm2-agent.toml").read_text())["run"][
        "harness_args"
    ]
    prof = load_profile("reference").model_copy(update={"args": args})  # the example's
    ok, noop = await _run(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="ref-calc", task=tasks[P_REF.name], profile=prof, base_url=url
            ),
            ExecutionSpec(
                execution_id="ref-noop", task=tasks[P_NOOP.name], profile=prof, base_url=url
            ),
        ],
    )
    assert ok.reward == 1.0, _diag(ok)
    assert noop.reward == 0.0, _diag(noop)
    out = json.loads(Path(ok.harness.stdout_path).read_text().strip().splitlines()[-1])
    assert out["requests"] == 2 and out["tool_calls"] == 1
    res = read_trace(trace_path(traces, "ref-calc"))
    assert res.errors == [] and len(res.records) == 2
    # the second call continues the first token for token: the first call's whole sequence
    # (its input and its verbatim output) is the second's prefix, never a fresh render
    first, second = res.records
    assert second.base == first.request_id and not second.forked
    assert second.base_len == len(first.input_suffix) + len(first.output_ids)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.skipif(
    find_mini() is None, reason="mini-swe-agent is not installed (scripts/install-harnesses.sh)"
)
async def test_mini_swe_agent_with_our_config(stack, tasks, tmp_path):
    url, register, _ = stack
    prof = load_profile(ROOT / "gyre" / "harness" / "mini_tools.toml")
    # this checkout's launcher, also where the venv's editable install points elsewhere
    prof = prof.model_copy(update={"env": {**prof.env, "PYTHONPATH": str(ROOT)}})
    (r,) = await _run(
        tmp_path,
        register,
        [
            ExecutionSpec(
                execution_id="mini-calc",
                task=tasks[P_MINI.name],
                profile=prof,
                base_url=url,
                harness_timeout_s=240,
            )
        ],
    )
    assert r.reward == 1.0, _diag(r)
    assert r.harness.stop == "exited"
