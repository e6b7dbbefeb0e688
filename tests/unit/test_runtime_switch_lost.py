"""A cell the heartbeat lost while its switch was ending stays lost (bench_chaos seed 3:
``PolicyError: cell 2 reported training while lost``)."""

from __future__ import annotations

import asyncio
import types

from gyre.policy import CellRole
from gyre.runtime.records import Records
from gyre.runtime.world import RealWorld


def _world(lost: set[int]) -> tuple[RealWorld, list]:
    w = RealWorld.__new__(RealWorld)
    emitted: list = []

    async def to_training(cell: int) -> int:
        return 0

    w.cluster = types.SimpleNamespace(to_training=to_training)
    w.faults = types.SimpleNamespace(down=lost, back=lambda c: None)
    w.records = Records(cells=3)
    w.emit = emitted.append
    w._set_role = lambda c, r: w.roles.__setitem__(c, r)
    return w, emitted


def test_a_switch_that_ends_after_its_cell_was_lost_is_dropped():
    w, emitted = _world({2})
    asyncio.run(w._switch(2, CellRole.TRAINING))
    assert emitted == [] and w.records.switches == []


def test_a_switch_of_a_live_cell_is_reported():
    w, emitted = _world(set())
    asyncio.run(w._switch(1, CellRole.TRAINING))
    assert [(e.cell, e.role) for e in emitted] == [(1, CellRole.TRAINING)]


def test_a_switch_record_carries_what_its_drain_moved_with_kv():
    w, _ = _world(set())
    w.cluster.switch_kv = {1: {"kv_migrated": 2, "kv_bytes": 4096, "kv_saved_s": 1.5}}
    asyncio.run(w._switch(1, CellRole.TRAINING))
    rec = w.records.switches[0]
    assert rec["moved_calls"] == 0 and rec["kv_migrated"] == 2 and rec["kv_bytes"] == 4096
    assert w.cluster.switch_kv == {}  # one switch's moves, not the next one's
