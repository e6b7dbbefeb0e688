"""``calc``: multi-digit arithmetic that a small model cannot do in its head, but a shell can.

"What is 4821 * 937 + 5512? End your reply with a line of the form 'Answer: <number>'."
Operands have 3 to 5 digits (the second factor 2 to 3), and a problem has one operation
(``a * b``) or two (``a * b + c``, ``a * b - c``, ``(a + b) * c``), so the products run to
nine digits: out of reach of SmolLM2-135M's arithmetic, one ``echo $((...))`` for a shell.
Correct means the last ``Answer:`` line holds exactly the value (commas and a final period
tolerated); an expression on that line is not the value, so the model has to run it.

Reward (the shared rule, :func:`base.graded`): 1 correct in that format, 0.1 the format
with anything else on the line, 0 no ``Answer:`` line. No credit for a right number
outside the format: the verifier checks the line, nothing else.
"""

from __future__ import annotations

import random
from typing import Any

from .base import TOOL_NAME, Problem, draw, score_integer_answer

INSTRUCTION = "What is {expr}? End your reply with a line of the form 'Answer: <number>'."
# kind -> (expression, the value); the digits of each operand are drawn in make()
KINDS = ("mul", "mul_add", "mul_sub", "add_mul")


def _expr(kind: str, a: int, b: int, c: int) -> tuple[str, int]:
    if kind == "mul":
        return f"{a} * {b}", a * b
    if kind == "mul_add":
        return f"{a} * {b} + {c}", a * b + c
    if kind == "mul_sub":
        return f"{a} * {b} - {c}", a * b - c
    return f"({a} + {c}) * {b}", (a + c) * b


def _digits(rng: random.Random, lo: int, hi: int) -> int:
    k = rng.randint(lo, hi)
    return rng.randint(10 ** (k - 1), 10**k - 1)


def make(seed: int, split: str, n: int) -> list[Problem]:
    """``n`` distinct problems of ``split``: half with one operation, half with two."""
    rng = random.Random(f"calc-{seed}-{split}")

    def propose() -> Problem:
        kind = "mul" if rng.random() < 0.5 else rng.choice(KINDS[1:])
        a, b, c = _digits(rng, 3, 5), _digits(rng, 2, 3), _digits(rng, 3, 5)
        expr, value = _expr(kind, a, b, c)
        name = f"calc-{kind.replace('_', '')}-{a}-{b}" + ("" if kind == "mul" else f"-{c}")
        return Problem(
            family="calc",
            name=name,
            split=split,
            instruction=INSTRUCTION.format(expr=expr),
            answer=str(value),
            data={"expression": expr, "operations": 1 if kind == "mul" else 2},
        )

    return draw(n, split, propose)


score = score_integer_answer  # the tool-use families' rule (base.py)


def demonstration(p: Problem) -> list[dict[str, Any]]:
    """The oracle's execution of ``p`` as the reference agent's conversation after its system
    prompt: the task, one ``bc`` call (the worked exchange's command, on this problem's
    expression), the tool's output as the agent returns it, and the answer line. What the
    optional warm-up (``gyre train sft``) imitates; the run itself never sees it."""
    command = f'echo "{p.data["expression"]}" | bc'
    return [
        {"role": "user", "content": p.instruction},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": {"command": command}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": f"exit status 0\n{p.answer}\n"},
        {"role": "assistant", "content": f"Answer: {p.answer}"},
    ]
