"""Where the cells' gloo world meets (gyre/runtime/rendezvous.py): a fresh file in the driver's
private folder when every cell sees that folder, else None (a TCPStore across machines)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gyre.runtime.cell import Cell
from gyre.runtime.rendezvous import Rendezvous


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    async def remote(self, *args):
        return self.fn(*args)


class _Cell:
    """A cell handle whose ``sees`` runs Cell.sees here, or answers as a cell elsewhere would."""

    def __init__(self, elsewhere: bool = False):
        self.sees = _Remote(lambda f, t: False if elsewhere else Cell.sees(None, f, t))  # type: ignore[arg-type]


def test_one_machine_gets_a_fresh_private_file_per_world():
    rdv = Rendezvous()
    try:
        first = asyncio.run(rdv.store_file([_Cell(), _Cell(), _Cell()]))
        again = asyncio.run(rdv.store_file([_Cell(), _Cell(), _Cell()]))  # a rebuild
        assert first and again and first != again
        folder = Path(first).parent
        assert folder == Path(again).parent and folder.stat().st_uid == os.geteuid()
        assert folder.stat().st_mode & 0o777 == 0o700
        assert not Path(first).exists()  # torch makes it; nothing stale is there
    finally:
        rdv.close()
    assert not folder.exists()


def test_a_cell_on_another_machine_keeps_the_tcp_rendezvous():
    rdv = Rendezvous()
    try:
        assert asyncio.run(rdv.store_file([_Cell(), _Cell(elsewhere=True)])) is None
        assert Cell.sees(None, "/nonexistent", rdv.token) is False  # type: ignore[arg-type]
    finally:
        rdv.close()


def test_the_tcp_rendezvous_can_be_asked_for(monkeypatch):
    monkeypatch.setenv("GYRE_RENDEZVOUS", "tcp")
    rdv = Rendezvous()
    assert asyncio.run(rdv.store_file([_Cell(), _Cell()])) is None
    rdv.close()
