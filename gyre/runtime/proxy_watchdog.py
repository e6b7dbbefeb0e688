"""The proxy that dies is restarted: same address, admin socket, token and trace directory.

The proxy is a thread of the driver (:class:`gyre.proxy.runner.ProxyServer`); if it ends (a
crash, or :meth:`ProxyServer.kill` from a test rig), harnesses see refused or cut
connections and every engine switch would fail. Whether that thread lives is read in this
process at no cost, so the watchdog looks every ``min(run.fault.heartbeat_s, 0.25 s)``, and
whoever is about to use the proxy (an engine switch, an admin call) asks it first
(:meth:`ProxyWatchdog.ensure`). A dead proxy is restarted through
:meth:`gyre.runtime.managed_proxy.ManagedProxy.restart` (:mod:`gyre.proxy.restart` carries the
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

from gyre.cli_errors import first_line
from gyre.runtime.config import FaultConfig
from gyre.runtime.managed_proxy import ManagedProxy
from gyre.runtime.records import Records

POLL_S = 0.25  # the thread's liveness is a local read: looked at this often (at most heartbeat_s)


class ProxyWatchdog:
    """Watches the run's proxy; restarts it when it died, once per death. It is the proxy's
    ``ensure``: whoever is about to use the proxy asks it first."""

    def __init__(
        self, cfg: FaultConfig, proxy: ManagedProxy, records: Records, now: Callable[[], float]
    ) -> None:
        self.cfg, self.proxy, self.records, self.now = cfg, proxy, records, now
        proxy.ensure = self.ensure
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
            if not self.proxy.started or self.proxy.alive:
                return
            await self._restart(where)

    async def _restart(self, where: str) -> None:
        proxy = self.proxy
        now = self.now()
        cause = proxy.error
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
        answered0 = proxy.answered()
        await proxy.restart()
        self.restarts += 1
        self.records.complete(
            rec,
            restart_s=round(time.perf_counter() - t0, 3),
            back=round(self.now(), 3),
            answered_before=answered0,  # carried over: the counters go on from here
            port=proxy.port,
        )
