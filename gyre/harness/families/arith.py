"""``arith``: addition and subtraction of two numbers in 2..20, with a required answer line.

"What is 17 - 9? End your reply with a line of the form 'Answer: <number>'." Correct means
the last ``Answer:`` line holds exactly the right integer (commas and a trailing period
tolerated). Reward: 1 correct in that format, 0.1 the format with a wrong number, 0.5 a
correct number as the reply's last integer without the format, 0 otherwise. The half
reward is there because SmolLM2-135M-Instruct, sampled at temperature 1, almost never
writes the format unprompted (2 of 16 replies) but often ends on the right number; it
gives a group's advantages something to rank before the format is learned.
"""

from __future__ import annotations

import random
import re

from .base import (
    MAX_REPLY_CHARS,
    Problem,
    Score,
    draw,
    final_answer,
    graded,
)

INSTRUCTION = "What is {a} {op} {b}? End your reply with a line of the form 'Answer: <number>'."
_INT = re.compile(r"^[-+]?\d{1,12}$")
_NUMBER = re.compile(r"(?<![\w.])-?\d{1,12}(?:\.\d+)?(?!\w)")
LOW, HIGH = 2, 20


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make(seed: int, split: str, n: int, low: int = LOW, high: int = HIGH) -> list[Problem]:
    """``n`` distinct problems of ``split`` with operands in ``low..high``, drawn from ``seed``."""
    lo, hi = low, high
    space = 2 * (hi - lo + 1) ** 2
    share = 0.8 if split == "train" else 0.2
    if n > space * share * 0.9:
        raise ValueError(f"arith: {n} {split} problems asked of a space of {space} ({lo}..{hi})")
    rng = random.Random(f"arith-{seed}-{split}-{lo}-{hi}")

    def propose() -> Problem:
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice("+-")
        return Problem(
            family="arith",
            name=f"arith-{a}{'p' if op == '+' else 'm'}{b}",
            split=split,
            instruction=INSTRUCTION.format(a=a, op=op, b=b),
            answer=str(_value(a, op, b)),
        )

    return draw(n, split, propose)


def score(reply: str, problem: Problem) -> Score:
    got = final_answer(reply)
    if got is None:
        nums = _NUMBER.findall(reply[:MAX_REPLY_CHARS].replace(",", ""))
        if nums and _INT.match(nums[-1]) and int(nums[-1]) == int(problem.answer):
            return Score(reward=0.5, formatted=False, correct=False)
        return graded(False, False)
    text = got.replace(",", "").rstrip(".").strip()
    ok = bool(_INT.match(text)) and int(text) == int(problem.answer)
    return graded(True, ok)
