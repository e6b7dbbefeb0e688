"""Who joined each step: the satellites' join decision under simulated load, and the report.

The core never waits for a satellite (docs/training.md), so a satellite held up by
load misses the step; the report must name it and say why, never run short silently.
Threads over the in-process coordinator stand in for the cells; "load" is a sleep.
"""

from __future__ import annotations

import threading
import time

import pytest

from gyre.trace.packing import MicroStep, PackedSequence
from gyre.train.demo.coordinator import LocalCoordinator
from gyre.train.demo.participation import (
    NOT_JOINED_PREFIX,
    SEALED_BEFORE_JOIN_POINT,
    SEALED_WHILE_QUEUED,
    describe,
    join_when_due,
    step_participation,
    summary,
)
from gyre.train.tasks import MicroStepTask

ITEMS = 6


def task(i: int) -> MicroStepTask:
    row = PackedSequence.from_chain([5, 6, 7])
    row.execution_index = [-1, 0, 0]
    row.token_weight = [0.0, 0.5, 0.5]
    return MicroStepTask(i, MicroStep("paths", [row], [f"e{i}"]), [1.0], {}, ["g"])


def run_step(delays: dict[int, float], after_done: dict[int, int], work_s: float):
    """The core fills and works a step of ITEMS micro-steps (``work_s`` each) and seals it;
    satellite c starts ``delays[c]`` seconds late (load) and joins at ``after_done[c]``."""
    coord = LocalCoordinator(poll_s=0.001, stall_timeout_s=10)
    coord.open_step(0, 0)
    for i in range(ITEMS):
        coord.put(0, task(i))
    coord.close(0, n_scored=ITEMS)
    accounts: dict[int, dict] = {}

    def claim_all(cell: int) -> int:
        n = 0
        while (t := coord.claim(0)) is not None:
            time.sleep(work_s)
            coord.done(0, t.index, cell)
            n += 1
        return n

    def satellite(c: int) -> None:
        time.sleep(delays[c])

        def join():
            return claim_all(c) if coord.join(0, c) else None

        res, why = join_when_due(coord, 0, after_done[c], join, poll_s=0.001)
        accounts[c] = {"step": 0, "joined": res is not None, "why": why}

    threads = [threading.Thread(target=satellite, args=(c,)) for c in delays]
    for t in threads:
        t.start()
    claim_all(0)
    seal = coord.seal(0)
    for t in threads:
        t.join(10)
    return seal, accounts


def test_satellites_in_time_all_join():
    seal, accounts = run_step({1: 0.0, 2: 0.0}, {1: 1, 2: 2}, work_s=0.05)
    p = step_participation(0, 3, seal.participants, [1, 2], accounts)
    assert p.joined == [0, 1, 2] and p.complete, accounts
    assert sum(seal.claims.values()) == ITEMS
    assert describe(p) == "cells 3/3 [0, 1, 2]"


def test_a_satellite_slowed_by_load_misses_the_step_and_says_why():
    # satellite 2 is held up past the seal; the core does not wait for it
    seal, accounts = run_step({1: 0.0, 2: 1.0}, {1: 1, 2: 2}, work_s=0.02)
    assert seal.participants == 2
    p = step_participation(0, 3, seal.participants, [1, 2], accounts)
    assert p.joined == [0, 1]
    assert p.missed == {2: SEALED_BEFORE_JOIN_POINT.format(after_done=2)}
    assert describe(p).splitlines() == [
        "cells 2/3 [0, 1]",
        "    cell 2 missed step 0: the step sealed before this cell joined "
        "(its join point: 2 micro-steps done)",
    ]


def test_cells_join_in_order_so_a_late_cell_1_keeps_cell_2_out():
    # cell 2 is ready at once but must wait for cell 1 (prefix membership); cell 1 is late
    seal, accounts = run_step({1: 1.0, 2: 0.0}, {1: 0, 2: 0}, work_s=0.02)
    assert seal.participants == 1
    p = step_participation(0, 3, seal.participants, [1, 2], accounts)
    assert p.joined == [0]
    assert p.missed[1] == SEALED_BEFORE_JOIN_POINT.format(after_done=0)
    assert p.missed[2] == SEALED_WHILE_QUEUED


def test_report_without_accounts_and_summary():
    p = step_participation(3, 3, 1, [1, 2], {})
    assert p.missed == {1: "no account from the cell", 2: NOT_JOINED_PREFIX}
    full = step_participation(4, 3, 3, [1, 2])
    assert summary([full]) == "every step ran with every planned cell (run of 3 cells)"
    line = summary([full, p])
    assert line.startswith("1 of 2 steps ran with fewer than the planned cells (steps [3])")
    assert "never waits for a satellite" in line
    assert summary([]) == "no steps ran"
    with pytest.raises(ValueError):
        step_participation(0, 3, 4, [1, 2])
