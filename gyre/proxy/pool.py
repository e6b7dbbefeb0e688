"""A pool of engines: session affinity, least-loaded placement, drain with resume.

Requests go to engines over the SGLang ``/generate`` protocol. The body is
assembled from pre-serialised JSON bytes (the prefix ids of a long context are
cached as JSON by the session), so sending a 500K-token input costs a memcpy,
not half a million ``int -> str`` conversions.

``drain(url)``: the engine gets no new requests; each in-flight request is
aborted there (the engine answers with the tokens generated so far) and
re-issued to another engine with the prompt plus those tokens, asking only for
the remaining budget. The client's output is the concatenation, token for
token, with each piece's log-probs as sampled; the trace gets one output
segment per engine. The client sees one slower call, never an error.

Engine faults (see :mod:`gyre.proxy.enginefaults` for the policy):

* broken connection or 5xx: the call moves to another engine with its output so
  far; when no other engine is up it retries with exponential back-off and jitter,
  within a number of attempts and a time budget, then answers 503 (``Retry-After``).
* silence: no first data within ``first_byte_timeout`` or nothing between stream
  chunks for ``idle_timeout`` (a frozen engine) counts as a broken attempt; when the
  retries run out the answer is 504.
* a protocol violation (a stream request answered with a plain body, data that is
  not the ``/generate`` JSON) is not transient: 502 naming it, no retry, and the
  engine is marked suspect (routed to only when no other engine is up).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import aiohttp.payload

from gyre.engine.client import EngineClient, EngineProtocolError, auth_headers
from gyre.proxy import jsonfast
from gyre.proxy.config import PoolConfig
from gyre.proxy.counters import PoolCounters
from gyre.proxy.enginefaults import (
    Backoff,
    CallFaults,
    EngineBroke,
    EngineSilent,
    protocol_error,
)
from gyre.proxy.errors import ApiError
from gyre.trace.record import OutputSegment

log = logging.getLogger("gyre.proxy.pool")

EngineState = Literal["active", "draining"]
GenFinish = Literal["stop", "length"]


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
    session: aiohttp.ClientSession  # the /generate hot path (see EnginePool.add)
    ctl: EngineClient
    engine_id: str
    state: EngineState = "active"
    inflight: set = field(default_factory=set)
    failures: int = 0
    served: int = 0
    down_until: float = 0.0  # after a broken connection, routed to only when no other engine is up
    streak: int = 0  # consecutive broken attempts (the back-off grows with it)
    suspect: str | None = None  # the last protocol violation seen (cleared by a good answer)
    last_alive: float = 0.0  # time.monotonic() of the last byte or probe answer from it
    probe: asyncio.Task | None = None  # the liveness probe in flight, shared by waiting calls


@dataclass
class GenResult:
    output_ids: list[int]
    logprobs: list[float]
    segments: list[OutputSegment]
    finish: GenFinish  # an engine's "abort" is a move, never a result
    moves: int = 0


def _version(v: Any) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return -1  # SGLang's "default" and other non-numeric labels


class EnginePool:
    def __init__(
        self,
        urls: list[str],
        config: PoolConfig | None = None,
    ) -> None:
        self._urls = [u.rstrip("/") for u in urls]
        self.config = cfg = config or PoolConfig()
        self.backoff = Backoff(
            max_attempts=cfg.engine_max_attempts, budget_s=cfg.engine_retry_budget_s
        )
        self._rng = random.Random()
        # the engines' API key (None: $GYRE_ENGINE_API_KEY, or none); `gyre run` sets it before
        # start() from the run's secret, which never enters the environment harnesses inherit
        self.api_key: str | None = None
        self.engines: dict[str, EngineHandle] = {}
        self.affinity: dict[str, str] = {}
        self.counters = PoolCounters()
        self._rr = itertools.count()
        self._changed: asyncio.Event | None = None

    async def start(self) -> None:
        self._changed = asyncio.Event()
        for u in self._urls:
            await self.add(u)

    async def aclose(self) -> None:
        for e in list(self.engines.values()):
            await e.session.close()
            await e.ctl.aclose()
        self.engines.clear()

    # -- membership ---------------------------------------------------------------------------
    async def add(self, url: str) -> EngineHandle:
        url = url.rstrip("/")
        if url in self.engines:
            e = self.engines[url]
            e.state = "active"
            self._notify()
            return e
        # /generate goes through aiohttp: ~0.5 ms of CPU a request against ~2 ms for httpx, and no
        # pool scan per request (httpcore's made hundreds of concurrent executions quadratic). Idle
        # connections expire before the engine server's keep-alive (uvicorn: 5 s) closes them, so a
        # request never goes out on a connection the engine is closing.
        connector = aiohttp.TCPConnector(
            limit=0, keepalive_timeout=2.0, socket_factory=_big_send_buffer
        )
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10.0, sock_read=self.config.engine_timeout_s
        )
        session = aiohttp.ClientSession(
            base_url=url,
            connector=connector,
            timeout=timeout,
            read_bufsize=1 << 20,
            headers=auth_headers(self.api_key),
        )
        ctl = EngineClient(
            url, read_timeout=30.0, api_key=self.api_key
        )  # control calls; a frozen engine cannot hang them
        engine_id = url
        try:
            info = await asyncio.wait_for(ctl.model_info(), 10.0)
            engine_id = info.engine_id or url
        except Exception as e:  # an engine that is still starting: keep its URL as id
            log.warning("engine %s: model info unavailable (%s)", url, e)
        h = EngineHandle(url=url, session=session, ctl=ctl, engine_id=engine_id)
        self.engines[url] = h
        self._notify()
        return h

    def undrain(self, url: str) -> None:
        self.engines[url.rstrip("/")].state = "active"
        self._notify()

    async def remove(self, url: str) -> None:
        await self.drain(url)
        e = self.engines.pop(url.rstrip("/"), None)
        if e is not None:
            await e.session.close()
            await e.ctl.aclose()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "url": e.url,
                "engine_id": e.engine_id,
                "state": e.state,
                "inflight": len(e.inflight),
                "served": e.served,
                "failures": e.failures,
                "suspect": e.suspect,
            }
            for e in self.engines.values()
        ]

    # -- placement ----------------------------------------------------------------------------
    def pick(self, execution_id: str, avoid: EngineHandle | None = None) -> EngineHandle | None:
        """Same execution -> same engine while it is active (its KV prefix lives there); else least loaded."""
        url = self.affinity.get(execution_id)
        e = self.engines.get(url) if url else None
        if e is not None and e.state == "active" and e is not avoid:
            return e
        active = [x for x in self.engines.values() if x.state == "active" and x is not avoid]
        if not active:
            active = [x for x in self.engines.values() if x.state == "active"]
        if not active:
            return None
        now = time.monotonic()
        up = [x for x in active if x.down_until <= now]
        active = up or active  # an engine that just broke (killed, restarting) is tried last
        n = next(self._rr)
        best = min(active, key=lambda x: (len(x.inflight), (hash(x.url) + n) % 7919))
        self.affinity[execution_id] = best.url
        return best

    async def _wait_engine(self, execution_id: str, avoid: EngineHandle | None) -> EngineHandle:
        deadline = time.monotonic() + self.config.engine_wait_s
        while True:
            e = self.pick(execution_id, avoid)
            if e is not None:
                return e
            if time.monotonic() > deadline:
                raise ApiError(
                    503,
                    f"no inference engine joined the pool within {self.config.engine_wait_s:g} s",
                    "overloaded",
                    headers={"retry-after": "5"},
                )
            ev = self._changed
            assert ev is not None, "pool not started"
            try:  # woken by a pool change; never sleeps past the deadline
                await asyncio.wait_for(
                    ev.wait(), timeout=min(0.5, max(deadline - time.monotonic(), 0.01))
                )
            except TimeoutError:
                pass

    def forget(self, execution_id: str) -> None:
        self.affinity.pop(execution_id, None)

    # -- drain --------------------------------------------------------------------------------
    async def drain(self, url: str, timeout: float | None = None) -> int:
        """Stop routing to ``url`` and move its in-flight requests; returns how many were moved."""
        e = self.engines.get(url.rstrip("/"))
        if e is None:
            raise KeyError(f"unknown engine {url}")
        e.state = "draining"
        for ex, u in list(self.affinity.items()):
            if u == e.url:
                del self.affinity[ex]
        moved = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while e.inflight:
            now = time.monotonic()
            for f in list(e.inflight):
                if now - f.abort_sent > 0.25:  # re-sent: the engine may not have seen the rid yet
                    if not f.moving:
                        moved += 1
                    f.moving = True
                    f.abort_sent = now
                    try:
                        await e.ctl.abort(f.rid)
                    except (
                        Exception
                    ) as err:  # engine gone: the request's connection breaks and it moves
                        log.info("abort %s on %s: %s", f.rid, e.url, err)
            if deadline is not None and time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        self.counters.moved += moved
        return moved

    # -- generation ---------------------------------------------------------------------------
    @staticmethod
    def _body(
        rid: str,
        input_parts: list[bytes],
        extra_ids: list[int],
        sampling: dict[str, Any],
        stream: bool,
    ) -> PartsPayload:
        """The /generate body as pieces around the pre-serialised id pieces: the big (cached prefix)
        pieces are never joined or copied, they go to the socket as they are (:class:`PartsPayload`)."""
        out = [b'{"rid":' + jsonfast.dumps(rid) + b',"input_ids":[']
        first = True
        for p in input_parts:
            if p:
                if not first:
                    out.append(b",")
                out.append(p)
                first = False
        if extra_ids:
            if not first:
                out.append(b",")
            out.append(jsonfast.ids_json(extra_ids))
        out.append(
            b'],"sampling_params":'
            + jsonfast.dumps(sampling)
            + b',"return_logprob":true,"stream":'
            + (b"true" if stream else b"false")
            + b"}"
        )
        return PartsPayload(_coalesce(out))

    async def generate(
        self,
        execution_id: str,
        input_parts: list[bytes],
        input_len: int,
        sampling: dict[str, Any],
        *,
        stream: bool,
    ) -> AsyncGenerator[tuple[list[int], list[float]] | GenResult, None]:
        """Yield ``(new_ids, new_logprobs)`` pieces as they are sampled, then one :class:`GenResult`.

        Survives drains and engine failures by resuming elsewhere with the tokens
        generated so far. Cancelling the consumer aborts the engine request.
        """
        self.counters.requests += 1
        out_ids: list[int] = []
        out_lps: list[float] = []
        segments: list[OutputSegment] = []
        budget = int(sampling.get("max_new_tokens", 128))
        avoid: EngineHandle | None = None
        moves = 0
        faults = CallFaults(self.backoff)
        while True:
            engine = await self._wait_engine(execution_id, avoid)
            if faults.failures:
                now = time.monotonic()
                delay = faults.next_delay(engine.down_until <= now, now, self._rng)
                if delay > 0:  # no engine is up: back off before trying a failed one again
                    self.counters.backoff_waits += 1
                    await asyncio.sleep(delay)
                    engine = await self._wait_engine(execution_id, avoid)
            rid = f"gyre-{uuid.uuid4().hex[:16]}"
            f = InFlight(rid=rid, execution_id=execution_id, engine=engine)
            sp = dict(sampling, max_new_tokens=max(budget - len(out_ids), 0))
            body = self._body(rid, input_parts, out_ids, sp, stream)
            start = len(out_ids)
            finish: str | None = None
            version_marks: list[tuple[int, int]] = []
            broke = False
            silent = False
            engine.inflight.add(f)
            done = False
            try:
                if stream:
                    async with contextlib.aclosing(self._stream_attempt(engine, body)) as chunks:
                        async for ids, lps, fin, marks in chunks:
                            got = len(out_ids) - start
                            if len(ids) > got:
                                new_ids, new_lps = ids[got:], lps[got:]
                                out_ids.extend(new_ids)
                                out_lps.extend(new_lps)
                                yield new_ids, new_lps
                            if marks:
                                version_marks = marks
                            if fin is not None:
                                finish = fin
                else:
                    ids, lps, finish, version_marks = await self._plain_attempt(engine, body)
                    out_ids.extend(ids)
                    out_lps.extend(lps)
                    if ids:
                        yield ids, lps
                done = True
                if finish is None and not f.moving:  # not a drain's abort: the answer broke off
                    raise EngineBroke("the answer ended without a finish reason")
            except EngineBroke as err:
                broke = True
                silent = isinstance(err, EngineSilent)
                self._mark_broken(engine)
                if silent:
                    self.counters.engine_timeouts += 1
                else:
                    self.counters.engine_errors += 1
                faults.note(engine.url, err, time.monotonic())
                log.warning("engine %s failed (%s); trying again", engine.url, err)
            except EngineProtocolError as err:
                engine.failures += 1
                engine.suspect = str(err)[:300]
                engine.down_until = time.monotonic() + SUSPECT_S
                self.counters.protocol_errors += 1
                log.error("engine %s broke the /generate protocol: %s", engine.url, err)
                raise protocol_error(engine.url, str(err)) from None
            finally:
                engine.inflight.discard(f)
                if silent or (
                    not done and not broke
                ):  # cancelled, frozen or garbled: free the slot
                    asyncio.get_running_loop().create_task(self._abort_quietly(engine, rid))
            engine.served += 1
            if not broke:
                engine.streak = 0
                engine.suspect = None
            if len(out_ids) > start:
                segments.extend(_segments(start, len(out_ids), engine.engine_id, version_marks))
            if broke or finish == "abort" or finish is None:
                moves += 1
                if moves > self.config.max_resumes:
                    raise ApiError(
                        503,
                        f"request moved {moves} times without finishing",
                        "overloaded",
                        headers={"retry-after": "5"},
                    )
                if len(out_ids) >= budget:
                    finish = "length"
                else:
                    avoid = engine if (broke or f.moving) else None
                    continue
            yield GenResult(
                output_ids=out_ids,
                logprobs=out_lps,
                segments=_merge(segments),
                finish="length" if finish == "length" else "stop",
                moves=moves,
            )
            return

    def _mark_broken(self, engine: EngineHandle) -> None:
        """Routing hint: a broken engine is tried last for a while that grows with its streak."""
        engine.failures += 1
        engine.streak += 1
        engine.down_until = time.monotonic() + min(30.0, 0.5 * 2 ** min(engine.streak - 1, 6))

    async def _abort_quietly(self, engine: EngineHandle, rid: str) -> None:
        try:
            await engine.ctl.abort(rid)
        except Exception:
            pass

    # -- waiting on an engine: hard limits, and liveness probes in between ----------------------
    async def _alive(self, engine: EngineHandle) -> bool:
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
                    {fut}, timeout=None if until is None else max(until - loop.time(), 0)
                )
                if done:
                    return fut.result()
                if limit_at is not None and loop.time() >= limit_at:
                    raise EngineSilent(f"{what}: no answer within the read timeout")
                if not await self._alive(engine):
                    raise self._frozen(what)
        finally:
            if not fut.done():
                fut.cancel()

    async def _read_some(self, engine: EngineHandle, resp: Any, limit_at: float | None) -> bytes:
        """The next bytes of a stream (b"" at its end), with the same limits as :meth:`_await`;
        aiohttp's ``readany`` is cancel-safe, so no task is made per chunk."""
        loop = asyncio.get_running_loop()
        while True:
            until = limit_at
            if self.config.engine_probe_after_s is not None:
                p = loop.time() + self.config.engine_probe_after_s
                until = p if until is None else min(until, p)
            cm = asyncio.timeout_at(until)
            try:
                async with cm:
                    data = await resp.content.readany()
                engine.last_alive = time.monotonic()
                return data
            except TimeoutError:
                if not cm.expired():
                    raise
            if limit_at is not None and loop.time() >= limit_at:
                raise EngineSilent("the stream went silent past its read timeout")
            if not await self._alive(engine):
                raise self._frozen("the stream")

    async def _plain_attempt(self, engine: EngineHandle, body: PartsPayload):
        async def request() -> tuple[bytes, int]:
            async with engine.session.post("/generate", data=body, headers=_JSON) as resp:
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
            _raise_engine_error(status, raw.decode("utf-8", "replace"), engine)
        try:
            data = jsonfast.loads(raw)
        except ValueError:
            raise EngineProtocolError(f"the answer is not JSON: {_peek(raw)}") from None
        if isinstance(data, list) and data:
            data = data[0]
        return _unpack_checked(data)

    async def _stream_attempt(self, engine: EngineHandle, body: PartsPayload):
        first, idle = self.config.engine_first_byte_timeout_s, self.config.engine_idle_timeout_s
        loop = asyncio.get_running_loop()
        deadline = None if first is None else loop.time() + first
        try:
            resp = await self._await(
                engine,
                engine.session.post("/generate", data=body, headers=_JSON),
                deadline,
                "the stream",
            )
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineBroke(f"{type(e).__name__}: {e}") from e
        try:
            async with resp:
                if resp.status >= 400:
                    raw = await resp.read()
                    _raise_engine_error(resp.status, raw.decode("utf-8", "replace"), engine)
                ctype = resp.headers.get("content-type", "")
                if not ctype.startswith("text/event-stream"):
                    raw = await resp.content.read(300)
                    raise EngineProtocolError(
                        f"a stream request was answered with {ctype or 'no content-type'} "
                        f"instead of text/event-stream: {_peek(raw)}"
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
                                f"a stream event is not JSON: {_peek(payload)}"
                            ) from None
                        if isinstance(data, dict) and "error" in data:
                            err = data["error"]
                            code = _int(err.get("code", 500)) if isinstance(err, dict) else 500
                            _raise_engine_error(code, str(err), engine)
                        yield _unpack_checked(data)
        except (TimeoutError, aiohttp.ClientError) as e:
            raise EngineBroke(f"{type(e).__name__}: {e}") from e


_JSON = {"content-type": "application/json"}


BIG_PIECE = 64 << 10
"""Body pieces at least this long are written as they are; runs of smaller ones are joined first
(a write is a syscall, and joining a few KiB is cheaper than one)."""


def _coalesce(parts: list[bytes], big: int = BIG_PIECE) -> list[bytes]:
    out: list[bytes] = []
    run: list[bytes] = []
    for p in parts:
        if len(p) >= big:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out


class PartsPayload(aiohttp.payload.Payload):
    """A JSON request body given as byte pieces, written to the connection piece by piece.

    A 500K-token ``/generate`` body is ~3 MB, nearly all of it the cached JSON of the prefix ids;
    joining the pieces would copy it once more per call (and once per resume). The pieces are
    handed to the transport as they are (Content-Length is their total), so the only per-call
    copy left is the kernel's.
    """

    _autoclose = True  # bytes in memory, nothing to close

    def __init__(self, parts: list[bytes]) -> None:
        super().__init__(parts, content_type="application/json")
        self._size = sum(len(p) for p in parts)

    @property
    def parts(self) -> list[bytes]:
        return self._value

    def joined(self) -> bytes:
        return b"".join(self._value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.joined().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.joined()

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        size = self._size
        assert size is not None  # set by __init__ (aiohttp types it Optional)
        left = size if content_length is None else min(content_length, size)
        for p in self._value:
            if left <= 0:
                break
            if len(p) > left:
                p = p[:left]
            await writer.write(p)
            left -= len(p)


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


SUSPECT_S = 60.0
"""An engine that broke the protocol is routed to only when no other engine is up, this long."""


def _peek(raw: bytes) -> str:
    text = raw[:120].decode("utf-8", "replace")
    return repr(text) + ("..." if len(raw) > 120 else "")


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 500


def _raise_engine_error(status: int, text: str, engine: EngineHandle) -> None:
    if 400 <= status < 500:
        raise ApiError(400, f"engine rejected the request: {text[:500]}")
    raise EngineBroke(f"engine {engine.url} answered {status}: {text[:200]}")


def _unpack_checked(data: Any):
    """:func:`_unpack`, with anything that is not a ``/generate`` answer a protocol error."""
    if not isinstance(data, dict) or not isinstance(data.get("output_ids", []), list):
        raise EngineProtocolError(f"not a /generate answer: {_peek(jsonfast.dumps(data))}")
    try:
        return _unpack(data)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise EngineProtocolError(f"malformed /generate answer ({type(e).__name__}: {e})") from None


def _unpack(data: dict[str, Any]):
    meta = data.get("meta_info") or {}
    ids = [int(t) for t in data.get("output_ids") or []]
    lps_raw = meta.get("output_token_logprobs") or []
    lps = [float(x[0]) if x[0] is not None else 0.0 for x in lps_raw]
    if len(lps) < len(ids):  # an engine that did not return log-probs for every token
        lps = lps + [0.0] * (len(ids) - len(lps))
    fr = meta.get("finish_reason")
    finish = fr.get("type") if isinstance(fr, dict) else fr
    marks = [(int(i), _version(v)) for i, v in meta.get("weight_version_segments") or []]
    if not marks and meta.get("weight_version") is not None:
        marks = [(0, _version(meta["weight_version"]))]
    return ids, lps[: len(ids)], finish, marks


def _segments(
    start: int, end: int, engine_id: str, marks: list[tuple[int, int]]
) -> list[OutputSegment]:
    """Output ``[start, end)`` from one engine attempt, split where its weights version changed."""
    if not marks:
        return [OutputSegment(start=start, end=end, engine_id=engine_id, weights_version=-1)]
    marks = sorted(marks)
    marks[0] = (0, marks[0][1])
    out = []
    for k, (i, v) in enumerate(marks):
        s = min(start + i, end)
        e = min(start + marks[k + 1][0], end) if k + 1 < len(marks) else end
        if e > s:
            out.append(OutputSegment(start=s, end=e, engine_id=engine_id, weights_version=v))
    return out


def _merge(segs: list[OutputSegment]) -> list[OutputSegment]:
    out: list[OutputSegment] = []
    for s in segs:
        if (
            out
            and out[-1].engine_id == s.engine_id
            and out[-1].weights_version == s.weights_version
            and out[-1].end == s.start
        ):
            out[-1] = OutputSegment(
                start=out[-1].start,
                end=s.end,
                engine_id=s.engine_id,
                weights_version=s.weights_version,
            )
        else:
            out.append(s)
    return out
