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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import aiohttp.payload

from gyre.engine.client import EngineClient
from gyre.proxy import jsonfast
from gyre.proxy.errors import ApiError
from gyre.trace.record import OutputSegment

log = logging.getLogger("gyre.proxy.pool")


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
    state: str = "active"  # active | draining
    inflight: set = field(default_factory=set)
    failures: int = 0
    served: int = 0
    down_until: float = 0.0  # after a broken connection, routed to only when no other engine is up
    streak: int = 0  # consecutive broken attempts (the back-off grows with it)


@dataclass
class GenResult:
    output_ids: list[int]
    logprobs: list[float]
    segments: list[OutputSegment]
    finish: str  # stop | length | abort
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
        *,
        read_timeout: float | None = None,
        max_resumes: int = 16,
        wait_for_engine_s: float = 600.0,
    ) -> None:
        self._urls = [u.rstrip("/") for u in urls]
        self.read_timeout = read_timeout
        self.max_resumes = max_resumes
        self.wait_for_engine_s = wait_for_engine_s
        self.engines: dict[str, EngineHandle] = {}
        self.affinity: dict[str, str] = {}
        self.counters = {"requests": 0, "moved": 0, "engine_errors": 0}
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
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.read_timeout)
        session = aiohttp.ClientSession(
            base_url=url, connector=connector, timeout=timeout, read_bufsize=1 << 20
        )
        ctl = EngineClient(url)
        engine_id = url
        try:
            info = await ctl.model_info()
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
        deadline = time.monotonic() + self.wait_for_engine_s
        while True:
            e = self.pick(execution_id, avoid)
            if e is not None:
                return e
            if time.monotonic() > deadline:
                raise ApiError(503, "no inference engine is available", "overloaded")
            ev = self._changed
            try:
                await asyncio.wait_for(ev.wait(), timeout=0.5)
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
        self.counters["moved"] += moved
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
    ) -> AsyncIterator[tuple[list[int], list[float]] | GenResult]:
        """Yield ``(new_ids, new_logprobs)`` pieces as they are sampled, then one :class:`GenResult`.

        Survives drains and engine failures by resuming elsewhere with the tokens
        generated so far. Cancelling the consumer aborts the engine request.
        """
        self.counters["requests"] += 1
        out_ids: list[int] = []
        out_lps: list[float] = []
        segments: list[OutputSegment] = []
        budget = int(sampling.get("max_new_tokens", 128))
        avoid: EngineHandle | None = None
        moves = 0
        while True:
            engine = await self._wait_engine(execution_id, avoid)
            rid = f"gyre-{uuid.uuid4().hex[:16]}"
            f = InFlight(rid=rid, execution_id=execution_id, engine=engine)
            sp = dict(sampling, max_new_tokens=max(budget - len(out_ids), 0))
            body = self._body(rid, input_parts, out_ids, sp, stream)
            start = len(out_ids)
            finish: str | None = None
            version_marks: list[tuple[int, int]] = []
            broke = False
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
            except _EngineBroke as err:
                broke = True
                engine.failures += 1
                engine.streak += 1
                engine.down_until = time.monotonic() + min(
                    30.0, 0.5 * 2 ** min(engine.streak - 1, 6)
                )
                self.counters["engine_errors"] += 1
                log.warning(
                    "engine %s failed mid-request (%s); resuming elsewhere", engine.url, err
                )
            finally:
                engine.inflight.discard(f)
                if not done and not broke:  # cancelled (client went away): free the engine's slot
                    asyncio.get_running_loop().create_task(self._abort_quietly(engine, rid))
            engine.served += 1
            if not broke:
                engine.streak = 0
            if len(out_ids) > start:
                segments.extend(_segments(start, len(out_ids), engine.engine_id, version_marks))
            if broke or finish == "abort" or finish is None:
                moves += 1
                if moves > self.max_resumes:
                    raise ApiError(
                        503, f"request moved {moves} times without finishing", "overloaded"
                    )
                if len(out_ids) >= budget:
                    finish = "length"
                else:
                    avoid = engine if (broke or f.moving) else None
                    continue
            yield GenResult(out_ids, out_lps, _merge(segments), finish, moves)
            return

    async def _abort_quietly(self, engine: EngineHandle, rid: str) -> None:
        try:
            await engine.ctl.abort(rid)
        except Exception:
            pass

    async def _plain_attempt(self, engine: EngineHandle, body: PartsPayload):
        try:
            async with engine.session.post("/generate", data=body, headers=_JSON) as resp:
                raw = await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as e:
            raise _EngineBroke(f"{type(e).__name__}: {e}") from e
        if status >= 400:
            _raise_engine_error(status, raw.decode("utf-8", "replace"), engine)
        data = jsonfast.loads(raw)
        if isinstance(data, list):
            data = data[0]
        return _unpack(data)

    async def _stream_attempt(self, engine: EngineHandle, body: PartsPayload):
        try:
            async with engine.session.post("/generate", data=body, headers=_JSON) as resp:
                if resp.status >= 400:
                    raw = await resp.read()
                    _raise_engine_error(resp.status, raw.decode("utf-8", "replace"), engine)
                buf = b""
                async for chunk in resp.content.iter_any():  # SSE lines of any length
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        data = jsonfast.loads(payload)
                        if isinstance(data, dict) and "error" in data:
                            err = data["error"]
                            code = int(err.get("code", 500)) if isinstance(err, dict) else 500
                            _raise_engine_error(code, str(err), engine)
                        yield _unpack(data)
        except (TimeoutError, aiohttp.ClientError) as e:
            raise _EngineBroke(f"{type(e).__name__}: {e}") from e


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
        left = self._size if content_length is None else min(content_length, self._size)
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


class _EngineBroke(Exception):
    pass


def _raise_engine_error(status: int, text: str, engine: EngineHandle) -> None:
    if 400 <= status < 500:
        raise ApiError(400, f"engine rejected the request: {text[:500]}")
    raise _EngineBroke(f"engine {engine.url} answered {status}: {text[:200]}")


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
        return [OutputSegment(start, end, engine_id, -1)]
    marks = sorted(marks)
    marks[0] = (0, marks[0][1])
    out = []
    for k, (i, v) in enumerate(marks):
        s = min(start + i, end)
        e = min(start + marks[k + 1][0], end) if k + 1 < len(marks) else end
        if e > s:
            out.append(OutputSegment(s, e, engine_id, v))
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
            out[-1] = OutputSegment(out[-1].start, s.end, s.engine_id, s.weights_version)
        else:
            out.append(s)
    return out
