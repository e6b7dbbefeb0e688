"""The run's proxy, owned in one place: its lifecycle, its pool, its admin calls, its counters.

``gyre run`` serves every harness through one :class:`gyre.proxy.runner.ProxyServer`, a thread
of the driver. The runtime asks four kinds of things of it, and before this class each asker
reached into the server's service and pool for them (``proxy.service.pool.counters``):

* lifecycle: start with the run's engine key and heartbeat listener, restart after a death
  (same address, admin socket, token, trace directory; the executions' keys carried over),
  stop; ``kill`` stops it the way a crash does (for fault tests);
* the pool: drain, add and remove an engine (the cell switches and the fault handlers);
* admin calls (register, revoke, count an execution's calls), retried while the proxy is
  down, after asking ``ensure`` (the world's watchdog) to bring it back: an execution must not
  fail to register, or lose its call tally, because the proxy was restarting;
* counters: calls answered and moved, the per-engine load the live view shows, the stats the
  report writes; plain reads of the proxy's objects in this process (no request).

The cluster builds it unstarted, so the world can wire ``ensure`` before the run starts.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from gyre.proxy.config import ProxyConfig
from gyre.proxy.heartbeat import EngineEvent
from gyre.proxy.runner import ProxyServer

T = TypeVar("T")

ADMIN_RETRY_S = 60.0  # how long an admin call waits for a restarting proxy


class ManagedProxy:
    """The proxy of one run segment, between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self._server: ProxyServer | None = None
        self._admin: Any = None  # its ProxyAdminClient, opened at the first admin call
        # awaited with the asker's name before a call needs the proxy serving (the world's
        # watchdog restarts a dead one there); None: nobody watches it
        self.ensure: Callable[[str], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(
        self,
        cfg: ProxyConfig,
        engine_key: str,
        on_event: Callable[[EngineEvent], object],
        tokenizer: Any = None,
    ) -> None:
        """Serve ``cfg`` with ``engine_key`` (the pool's key to every engine); ``on_event`` is
        called on the proxy's thread with each engine the heartbeat loses or finds back.
        ``tokenizer``: ``cfg.model_dir``'s, loaded already (None: loaded here)."""
        server = ProxyServer(cfg, tokenizer)
        server.set_engine_api_key(engine_key)
        server.on_engine_event(on_event)
        await asyncio.to_thread(server.start)
        self._server = server

    @property
    def started(self) -> bool:
        """Between ``start()`` and ``stop()`` (serving or not)."""
        return self._server is not None

    @property
    def alive(self) -> bool:
        """Serving now (started, and its thread has not ended)."""
        return self._server is not None and self._server.alive

    @property
    def error(self) -> BaseException | None:
        """What ended its thread, when it crashed."""
        return getattr(self._server, "_error", None)

    @property
    def url(self) -> str:
        return self._live.url

    @property
    def port(self) -> int | None:
        return self._live.port

    @property
    def admin_socket(self) -> str:
        """The admin routes' unix socket (harnesses never reach it)."""
        return self._live.admin_socket

    @property
    def admin_token(self) -> str:
        return self._live.admin_token

    @property
    def _live(self) -> ProxyServer:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._server

    async def restart(self) -> None:
        """Bring it back after it died: same address, admin socket, token, trace directory and
        engines, the executions' keys carried over (``ProxyServer.restart``)."""
        await asyncio.to_thread(self._live.restart)

    def kill(self) -> None:
        """Stop at once, as a crash does (``ProxyServer.kill``): for fault tests."""
        self._live.kill()

    async def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None

    async def serving(self, who: str) -> None:
        """Return once it serves (``ensure`` restarts a dead one first)."""
        if self.ensure is not None:
            await self.ensure(who)

    # ------------------------------------------------------------------ the pool
    async def drain(self, url: str) -> int:
        """Take ``url`` out of routing and move its calls; returns how many moved."""
        return await asyncio.to_thread(self._live.drain, url)

    def last_drain(self, url: str) -> dict[str, Any]:
        """What ``url``'s last drain moved with K/V migration (``kv_migrated``, ``kv_bytes``,
        ``kv_tokens``, ``kv_transfer_s``, ``kv_saved_s``, ``kv_fallbacks``), for the switch's
        record; empty before any drain of it."""
        if self._server is None:
            return {}
        got = dict(self._server.service.pool.drains.get(url.rstrip("/"), {}))
        got.pop("moved", None)  # the drain's return value already says it
        return got

    async def add_engine(self, url: str) -> None:
        await asyncio.to_thread(self._live.add_engine, url)

    async def remove_engine(
        self, url: str, timeout: float | None = None, why: str | None = None
    ) -> None:
        """``url`` leaves the pool (drained first); ``why``: it is known dead or hung, so its
        calls move at once."""
        await asyncio.to_thread(self._live.remove_engine, url, timeout, why)

    # ------------------------------------------------------------------ admin calls
    async def register(self, execution_id: str, label: str) -> str:
        """A key for a new execution (its calls are traced under ``execution_id``)."""
        return await self._admin_call("register", execution_id, label)

    async def revoke(self, execution_id: str) -> None:
        """The execution's key dies; its trace file is closed."""
        await self._admin_call("revoke", execution_id)

    async def calls(self, execution_id: str) -> dict[str, Any]:
        """The proxy's tally of the execution's model calls."""
        return await self._admin_call("calls", execution_id)

    async def _admin_call(self, op: str, *args: Any) -> Any:
        if self._admin is None:
            self._admin = self._live.admin_client()
        fn = getattr(self._admin, op)
        deadline = time.monotonic() + ADMIN_RETRY_S
        while True:
            try:
                return await asyncio.to_thread(fn, *args)
            except httpx.TransportError:  # refused or cut: the proxy is down or restarting
                if time.monotonic() > deadline:
                    raise
            await self.serving("admin_call")
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------------ counters
    def answered(self) -> int:
        """Calls answered so far (a restart carries the counters over)."""
        return int(self._live.service.counters.answered)

    def moved(self) -> int:
        """Calls the pool moved to another engine so far (0 before it starts)."""
        return self._server.service.pool.counters.moved if self._server is not None else 0

    def load(self) -> dict[str, Any]:
        """Per engine URL ``(executions it holds, calls in flight)``, and the counters the live
        view shows: read from the proxy's objects in this process (a plain read of its dicts
        under the GIL), no request."""
        if self._server is None:
            return {"engines": {}}
        svc = self._server.service
        pool = svc.pool
        held = Counter(list(pool.affinity.values()))
        return {
            "engines": {
                u.rstrip("/"): (held.get(u, 0), len(e.inflight))
                for u, e in list(pool.engines.items())
            },
            "rerouted": pool.counters.moved,
            "engine_errors": pool.counters.engine_errors + pool.counters.engine_timeouts,
            "errors_5xx": svc.counters.errors_5xx,
        }

    def stats(self) -> dict[str, Any]:
        """The proxy's own statistics (counters, pool, executions), for the run's report."""
        return self._server.service.stats() if self._server is not None else {}
