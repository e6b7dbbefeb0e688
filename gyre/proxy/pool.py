"""A pool of engines: session affinity, least-loaded placement, drain with resume.

Requests go to engines over the SGLang ``/generate`` protocol (:mod:`gyre.proxy.enginewire`),
one attempt at a time (:mod:`gyre.proxy.attempts`); this module chooses the engine for each
attempt and decides what follows one that did not finish.

``drain(url)``: the engine gets no new requests; each in-flight request is
aborted there (the engine answers with the tokens generated so far) and
re-issued to another engine with the prompt plus those tokens, asking only for
the remaining budget. Where both engines can (embedded engines on the same
weights), the call's K/V moves with it and the new engine skips the prefill
(:mod:`gyre.proxy.kvmove`). The client's output is the concatenation, token for
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

Engine health (see :mod:`gyre.proxy.heartbeat`): an engine silent to the heartbeat for
``engine_lost_after_s`` is lost: out of routing at once, its calls abandoned there and resumed
elsewhere, and the pool's listeners told (``lost``, later ``back``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from gyre.engine.client import EngineProtocolError
from gyre.proxy.attempts import Attempts, EngineHandle, InFlight, abort_quietly, open_engine
from gyre.proxy.config import PoolConfig
from gyre.proxy.counters import PoolCounters
from gyre.proxy.enginefaults import (
    Backoff,
    CallFaults,
    EngineBroke,
    EngineSilent,
    protocol_error,
)
from gyre.proxy.enginewire import PartsPayload, generate_body, merge_segments, output_segments
from gyre.proxy.errors import ApiError
from gyre.proxy.heartbeat import EngineEvent, EngineListener, Heartbeat
from gyre.proxy.kvmove import move_kv
from gyre.trace.record import OutputSegment

log = logging.getLogger("gyre.proxy.pool")

GenFinish = Literal["stop", "length"]

SUSPECT_S = 60.0
"""An engine that broke the protocol is routed to only when no other engine is up, this long."""


@dataclass
class GenResult:
    output_ids: list[int]
    logprobs: list[float]
    segments: list[OutputSegment]
    finish: GenFinish  # an engine's "abort" is a move, never a result
    moves: int = 0


@dataclass
class _Output:
    """What one call has produced so far, across all its attempts."""

    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    segments: list[OutputSegment] = field(default_factory=list)


@dataclass
class _Attempt:
    """One try on one engine: where its output starts in the call's, and how it ended."""

    flight: InFlight
    start: int
    finish: str | None = None
    marks: list[tuple[int, int]] = field(default_factory=list)  # weights version changes
    broke: bool = False
    kv_from: EngineHandle | None = None  # drained off an engine that parked its K/V


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
        self.attempts = Attempts(cfg, self.counters)
        self._rr = itertools.count()
        self._changed: asyncio.Event | None = None
        self.heartbeat = Heartbeat(cfg, self.counters, lambda: self.engines, self.lose, self.back)
        self.listeners: list[EngineListener] = []  # told of every lost / back engine
        self.events: deque[EngineEvent] = deque(maxlen=256)  # the latest, for status readers
        self._closed_active: list[str] = []
        self.drains: dict[str, dict[str, Any]] = {}  # url -> what its last drain moved

    async def start(self) -> None:
        self._changed = asyncio.Event()
        for u in self._urls:
            await self.add(u)
        self.heartbeat.start()

    def active_urls(self) -> list[str]:
        """The engines calls are routed to (after :meth:`aclose`: those when it closed), which a
        restarted proxy starts with."""
        if self.engines:
            return [e.url for e in self.engines.values() if e.state == "active"]
        return list(self._closed_active)

    async def aclose(self) -> None:
        await self.heartbeat.aclose()
        self._closed_active = [e.url for e in self.engines.values() if e.state == "active"]
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
            e.last_alive = max(e.last_alive, time.monotonic())  # a lost one gets its grace again
            self._notify()
            return e
        h = await open_engine(url, self.config, self.api_key)
        self.engines[url] = h
        self._notify()
        return h

    def undrain(self, url: str) -> None:
        self.engines[url.rstrip("/")].state = "active"
        self._notify()

    async def remove(self, url: str, lost: str | None = None) -> None:
        """Out of the pool for good. ``lost``: why the caller knows the engine is dead or hung
        (a cell's heartbeat): its calls move now, as the engine heartbeat's loss moves them,
        instead of after aborts it cannot answer (a stopped process holds them until its kill
        lands: ~5 s for Ray's kill of a SIGSTOPped actor)."""
        e = self.engines.get(url.rstrip("/"))
        if lost is not None and e is not None and e.state != "lost":
            self.counters.moved += len(e.inflight)
            self.lose(e, lost)
        await self.drain(url)
        e = self.engines.pop(url.rstrip("/"), None)
        if e is not None:
            if e.beat is not None:
                e.beat.cancel()
            await e.session.close()
            await e.ctl.aclose()

    # -- health (the heartbeat decides, see gyre.proxy.heartbeat) ------------------------------
    def lose(self, e: EngineHandle, why: str, silent_s: float = 0.0) -> None:
        """Out of routing now; every call waiting on it breaks off and resumes elsewhere."""
        if e.state == "lost":
            return
        e.state_before_lost, e.state = e.state, "lost"
        e.lost_at = time.monotonic()
        e.failures += 1
        for ex, u in list(self.affinity.items()):
            if u == e.url:
                del self.affinity[ex]
        e.abandon()
        self.counters.engines_lost += 1
        log.warning("engine %s lost: %s (%d calls move)", e.url, why, len(e.inflight))
        self._emit(EngineEvent("lost", e.url, e.engine_id, time.time(), why, silent_s))
        self._notify()

    def back(self, e: EngineHandle) -> None:
        """A lost engine answered again: routed to again (unless ``engine_rejoin`` is off)."""
        if self.config.engine_rejoin:
            e.state = e.state_before_lost
            e.streak = 0
            e.down_until = 0.0
        self.counters.engines_back += 1
        away = time.monotonic() - e.lost_at
        log.warning("engine %s answers again after %.1f s lost", e.url, away)
        self._emit(
            EngineEvent(
                "back", e.url, e.engine_id, time.time(), f"answered after {away:.1f} s", 0.0
            )
        )
        self._notify()

    def _emit(self, ev: EngineEvent) -> None:
        self.events.append(ev)
        for listener in list(self.listeners):
            try:
                listener(ev)
            except Exception:  # a listener's bug must not stop the heartbeat
                log.exception("engine event listener failed on %s", ev)

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
                "silent_s": round(time.monotonic() - e.last_alive, 3),
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
        if e.state == "lost":  # its calls were abandoned already; nothing there answers aborts
            e.state_before_lost = "draining"
            return 0
        e.state = "draining"
        for ex, u in list(self.affinity.items()):
            if u == e.url:
                del self.affinity[ex]
        moved = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        keep_kv = e.kv_migration and self.config.kv_migration
        kv0 = self._kv_counts()
        # a call's K/V leaves before the drain ends (the engine is stopped after it), but a
        # call waiting for another engine to appear holds the drain at most this long
        kv_until: float | None = None
        while e.inflight or e.migrating:
            now = time.monotonic()
            if not e.inflight:
                kv_until = kv_until or now + self.config.kv_migration_timeout_s
                if now > kv_until:
                    break
            for f in list(e.inflight):
                if now - f.abort_sent > 0.25:  # re-sent: the engine may not have seen the rid yet
                    if not f.moving:
                        moved += 1
                    f.moving = True
                    f.abort_sent = now
                    try:
                        if keep_kv:
                            await e.ctl.abort(f.rid, keep_kv=True)
                        else:
                            await e.ctl.abort(f.rid)
                    except (
                        Exception
                    ) as err:  # engine gone: the request's connection breaks and it moves
                        log.info("abort %s on %s: %s", f.rid, e.url, err)
            if deadline is not None and time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        self.counters.moved += moved
        kv = {k: v - kv0[k] for k, v in self._kv_counts().items()}
        self.drains[e.url] = {"moved": moved, **kv}
        return moved

    def _kv_counts(self) -> dict[str, Any]:
        c = self.counters
        return {
            "kv_migrated": c.kv_migrated,
            "kv_bytes": c.kv_bytes,
            "kv_tokens": c.kv_tokens,
            "kv_transfer_s": c.kv_transfer_s,
            "kv_saved_s": c.kv_saved_s,
            "kv_fallbacks": c.kv_fallback_version
            + c.kv_fallback_room
            + c.kv_fallback_unsupported
            + c.kv_fallback_other,
        }

    # -- generation ---------------------------------------------------------------------------
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
        out = _Output()
        budget = int(sampling.get("max_new_tokens", 128))
        avoid: EngineHandle | None = None
        moves = 0
        faults = CallFaults(self.backoff)
        kv_from: EngineHandle | None = None  # the engine a drain took the call off, K/V parked
        kv_rid = ""  # the call's rid there
        try:
            while True:
                engine = await self._engine_for(execution_id, avoid, faults)
                rid = f"gyre-{uuid.uuid4().hex[:16]}"
                if kv_from is not None:  # the call's K/V goes first, then the next attempt
                    src, kv_from = kv_from, None
                    try:
                        await move_kv(
                            src,
                            engine,
                            kv_rid,
                            rid,
                            self.counters,
                            self.config.kv_migration_timeout_s,
                        )
                    finally:
                        src.migrating -= 1
                a = _Attempt(
                    InFlight(rid=rid, execution_id=execution_id, engine=engine), len(out.ids)
                )
                sp = dict(sampling, max_new_tokens=max(budget - len(out.ids), 0))
                body = generate_body(rid, input_parts, out.ids, sp, stream)
                async with contextlib.aclosing(
                    self._attempt(a, body, stream, out, faults)
                ) as pieces:
                    async for piece in pieces:
                        yield piece
                kv_from, kv_rid, a.kv_from = a.kv_from, a.flight.rid, None
                self._settle(a, out)
                if a.broke or a.finish == "abort" or a.finish is None:
                    moves += 1
                    if moves > self.config.max_resumes:
                        raise ApiError(
                            503,
                            f"request moved {moves} times without finishing",
                            "overloaded",
                            headers={"retry-after": "5"},
                        )
                    if len(out.ids) >= budget:
                        a.finish = "length"
                    else:
                        avoid = engine if (a.broke or a.flight.moving) else None
                        continue
                yield GenResult(
                    output_ids=out.ids,
                    logprobs=out.lps,
                    segments=merge_segments(out.segments),
                    finish="length" if a.finish == "length" else "stop",
                    moves=moves,
                )
                return
        finally:
            if kv_from is not None:  # the call ended before its K/V could move: the drain goes on
                kv_from.migrating -= 1

    async def _engine_for(
        self, execution_id: str, avoid: EngineHandle | None, faults: CallFaults
    ) -> EngineHandle:
        """The engine for the next attempt; after a failure, when no engine is up, back off first."""
        engine = await self._wait_engine(execution_id, avoid)
        if faults.failures:
            now = time.monotonic()
            delay = faults.next_delay(engine.down_until <= now, now, self._rng)
            if delay > 0:  # no engine is up: back off before trying a failed one again
                self.counters.backoff_waits += 1
                await asyncio.sleep(delay)
                engine = await self._wait_engine(execution_id, avoid)
        return engine

    async def _attempt(
        self, a: _Attempt, body: PartsPayload, stream: bool, out: _Output, faults: CallFaults
    ) -> AsyncGenerator[tuple[list[int], list[float]], None]:
        """Run one attempt, adding its new tokens to ``out`` and yielding them; how it ended is
        left on ``a``. A broken or silent engine ends the attempt (the call moves on); a protocol
        violation ends the call."""
        engine = a.flight.engine
        silent = False
        done = False
        engine.inflight.add(a.flight)
        try:
            if stream:
                async with contextlib.aclosing(self.attempts.stream(engine, body)) as chunks:
                    async for ids, lps, fin, marks in chunks:
                        got = len(out.ids) - a.start
                        if len(ids) > got:
                            new_ids, new_lps = ids[got:], lps[got:]
                            out.ids.extend(new_ids)
                            out.lps.extend(new_lps)
                            yield new_ids, new_lps
                        if marks:
                            a.marks = marks
                        if fin is not None:
                            a.finish = fin
            else:
                ids, lps, a.finish, a.marks = await self.attempts.plain(engine, body)
                out.ids.extend(ids)
                out.lps.extend(lps)
                if ids:
                    yield ids, lps
            done = True
            if a.finish is None and not a.flight.moving:  # not a drain's abort: it broke off
                raise EngineBroke("the answer ended without a finish reason")
        except EngineBroke as err:
            a.broke = True
            silent = isinstance(err, EngineSilent)
            self._note_broken(engine, err, faults)
        except EngineProtocolError as err:
            raise self._note_protocol_error(engine, err) from None
        finally:
            if a.flight.moving and not a.broke and engine.kv_migration and self.config.kv_migration:
                engine.migrating += 1  # counted before the flight leaves: the drain waits for it
                a.kv_from = engine
            engine.inflight.discard(a.flight)
            if silent or (not done and not a.broke):  # cancelled, frozen or garbled: free the slot
                asyncio.get_running_loop().create_task(abort_quietly(engine, a.flight.rid))

    def _settle(self, a: _Attempt, out: _Output) -> None:
        """Book an attempt that ended without ending the call: engine health, trace segments."""
        engine = a.flight.engine
        engine.served += 1
        if not a.broke:
            engine.streak = 0
            engine.suspect = None
        if len(out.ids) > a.start:
            out.segments.extend(output_segments(a.start, len(out.ids), engine.engine_id, a.marks))

    def _note_broken(self, engine: EngineHandle, err: EngineBroke, faults: CallFaults) -> None:
        self._mark_broken(engine)
        if isinstance(err, EngineSilent):
            self.counters.engine_timeouts += 1
        else:
            self.counters.engine_errors += 1
        faults.note(engine.url, err, time.monotonic())
        log.warning("engine %s failed (%s); trying again", engine.url, err)

    def _note_protocol_error(self, engine: EngineHandle, err: EngineProtocolError) -> ApiError:
        """Mark the engine suspect; the call's answer is the 502 returned."""
        engine.failures += 1
        engine.suspect = str(err)[:300]
        engine.down_until = time.monotonic() + SUSPECT_S
        self.counters.protocol_errors += 1
        log.error("engine %s broke the /generate protocol: %s", engine.url, err)
        return protocol_error(engine.url, str(err))

    def _mark_broken(self, engine: EngineHandle) -> None:
        """Routing hint: a broken engine is tried last for a while that grows with its streak."""
        engine.failures += 1
        engine.streak += 1
        engine.down_until = time.monotonic() + min(30.0, 0.5 * 2 ** min(engine.streak - 1, 6))
