"""The proxy that dies is restarted: same address, admin socket, token and trace directory.

The proxy is a thread of the driver (:class:`gyre.proxy.runner.ProxyServer`); if it ends (a
crash, or :meth:`ProxyServer.kill` from a test rig), harnesses see refused or cut
connections and every engine switch would fail. Whether that thread lives is read in this
process at no cost, so the watchdog looks every ``min(run.fault.heartbeat_s, 0.25 s)``, and
whoever is about to use the proxy (an engine switch, an admin call) asks it first
(:meth:`ProxyWatchdog.ensure`). A dead proxy is restarted through
:meth:`gyre.runtime.cluster.Cluster.restart_proxy` (:mod:`gyre.proxy.restart` carries the
run's keys, call tallies and execution states over), and the restart is a fault record
(``kind = "proxy"``) next to the cells' in ``summary.json``.

Calls in flight when it died are retried by the harnesses' clients (a cut connection, then a
refused one while it restarts); an answered call whose answer was cut is replayed from the
carried retry window, so the traces keep one record per answered call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import httpx

from gyre.cli_errors import first_line
from gyre.runtime.config import FaultConfig
from gyre.runtime.records import Records

T = TypeVar("T")

POLL_S = 0.25  # the thread's liveness is a local read: looked at this often (at most heartbeat_s)
ADMIN_RETRY_S = 60.0  # how long an admin call waits for a restarting proxy


class ProxyHost(Protocol):
    """The owner of the managed proxy (the cluster): the proxy now (None before it starts and
    after it stops) and how to bring it back."""

    @property
    def proxy(self) -> Any: ...

    async def restart_proxy(self) -> None: ...


class ProxyWatchdog:
    """Watches ``host.proxy``; restarts it when it died, once per death."""

    def __init__(
        self, cfg: FaultConfig, host: ProxyHost, records: Records, now: Callable[[], float]
    ) -> None:
        self.cfg, self.host, self.records, self.now = cfg, host, records, now
        self._lock = asyncio.Lock()
        self.restarts = 0

    async def run(self) -> None:
        every = min(self.cfg.heartbeat_s, POLL_S)
        while True:
            await asyncio.sleep(every)
            await self.ensure("watchdog")

    async def ensure(self, where: str) -> None:
        """The proxy serves when this returns (restarted here if it had died)."""
        async with self._lock:
            proxy = self.host.proxy
            if proxy is None or proxy.alive:
                return
            await self._restart(where)

    async def _restart(self, where: str) -> None:
        proxy = self.host.proxy
        now = self.now()
        cause = getattr(proxy, "_error", None)
        rec = self.records.fault(
            cell=None,
            kind="proxy",
            role="proxy",
            at=now,
            detected_by=where,
            cause=first_line(cause)[:200] if cause else "proxy thread ended",
            action="restart",
        )
        t0 = time.perf_counter()
        answered0 = _answered(proxy)
        await self.host.restart_proxy()
        self.restarts += 1
        self.records.complete(
            rec,
            restart_s=round(time.perf_counter() - t0, 3),
            back=round(self.now(), 3),
            answered_before=answered0,  # carried over: the counters go on from here
            port=proxy.port,
        )


def _answered(proxy: Any) -> int:
    """Calls the proxy answered so far (its counters are carried over by a restart)."""
    return int(proxy.service.counters.answered)


async def admin_call(fn: Callable[..., T], *args: Any, watchdog: ProxyWatchdog | None) -> T:
    """``fn(*args)`` on the proxy's admin socket in a thread, retried while the proxy is down
    (a refused or cut connection) for up to ``ADMIN_RETRY_S``: an execution must not fail to
    register, or lose its call tally, because the proxy was restarting."""
    deadline = time.monotonic() + ADMIN_RETRY_S
    while True:
        try:
            return await asyncio.to_thread(fn, *args)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        if watchdog is not None:
            await watchdog.ensure("admin_call")
        await asyncio.sleep(0.1)
