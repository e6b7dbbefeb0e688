"""The vLLM adapter's mapping, against a stand-in for vLLM's routes (runs everywhere, CI too).

The stand-in (``fake_vllm``) answers the routes the adapter uses with the shapes vLLM 0.32
sends (read from a real server: tests/integration/test_engine_vllm.py runs the adapter
against one). It is a test double, named as such: fixed tokens 100, 101, ..., log-prob -0.5,
EOS 2 after five tokens unless ignored, weight-version spans per token.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gyre.engine.app import create_app
from gyre.engine.client import EngineClient, EngineRequestError, EngineServerError
from gyre.engine.config import VllmEngineConfig
from gyre.engine.runner import ServerRunner
from gyre.engine.vllm import VllmEngine

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def fake_vllm(tied_heads: int | None = None) -> tuple[FastAPI, dict]:
    """``tied_heads``: what Gyre's worker extension answers; None: a server without it (its
    ``gyre_*`` collective_rpc methods fail, as vLLM's do for a method the worker lacks)."""
    st: dict = {"version": "default", "paused": False, "aborted": set(), "rpc": [], "calls": []}
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m", "max_model_len": 512}]}

    @app.post("/update_weight_version")
    async def version(req: Request):
        st["version"] = (await req.json())["new_version"]
        return {"success": True}

    @app.post("/pause")
    async def pause(mode: str = "abort"):
        st["paused"] = True
        st["calls"].append(f"pause:{mode}")
        return {"status": "paused"}

    @app.post("/resume")
    async def resume():
        st["paused"] = False
        st["calls"].append("resume")
        return {"status": "resumed"}

    @app.post("/collective_rpc")
    async def rpc(req: Request):
        body = await req.json()
        st["rpc"].append(body)
        if body["method"].startswith("gyre_"):
            if tied_heads is None:
                return JSONResponse({"error": f"no method {body['method']}"}, status_code=500)
            return {"results": [str(tied_heads)]}  # vLLM sends an int result as a string
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset():
        st["calls"].append("reset")
        return {}

    @app.post("/inference/v1/abort_requests")
    async def abort(req: Request):
        st["aborted"].update((await req.json())["request_ids"])
        return {}

    @app.post("/inference/v1/generate")
    async def generate(req: Request):
        body = await req.json()
        rid, sp = "generate-tokens-" + body["request_id"], body["sampling_params"]
        st["last"] = body
        if body["token_ids"][0] == 999:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)

        async def events():
            versions: list[str] = []

            def chunk(ids, fin=None):
                ch = {
                    "index": 0,
                    "finish_reason": fin,
                    "stop_reason": None,
                    "token_ids": ids,
                    "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids]},
                }
                if fin:
                    spans, start = [], 0
                    for i, v in enumerate(versions + [None]):
                        if i == len(versions) or (i and v != versions[i - 1]):
                            if i:
                                spans.append({"version": versions[i - 1], "start": start, "end": i})
                            start = i
                    ch["weight_versions"] = spans
                return f"data: {json.dumps({'choices': [ch]})}\n\n"

            for i in range(sp["max_tokens"]):
                while st["paused"] and rid not in st["aborted"]:
                    await asyncio.sleep(0.005)
                if rid in st["aborted"]:
                    yield chunk([], "abort")
                    break
                eos = i == 5 and not sp["ignore_eos"]
                versions.append(st["version"])
                tok = 2 if eos else 100 + i
                done = "stop" if eos else ("length" if i == sp["max_tokens"] - 1 else None)
                yield chunk([tok], done)
                if done:
                    break
                await asyncio.sleep(0.01)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, st


@pytest.fixture
def stack(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    app, st = fake_vllm()
    fake = ServerRunner(app, name="fake-vllm").start()
    engine = VllmEngine(VllmEngineConfig(url=fake.url, model_dir=str(tmp_path), engine_id="v"))
    adapter = ServerRunner(create_app(engine), name="adapter").start()
    try:
        yield adapter.url, st, tmp_path, fake
    finally:
        adapter.stop()
        fake.stop()


async def test_ids_logprobs_stop_and_sampling_map(stack):
    url, st, _, _ = stack
    async with EngineClient(url) as c:
        r = await c.generate([1, 2, 3], {"max_new_tokens": 20, "top_k": -1, "seed": 4})
    assert r.output_ids == [100, 101, 102, 103, 104, 2] and r.logprobs == [-0.5] * 6
    assert r.meta_info.finish_reason.type == "stop" and r.meta_info.finish_reason.matched == 2
    assert r.meta_info.weight_version_segments == [(0, 0)] and r.meta_info.engine_id == "v"
    sp = st["last"]["sampling_params"]
    assert st["last"]["token_ids"] == [1, 2, 3] and st["last"]["stream"] is True
    assert sp["max_tokens"] == 20 and sp["top_k"] == 0 and sp["seed"] == 4
    assert sp["logprobs"] == 0 and sp["detokenize"] is False


async def test_refusals_are_400s(stack):
    url, *_ = stack
    async with EngineClient(url) as c:
        for ids, sp, words in (
            ([5000], {}, "outside the vocabulary"),
            ([1] * 500, {"max_new_tokens": 100}, "context limit 512"),
            ([1], {"repetition_penalty": 1.3}, "repetition_penalty is not supported"),
        ):
            with pytest.raises(EngineRequestError, match=words):
                await c.generate(ids, sp)
        await c.generate([1], {"repetition_penalty": 1.0, "max_new_tokens": 2})  # neutral: fine


async def test_abort_returns_partial_output(stack):
    url, *_ = stack
    async with EngineClient(url) as c:
        chunks = []

        async def consume():
            async for ch in c.generate_stream(
                [1], {"max_new_tokens": 500, "ignore_eos": True}, rid="r1"
            ):
                chunks.append(ch)

        task = asyncio.create_task(consume())
        while not chunks or len(chunks[-1].output_ids) < 3:
            await asyncio.sleep(0.01)
        assert await c.abort("r1")
        await asyncio.wait_for(task, 10)
    last = chunks[-1]
    assert last.meta_info.finish_reason.type == "abort" and 3 <= len(last.output_ids) < 500


async def test_weight_update_spans_and_calls(stack):
    url, st, model_dir, _ = stack
    async with EngineClient(url) as c:
        chunks = []

        async def consume():
            async for ch in c.generate_stream([1], {"max_new_tokens": 30, "ignore_eos": True}):
                chunks.append(ch)

        task = asyncio.create_task(consume())
        while not chunks or len(chunks[-1].output_ids) < 3:
            await asyncio.sleep(0.01)
        upd = await c.update_weights_from_disk(str(model_dir), weight_version=5)
        await asyncio.wait_for(task, 10)
        info = await c.model_info()
    assert upd.weight_version == 5 and info.weight_version == 5 and info.engine_kind == "vllm"
    segs = chunks[-1].meta_info.weight_version_segments
    assert [v for _, v in segs] == [0, 5] and segs[1][0] >= 3
    assert st["rpc"] == [
        {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir.resolve())}}
    ]
    assert st["calls"] == ["pause:keep", "reset", "resume"]


async def test_weight_update_refusals(stack, tmp_path_factory):
    url, st, model_dir, _ = stack
    other = tmp_path_factory.mktemp("other")
    (other / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 256}))
    async with EngineClient(url) as c:
        with pytest.raises(EngineRequestError, match="hidden_size differ"):
            await c.update_weights_from_disk(str(other))
        with pytest.raises(EngineRequestError, match="config.json"):
            await c.update_weights_from_disk(str(other / "nope"))
    assert st["rpc"] == []


async def _tied_reload(tmp_path, tied_heads: int | None):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "tie_word_embeddings": True}))
    app, st = fake_vllm(tied_heads)
    with ServerRunner(app, name="fake-vllm") as fake:
        eng = VllmEngine(VllmEngineConfig(url=fake.url, model_dir=str(tmp_path)))
        with ServerRunner(create_app(eng), name="adapter") as ad:
            async with EngineClient(ad.url) as c:
                try:
                    return st, await c.update_weights_from_disk(str(tmp_path), weight_version=4)
                except EngineRequestError as e:
                    return st, e


async def test_tied_model_reloads_through_the_extension(tmp_path):
    """A tied model: probed at start, reloaded by gyre_reload_weights (which re-packs the
    head), never by vLLM's plain reload_weights (which leaves the tied head stale)."""
    st, upd = await _tied_reload(tmp_path, tied_heads=1)
    assert not isinstance(upd, Exception) and upd.weight_version == 4
    path = str(tmp_path.resolve())
    assert st["rpc"] == [
        {"method": "gyre_tied_heads"},
        {"method": "gyre_reload_weights", "kwargs": {"weights_path": path}},
    ]
    assert st["version"] == "4" and st["calls"] == ["pause:keep", "reset", "resume"]


async def test_tied_model_reload_refused_without_the_extension(tmp_path):
    for heads in (None, 0):  # no extension; or one that finds no tied head to refresh
        st, err = await _tied_reload(tmp_path, tied_heads=heads)
        assert isinstance(err, EngineRequestError), err
        assert "ties lm_head" in str(err) and "worker-extension-cls" in str(err)
        assert st["rpc"] == [{"method": "gyre_tied_heads"}]  # probed, nothing reloaded
        assert st["version"] == "0" and st["calls"] == []


async def test_upstream_failure_is_an_engine_error(stack):
    url, *_ = stack
    async with EngineClient(url) as c:
        with pytest.raises(EngineServerError, match="vLLM refused the request"):
            await c.generate([999], {"max_new_tokens": 3})
        with pytest.raises(EngineServerError):
            async for _ in c.generate_stream([999], {"max_new_tokens": 3}):
                pass
