"""The pool's heartbeat: every engine is pinged periodically, and one that stays silent is lost.

Calls already find a failing engine by themselves (a broken connection moves a call at once; a
silent one is probed after ``engine_probe_after_s``), but only the calls that happen to wait on
it, and the engine stays in the pool. The heartbeat checks every engine whether or not a call
waits on it: every ``engine_heartbeat_s`` it asks ``/get_model_info`` (any HTTP answer counts,
so a busy engine passes and only a dead or frozen process fails), and an engine from which
nothing has come (no ping answer, no stream byte) for ``engine_lost_after_s`` is **lost**:

* it leaves routing at once (:meth:`EnginePool.lose`);
* every wait on it ends (its open streams and requests are abandoned, never awaited), so each
  call it held moves to another engine with the tokens generated so far, as a drain does;
* the pool's owner hears of it (an :class:`EngineEvent` to each listener).

A killed engine is therefore found in at most ``engine_lost_after_s + engine_heartbeat_s`` after
its last answer, a frozen one (SIGSTOP) the same. A lost engine is still pinged; the first
answer brings it **back** (the state it had before, unless ``engine_rejoin`` is false, then it
stays lost until added again) and the owner hears that too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gyre.proxy.attempts import EngineHandle
from gyre.proxy.config import PoolConfig
from gyre.proxy.counters import PoolCounters

log = logging.getLogger("gyre.proxy.pool")


@dataclass(frozen=True)
class EngineEvent:
    """An engine the heartbeat declared lost, or that answered again."""

    kind: Literal["lost", "back"]
    url: str
    engine_id: str
    at: float  # time.time()
    why: str
    silent_s: float  # how long nothing had come from it when it was declared lost (0 for back)


EngineListener = Callable[[EngineEvent], object]
"""Called on the proxy's event loop, so it must not block: a listener on another loop hands the
event over with ``loop.call_soon_threadsafe``."""


class Heartbeat:
    """Pings the pool's engines and tells the pool which are lost or back: it reads the engines
    through ``engines`` (the pool's current ones) and changes their state only through
    ``lose`` and ``back``, the pool's own methods, so the pool stays the one owner of routing."""

    def __init__(
        self,
        config: PoolConfig,
        counters: PoolCounters,
        engines: Callable[[], dict[str, EngineHandle]],
        lose: Callable[[EngineHandle, str, float], None],
        back: Callable[[EngineHandle], None],
    ) -> None:
        self.config = config
        self.counters = counters
        self._engines = engines
        self._lose = lose
        self._back = back
        self._task: asyncio.Task | None = None
        self._last_tick: float | None = None
        self._judge_from = 0.0  # after a stall of this loop, silence is judged again from here

    def start(self) -> None:
        if self.config.engine_heartbeat_s is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for e in self._engines().values():
            if e.beat is not None:
                e.beat.cancel()

    async def _run(self) -> None:
        every = self.config.engine_heartbeat_s
        assert every is not None
        while True:
            await asyncio.sleep(every)
            try:
                self.tick(time.monotonic())
            except Exception:  # never let the heartbeat die with the pool still serving
                log.exception("heartbeat tick failed")

    def tick(self, now: float) -> None:
        """Ping every engine that has no ping in flight; declare lost the ones silent too long.

        A stall of the proxy's own loop (a tick far later than due) is no engine's silence: no
        ping answer could be read meanwhile. Then nothing is judged until the pings sent now
        had two heartbeat periods to come back."""
        lost_after = self.config.engine_lost_after_s
        every = self.config.engine_heartbeat_s or 1.0
        if self._last_tick is not None and now - self._last_tick > 2 * every + 0.5:
            self._judge_from = now + 2 * every
            self.counters.heartbeat_stalls += 1
        self._last_tick = now
        loop = asyncio.get_running_loop()
        for e in list(self._engines().values()):
            if e.beat is None or e.beat.done():
                e.beat = loop.create_task(self._ping(e, lost_after))
            silent = now - e.last_alive
            if e.state != "lost" and silent > lost_after and now >= self._judge_from:
                self._lose(e, f"no answer to a heartbeat for {silent:.1f} s", silent)

    async def _ping(self, e: EngineHandle, timeout: float) -> None:
        self.counters.heartbeats += 1
        try:
            ok = await asyncio.wait_for(e.ctl.ping(), timeout)
        except Exception:  # timeout, refused, reset: no sign of life
            ok = False
        if not ok:
            self.counters.heartbeats_failed += 1
            return
        e.last_alive = time.monotonic()
        if e.state == "lost" and self._engines().get(e.url) is e:
            self._back(e)
