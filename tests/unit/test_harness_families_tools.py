"""The tool-use families ``calc`` and ``lookup``: disjoint seeded splits, exact verifiers that
hold against hostile replies, and workspaces that hold the answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.harness.families import problems, score
from gyre.harness.families.base import MAX_REPLY_CHARS
from gyre.harness.families.write import write_taskset
from gyre.harness.task import load_taskset


@pytest.mark.parametrize("family", ["calc", "lookup"])
def test_splits_are_disjoint_and_seeded(family: str) -> None:
    a = problems(family, 0, "train", 300)
    b = problems(family, 1, "train", 300)
    h = problems(family, 0, "held-out", 64) + problems(family, 1, "held-out", 64)
    names = {p.name for p in a}
    assert len(names) == 300 and all(p.split == "train" for p in a)
    assert names.isdisjoint({p.name for p in h}) and {p.name for p in b}.isdisjoint(
        {p.name for p in h}
    )
    assert [p.__dict__ for p in a] == [p.__dict__ for p in problems(family, 0, "train", 300)]
    assert [p.name for p in a] != [p.name for p in b]


def test_calc_mixes_one_and_two_operations_of_3_to_5_digits() -> None:
    ps = problems("calc", 0, "train", 200)
    ops = [p.data["operations"] for p in ps]
    assert 60 < ops.count(1) < 140 and 60 < ops.count(2) < 140
    for p in ps:
        nums = [int(x) for x in re.findall(r"\d+", p.data["expression"])]
        assert all(10 <= n < 100_000 for n in nums) and max(nums) >= 100
        assert str(eval(p.data["expression"])) == p.answer  # the stated value is the value
        assert p.data["expression"] in p.instruction


def test_lookup_kinds_and_their_files_hold_the_answer() -> None:
    ps = problems("lookup", 0, "train", 90)
    kinds = {p.data["kind"] for p in ps}
    assert kinds == {"read", "find", "combine"}
    for p in ps:
        files = p.data["files"]
        text = "\n".join(files.values())
        kind = p.data["kind"]
        if kind in ("read", "find"):
            assert p.answer in text  # read it off a file
        if kind == "find":
            assert len(files) >= 4
            key = re.search(r"key (\w{4})", p.instruction)
            assert key
            holders = [t for t in files.values() if re.search(rf"^{key.group(1)} = ", t, re.M)]
            assert len(holders) == 1 and f"{key.group(1)} = {p.answer}\n" in holders[0]
        if kind == "combine":
            item = re.search(r"price of (\w+) times", p.instruction)
            assert item
            price = re.search(rf"^{item.group(1)}: (\d+)$", files["data/prices.txt"], re.M)
            count = re.search(rf"^{item.group(1)}: (\d+)$", files["data/stock.txt"], re.M)
            assert price and count and int(price.group(1)) * int(count.group(1)) == int(p.answer)
            assert p.answer not in text  # computed, not read


@pytest.mark.parametrize("family", ["calc", "lookup"])
def test_verifier_right_wrong_and_hostile(family: str) -> None:
    p = problems(family, 0, "held-out", 1)[0]
    a = p.answer
    big = f"{int(a):,}"
    cases = {
        f"Let me run it.\nAnswer: {a}": 1.0,
        f"answer: {big}.": 1.0,  # thousands separators and a final period
        f"Answer: 1\nAnswer: {a}": 1.0,  # the last line counts
        f"Answer: {int(a) + 1}": 0.1,
        f"Answer: {a}\nAnswer: 7": 0.1,
        f"Answer: {a} or {int(a) + 1}": 0.1,  # two answers on one line
        f"Answer: {a}, {int(a) + 1}": 0.1,
        f"Answer: {p.data.get('expression', a + ' * 1')}": 0.1,  # not the value
        "Answer: forty-two": 0.1,
        f"Answer: $(echo {a})": 0.1,  # shell injection: text, never run
        f"Answer: __import__('os').system('echo {a}')": 0.1,
        f"Answer: {a}0": 0.1,
        "Answer: " + "9" * 5000: 0.1,  # a huge number is not parsed
        f"The answer is {a}.": 0.0,  # right number, no answer line: no credit
        "": 0.0,
        "x" * (MAX_REPLY_CHARS + 10) + f"\nAnswer: {a}": 0.0,  # past what the verifier reads
        f"```bash\necho {a}\n```": 0.0,
    }
    for reply, reward in cases.items():
        got = score(reply, p)
        assert got.reward == reward, (reply[:80], got)
        assert got.correct == (reward == 1.0)


def test_lookup_workspace_written_and_verifier_scores(tmp_path: Path) -> None:
    ps = problems("lookup", 0, "train", 12) + problems("calc", 0, "held-out", 2)
    write_taskset(ps, tmp_path / "set")
    tasks = {t.name: t for t in load_taskset(tmp_path / "set")}
    for p in ps:
        repo = tasks[f"{p.split}-{p.name}"].root / "environment" / "repo"
        for rel, text in p.data.get("files", {}).items():
            assert (repo / rel).read_text() == text
    for p in (ps[0], ps[-1]):  # the verifier, through its own process, for each family
        t = tasks[f"{p.split}-{p.name}"]
        ws, out = tmp_path / f"ws-{p.name}", tmp_path / f"out-{p.name}"
        ws.mkdir()
        out.mkdir()
        (ws / "answer.txt").write_text(f"Found it.\nAnswer: {p.answer}\n")
        env = dict(os.environ, GYRE_WORKSPACE=str(ws), GYRE_REWARD_DIR=str(out))
        env["GYRE_TESTS_DIR"] = str(t.tests_dir)
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        subprocess.run(["bash", str(t.tests_dir / "test.sh")], cwd=ws, env=env, check=True)
        assert json.loads((out / "reward.json").read_text())["reward"] == 1.0


def test_workspace_file_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    p = problems("lookup", 0, "train", 1)[0]
    bad = replace(p, data={**p.data, "files": {"../../escape.txt": "1"}})
    with pytest.raises(ValueError, match="outside the workspace"):
        write_taskset([bad], tmp_path / "set")
