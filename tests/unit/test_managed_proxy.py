"""The run's proxy has one owner (gyre.runtime.managed_proxy.ManagedProxy): admin calls wait for
a restarting proxy, counters read as zero before it starts, nothing reaches into its service."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

import httpx

from gyre.runtime.managed_proxy import ManagedProxy

ROOT = Path(__file__).resolve().parents[2]


class _Admin:
    """An admin client whose first call finds the proxy down (a refused connection)."""

    def __init__(self) -> None:
        self.tries = 0
        self.closed = False

    def register(self, execution_id: str, label: str) -> str:
        self.tries += 1
        if self.tries == 1:
            raise httpx.ConnectError("refused")
        return f"key-{execution_id}-{label}"

    def close(self) -> None:
        self.closed = True


def test_an_admin_call_asks_the_watchdog_and_is_retried_while_the_proxy_restarts():
    proxy = ManagedProxy()
    admin = _Admin()
    proxy._server = types.SimpleNamespace(admin_client=lambda: admin, alive=True)  # type: ignore[assignment]
    asked: list[str] = []

    async def ensure(who: str) -> None:
        asked.append(who)

    proxy.ensure = ensure
    assert asyncio.run(proxy.register("r0-g00001-a00", "main")) == "key-r0-g00001-a00-main"
    assert admin.tries == 2 and asked == ["admin_call"]
    proxy._server = None  # stop() closes the admin client it opened
    proxy._admin = admin
    asyncio.run(proxy.stop())
    assert admin.closed


def test_counters_before_the_proxy_starts():
    proxy = ManagedProxy()
    assert not proxy.started and not proxy.alive and proxy.error is None
    assert proxy.moved() == 0 and proxy.load() == {"engines": {}} and proxy.stats() == {}


def test_no_reach_into_the_proxys_service_outside_its_owner():
    """``proxy.service.pool.counters`` and the like are read in managed_proxy.py only."""
    reach = re.compile(r"proxy\w*\.service\.|\.service\.pool\b|\.service\.counters\b")
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for d in ("gyre/runtime", "bench")
        for p in sorted((ROOT / d).rglob("*.py"))
        if p.name != "managed_proxy.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if reach.search(line)
    ]
    assert not bad, bad
