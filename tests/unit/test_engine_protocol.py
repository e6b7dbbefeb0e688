"""Wire protocol types, the client's error mapping, and the sampler (no server processes)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst
from pydantic import ValidationError

from gyre.engine.client import (
    EngineClient,
    EngineConnectionError,
    EngineRequestError,
    EngineServerError,
)
from gyre.engine.protocol import (
    DONE_SENTINEL,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    MetaInfo,
    ModelInfo,
    SamplingParams,
)
from gyre.engine.sampling import make_generator, processed_logits, sample_row


@given(
    ids=hst.lists(hst.integers(0, 200_000), min_size=1, max_size=50),
    n=hst.integers(0, 4096),
    t=hst.floats(0, 5),
    p=hst.floats(0.01, 1.0),
    k=hst.integers(-1, 100),
    seed=hst.none() | hst.integers(0, 2**31),
    stream=hst.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_generate_request_round_trip(ids, n, t, p, k, seed, stream):
    req = GenerateRequest(
        rid="r",
        input_ids=ids,
        stream=stream,
        sampling_params=SamplingParams(
            max_new_tokens=n, temperature=t, top_p=p, top_k=k, seed=seed
        ),
    )
    wire = json.dumps(req.model_dump(exclude_none=True))
    back = GenerateRequest.model_validate_json(wire)
    assert back == req
    assert ("seed" in json.loads(wire)["sampling_params"]) == (seed is not None)


def test_response_round_trip_and_sglang_shapes():
    sglang_like = {  # what SGLang sends (text, extra meta fields we do not model)
        "text": "hi",
        "output_ids": [5, 6],
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "stop", "matched": 6},
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "cached_tokens": 1,
            "e2e_latency": 0.1,
            "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None]],
            "weight_version": "default",
        },
    }
    r = GenerateResponse.model_validate(sglang_like)
    assert r.finished and r.logprobs == [-0.5, -0.25] and r.meta_info.weight_version == "default"
    assert r.meta_info.model_extra["e2e_latency"] == 0.1
    again = GenerateResponse.model_validate_json(r.model_dump_json())
    assert again == r
    chunk = GenerateResponse(output_ids=[1], meta_info=MetaInfo(id="x"))
    assert not chunk.finished
    assert FinishReason(type="abort", message="m").type == "abort"
    with pytest.raises(ValidationError):
        FinishReason(type="exploded")
    info = ModelInfo.model_validate(
        {"model_path": "/m", "is_generation": True, "weight_version": "default"}
    )
    assert info.engine_kind is None  # SGLang does not send Gyre's additions


def test_sampling_params_validation_and_sglang_seed_alias():
    assert SamplingParams.model_validate({"sampling_seed": 7}).seed == 7
    assert SamplingParams(temperature=0).greedy and SamplingParams(top_k=1).greedy
    assert not SamplingParams().greedy
    for bad in (
        {"max_new_tokens": -1},
        {"temperature": -0.1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"min_p": 2},
    ):
        with pytest.raises(ValidationError):
            SamplingParams(**bad)
    for bad_ids in ([], [3, -1]):
        with pytest.raises(ValidationError):
            GenerateRequest(input_ids=bad_ids)
    # unknown SGLang parameters pass through untouched
    assert SamplingParams.model_validate({"frequency_penalty": 0.5}).model_extra == {
        "frequency_penalty": 0.5
    }


def _mock_client(handler) -> EngineClient:
    return EngineClient("http://engine.test", transport=httpx.MockTransport(handler))


async def test_client_maps_statuses_to_error_classes():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/generate":
            return httpx.Response(400, json={"error": {"message": "context too long", "code": 400}})
        if request.url.path == "/get_model_info":
            return httpx.Response(500, text="boom")
        if request.url.path == "/health":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={})

    async with _mock_client(handler) as c:
        with pytest.raises(EngineRequestError, match="context too long") as ei:
            await c.generate([1], {"max_new_tokens": 1})
        assert ei.value.status_code == 400
        with pytest.raises(EngineServerError, match="boom"):
            await c.model_info()
        assert await c.health() is False
        with pytest.raises(EngineConnectionError):
            await c._request("GET", "/health")


async def test_client_stream_parses_sse_and_inband_errors():
    def chunk(n: int, done: bool) -> str:
        meta = {
            "id": "s",
            "finish_reason": {"type": "length", "length": n} if done else None,
            "output_token_logprobs": [[-0.1, 9, None]] * n,
        }
        return "data: " + json.dumps({"output_ids": [9] * n, "meta_info": meta}) + "\n\n"

    good = (
        chunk(1, False) + ": keep-alive comment\n\n" + chunk(2, True) + f"data: {DONE_SENTINEL}\n\n"
    )
    bad = chunk(1, False) + 'data: {"error": {"message": "engine died", "code": 500}}\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is True
        assert (
            body["sampling_params"]["sampling_seed"] == 3 and "seed" not in body["sampling_params"]
        )
        return httpx.Response(
            200,
            text=good if body["input_ids"] == [1] else bad,
            headers={"content-type": "text/event-stream"},
        )

    async with _mock_client(handler) as c:
        chunks = [ch async for ch in c.generate_stream([1], {"max_new_tokens": 2, "seed": 3})]
        assert [len(ch.output_ids) for ch in chunks] == [1, 2] and chunks[-1].finished
        with pytest.raises(EngineServerError, match="engine died"):
            async for _ in c.generate_stream([2], {"max_new_tokens": 2, "seed": 3}):
                pass


def test_processed_logits_topk_topp_minp():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert torch.isinf(processed_logits(logits, SamplingParams(top_k=2))).tolist() == [
        False,
        False,
        True,
        True,
    ]
    # top_p=0.7: 0.5 < 0.7 so the second token is needed; the third is not
    assert torch.isinf(processed_logits(logits, SamplingParams(top_p=0.7))).tolist() == [
        False,
        False,
        True,
        True,
    ]
    assert torch.isinf(processed_logits(logits, SamplingParams(top_p=0.5))).tolist() == [
        False,
        True,
        True,
        True,
    ]
    assert torch.isinf(processed_logits(logits, SamplingParams(min_p=0.4))).tolist() == [
        False,
        False,
        True,
        True,
    ]
    tempered = processed_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(tempered, logits / 0.5)


def test_sample_row_logprobs_and_determinism():
    torch.manual_seed(0)
    logits = torch.randn(50)
    tok, raw, tempered, proc = sample_row(logits, SamplingParams(temperature=0.0), None)
    assert tok == int(logits.argmax()) and proc == 0.0
    assert raw == tempered == pytest.approx(float(torch.log_softmax(logits, -1)[tok]))
    p = SamplingParams(temperature=0.8, top_k=10)
    a = [sample_row(logits, p, g)[0] for g in [make_generator(3)] for _ in range(20)]
    b = [sample_row(logits, p, g)[0] for g in [make_generator(3)] for _ in range(20)]
    assert a == b
    tok, raw, tempered, proc = sample_row(logits, p, make_generator(4))
    assert tok in torch.topk(logits, 10).indices.tolist()
    assert tempered == pytest.approx(float(torch.log_softmax(logits / 0.8, -1)[tok]))
    assert proc == pytest.approx(float(torch.log_softmax(processed_logits(logits, p), -1)[tok]))
    assert raw == pytest.approx(float(torch.log_softmax(logits, -1)[tok]))
    assert proc > raw  # truncation + sharpening moves mass onto the kept tokens


def test_prefix_cache_lcp_lru_budget_and_supersede():
    from gyre.engine.prefix_cache import PrefixCache

    def kv(n):  # 2 layers x (k, v) of [1, 1, n, 2] float32 = 32 bytes per token
        return [(torch.full((1, 1, n, 2), float(i)), torch.zeros(1, 1, n, 2)) for i in range(2)]

    pc = PrefixCache(max_bytes=32 * 40, min_tokens=4)
    pc.put(list(range(10)), kv(10))
    assert pc.lookup([9, 9, 9, 9, 9]) is None  # nothing shared
    n, got = pc.lookup(list(range(6)) + [99, 98])
    assert n == 6 and got[1][0].shape == (1, 1, 6, 2) and float(got[1][0][0, 0, 0, 0]) == 1.0
    n, _ = pc.lookup(list(range(10)))
    assert n == 9  # one token left to run for logits
    assert pc.lookup([0, 1, 2, 50]) is None  # shares 3 < min_tokens
    assert (pc.hits, pc.misses, pc.hit_tokens) == (2, 2, 6 + 9)  # what a run's report sums
    pc.put(list(range(20)), kv(20))  # extends the first: replaces it
    assert len(pc) == 1 and pc.bytes == 20 * 32
    pc.put([7] * 30, kv(30))  # over budget: the older entry goes
    assert len(pc) == 1 and pc.lookup(list(range(12))) is None
    pc.put([1, 2], kv(2))  # shorter than min_tokens: not kept
    assert len(pc) == 1
    pc.clear()
    assert len(pc) == 0 and pc.bytes == 0
