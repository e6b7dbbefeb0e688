"""Move a drained call's K/V from the engine it leaves to the engine that takes it over.

Why: a drain (a cell switching to training) moves each live call to another engine with the
tokens generated so far (:mod:`gyre.proxy.pool`); the new engine would prefill that whole
context again. When both engines can (embedded engines, model info ``kv_migration``), the
drain's abort parks the call's K/V on the old engine and this module carries it over before the
call's next attempt: ``/kv_export`` from the old engine (for the new one's weights version),
``/kv_import`` into the new one under the next attempt's rid (the protocol is
:mod:`gyre.engine.kv_migrate`'s). The bytes go through the proxy over the engines' own HTTP
connections, so engines in other processes or on other nodes need nothing more.

Every failure is a fallback, never an error: the next attempt is sent as before and the new
engine prefills (an engine that cannot take K/V, K/V of other weights, no room, a timeout).
Each move and each fallback is counted (:class:`gyre.proxy.counters.PoolCounters`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gyre.proxy import jsonfast
from gyre.proxy.attempts import EngineHandle
from gyre.proxy.counters import PoolCounters

log = logging.getLogger("gyre.proxy.pool")

_OCTETS = {"content-type": "application/octet-stream"}


@dataclass
class Moved:
    """One call's K/V move: what it carried and what it cost."""

    tokens: int
    nbytes: int
    transfer_s: float
    prefill_estimate_s: float | None  # the target's estimate of the prefill it skips


async def move_kv(
    src: EngineHandle,
    dst: EngineHandle,
    src_rid: str,
    dst_rid: str,
    counters: PoolCounters,
    timeout_s: float,
) -> Moved | None:
    """Carry ``src_rid``'s parked K/V to ``dst`` for ``dst_rid``; None: it stays (the caller's
    next attempt prefills). Counted either way."""
    if not dst.kv_migration or dst is src:
        counters.kv_fallback_unsupported += 1
        return None
    try:
        return await asyncio.wait_for(_move(src, dst, src_rid, dst_rid, counters), timeout_s)
    except Exception as e:  # a move that fails is a fallback, never the call's error
        log.info("K/V of %s not moved %s -> %s: %s", src_rid, src.url, dst.url, e)
        counters.kv_fallback_other += 1
        return None


async def _move(
    src: EngineHandle, dst: EngineHandle, src_rid: str, dst_rid: str, counters: PoolCounters
) -> Moved | None:
    t0 = time.perf_counter()
    info = await dst.ctl.model_info()  # the version it serves now (it checks again on import)
    try:
        version = int(info.weight_version)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        counters.kv_fallback_unsupported += 1
        return None
    body = jsonfast.dumps({"rid": src_rid, "weight_version": version})
    headers = {"content-type": "application/json"}
    async with src.session.post("/kv_export", data=body, headers=headers) as resp:
        data = await resp.read()
        if resp.status != 200:
            _fallback(counters, resp.status, data, f"export from {src.url}")
            return None
    async with dst.session.post(
        "/kv_import", params={"rid": dst_rid}, data=data, headers=_OCTETS
    ) as resp:
        raw = await resp.read()
        if resp.status != 200:
            _fallback(counters, resp.status, raw, f"import into {dst.url}")
            return None
    got = jsonfast.loads(raw)
    moved = Moved(
        tokens=int(got.get("tokens", 0)),
        nbytes=int(got.get("bytes", len(data))),
        transfer_s=time.perf_counter() - t0,
        prefill_estimate_s=got.get("prefill_estimate_s"),
    )
    counters.kv_migrated += 1
    counters.kv_bytes += moved.nbytes
    counters.kv_tokens += moved.tokens
    counters.kv_transfer_s += moved.transfer_s
    if moved.prefill_estimate_s is not None:
        counters.kv_saved_s += moved.prefill_estimate_s - moved.transfer_s
    return moved


def _fallback(counters: PoolCounters, status: int, raw: bytes, what: str) -> None:
    """Count a refused export or import by the engine's reason."""
    reason = "other"
    try:
        err = jsonfast.loads(raw).get("error") or {}
        reason = str(err.get("reason") or "other")
    except (ValueError, AttributeError):
        pass
    if reason == "version" or reason == "weights":
        counters.kv_fallback_version += 1
    elif reason == "room":
        counters.kv_fallback_room += 1
    elif reason in ("unsupported", "layout") or status == 404 and reason == "other":
        counters.kv_fallback_unsupported += 1
    else:
        counters.kv_fallback_other += 1
    # routine (nothing parked: the call was queued or done; the target serves newer weights):
    # counted, logged at debug (a drain of 64 calls wrote 64 info lines); the rest at info
    level = logging.DEBUG if reason in ("missing", "version", "weights") else logging.INFO
    log.log(level, "K/V not moved (%s): %s answered %d (%s)", reason, what, status, raw[:200])
