"""The embedded engine over HTTP (uvicorn on 127.0.0.1) with the tiny model.

Exactness is checked against Hugging Face itself: ``model.generate`` for greedy
tokens and a separate full forward pass for log-probs.
"""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest
import torch

from gyre.engine.app import create_app
from gyre.engine.client import EngineClient, EngineConnectionError, EngineRequestError
from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.embedded import EmbeddedEngine
from gyre.engine.protocol import GenerateRequest
from gyre.engine.runner import ServerRunner

GREEDY = {"temperature": 0.0, "ignore_eos": True}
PROMPTS = [[5, 17, 300, 42, 9, 77][: 2 + i % 5] + [50 + i] * (1 + i % 3) for i in range(6)]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    m.eval()
    return m


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=str(tiny_model_dir), max_batch=8, engine_id="emb-test")
    )
    runner = ServerRunner(create_app(engine)).start()
    runner.engine = engine
    yield runner
    runner.stop()


@pytest.fixture
async def client(server):
    async with EngineClient(server.url) as c:
        yield c


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
    )
    return out[0, len(prompt) :].tolist()


def hf_logprobs(
    model, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


async def test_greedy_equals_hf_generate_and_logprobs_equal_forward(client, hf_model):
    for prompt in PROMPTS[:3]:
        r = await client.generate(prompt, {"max_new_tokens": 20, **GREEDY})
        assert r.output_ids == hf_greedy(hf_model, prompt, 20)
        assert r.meta_info.finish_reason.type == "length"
        assert r.meta_info.prompt_tokens == len(prompt) and r.meta_info.completion_tokens == 20
        assert [t for _, t, _ in r.meta_info.output_token_logprobs] == r.output_ids
        assert r.logprobs == pytest.approx(hf_logprobs(hf_model, prompt, r.output_ids), abs=1e-4)


async def test_concurrent_requests_are_batched_and_match_sequential(client, server, hf_model):
    seq = [await client.generate(p, {"max_new_tokens": 16, **GREEDY}) for p in PROMPTS]
    before = server.engine.max_rows_seen
    server.engine.max_rows_seen = 0
    conc = await asyncio.gather(
        *[client.generate(p, {"max_new_tokens": 16, **GREEDY}) for p in PROMPTS]
    )
    assert server.engine.max_rows_seen > 1, "concurrent requests never shared a decode step"
    server.engine.max_rows_seen = max(before, server.engine.max_rows_seen)
    for s, c, _p in zip(seq, conc, PROMPTS):
        assert c.output_ids == s.output_ids
        assert c.logprobs == pytest.approx(s.logprobs, abs=1e-4)
    assert conc[-1].output_ids == hf_greedy(hf_model, PROMPTS[-1], 16)


async def test_stop_at_eos_and_stop_token_ids(client, hf_model):
    prompt = PROMPTS[0]
    ref = hf_greedy(hf_model, prompt, 12)
    stop_at = ref[5]
    r = await client.generate(
        prompt, {"max_new_tokens": 12, "temperature": 0.0, "stop_token_ids": [stop_at]}
    )
    k = ref.index(stop_at)
    assert r.output_ids == ref[: k + 1]  # the stop token is the last output token
    assert r.meta_info.finish_reason.type == "stop" and r.meta_info.finish_reason.matched == stop_at


async def test_seeded_sampling_reproducible_and_batch_independent(client):
    sp = {
        "max_new_tokens": 12,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 50,
        "seed": 1234,
        "ignore_eos": True,
    }
    a = await client.generate(PROMPTS[1], sp)
    others = [client.generate(p, {**sp, "seed": 7 + i}) for i, p in enumerate(PROMPTS[2:5])]
    b, *_ = await asyncio.gather(client.generate(PROMPTS[1], sp), *others)
    assert a.output_ids == b.output_ids
    c = await client.generate(PROMPTS[1], {**sp, "seed": 99})
    assert c.output_ids != a.output_ids  # 12 sampled tokens from a near-uniform tiny model


async def test_stream_is_cumulative_and_abort_returns_partial(client, server):
    rid = "abort-me"
    chunks, aborted = [], False
    async for chunk in client.generate_stream(
        PROMPTS[0], {"max_new_tokens": 5000, **GREEDY}, rid=rid
    ):
        chunks.append(chunk)
        if not aborted and len(chunk.output_ids) >= 3:
            async with EngineClient(server.url) as other:
                assert await other.abort(rid) is True
            aborted = True
    final = chunks[-1]
    assert final.meta_info.finish_reason.type == "abort"
    assert 0 < len(final.output_ids) < 5000
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.output_ids[: len(prev.output_ids)] == prev.output_ids
    assert len(final.logprobs) == len(final.output_ids)
    assert server.engine.live_requests == 0
    assert not await client.abort("no-such-rid")


async def test_pause_holds_inflight_and_queued_requests_then_resume(client, server):
    eng = server.engine
    await client.pause()
    assert (await client.model_info()).paused is True
    queued = asyncio.create_task(
        client.generate(PROMPTS[2], {"max_new_tokens": 6, **GREEDY}, rid="queued")
    )
    await asyncio.sleep(0.4)
    assert not queued.done()
    st = eng._requests["queued"]
    assert st.output_ids == [] and st.finish is None
    await client.resume()
    r = await asyncio.wait_for(queued, 30)
    assert len(r.output_ids) == 6 and r.meta_info.finish_reason.type == "length"
    assert (await client.model_info()).paused is False

    # in-flight: pause after some tokens; no step runs while paused; resume continues the same request
    stream = client.generate_stream(PROMPTS[3], {"max_new_tokens": 4000, **GREEDY}, rid="inflight")
    first = await stream.__anext__()
    await client.pause()
    await asyncio.sleep(0.2)  # let a step that was already running land
    n_paused = len(eng._requests["inflight"].output_ids)
    steps = eng.steps
    await asyncio.sleep(0.4)
    assert len(eng._requests["inflight"].output_ids) == n_paused and eng.steps == steps
    assert n_paused >= len(first.output_ids)
    await client.resume()
    nxt = first
    while len(nxt.output_ids) <= n_paused:  # chunks sent before the pause may still be in the pipe
        nxt = await asyncio.wait_for(stream.__anext__(), 30)
    assert nxt.output_ids[:n_paused] == eng._requests["inflight"].output_ids[:n_paused]
    await client.abort("inflight")
    last = nxt
    async for last in stream:
        pass
    assert last.meta_info.finish_reason.type == "abort"


async def test_update_weights_bumps_version_and_changes_outputs(
    client, server, tiny_model_dir, hf_model, tmp_path_factory
):
    from gyre.models.tiny import build_tiny_model

    other_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-seed1"), seed=1)
    prompt = PROMPTS[4]
    v0 = (await client.model_info()).weight_version
    before = await client.generate(prompt, {"max_new_tokens": 10, **GREEDY})
    assert before.meta_info.weight_version == v0
    out = await client.update_weights_from_disk(str(other_dir))
    assert out.success and out.weight_version == v0 + 1
    assert (await client.model_info()).weight_version == v0 + 1
    after = await client.generate(prompt, {"max_new_tokens": 10, **GREEDY})
    assert after.meta_info.weight_version == v0 + 1
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(other_dir)
    assert after.output_ids == hf_greedy(other, prompt, 10)
    # the random tiny models both tend to echo the prompt, so compare the distributions they report
    assert after.logprobs == pytest.approx(hf_logprobs(other, prompt, after.output_ids), abs=1e-4)
    assert after.logprobs != pytest.approx(
        hf_logprobs(hf_model, prompt, after.output_ids), abs=1e-3
    )
    # a directory that is not a compatible model: refused, version and weights unchanged
    bad_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-wide"), hidden=64)
    with pytest.raises(EngineRequestError, match="weights not loaded"):
        await client.update_weights_from_disk(str(bad_dir))
    with pytest.raises(EngineRequestError, match="not a directory"):
        await client.update_weights_from_disk("/nonexistent/model")
    assert (await client.model_info()).weight_version == v0 + 1
    restored = await client.update_weights_from_disk(str(tiny_model_dir))
    assert restored.weight_version == v0 + 2
    again = await client.generate(prompt, {"max_new_tokens": 10, **GREEDY})
    assert again.output_ids == before.output_ids
    assert again.logprobs == pytest.approx(before.logprobs, abs=1e-5)


@pytest.mark.parametrize(
    "body, needle",
    [
        (
            {"input_ids": [], "sampling_params": {"max_new_tokens": 4}},
            "input_ids must not be empty",
        ),
        (
            {"input_ids": [1, 2048], "sampling_params": {"max_new_tokens": 4}},
            "outside the model's vocabulary",
        ),
        ({"input_ids": [1, -3], "sampling_params": {"max_new_tokens": 4}}, "non-negative"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 65535}},
            "exceeds the context limit 65536",
        ),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"stop_token_ids": [99999]}}, "stop_token_ids"),
        ({"input_ids": "hello"}, "input_ids"),
        (
            {"input_ids": [1], "sampling_params": {"repetition_penalty": 1.2}},
            "repetition_penalty=1.2 is not supported",
        ),
        (
            {"input_ids": [1], "sampling_params": {"stop": ["\n"]}},
            "sampling_params.stop is not supported",
        ),
        (None, "Invalid JSON"),
    ],
)
async def test_bad_input_is_a_clear_400(server, body, needle):
    async with httpx.AsyncClient(base_url=server.url) as http:
        if body is None:
            resp = await http.post("/generate", content=b"{not json")
        else:
            resp = await http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]
    # the engine is unharmed
    async with EngineClient(server.url) as c:
        assert (await c.generate([1, 2, 3], {"max_new_tokens": 2})).meta_info.completion_tokens == 2


async def test_zero_max_new_tokens_and_client_side_validation(client):
    r = await client.generate([1, 2, 3], {"max_new_tokens": 0})
    assert r.output_ids == [] and r.meta_info.finish_reason.type == "length"
    with pytest.raises(EngineRequestError, match="not sent"):
        await client.generate([], {"max_new_tokens": 3})


async def test_client_disconnect_aborts_engine_request(server):
    eng = server.engine
    async with EngineClient(server.url) as c:
        stream = c.generate_stream(
            PROMPTS[0], {"max_new_tokens": 5000, **GREEDY}, rid="gone-stream"
        )
        await stream.__anext__()
        await stream.aclose()
    # non-streaming client that times out
    async with EngineClient(server.url, read_timeout=0.3) as c:
        with pytest.raises(EngineConnectionError):
            await c.generate(PROMPTS[1], {"max_new_tokens": 5000, **GREEDY}, rid="gone-plain")
    for _ in range(100):
        if eng.live_requests == 0 and not eng._live:
            break
        await asyncio.sleep(0.05)
    assert eng.live_requests == 0 and not eng._live


async def test_duplicate_live_rid_refused(client):
    stream = client.generate_stream(PROMPTS[0], {"max_new_tokens": 3000, **GREEDY}, rid="dup")
    await stream.__anext__()
    with pytest.raises(EngineRequestError, match="already in use"):
        await client.generate([1, 2], {"max_new_tokens": 2}, rid="dup")
    await client.abort("dup")
    async for _ in stream:
        pass


async def test_connection_error_is_distinct():
    async with EngineClient("http://127.0.0.1:9", connect_timeout=1.0) as c:
        with pytest.raises(EngineConnectionError):
            await c.generate([1, 2], {"max_new_tokens": 2})
        assert await c.health() is False


async def test_three_engines_in_one_process_and_logprob_modes(tiny_model_dir, hf_model):
    """No global state: three in-process engines, one per log-prob mode, same seeded tokens."""
    raw = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="a"))
    proc = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="b", logprob_mode="processed")
    )
    temp = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="c", logprob_mode="tempered")
    )
    await raw.start()
    await proc.start()
    await temp.start()
    try:
        sp = {"max_new_tokens": 8, "temperature": 0.7, "top_k": 40, "seed": 5, "ignore_eos": True}
        req = GenerateRequest(input_ids=PROMPTS[0], sampling_params=sp)
        a, b, c = await asyncio.gather(raw.generate(req), proc.generate(req), temp.generate(req))
        assert a.output_ids == b.output_ids == c.output_ids
        assert (a.meta_info.engine_id, b.meta_info.engine_id, c.meta_info.engine_id) == (
            "a",
            "b",
            "c",
        )
        assert a.logprobs == pytest.approx(
            hf_logprobs(hf_model, PROMPTS[0], a.output_ids), abs=1e-4
        )
        assert c.logprobs == pytest.approx(
            hf_logprobs(hf_model, PROMPTS[0], c.output_ids, 0.7), abs=1e-4
        )
        # processed: tempered and cut to the top 40, renormalised
        with torch.no_grad():
            logits = hf_model(torch.tensor([PROMPTS[0] + b.output_ids])).logits[0].float() / 0.7
        n = len(PROMPTS[0])
        ref = []
        for i, t in enumerate(b.output_ids):
            row = logits[n - 1 + i]
            kth = torch.topk(row, 40).values[-1]
            ref.append(torch.log_softmax(row.masked_fill(row < kth, float("-inf")), -1)[t].item())
        assert b.logprobs == pytest.approx(ref, abs=1e-4)
        g = await proc.generate(
            GenerateRequest(input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 4, **GREEDY})
        )
        assert g.logprobs == [0.0] * 4  # greedy samples from a point mass
    finally:
        await raw.stop()
        await proc.stop()
        await temp.stop()


async def test_weights_update_mid_request_is_recorded_per_segment(client, tiny_model_dir):
    """pause -> update -> continue (the publication flow): one request spans two versions."""
    stream = client.generate_stream(PROMPTS[5], {"max_new_tokens": 3000, **GREEDY}, rid="span")
    first = await stream.__anext__()
    await client.pause()
    out = await client.update_weights_from_disk(str(tiny_model_dir))
    await client.resume()
    last = first
    while True:
        last = await asyncio.wait_for(stream.__anext__(), 30)
        segs = last.meta_info.weight_version_segments
        if len(segs) == 2 and len(last.output_ids) > segs[1][0]:
            break
    await client.abort("span")
    async for last in stream:
        pass
    (s0, v0), (s1, v1) = last.meta_info.weight_version_segments
    assert s0 == 0 and s1 >= len(first.output_ids) and v1 == out.weight_version == v0 + 1
    assert last.meta_info.weight_version == v1


async def test_prefix_cache_reuses_a_conversations_kv_exactly(client, hf_model, tiny_model_dir):
    """Turn 2 = turn 1's input + output + new tokens: only the new part is prefilled, same results."""
    prompt = list(range(100, 160))
    r1 = await client.generate(prompt, {"max_new_tokens": 20, **GREEDY})
    assert r1.meta_info.cached_tokens == 0
    turn2 = prompt + r1.output_ids + list(range(200, 230))
    r2 = await client.generate(turn2, {"max_new_tokens": 20, **GREEDY})
    assert (
        r2.meta_info.cached_tokens == len(prompt) + len(r1.output_ids) - 1
    )  # the last sampled token was never fed
    assert r2.output_ids == hf_greedy(hf_model, turn2, 20)
    assert r2.logprobs == pytest.approx(hf_logprobs(hf_model, turn2, r2.output_ids), abs=1e-4)
    r3 = await client.generate(turn2, {"max_new_tokens": 20, **GREEDY})
    assert r3.meta_info.cached_tokens == len(turn2) - 1 and r3.output_ids == r2.output_ids
    stats = await client.server_info()
    assert (
        stats["prefix_cache_hits"] >= 2
        and stats["prefix_cache_entries"] >= 1
        and stats["live_requests"] == 0
    )
    # new weights: cached K/V are stale and must not be reused
    await client.update_weights_from_disk(str(tiny_model_dir))
    r4 = await client.generate(turn2, {"max_new_tokens": 20, **GREEDY})
    assert r4.meta_info.cached_tokens == 0 and r4.output_ids == r2.output_ids


async def test_request_sent_while_an_aborted_row_is_freed_is_served(tiny_model_dir):
    """A request that arrives while the idle scheduler frees an aborted row (on the worker) is
    served: its wake-up must not be cleared after the free. The free is slowed to 0.3 s so the
    second request always lands inside it (the old code cleared the wake-up there and hung)."""
    eng = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir)))
    await eng.start()
    try:
        batch = eng._live_batch()
        free = batch.remove

        def slow_remove(rids):
            if rids:
                time.sleep(0.3)
            free(rids)

        batch.remove = slow_remove  # type: ignore[method-assign]
        runner = await eng.submit(
            GenerateRequest(
                input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 3000, **GREEDY}
            )
        )
        updates = runner.updates()
        await updates.__anext__()
        await eng.abort(runner.rid)
        async for _ in updates:
            pass
        await asyncio.sleep(0.05)  # the scheduler is now freeing the aborted row
        params = {"max_new_tokens": 4, **GREEDY}
        r = await asyncio.wait_for(
            eng.generate(GenerateRequest(input_ids=PROMPTS[1], sampling_params=params)), 20
        )
        assert len(r.output_ids) == 4
    finally:
        await eng.stop()


async def test_chunked_prefill_is_exact_and_interleaves_with_decoding(tiny_model_dir, hf_model):
    eng = EmbeddedEngine(
        EmbeddedEngineConfig(
            model_dir=str(tiny_model_dir), prefill_chunk_tokens=8, prefix_cache_mb=0
        )
    )
    await eng.start()
    try:
        long_prompt = [(7 * i) % 1900 + 20 for i in range(200)]  # 25 chunks of 8
        runner = await eng.submit(
            GenerateRequest(
                input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 3000, **GREEDY}
            )
        )
        updates = runner.updates()
        await updates.__anext__()
        n_before = len(runner.state.output_ids)
        r = await eng.generate(
            GenerateRequest(input_ids=long_prompt, sampling_params={"max_new_tokens": 8, **GREEDY})
        )
        n_after = len(runner.state.output_ids)
        assert n_after - n_before >= 25, "the live request stalled during the chunked prefill"
        assert r.output_ids == hf_greedy(hf_model, long_prompt, 8)
        assert r.logprobs == pytest.approx(
            hf_logprobs(hf_model, long_prompt, r.output_ids), abs=1e-4
        )
        await eng.abort(runner.rid)
        async for _ in updates:
            pass
    finally:
        await eng.stop()


async def test_scheduler_churn_joins_leaves_aborts_stay_exact(tiny_model_dir, hf_model):
    """Many requests through a small batch: rows join and leave at different steps (re-padding,
    trimming), some are aborted mid-way; finished outputs equal HF generate, aborted ones are prefixes."""
    import random

    rng = random.Random(0)
    eng = EmbeddedEngine(
        EmbeddedEngineConfig(
            model_dir=str(tiny_model_dir), max_batch=3, prefill_chunk_tokens=16, prefix_cache_mb=0
        )
    )
    await eng.start()
    try:
        reqs = []
        for i in range(10):
            prompt = [rng.randrange(10, 2000) for _ in range(rng.randrange(2, 40))]
            reqs.append((f"churn-{i}", prompt, rng.randrange(3, 30)))
        handles = [
            await eng.submit(
                GenerateRequest(
                    rid=rid, input_ids=p, sampling_params={"max_new_tokens": n, **GREEDY}
                )
            )
            for rid, p, n in reqs
        ]
        to_abort = {"churn-2", "churn-5", "churn-8"}

        async def aborter():
            for rid in sorted(to_abort):
                st = eng._requests.get(rid)
                while st is not None and st.finish is None and len(st.output_ids) < 2:
                    await asyncio.sleep(0.005)
                await eng.abort(rid)

        results, _ = await asyncio.gather(asyncio.gather(*[h.result() for h in handles]), aborter())
        assert eng.max_rows_seen == 3
        for (rid, prompt, n), r in zip(reqs, results):
            ref = hf_greedy(hf_model, prompt, n)
            if r.meta_info.finish_reason.type == "abort":
                assert rid in to_abort and r.output_ids == ref[: len(r.output_ids)]
            else:
                assert r.output_ids == ref, rid
                assert r.logprobs == pytest.approx(hf_logprobs(hf_model, prompt, ref), abs=1e-4)
        assert eng.live_requests == 0
    finally:
        await eng.stop()


async def test_sliding_window_models_are_refused_clearly(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from gyre.models.tiny import tiny_config_kwargs

    cfg = Qwen3Config(
        **tiny_config_kwargs(256, layers=2, hidden=64),
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
    )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    eng = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="full-attention decoder models only"):
        await eng.start()


async def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny_model_dir):
    eng = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir)))
    await eng.start()
    try:
        real_step = type(eng._batch).step
        calls = {"n": 0}

        def flaky_step(self):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected failure")
            return real_step(self)

        eng._batch.step = flaky_step.__get__(eng._batch)
        r = await asyncio.wait_for(
            eng.generate(
                GenerateRequest(
                    input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 50, **GREEDY}
                )
            ),
            30,
        )
        assert (
            r.meta_info.finish_reason.type == "abort"
            and "injected failure" in r.meta_info.finish_reason.message
        )
        assert 0 < len(r.output_ids) < 50  # partial output kept
        ok = await eng.generate(
            GenerateRequest(input_ids=PROMPTS[0], sampling_params={"max_new_tokens": 5, **GREEDY})
        )
        assert (
            ok.meta_info.finish_reason.type == "length"
            and ok.output_ids[: len(r.output_ids)] == r.output_ids[:5]
        )
    finally:
        await eng.stop()


async def test_engine_restarts_cleanly_and_stop_aborts_inflight(tiny_model_dir):
    eng = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir)))
    for _ in range(2):
        await eng.start()
        assert eng.healthy()
        inflight = await eng.submit(
            GenerateRequest(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 5000, **GREEDY})
        )
        r = await eng.generate(
            GenerateRequest(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, **GREEDY})
        )
        assert len(r.output_ids) == 4
        await eng.stop()
        assert not eng.healthy()
        final = await inflight.result()
        assert (
            final.meta_info.finish_reason.type == "abort"
            and final.meta_info.finish_reason.message == "engine stopped"
        )


async def test_resume_on_another_engine_continues_the_same_greedy_output(tiny_model_dir, hf_model):
    """What the proxy's drain relies on: abort on A, re-issue prompt + partial output on B."""
    a = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="A"))
    b = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="B"))
    await a.start()
    await b.start()
    try:
        prompt, n = PROMPTS[3], 40
        handle = await a.submit(
            GenerateRequest(input_ids=prompt, sampling_params={"max_new_tokens": n, **GREEDY})
        )
        updates = handle.updates()
        first = await updates.__anext__()
        await a.abort(handle.rid)
        part = first
        async for part in updates:
            pass
        assert part.meta_info.finish_reason.type == "abort" and 0 < len(part.output_ids) < n
        k = len(part.output_ids)
        rest = await b.generate(
            GenerateRequest(
                input_ids=prompt + part.output_ids,
                sampling_params={"max_new_tokens": n - k, **GREEDY},
            )
        )
        full = part.output_ids + rest.output_ids
        assert full == hf_greedy(hf_model, prompt, n)
        assert part.logprobs + rest.logprobs == pytest.approx(
            hf_logprobs(hf_model, prompt, full), abs=1e-4
        )
    finally:
        await a.stop()
        await b.stop()


def nucleus_logprob(logits_row: torch.Tensor, token: int, top_p: float) -> tuple[float, int]:
    """log p(token) under the top-p cut of softmax(logits_row), renormalised, computed apart
    from the engine's code: walk the tokens by falling probability and keep each one while the
    mass before it is below top_p. Returns (log-prob, tokens kept)."""
    probs = torch.softmax(logits_row.double(), -1).tolist()
    kept, mass = [], 0.0
    for i in sorted(range(len(probs)), key=lambda j: -probs[j]):
        if mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    assert token in kept, "the engine sampled a token outside the nucleus"
    return math.log(probs[token] / sum(probs[i] for i in kept)), len(kept)


async def test_processed_logprob_under_top_p_is_the_renormalised_nucleus(tiny_model_dir, hf_model):
    """The opt-in of docs/engine.md "Sampling semantics": with top_p < 1 the processed log-prob
    is log(p / P(nucleus)), the distribution the token was drawn from, not the raw one."""
    top_p = 0.3
    proc = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="p", logprob_mode="processed")
    )
    raw = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(tiny_model_dir), engine_id="r"))
    await proc.start()
    await raw.start()
    try:
        sp = {"max_new_tokens": 12, "top_p": top_p, "seed": 11, "ignore_eos": True}
        req = GenerateRequest(input_ids=PROMPTS[1], sampling_params=sp)
        p, r = await asyncio.gather(proc.generate(req), raw.generate(req))
    finally:
        await proc.stop()
        await raw.stop()
    assert p.output_ids == r.output_ids  # same seed, same draws: only the reported log-prob differs
    with torch.no_grad():
        logits = hf_model(torch.tensor([PROMPTS[1] + p.output_ids])).logits[0].float()
    n = len(PROMPTS[1])
    ref, sizes = zip(
        *(nucleus_logprob(logits[n - 1 + i], t, top_p) for i, t in enumerate(p.output_ids)),
        strict=True,
    )
    assert max(sizes) < logits.shape[-1]  # the cut removed tokens: the two log-probs differ
    assert p.logprobs == pytest.approx(list(ref), abs=1e-4)
    assert r.logprobs == pytest.approx(hf_logprobs(hf_model, PROMPTS[1], r.output_ids), abs=1e-4)
    assert all(a > b + 1e-3 for a, b in zip(p.logprobs, r.logprobs, strict=True))
