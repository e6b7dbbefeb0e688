"""Generated task families: disjoint splits, exact verifiers, the stated reward rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.harness.families import problems, score
from gyre.harness.families.countdown import check
from gyre.harness.families.write import write_taskset
from gyre.harness.task import load_taskset


@pytest.mark.parametrize("family", ["arith", "countdown"])
def test_splits_are_disjoint_and_seeded(family: str) -> None:
    a = problems(family, 0, "train", 200)
    b = problems(family, 1, "train", 200)
    h = problems(family, 0, "held-out", 50)
    h1 = problems(family, 1, "held-out", 50)
    assert len({p.name for p in a}) == 200
    assert {p.name for p in a}.isdisjoint({p.name for p in h} | {p.name for p in h1})
    assert {p.name for p in b}.isdisjoint({p.name for p in h})
    assert [p.name for p in a] == [p.name for p in problems(family, 0, "train", 200)]
    assert [p.name for p in a] != [p.name for p in b]


def test_arith_reward_rule() -> None:
    p = next(p for p in problems("arith", 0, "train", 50) if "p" in p.name.split("-")[1])
    right = p.answer
    assert score(f"Let me add.\nAnswer: {right}", p).reward == 1.0
    assert score(f"Answer: 1\nthen\nanswer: {right}.", p).reward == 1.0  # the last line counts
    assert score(f"Answer: {int(right) + 1}", p).reward == 0.1
    assert score(f"Answer: {right} apples", p).reward == 0.1
    assert score(f"The answer is {right}.", p).reward == 0.5  # right, but not in the format
    assert score(f"The answer is {right}st", p).reward == 0.0
    assert score(f"{right} or {int(right) + 1}", p).reward == 0.0  # the last number counts
    assert score("", p).reward == 0.0
    assert score(f"Answer: {right}", p).correct


def test_countdown_checks_numbers_and_value() -> None:
    assert check("(3 + 7) * 3", [3, 3, 7], 30)
    assert not check("(3 + 7) * 3", [3, 7, 9], 30)  # 3 used twice, given once
    assert not check("30", [3, 7, 9], 30)  # a number not given
    assert not check("__import__('os').system('true')", [3, 7, 9], 0)
    assert not check("9 ** 2", [9, 2, 1], 81)
    assert not check("9 / 3", [9, 3, 1], 3)
    assert check("7 * 3 + 9 = 30", [3, 7, 9], 30)
    for p in problems("countdown", 0, "train", 30):  # every problem is solvable as stated
        assert 1 <= int(p.answer) <= 100 and len(p.data["numbers"]) == 3


def test_unknown_family_and_split() -> None:
    with pytest.raises(ValueError, match="unknown task family"):
        problems("nope", 0, "train", 1)
    with pytest.raises(ValueError, match="unknown split"):
        problems("arith", 0, "test", 1)


@pytest.mark.parametrize("sandbox", [False, True])
@pytest.mark.parametrize(
    ("reply", "reward"), [("Answer: {a}", 1.0), ("Answer: {b}", 0.1), ("so {a}.", 0.5), ("", 0.0)]
)
async def test_scorer_reads_the_generated_verifier(
    tmp_path: Path, reply: str, reward: float, sandbox: bool
) -> None:
    """Through Gyre's own scorer (copy, verifier process, the task's declared result file),
    also in the sandbox, where Gyre's checkout may be out of sight: the verifier must not
    need ``import gyre``."""
    import shutil

    from gyre.harness.scorer import Scorer
    from gyre.trace.assessment import Scored

    if sandbox and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")

    p = problems("arith", 0, "train", 1)[0]
    write_taskset([p], tmp_path / "set")
    task = load_taskset(tmp_path / "set")[0]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text(reply.format(a=p.answer, b=int(p.answer) + 1))
    scorer = (
        Scorer(bwrap="bwrap", hide=[Path(__file__).resolve().parents[2]]) if sandbox else Scorer()
    )
    got = await scorer.score(task, ws, tmp_path / "scratch", timeout_s=60.0)
    assert isinstance(got, Scored) and got.reward == reward, got
    await scorer.drain()  # the scoring folder is removed after the assessment, drain waits
    assert not (tmp_path / "scratch").exists()


@pytest.mark.parametrize("family", ["arith", "calc", "lookup"])
def test_written_verifier_scores_answer(tmp_path: Path, family: str) -> None:
    """The generated verifier runs on its own copy of the family (base.py and the family's
    file): a family that imports anything else from the package fails here, not in a run."""
    items = problems(family, 0, "train", 2) + problems(family, 0, "held-out", 1)
    write_taskset(items, tmp_path / "set")
    tasks = load_taskset(tmp_path / "set")
    assert sorted(t.name for t in tasks) == sorted(f"{p.split}-{p.name}" for p in items)
    t, p = next((t, p) for t in tasks for p in items if t.name == f"{p.split}-{p.name}")
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    (ws / "answer.txt").write_text(f"Sure.\nAnswer: {p.answer}\n")
    env = dict(os.environ, GYRE_WORKSPACE=str(ws), GYRE_REWARD_DIR=str(out))
    env["GYRE_TESTS_DIR"] = str(t.tests_dir)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    subprocess.run(["bash", str(t.tests_dir / "test.sh")], cwd=ws, env=env, check=True)
    assert json.loads((out / "reward.json").read_text())["reward"] == 1.0
