"""What every family shares: the problem record, the score, the split rule, answer parsing."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "held-out")
HELD_OUT_SHARE = 0.2  # of the problem space; the split is a hash of the problem's content
_ANSWER = re.compile(r"^\s*answer\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
MAX_REPLY_CHARS = 4000  # what a verifier reads of a reply
_INTEGER = re.compile(r"^[-+]?\d{1,15}$")
TOOL_NAME = "run_command"  # the reference agent's shell tool; its argument is "command"


@dataclass(frozen=True)
class Problem:
    family: str
    name: str  # unique within the family: the task folder's name
    split: str
    instruction: str  # the user message the harness sends
    answer: str  # what the verifier checks (a number, or the target for countdown)
    data: dict[str, Any] = field(default_factory=dict)  # what the verifier needs besides


@dataclass(frozen=True)
class Score:
    reward: float  # in [0, 1]
    formatted: bool  # the reply ends with an ``Answer: ...`` line
    correct: bool


def split_of(key: str) -> str:
    """``train`` or ``held-out``, from a hash of the problem's content: stable across seeds
    and sizes, so the two splits never share a problem."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "held-out" if (h % 10_000) < HELD_OUT_SHARE * 10_000 else "train"


def final_answer(reply: str) -> str | None:
    """The text after the last ``Answer:`` line of the reply (None: no such line)."""
    found = _ANSWER.findall(reply[:MAX_REPLY_CHARS])
    return found[-1] if found else None


def exact_integer(text: str, answer: str) -> bool:
    """Is ``text`` (an ``Answer:`` line's content) exactly the integer ``answer``? Commas and
    a final period are tolerated; anything else (an expression, two numbers, words) is not."""
    t = text.replace(",", "").rstrip(".").strip()
    return bool(_INTEGER.match(t)) and int(t) == int(answer)


def graded(formatted: bool, correct: bool) -> Score:
    """The reward rule shared by the families: 1 for a correct answer in the required format,
    0.1 for the format with a wrong answer (a small push towards answers that can be checked),
    0 for a reply without an ``Answer:`` line."""
    reward = 1.0 if (formatted and correct) else 0.1 if formatted else 0.0
    return Score(reward=reward, formatted=formatted, correct=formatted and correct)


def score_integer_answer(reply: str, problem: Problem) -> Score:
    """The tool-use families' rule: only the last ``Answer:`` line counts, and only the exact
    integer in it; a right number anywhere else in the reply earns nothing (the tool's output
    is in the conversation, so crediting it would reward copying without answering)."""
    got = final_answer(reply)
    if got is None:
        return graded(False, False)
    return graded(True, exact_integer(got, problem.answer))


def draw(n: int, split: str, propose: Callable[[], Problem | None]) -> list[Problem]:
    """``n`` distinct problems of ``split`` from repeated ``propose()`` calls (None: rejected);
    the caller's generator is seeded, so the draw is too."""
    out: dict[str, Problem] = {}
    while len(out) < n:
        p = propose()
        if p is not None and p.name not in out and split_of(p.name) == split:
            out[p.name] = p
    return list(out.values())
