"""The families by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gyre.harness.families import arith, calc, countdown, lookup
from gyre.harness.families.base import SPLITS, Problem, Score

FAMILIES: dict[str, tuple[Callable[..., list[Problem]], Callable[[str, Problem], Score]]] = {
    "arith": (arith.make, arith.score),
    "countdown": (countdown.make, countdown.score),
    "calc": (calc.make, calc.score),
    "lookup": (lookup.make, lookup.score),
}


def problems(family: str, seed: int, split: str, n: int) -> list[Problem]:
    """``n`` problems of ``family`` in ``split`` ('train' or 'held-out'), drawn from ``seed``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r} (known: {', '.join(FAMILIES)})")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (known: {', '.join(SPLITS)})")
    return FAMILIES[family][0](seed, split, n)


def score(reply: str, problem: Problem) -> Score:
    return FAMILIES[problem.family][1](reply, problem)


# families whose oracle can write a demonstration (the optional warm-up, ``gyre train sft``)
DEMONSTRATIONS: dict[str, Callable[[Problem], list[dict[str, Any]]]] = {
    "calc": calc.demonstration,
}


def demonstration(problem: Problem) -> list[dict[str, Any]]:
    """The oracle's conversation for ``problem`` (after the system prompt)."""
    if problem.family not in DEMONSTRATIONS:
        raise ValueError(
            f"family {problem.family!r} has no oracle demonstrations "
            f"(families with one: {', '.join(DEMONSTRATIONS)})"
        )
    return DEMONSTRATIONS[problem.family](problem)
