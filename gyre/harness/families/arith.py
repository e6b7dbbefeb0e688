"""``arith``: multi-digit addition and subtraction with a required answer line.

"What is 47 + 38? ... give the final answer on the last line as 'Answer: <number>'."
Correct means the last ``Answer:`` line holds exactly the right integer (commas and a
trailing period tolerated); see :func:`gyre.harness.families.base.graded` for the reward.
"""

from __future__ import annotations

import random
import re

from gyre.harness.families.base import Problem, Score, final_answer, graded, split_of

INSTRUCTION = (
    "What is {a} {op} {b}? Think briefly, then give the final answer on the last line "
    "as 'Answer: <number>'."
)
_INT = re.compile(r"^[-+]?\d{1,12}$")


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make(seed: int, split: str, n: int, digits: int = 2) -> list[Problem]:
    """``n`` distinct problems of ``split`` with ``digits``-digit operands, drawn from ``seed``."""
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    space = 2 * (hi - lo + 1) ** 2
    if n > space // 10:
        raise ValueError(f"arith: {n} problems asked of a space of {space} ({digits} digits)")
    rng = random.Random(f"arith-{seed}-{split}-{digits}")
    out: dict[str, Problem] = {}
    while len(out) < n:
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice("+-")
        key = f"arith-{a}{'p' if op == '+' else 'm'}{b}"
        if key in out or split_of(key) != split:
            continue
        out[key] = Problem(
            family="arith",
            name=key,
            split=split,
            instruction=INSTRUCTION.format(a=a, op=op, b=b),
            answer=str(_value(a, op, b)),
        )
    return list(out.values())


def score(reply: str, problem: Problem) -> Score:
    got = final_answer(reply)
    if got is None:
        return graded(False, False)
    text = got.replace(",", "").rstrip(".").strip()
    ok = bool(_INT.match(text)) and int(text) == int(problem.answer)
    return graded(True, ok)
