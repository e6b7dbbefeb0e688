"""Problems -> Harbor task folders (``<split>-<name>/``) that ``gyre run`` loads as a task set.

Each folder's verifier (``tests/score.py``) scores ``answer.txt`` (the reference agent's
final message) with the family's own ``score``, so the reward a run trains on is the one a
peer trainer computes from the same reply. The family's two source files are copied into
``tests/_family/``: a sandboxed verifier sees the venv's Python but not necessarily Gyre's
checkout (an editable install points there), and it runs with ``PYTHONSAFEPATH``, so it
imports the family from its own folder, not from ``gyre``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gyre.harness.families.base import Problem

_HERE = Path(__file__).resolve().parent

TASK_TOML = """version = "1.0"

[metadata]
author_name = "Gyre"
category = "{family}"
split = "{split}"
tags = ["generated", "{family}"]

[agent]
timeout_sec = {harness_timeout}

[verifier]
timeout_sec = 30.0

[gyre]
result = "reward.json"
reward = "fraction"
overall_timeout_sec = {overall_timeout}
"""
# -I -S: score.py needs only the standard library and its own folder; without site and
# isolated, the verifier's interpreter starts ~60 ms sooner on a loaded machine, in every
# execution's scoring (docs/measurements.md, "Around each execution").
TEST_SH = (
    "#!/usr/bin/env bash\n# Generated verifier: scores answer.txt (see score.py).\n"
    'exec python -I -S "$GYRE_TESTS_DIR/score.py"\n'
)
SCORE_PY = '''"""Generated verifier: the family's reward for answer.txt, written to reward.json."""
import importlib
import json
import os
import sys

def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)  # the family's own copy (tests/_family), never the workspace
    base = importlib.import_module("_family.base")
    with open(os.path.join(here, "problem.json"), encoding="utf-8") as f:
        problem = base.Problem(**json.load(f))
    score = importlib.import_module("_family." + problem.family).score
    path = os.path.join(os.environ["GYRE_WORKSPACE"], "answer.txt")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            reply = f.read(8192)
    except (FileNotFoundError, IsADirectoryError):
        reply = ""
    s = score(reply, problem)
    with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
        json.dump({"reward": s.reward, "formatted": s.formatted, "correct": s.correct}, f)
    return 0

if __name__ == "__main__":
    sys.exit(main())
'''
README = "Write your reply as your final message; the harness saves it to answer.txt.\n"


def folder_name(p: Problem) -> str:
    return f"{p.split}-{p.name}"


def write_task(p: Problem, root: Path, harness_timeout: float = 600.0) -> Path:
    """One task folder. The harness timeout is generous (one reply takes seconds on an idle
    2-core machine) because a timeout is a *missing* assessment when no call was answered,
    and at 112 concurrent executions on three CPU engines under load replies took > 120 s."""
    d = root / folder_name(p)
    (d / "environment" / "repo").mkdir(parents=True, exist_ok=True)
    (d / "tests").mkdir(exist_ok=True)
    (d / "instruction.md").write_text(p.instruction + "\n", encoding="utf-8")
    (d / "task.toml").write_text(
        TASK_TOML.format(
            family=p.family,
            split=p.split,
            harness_timeout=harness_timeout,
            overall_timeout=harness_timeout + 120.0,
        )
    )
    repo = d / "environment" / "repo"
    (repo / "README.md").write_text(README)
    for rel, text in (p.data.get("files") or {}).items():  # the workspace of ``lookup``
        f = (repo / rel).resolve()
        if repo.resolve() not in f.parents:
            raise ValueError(f"{p.name}: workspace file {rel!r} lies outside the workspace")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "tests" / "score.py").write_text(SCORE_PY)
    (d / "tests" / "problem.json").write_text(json.dumps(p.__dict__, indent=1) + "\n")
    fam = d / "tests" / "_family"
    fam.mkdir(exist_ok=True)
    (fam / "__init__.py").write_text("")
    for name in ("base.py", f"{p.family}.py"):
        shutil.copyfile(_HERE / name, fam / name)
    return d


def write_taskset(problems: list[Problem], root: str | Path) -> list[Path]:
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    return [write_task(p, out) for p in problems]
