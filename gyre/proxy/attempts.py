"""One attempt on one engine: the ``/generate`` request, plain or streamed, under hard limits.

Silence is the fault to catch here: no first data within ``first_byte_timeout`` or nothing
between stream chunks for ``idle_timeout`` raises :class:`EngineSilent`. Between those limits,
every ``probe_after`` seconds of waiting the engine must answer a cheap liveness probe (one per
engine at a time, shared by the calls waiting on it), so a frozen engine is found long before a
generous read timeout runs out. Which engine an attempt goes to, and what happens after it
fails, is the pool's business (:mod:`gyre.proxy.pool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from gyre.engine.client import EngineClient, EngineProtocolError, auth_headers
from gyre.proxy import jsonfast
from gyre.proxy.config import PoolConfig
from gyre.proxy.counters import PoolCounters
from gyre.proxy.enginefaults import EngineBroke, EngineSilent
from gyre.proxy.enginewire import (
    JSON_HEADERS,
    PartsPayload,
    error_code,
    peek,
    raise_engine_error,
    unpack_checked,
)

log = logging.getLogger("gyre.proxy.pool")  # the pool's log: one name to filter its engines by

EngineState = Literal["active", "draining", "lost"]
"""``lost``: the heartbeat found it dead or frozen (:mod:`gyre.proxy.heartbeat`); no call is
routed there and the calls it held were abandoned and resumed elsewhere."""


@dataclass(eq=False)
class InFlight:
    rid: str
    execution_id: str
    engine: EngineHandle
    moving: bool = False
    abort_sent: float = 0.0


@dataclass(eq=False)
class EngineHandle:
    url: str
    session: aiohttp.ClientSession  # the /generate hot path (see open_engine)
    ctl: EngineClient
    engine_id: str
    kv_migration: bool = False  # its model info says it parks, exports and imports K/V
    migrating: int = 0  # calls drained off it whose K/V is being moved (a drain waits for them)
    state: EngineState = "active"
    inflight: set = field(default_factory=set)
    failures: int = 0
    served: int = 0
    down_until: float = 0.0  # after a broken connection, routed to only when no other engine is up
    streak: int = 0  # consecutive broken attempts (the back-off grows with it)
    suspect: str | None = None  # the last protocol violation seen (cleared by a good answer)
    last_alive: float = 0.0  # time.monotonic() of the last byte or probe answer from it
    probe: asyncio.Task | None = None  # the liveness probe in flight, shared by waiting calls
    beat: asyncio.Task | None = None  # the heartbeat's ping in flight
    lost_at: float = 0.0  # time.monotonic() when the heartbeat declared it lost
    state_before_lost: EngineState = "active"  # what it returns to when it answers again
    gone: asyncio.Future | None = None  # set when it is declared lost: ends waits on it at once
    readers: set = field(default_factory=set)  # timeouts of stream reads waiting on it (to cut)

    @property
    def lost(self) -> bool:
        return self.state == "lost"

    def abandon(self) -> None:
        """End every wait on this engine now (it was declared lost): each attempt's read or
        request wakes up, sees ``state == "lost"`` and breaks off, so its call moves on with the
        tokens received so far instead of waiting on a stopped process."""
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)
        self.gone = None
        now = asyncio.get_running_loop().time()
        for cm in list(self.readers):
            with contextlib.suppress(RuntimeError):  # expired or exiting already: it wakes anyway
                cm.reschedule(now)

    def gone_future(self) -> asyncio.Future:
        if self.gone is None:
            self.gone = asyncio.get_running_loop().create_future()
        return self.gone


async def open_engine(url: str, config: PoolConfig, api_key: str | None) -> EngineHandle:
    """The handle of the engine at ``url``: its ``/generate`` session and its control client."""
    # /generate goes through aiohttp: ~0.5 ms of CPU a request against ~2 ms for httpx, and no
    # pool scan per request (httpcore's made hundreds of concurrent executions quadratic). Idle
    # connections expire before the engine server's keep-alive (uvicorn: 5 s) closes them, so a
    # request never goes out on a connection the engine is closing.
    connector = aiohttp.TCPConnector(
        limit=0, keepalive_timeout=2.0, socket_factory=_big_send_buffer
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=10.0, sock_read=config.engine_timeout_s
    )
    session = aiohttp.ClientSession(
        base_url=url,
        connector=connector,
        timeout=timeout,
        read_bufsize=1 << 20,
        headers=auth_headers(api_key),
    )
    ctl = EngineClient(
        url, read_timeout=30.0, api_key=api_key
    )  # control calls; a frozen engine cannot hang them
    engine_id = url
    kv = False
    try:
        info = await asyncio.wait_for(ctl.model_info(), 10.0)
        engine_id = info.engine_id or url
        kv = bool(info.kv_migration)
    except Exception as e:  # an engine that is still starting: keep its URL as id
        log.warning("engine %s: model info unavailable (%s)", url, e)
    # counted alive from now: one that never answers is declared lost after engine_lost_after_s
    return EngineHandle(
        url=url,
        session=session,
        ctl=ctl,
        engine_id=engine_id,
        kv_migration=kv,
        last_alive=time.monotonic(),
    )


def _big_send_buffer(addr_info) -> socket.socket:
    """Engine connections get a large send buffer: a 500K-token request (~3 MB of ids) then goes
    to the kernel in one send instead of being trickled out of a Python buffer, loop turn by turn."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    try:
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20
        )  # the kernel caps it at wmem_max
    except OSError:
        pass
    return sock


async def abort_quietly(engine: EngineHandle, rid: str) -> None:
    try:
        await engine.ctl.abort(rid)
    except Exception:
        pass


class Attempts:
    """Runs attempts on engines with the pool's limits, counting probes in the pool's counters."""

    def __init__(self, config: PoolConfig, counters: PoolCounters) -> None:
        self.config = config
        self.counters = counters

    # -- waiting on an engine: hard limits, and liveness probes in between ----------------------
    async def alive(self, engine: EngineHandle) -> bool:
        """Does the engine answer a cheap control request? One probe per engine at a time, shared
        by every call waiting on it; an engine that sent anything lately counts as alive."""
        if (
            self.config.engine_probe_after_s is None
            or time.monotonic() - engine.last_alive < self.config.engine_probe_after_s
        ):
            return True
        if engine.probe is None or engine.probe.done():
            engine.probe = asyncio.get_running_loop().create_task(self._probe(engine))
        return await asyncio.shield(engine.probe)

    async def _probe(self, engine: EngineHandle) -> bool:
        self.counters.probes += 1
        try:
            ok = await asyncio.wait_for(engine.ctl.ping(), self.config.engine_probe_timeout_s)
        except Exception:  # timeout, refused, reset: no sign of life
            ok = False
        if ok:
            engine.last_alive = time.monotonic()
        else:
            self.counters.probes_failed += 1
        return ok

    def _frozen(self, what: str) -> EngineSilent:
        return EngineSilent(
            f"{what}: silent for {self.config.engine_probe_after_s:g} s and no answer to a liveness probe "
            f"within {self.config.engine_probe_timeout_s:g} s (frozen?)"
        )

    async def _await(self, engine: EngineHandle, aw: Any, limit_at: float | None, what: str):
        """Await ``aw`` (run as a task) until ``limit_at`` (loop time; None: no limit); every
        ``probe_after`` seconds of waiting the engine must answer a probe. Raises EngineSilent."""
        loop = asyncio.get_running_loop()
        fut = asyncio.ensure_future(aw)
        try:
            while True:
                until = limit_at
                if self.config.engine_probe_after_s is not None:
                    p = loop.time() + self.config.engine_probe_after_s
                    until = p if until is None else min(until, p)
                done, _ = await asyncio.wait(
                    {fut, engine.gone_future()},
                    timeout=None if until is None else max(until - loop.time(), 0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if fut in done:
                    return fut.result()
                if engine.lost:
                    raise EngineBroke(f"{what}: engine lost (heartbeat)")
                if limit_at is not None and loop.time() >= limit_at:
                    raise EngineSilent(f"{what}: no answer within the read timeout")
                if not await self.alive(engine):
                    raise self._frozen(what)
        finally:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():  # it ended as the engine was declared lost: its answer or
                fut.exception()  # error lost the race; retrieved, so asyncio never logs it
                # ("Task exception was never retrieved" with a traceback, seen when a core died)

    async def _read_some(self, engine: EngineHandle, resp: Any, limit_at: float | None) -> bytes:
        """The next bytes of a stream (b"" at its end), with the same limits as :meth:`_await`;
        aiohttp's ``readany`` is cancel-safe, so no task is made per chunk."""
        loop = asyncio.get_running_loop()
        while True:
            if engine.lost:
                raise EngineBroke("the stream: engine lost (heartbeat)")
            until = limit_at
            if self.config.engine_probe_after_s is not None:
                p = loop.time() + self.config.engine_probe_after_s
                until = p if until is None else min(until, p)
            cm = asyncio.timeout_at(until)
            engine.readers.add(cm)  # the heartbeat cuts the wait when it declares the engine lost
            try:
                async with cm:
                    data = await resp.content.readany()
                engine.last_alive = time.monotonic()
                return data
            except TimeoutError:
                if not cm.expired():
                    raise
            finally:
                engine.readers.discard(cm)
            if engine.lost:
                continue
            if limit_at is not None and loop.time() >= limit_at:
                raise EngineSilent("the stream went silent past its read timeout")
            if not await self.alive(engine):
                raise self._frozen("the stream")

    # -- the attempts ---------------------------------------------------------------------------
    async def plain(self, engine: EngineHandle, body: PartsPayload):
        async def request() -> tuple[bytes, int]:
            async with engine.session.post("/generate", data=body, headers=JSON_HEADERS) as resp:
                return await resp.read(), resp.status

        loop = asyncio.get_running_loop()
        first = self.config.engine_first_byte_timeout_s
        try:
            raw, status = await self._await(
                engine, request(), None if first is None else loop.time() + first, "the answer"
            )
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineBroke(f"{type(e).__name__}: {e}") from e
        engine.last_alive = time.monotonic()
        if status >= 400:
            raise_engine_error(status, raw.decode("utf-8", "replace"), engine.url)
        try:
            data = jsonfast.loads(raw)
        except ValueError:
            raise EngineProtocolError(f"the answer is not JSON: {peek(raw)}") from None
        if isinstance(data, list) and data:
            data = data[0]
        return unpack_checked(data)

    async def stream(self, engine: EngineHandle, body: PartsPayload):
        first, idle = self.config.engine_first_byte_timeout_s, self.config.engine_idle_timeout_s
        loop = asyncio.get_running_loop()
        deadline = None if first is None else loop.time() + first
        try:
            resp = await self._await(
                engine,
                engine.session.post("/generate", data=body, headers=JSON_HEADERS),
                deadline,
                "the stream",
            )
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineBroke(f"{type(e).__name__}: {e}") from e
        try:
            async with resp:
                if resp.status >= 400:
                    raw = await resp.read()
                    raise_engine_error(resp.status, raw.decode("utf-8", "replace"), engine.url)
                ctype = resp.headers.get("content-type", "")
                if not ctype.startswith("text/event-stream"):
                    raw = await resp.content.read(300)
                    raise EngineProtocolError(
                        f"a stream request was answered with {ctype or 'no content-type'} "
                        f"instead of text/event-stream: {peek(raw)}"
                    )
                buf = b""
                got_data = False
                while True:  # SSE lines of any length
                    if got_data:
                        limit_at = None if idle is None else loop.time() + idle
                    else:
                        limit_at = deadline
                    chunk = await self._read_some(engine, resp, limit_at)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        got_data = True
                        try:
                            data = jsonfast.loads(payload)
                        except ValueError:
                            raise EngineProtocolError(
                                f"a stream event is not JSON: {peek(payload)}"
                            ) from None
                        if isinstance(data, dict) and "error" in data:
                            err = data["error"]
                            code = (
                                error_code(err.get("code", 500)) if isinstance(err, dict) else 500
                            )
                            raise_engine_error(code, str(err), engine.url)
                        yield unpack_checked(data)
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineBroke(f"{type(e).__name__}: {e}") from e
