"""KV migration between two embedded engines (gyre.engine.kv_migrate): a request parked on one
engine continues on another from its K/V and generator state, with the tokens and log-probs an
unswitched engine gives; K/V of other weights, or with no room for it, is refused."""

from __future__ import annotations

import asyncio

import pytest

from gyre.engine.base import KVRefused
from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.embedded import EmbeddedEngine
from gyre.engine.kv_migrate import decode, encode
from gyre.engine.protocol import GenerateRequest, SamplingParams

PROMPT = [(7 * i + 3) % 200 + 20 for i in range(300)]
N = 40


def _engine(model_dir, name: str, **kw) -> EmbeddedEngine:
    cfg = dict(model_dir=str(model_dir), engine_id=name, torch_threads=1, prefix_cache_mb=0)
    cfg.update(kw)
    return EmbeddedEngine(EmbeddedEngineConfig(**cfg))


def _sampling(n: int, greedy: bool) -> SamplingParams:
    if greedy:
        return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_new_tokens=n, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)


async def _park_after(engine: EmbeddedEngine, rid: str, greedy: bool, k: int):
    """Generate on ``engine`` until at least ``k`` tokens, then park: the partial output."""
    h = await engine.submit(
        GenerateRequest(rid=rid, input_ids=PROMPT, sampling_params=_sampling(N, greedy))
    )
    async for snap in h.updates():
        if len(snap.output_ids) >= k and snap.meta_info.finish_reason is None:
            assert await engine.park(rid)
        if snap.meta_info.finish_reason is not None:
            assert snap.meta_info.finish_reason.type == "abort"
            return snap.output_ids, snap.logprobs
    raise AssertionError("no finished snapshot")


@pytest.mark.parametrize("greedy", [True, False])
async def test_migrated_continuation_equals_unswitched_reference(tiny_model_dir, greedy):
    ref_engine, a, b = (_engine(tiny_model_dir, n) for n in ("ref", "a", "b"))
    for e in (ref_engine, a, b):
        await e.start()
    try:
        ref = await ref_engine.generate(
            GenerateRequest(rid="ref", input_ids=PROMPT, sampling_params=_sampling(N, greedy))
        )
        assert len(ref.output_ids) == N

        out, lps = await _park_after(a, "r1", greedy, 12)
        assert 12 <= len(out) < N
        packet = await a.export_kv("r1", b.weight_version)
        # the K/V covers the prompt and every output token but the last (sampled, not fed yet)
        assert packet.tokens == PROMPT + out[:-1]
        wire = encode(packet)  # across processes it travels as these bytes
        assert len(wire) > packet.nbytes
        got = await b.import_kv("r2", decode(wire))
        assert got["tokens"] == len(PROMPT) + len(out) - 1 and got["bytes"] == packet.nbytes

        rest = await b.generate(
            GenerateRequest(
                rid="r2", input_ids=PROMPT + out, sampling_params=_sampling(N - len(out), greedy)
            )
        )
        assert b.kv_counts["admitted"] == 1
        assert rest.meta_info.cached_tokens == len(PROMPT) + len(out) - 1  # one token prefilled
        assert out + rest.output_ids == ref.output_ids
        assert lps + rest.logprobs == ref.logprobs  # exactly, not approximately
    finally:
        for e in (ref_engine, a, b):
            await e.stop()


async def test_reprefill_fallback_differs_only_within_rounding(tiny_model_dir):
    """What migration replaces: a re-prefill gives the same greedy tokens, log-probs within
    float rounding (a full forward over the context instead of step by step)."""
    a, b = _engine(tiny_model_dir, "a"), _engine(tiny_model_dir, "b", kv_migration_mb=0)
    await a.start()
    await b.start()
    try:
        ref = await a.generate(
            GenerateRequest(rid="ref", input_ids=PROMPT, sampling_params=_sampling(N, True))
        )
        out = ref.output_ids[:10]
        rest = await b.generate(
            GenerateRequest(
                rid="x", input_ids=PROMPT + out, sampling_params=_sampling(N - 10, True)
            )
        )
        assert rest.output_ids == ref.output_ids[10:]
        assert rest.logprobs == pytest.approx(ref.logprobs[10:], abs=1e-4)
    finally:
        await a.stop()
        await b.stop()


async def test_kv_of_other_weights_is_refused(tiny_model_dir):
    a, b = _engine(tiny_model_dir, "a"), _engine(tiny_model_dir, "b", weight_version=3)
    await a.start()
    await b.start()
    try:
        await _park_after(a, "r1", True, 5)
        with pytest.raises(KVRefused) as e:  # the source checks the target's version first
            await a.export_kv("r1", b.weight_version)
        assert e.value.reason == "version"
        await _park_after(a, "r2", True, 5)
        packet = await a.export_kv("r2", 0)
        with pytest.raises(KVRefused) as e:  # and the target checks it again
            await b.import_kv("r3", packet)
        assert e.value.reason == "version"
        packet.kv_version = 3  # same version number, other weights: the checksum tells
        packet.weights_checksum = (b.weights_checksum or 0.0) + 1.0
        with pytest.raises(KVRefused) as e:
            await b.import_kv("r3", packet)
        assert e.value.reason == "weights"
        assert b.kv_counts["refused"] == 2 and b.kv_counts["imported"] == 0
    finally:
        await a.stop()
        await b.stop()


async def test_target_without_room_or_migration_refuses(tiny_model_dir):
    a = _engine(tiny_model_dir, "a")
    small = _engine(tiny_model_dir, "small", kv_migration_mb=0.01)
    off = _engine(tiny_model_dir, "off", kv_migration_mb=0)
    for e in (a, small, off):
        await e.start()
    try:
        await _park_after(a, "r1", True, 5)
        packet = await a.export_kv("r1", 0)
        with pytest.raises(KVRefused) as e:
            await small.import_kv("r2", packet)
        assert e.value.reason == "room"
        with pytest.raises(KVRefused) as e:
            await off.import_kv("r2", packet)
        assert e.value.reason == "unsupported"
        assert not off.model_info().kv_migration and a.model_info().kv_migration
        # an engine without migration aborts on park: nothing parked, export says missing
        h = await off.submit(
            GenerateRequest(rid="q", input_ids=PROMPT, sampling_params=_sampling(N, True))
        )
        await asyncio.sleep(0)
        assert await off.park("q")
        assert (await h.result()).meta_info.finish_reason.type == "abort"
        with pytest.raises(KVRefused) as e:
            await off.export_kv("q", 0)
        assert e.value.reason == "missing"
    finally:
        for e in (a, small, off):
            await e.stop()


def test_packet_bytes_round_trip_every_dtype():
    import torch

    from gyre.engine.kv_migrate import KVPacket

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        kv = [(torch.randn(1, 2, 7, 4).to(dtype), torch.randn(1, 2, 7, 4).to(dtype))] * 3
        p = KVPacket(list(range(7)), kv, 2, 0.5, "float32", generator_state=b"\x01\x02")
        wire = bytes(encode(p))
        q = decode(wire)
        assert (q.tokens, q.kv_version, q.weights_checksum, q.generator_state) == (
            p.tokens,
            2,
            0.5,
            b"\x01\x02",
        )
        assert q.weights_dtype == "float32" and q.layout() == p.layout()
        assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(kv, q.kv))
        with pytest.raises(KVRefused):
            decode(wire[:-1])
