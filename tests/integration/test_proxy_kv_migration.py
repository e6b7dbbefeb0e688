"""A call drained off an embedded engine moves with its K/V (gyre.proxy.kvmove): the client's
tokens and log-probs are the unswitched engine's, the bytes moved are counted per drain; an
engine on other weights gets the call without K/V and prefills it again."""

from __future__ import annotations

import asyncio

from helpers.servers import running_engine

from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.embedded import EmbeddedEngine
from gyre.engine.protocol import GenerateRequest, SamplingParams
from gyre.proxy import jsonfast
from gyre.proxy.pool import EnginePool, GenResult

PROMPT = [(11 * i + 5) % 200 + 20 for i in range(400)]
N = 300
SEEDED = {"max_new_tokens": N, "temperature": 0.8, "seed": 77, "ignore_eos": True}
ENGINE = dict(torch_threads=1, prefix_cache_mb=0)


async def _reference(model_dir, sampling: dict) -> tuple[list[int], list[float]]:
    e = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(model_dir), engine_id="ref", **ENGINE))
    await e.start()
    try:
        r = await e.generate(
            GenerateRequest(input_ids=PROMPT, sampling_params=SamplingParams(**sampling))
        )
        return r.output_ids, r.logprobs
    finally:
        await e.stop()


async def _drained_call(pool: EnginePool, sampling: dict, after: int) -> tuple[GenResult, str]:
    """One streamed call; once ``after`` tokens arrived, the engine serving it is drained."""
    drain: asyncio.Task | None = None
    got = 0
    result = None
    async for item in pool.generate(
        "exec-1", [jsonfast.ids_json(PROMPT)], len(PROMPT), sampling, stream=True
    ):
        if isinstance(item, GenResult):
            result = item
            continue
        got += len(item[0])
        if drain is None and got >= after:
            url = next(u for u, e in pool.engines.items() if e.inflight)
            drain = asyncio.create_task(pool.drain(url))
    assert drain is not None and result is not None
    assert await drain == 1
    return result, url


async def test_drained_call_moves_with_its_kv_and_stays_exact(tiny_model_dir):
    ref_ids, ref_lps = await _reference(tiny_model_dir, SEEDED)
    with (
        running_engine("embedded", tiny_model_dir, engine_id="A", **ENGINE) as a,
        running_engine("embedded", tiny_model_dir, engine_id="B", **ENGINE) as b,
    ):
        pool = EnginePool([a.url, b.url])
        await pool.start()
        try:
            assert all(e.kv_migration for e in pool.engines.values())
            res, url = await _drained_call(pool, SEEDED, after=20)
            assert res.moves == 1 and len({s.engine_id for s in res.segments}) == 2
            assert res.output_ids == ref_ids
            assert res.logprobs == ref_lps  # exactly: the same K/V, generator and kernels
            c = pool.counters
            assert c.kv_migrated == 1 and c.kv_fallback_other == 0
            # tiny model: 2 layers, K and V, float32; every context token but the last output
            n = len(PROMPT) + res.segments[0].end - 1
            assert c.kv_tokens == n and c.kv_bytes > 0 and c.kv_bytes % n == 0
            rec = pool.drains[url]
            assert rec["moved"] == 1 and rec["kv_migrated"] == 1
            assert rec["kv_bytes"] == c.kv_bytes and rec["kv_fallbacks"] == 0
            assert rec["kv_transfer_s"] > 0
            assert not any(e.migrating for e in pool.engines.values())
        finally:
            await pool.aclose()


async def test_target_on_other_weights_prefills_again(tiny_model_dir):
    greedy = {"max_new_tokens": N, "temperature": 0.0, "ignore_eos": True}
    ref_ids, _ = await _reference(tiny_model_dir, greedy)
    with (
        running_engine("embedded", tiny_model_dir, engine_id="A", **ENGINE) as a,
        running_engine("embedded", tiny_model_dir, engine_id="B", weight_version=1, **ENGINE) as b,
    ):
        pool = EnginePool([a.url])  # the call starts on A (v0); B (v1) joins to take it over
        await pool.start()
        try:
            await pool.add(b.url)
            pool.engines[b.url].state = "draining"
            task = asyncio.create_task(_drained_call(pool, greedy, after=20))
            while not pool.engines[a.url].inflight:
                await asyncio.sleep(0.005)
            pool.undrain(b.url)
            res, url = await task
            assert url == a.url and res.moves == 1
            assert res.output_ids == ref_ids  # greedy: the same tokens after a re-prefill
            assert pool.counters.kv_migrated == 0 and pool.counters.kv_fallback_version == 1
            assert pool.drains[url]["kv_fallbacks"] == 1 and pool.drains[url]["kv_bytes"] == 0
        finally:
            await pool.aclose()
