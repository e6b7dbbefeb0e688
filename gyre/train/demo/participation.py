"""Who took part in each step, and why a planned cell did not: the elastic join made visible.

The policy never waits for a satellite (docs/training.md, "Cells"): a step
seals as soon as its micro-steps are done, with the cells that joined by then,
always a prefix 0..k-1 (cells join in order, so cell 2 cannot take part
without cell 1). The update is the same whoever took part, so a run with fewer
cells is correct; it must not be *silent*. :func:`step_participation` turns the
core's seal (k participants) and each satellite's own account of the step into
one record, and :func:`describe` into the lines a user reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

# Why a satellite did not take part in a step (its own account, written by gyre.train.demo.local).
OVER_BEFORE_READY = "the step was over before this cell was ready for it"
SEALED_BEFORE_JOIN_POINT = (
    "the step sealed before this cell joined (its join point: {after_done} micro-steps done)"
)
SEALED_WHILE_QUEUED = (
    "the step sealed before its join went through (a cell joins only after the cells below it)"
)
NOT_JOINED_PREFIX = "a lower cell did not join (cells join in order 1, 2, ...)"


class _Progress(Protocol):
    def n_done(self, step: int) -> int: ...
    def is_sealed(self, step: int) -> bool: ...


def join_when_due(
    coord: _Progress,
    step: int,
    after_done: int,
    join: Callable[[], T | None],
    *,
    poll_s: float = 0.005,
) -> tuple[T | None, str]:
    """A satellite's turn at a running step: wait for its join point, unless the step seals first.

    Returns ``(join()'s result, "")`` when it took part, else ``(None, why)``. Never holds
    the step back: the seal wins over a satellite still on its way (the policy).
    """
    while coord.n_done(step) < after_done and not coord.is_sealed(step):
        time.sleep(poll_s)
    if coord.is_sealed(step):
        return None, SEALED_BEFORE_JOIN_POINT.format(after_done=after_done)
    res = join()
    return res, "" if res is not None else SEALED_WHILE_QUEUED


@dataclass(frozen=True)
class StepParticipation:
    step: int
    world: int  # K: cells the run has
    joined: list[int]  # the prefix 0..k-1 that took part (the core's seal)
    missed: dict[int, str] = field(default_factory=dict)  # planned cell -> why it did not

    @property
    def complete(self) -> bool:
        return not self.missed


def step_participation(
    step: int,
    world: int,
    participants: int,
    planned: Iterable[int],
    accounts: Mapping[int, Mapping[str, Any]] | None = None,
) -> StepParticipation:
    """One step's record from the core's seal and the satellites' accounts.

    ``participants`` is the seal's k; ``planned`` the satellites meant to join this
    step; ``accounts[c]`` satellite c's row for the step (``{"joined", "why"}``), when
    it wrote one. A planned cell at or above k missed the step; its reason is its own
    account, else the prefix rule if it is above a cell that also missed.
    """
    if not 1 <= participants <= world:
        raise ValueError(f"step {step}: {participants} participants in a run of {world} cells")
    accounts = accounts or {}
    missed: dict[int, str] = {}
    for c in sorted(set(planned)):
        if c < participants:
            continue
        why = str(accounts.get(c, {}).get("why") or "")
        if not why:
            why = NOT_JOINED_PREFIX if any(m < c for m in missed) else "no account from the cell"
        missed[c] = why
    return StepParticipation(
        step=step, world=world, joined=list(range(participants)), missed=missed
    )


def describe(p: StepParticipation) -> str:
    """``cells 2/3 [0, 1]`` plus one indented line per planned cell that missed the step."""
    head = f"cells {len(p.joined)}/{p.world} {p.joined}"
    return "\n".join(
        [head, *(f"    cell {c} missed step {p.step}: {w}" for c, w in p.missed.items())]
    )


def summary(steps: list[StepParticipation]) -> str:
    """One closing line: did every step run with every planned cell?"""
    if not steps:
        return "no steps ran"
    world = steps[0].world
    short = [p.step for p in steps if not p.complete]
    if not short:
        return f"every step ran with every planned cell (run of {world} cells)"
    return (
        f"{len(short)} of {len(steps)} steps ran with fewer than the planned cells "
        f"(steps {short}): the core never waits for a satellite (docs/training.md); "
        "the update is the same whoever took part"
    )
