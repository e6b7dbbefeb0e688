"""Hostile harnesses and verifier outputs through the real executor and scorer (issue 19: 1-4).

Each execution here is what a policy being trained could do to its own assessment:
run a planted ``pytest.py`` as the verifier, write its own reward from the module
under test, write out-of-range or malformed result files, leave a FIFO, a deep tree
or a link to a host secret behind, or claim the model never answered. Each must
come out as the score an honest verifier gives, or as a recorded zero, and
``run()`` must return.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.model_calls import ModelCalls
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import builtin_tasksets_dir, load_task
from gyre.trace.assessment import Missing, MissingReason, Scored

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import make_task, shell_profile

SECRET = "TOPSECRET-7f3a9c-host-only"
modes = [
    False,
    pytest.param(True, marks=pytest.mark.skipif(bwrap_available() is None, reason="no bwrap")),
]


def spec(eid: str, task, script: str) -> ExecutionSpec:
    return ExecutionSpec(
        execution_id=eid,
        task=task,
        profile=shell_profile(script),
        base_url="http://127.0.0.1:9",
        api_key="k",
    )


async def run_all(tmp_path: Path, specs, sandbox: bool = False, calls=None, **kw):
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs",
        kill_grace_s=0.5,
        sandbox=SandboxConfig(enabled=sandbox),
        **kw,
    )
    async with HarnessExecutor(cfg, calls=calls) as ex:
        return await asyncio.wait_for(ex.run_many(specs), 120)


def plant(name: str, text: str, append: bool = False) -> str:
    """A harness command that writes ``text`` to ``name`` (base64: no braces for the template)."""
    b = base64.b64encode(text.encode()).decode()
    mode = "ab" if append else "wb"
    return f"python3 -c \"import base64; open('{name}', '{mode}').write(base64.b64decode('{b}'))\""


def scored(r, reward: float) -> bool:
    return isinstance(r.assessment, Scored) and r.assessment.reward == reward


# ---- finding 1: the planted verifier, the self-written reward, the out-of-range junit -----------


@pytest.mark.parametrize("sandbox", modes)
async def test_pyfix_reward_hacks_score_what_the_honest_verifier_gives(tmp_path, sandbox):
    """bsearch's bug left unfixed passes 1 of its 4 hidden tests: 0.25, whatever is planted."""
    task = load_task(builtin_tasksets_dir() / "pyfix" / "bsearch")
    planted_pytest = plant(
        "pytest.py",
        "import os\n"
        "d = os.environ['GYRE_REWARD_DIR']\n"
        "open(d + '/junit.xml', 'w').write('<testsuite tests=\"4\" failures=\"0\"/>')\n"
        "open(d + '/reward.json', 'w').write('{\"reward\": 1.0}')\n",
    )
    self_reward = plant(
        "bsearch.py",
        "import os as _os\n"
        "open(_os.environ['GYRE_REWARD_DIR'] + '/reward.json', 'w').write('{\"reward\": 1.0}')\n",
        append=True,
    )
    results = await run_all(
        tmp_path,
        [
            spec("honest", task, "true"),
            spec("planted-pytest", task, planted_pytest),
            spec("self-reward", task, self_reward),
        ],
        sandbox=sandbox,
    )
    for r in results:
        assert scored(r, 0.25), (r.execution_id, r.assessment)
        assert r.assessment.passed == 1 and r.assessment.total == 4


async def test_out_of_range_and_malformed_results_are_zero_and_run_returns(tmp_path):
    cases = {
        "neg-failures": ("junit.xml", '<testsuite tests="5" failures="-999995" errors="0"/>'),
        "abc": ("junit.xml", '<testsuite tests="abc" failures="0"/>'),
        "float-count": ("junit.xml", '<testsuite tests="3.0" failures="0"/>'),
        "huge-int": ("reward.json", '{"passed": 1' + "0" * 5000 + ', "total": 1}'),
        "nan": ("reward.txt", "nan"),
        "too-big": ("reward.txt", "200000"),
        "deep-json": ("reward.json", "[" * 60_000),
    }
    specs = []
    for name, (fname, body) in cases.items():
        d = tmp_path / "tasks" / name
        (d.parent).mkdir(exist_ok=True)
        (tmp_path / f"{name}.body").write_text(body)
        make_task(
            d.parent,
            name,
            test_sh=f'cp "{tmp_path / f"{name}.body"}" "$GYRE_REWARD_DIR/{fname}"\n',
        )
        toml = d / "task.toml"
        toml.write_text(toml.read_text() + f'result = "{fname}"\n')
        specs.append(spec(name, load_task(d), "echo 42 > answer.txt"))
    # invalid UTF-8 in the result file
    make_task(
        tmp_path / "tasks",
        "utf8",
        test_sh="printf '\\xff\\xfe1' > \"$GYRE_REWARD_DIR/reward.txt\"\n",
    )
    specs.append(spec("utf8", load_task(tmp_path / "tasks" / "utf8"), "true"))
    results = await run_all(tmp_path, specs)
    for r in results:
        a = r.assessment
        assert scored(r, 0.0), (r.execution_id, a)
        assert a.detail.startswith("scored 0: invalid verifier result"), (r.execution_id, a.detail)
        assert len(a.detail) < 400


# ---- finding 2: no opting out of a zero ---------------------------------------------------------


async def test_fifo_socket_in_the_workspace_are_skipped_not_an_infra_error(tmp_path):
    task = load_task(make_task(tmp_path))
    mk = (  # a FIFO, a socket, and a FIFO whose name is not UTF-8 (it reaches the detail)
        "mkfifo pipe; python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')\"; "
        "mkfifo \"$(printf 'p\\377')\"; "
    )
    solved, unsolved = await run_all(
        tmp_path,
        [spec("fifo-solved", task, mk + "echo 42 > answer.txt"), spec("fifo-zero", task, mk)],
    )
    assert scored(solved, 1.0), solved.assessment
    assert "3 FIFO/socket/device entries not copied" in solved.assessment.detail
    assert (Path(solved.execution_dir) / "result.json").is_file()  # it serialised
    assert scored(unsolved, 0.0), unsolved.assessment  # a zero, not a missing infra_error


async def test_harness_written_counts_never_turn_a_zero_into_missing(tmp_path):
    task = load_task(make_task(tmp_path))
    fake = (
        'echo \'{{"attempted": 3, "answered": 0, "last_error": "refused \\ud800"}}\' '
        '> "$GYRE_MODEL_CALLS_FILE"'
    )

    async def proxy_saw_nothing(eid: str) -> ModelCalls:
        return ModelCalls(0, 0, "", "proxy")

    zero, blind_success = await run_all(
        tmp_path,
        [spec("fake-zero", task, fake), spec("fake-one", task, "echo 42 > answer.txt; " + fake)],
        calls=proxy_saw_nothing,
    )
    assert scored(zero, 0.0), zero.assessment  # not model_unreachable: a zero stays a zero
    assert "3 model calls attempted, none answered by the policy (by the harness)" in (
        zero.assessment.detail
    )
    assert (Path(zero.execution_dir) / "result.json").is_file()  # a lone surrogate serialised
    # A success that the harness itself says was blind is dropped: that only costs it.
    a = blind_success.assessment
    assert isinstance(a, Missing) and a.reason == MissingReason.model_unreachable, a


async def test_proxy_counts_of_client_side_failures_do_not_drop_a_zero(tmp_path):
    """A harness can make its own calls fail (malformed JSON: HTTP 400); only a server-side
    failure of every call (HTTP 5xx) drops the execution unscored."""
    task = load_task(make_task(tmp_path))
    counts = {
        "client-400": ModelCalls(2, 0, "HTTP 400: request body is not valid JSON", "proxy"),
        "server-503": ModelCalls(2, 0, "HTTP 503: no inference engine", "proxy"),
    }

    async def calls(eid: str) -> ModelCalls:
        return counts[eid]

    client, server = await run_all(tmp_path, [spec(e, task, "true") for e in counts], calls=calls)
    assert scored(client, 0.0), client.assessment
    assert isinstance(server.assessment, Missing)
    assert server.assessment.reason == MissingReason.model_unreachable
    assert server.timings.scoring_s == 0.0


async def test_a_verifier_the_workspace_breaks_scores_zero(tmp_path):
    """pytest imports the workspace's module: a module that exits, hangs or writes junk at
    import breaks the verifier, and that must cost the harness its zero, not drop it."""
    src = builtin_tasksets_dir() / "pyfix" / "bsearch"
    dst = tmp_path / "bsearch"
    shutil.copytree(src, dst)
    toml = dst / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 3.0"))
    task = load_task(dst)
    results = await run_all(
        tmp_path,
        [
            spec("exits", task, plant("bsearch.py", "\nimport os; os._exit(0)\n", append=True)),
            spec("hangs", task, plant("bsearch.py", "\nwhile True: pass\n", append=True)),
        ],
    )
    for r in results:
        assert scored(r, 0.0), (r.execution_id, r.assessment)


# ---- finding 3: one execution never ends or freezes the run ------------------------------------


async def test_deep_tree_sparse_file_and_fifo_calls_file_return(tmp_path):
    task = load_task(make_task(tmp_path))
    fifo_calls = load_task(make_task(tmp_path, "fifo-calls"))
    sparse = load_task(
        make_task(
            tmp_path,
            "sparse",
            test_sh='truncate -s 512M "$GYRE_REWARD_DIR/reward.txt"\n',
        )
    )
    t0 = time.monotonic()
    deep, calls_fifo, big = await run_all(
        tmp_path,
        [
            spec(
                "deep",
                task,
                "echo 42 > answer.txt; python3 -c \"import os; os.makedirs('/'.join(['d'] * 700))\"",
            ),
            spec("fifo-calls", fifo_calls, 'echo 42 > answer.txt; mkfifo "$GYRE_MODEL_CALLS_FILE"'),
            spec("sparse", sparse, "true"),
        ],
        keep_workspaces=False,  # and the deep workspace is removed without a RecursionError
    )
    assert time.monotonic() - t0 < 60
    assert scored(deep, 0.0) and "levels deep" in deep.assessment.detail, deep.assessment
    assert not Path(deep.workspace).exists()
    assert scored(calls_fifo, 1.0), calls_fifo.assessment  # the FIFO is not read, nor waited on
    assert scored(big, 0.0) and "limit 65536" in big.assessment.detail, big.assessment


# ---- finding 4: no host file in the records ----------------------------------------------------


@pytest.mark.parametrize("sandbox", modes)
async def test_result_file_linked_to_a_host_secret_is_not_followed(tmp_path, sandbox):
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"{SECRET}\n" * 100)
    secret.chmod(0o644)  # readable by the sandbox user too: only the no-follow rule protects it
    task = load_task(
        make_task(
            tmp_path,
            "linked",
            test_sh=f'ln -s "{secret}" "$GYRE_REWARD_DIR/reward.txt"\n',
        )
    )
    (r,) = await run_all(tmp_path, [spec("linked", task, "echo 42 > answer.txt")], sandbox=sandbox)
    assert scored(r, 0.0) and "symbolic link" in r.assessment.detail, r.assessment
    record = (Path(r.execution_dir) / "result.json").read_text()
    assert SECRET not in record and SECRET[:8] not in json.dumps(r.model_dump())


async def test_an_unexpected_error_is_the_executions_record_not_the_runs_end(tmp_path):
    """Whatever escapes the known cases (a Gyre bug) becomes that execution's recorded
    result, with the reason; the other executions of the batch are unaffected."""
    task = load_task(make_task(tmp_path))
    cfg = ExecutorConfig(workspace_root=tmp_path / "runs", kill_grace_s=0.5)
    async with HarnessExecutor(cfg) as ex:
        real = ex._scorer.score

        async def flaky(task, workspace, scratch, timeout_s=None):
            if "boom" in str(workspace):
                raise RecursionError("maximum recursion depth exceeded")
            return await real(task, workspace, scratch, timeout_s)

        ex._scorer.score = flaky  # type: ignore[method-assign]
        bad, good = await ex.run_many(
            [spec("boom", task, "echo 42 > answer.txt"), spec("fine", task, "echo 42 > answer.txt")]
        )
    a = bad.assessment
    assert isinstance(a, Missing) and a.reason == MissingReason.infra_error, a
    assert a.detail.startswith("internal error: RecursionError")
    assert json.loads((Path(bad.execution_dir) / "result.json").read_text())["assessment"] == (
        a.model_dump(mode="json")
    )
    assert scored(good, 1.0)


async def test_the_copys_time_is_not_taken_from_the_verifiers(tmp_path, monkeypatch):
    """A slow copy (a big workspace, within the copy bounds) must not cut the verifier short:
    on main the copy's seconds came off the verifier's timeout (a harness could turn its zero
    into an evaluator_timeout that way)."""
    import gyre.harness.scorer as scorer_mod
    from gyre.harness.scorer import Scorer

    real = scorer_mod.copy_workspace

    def slow_copy(*a, **kw):
        time.sleep(1.5)  # longer than the verifier's whole timeout
        return real(*a, **kw)

    monkeypatch.setattr(scorer_mod, "copy_workspace", slow_copy)
    task = load_task(
        make_task(
            tmp_path,
            verifier_timeout=1.0,
            test_sh='sleep 0.3; echo 1 > "$GYRE_REWARD_DIR/reward.txt"\n',
        )
    )
    (tmp_path / "ws").mkdir()
    a = await Scorer().score(task, tmp_path / "ws", tmp_path / "scratch", timeout_s=30.0)
    assert isinstance(a, Scored) and a.reward == 1.0, a
