"""``countdown``: reach a target from three numbers with + - * and parentheses.

"Using the numbers 3, 7, 9, each at most once, and + - * ( ), make 30 ..." The reply must
end with 'Answer: <expression>'; correct means the expression parses as arithmetic over
those numbers only (each used at most as often as given) and evaluates to the target. A
one-line reply rarely gets there: the model has to try combinations first.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from collections.abc import Callable

from .base import Problem, Score, draw, final_answer, graded

INSTRUCTION = (
    "Using the numbers {nums}, each at most once, and the operations + - * and parentheses, "
    "write an expression equal to {target}. Work it out step by step, then give the "
    "expression on the last line as 'Answer: <expression>'."
)
_BY_SYMBOL: dict[str, Callable[[int, int], int]] = {
    "+": lambda x, y: x + y,
    "-": lambda x, y: x - y,
    "*": lambda x, y: x * y,
}
_OPS = {ast.Add: _BY_SYMBOL["+"], ast.Sub: _BY_SYMBOL["-"], ast.Mult: _BY_SYMBOL["*"]}
MAX_EXPR_CHARS = 200


def make(seed: int, split: str, n: int) -> list[Problem]:
    """``n`` distinct solvable problems of ``split``: three numbers in 1..12, a target in 1..100
    built from all three (so a solution exists)."""
    rng = random.Random(f"countdown-{seed}-{split}")

    def propose() -> Problem | None:
        nums = sorted(rng.randint(1, 12) for _ in range(3))
        a, b, c = rng.sample(nums, 3)
        o1, o2 = rng.choice("+-*"), rng.choice("+-*")
        target = _BY_SYMBOL[o2](_BY_SYMBOL[o1](a, b), c)
        if not 1 <= target <= 100:
            return None
        return Problem(
            family="countdown",
            name=f"countdown-{'-'.join(map(str, nums))}-t{target}",
            split=split,
            instruction=INSTRUCTION.format(nums=", ".join(map(str, nums)), target=target),
            answer=str(target),
            data={"numbers": nums},
        )

    return draw(n, split, propose)


def _eval(node: ast.AST, used: list[int]) -> int:
    if isinstance(node, ast.Expression):
        return _eval(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left, used), _eval(node.right, used))
    raise ValueError("not an expression of integers with + - *")


def check(expr: str, numbers: list[int], target: int) -> bool:
    """Does ``expr`` use only ``numbers`` (multiset) and equal ``target``? Never evaluates
    anything but integer + - * (no names, calls, powers or division)."""
    expr = expr.strip().rstrip(".").split("=")[0]
    if not expr or len(expr) > MAX_EXPR_CHARS:
        return False
    try:
        used: list[int] = []
        value = _eval(ast.parse(expr, mode="eval"), used)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return value == target and not (Counter(used) - Counter(numbers))


def score(reply: str, problem: Problem) -> Score:
    got = final_answer(reply)
    if got is None:
        return graded(False, False)
    return graded(True, check(got, list(problem.data["numbers"]), int(problem.answer)))
