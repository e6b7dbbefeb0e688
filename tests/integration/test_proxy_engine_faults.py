"""Engine faults (issue 13, item 7): each ends in a bounded, API-shaped answer, in bounded time,
with a bounded number of engine calls.

Engines here are real HTTP servers on loopback: a closed port (dead), a null engine process
stopped with SIGSTOP (frozen), a stream that goes silent after a few chunks (frozen mid-answer,
with a healthy engine to move to), engines that answer a stream request with a plain JSON body or
with SSE that is not JSON (protocol violations), and an empty pool.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gyre.engine.runner import ServerRunner
from gyre.ports import free_ports
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer

OA = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
AN = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
FAST = dict(  # short limits so each fault shows in a second or two
    engine_wait_s=1.0,
    engine_first_byte_timeout_s=1.5,
    engine_idle_timeout_s=1.0,
    engine_probe_after_s=0.5,
    engine_probe_timeout_s=0.5,
    engine_max_attempts=4,
    engine_retry_budget_s=3.0,
    fsync=False,
)


class FakeEngine:
    """A /generate server whose answer to a request is chosen by ``mode``; counts the calls."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

        async def generate(request: Request) -> Response:
            self.calls += 1
            req = json.loads(await request.body())
            if self.mode == "plain_json":  # a stream request answered as if it were not one
                return JSONResponse(_answer([5, 6, 7], "stop"))
            if self.mode == "garbage_sse":
                return StreamingResponse(_garbage(), media_type="text/event-stream")
            if self.mode == "freeze_mid_stream":
                return StreamingResponse(_then_silent(), media_type="text/event-stream")
            if self.mode == "slow":  # busy (long queue/prefill) but alive: answers probes
                if not req.get("stream"):
                    await asyncio.sleep(2.0)
                    return JSONResponse(_answer([7, 8], "stop"))
                return StreamingResponse(_slow_stream(), media_type="text/event-stream")
            raise AssertionError(f"unknown mode {self.mode} ({req.get('rid')})")

        async def info(request: Request) -> Response:
            return JSONResponse({"model_path": "fake", "engine_id": f"fake-{mode}"})

        async def ok(request: Request) -> Response:
            return JSONResponse({})

        app = Starlette(
            routes=[
                Route("/generate", generate, methods=["POST"]),
                Route("/get_model_info", info),
                Route("/health", ok),
                Route("/abort_request", ok, methods=["POST"]),
            ]
        )
        self.runner = ServerRunner(app, name=f"fake-{mode}")

    def __enter__(self) -> FakeEngine:
        self.runner.start()
        return self

    def __exit__(self, *exc) -> None:
        self.runner.stop()

    @property
    def url(self) -> str:
        return self.runner.url


def _answer(ids: list[int], finish: str | None) -> dict:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "x",
            "finish_reason": {"type": finish} if finish else None,
            "output_token_logprobs": [[-0.1, t, None] for t in ids],
        },
    }


async def _garbage():
    yield b"data: this is not json\n\n"
    yield b"data: [DONE]\n\n"


async def _slow_stream():
    await asyncio.sleep(2.0)
    yield b"data: " + json.dumps(_answer([7, 8], "stop")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _then_silent():
    for k in range(1, 4):  # three tokens, cumulative as SGLang streams them
        yield b"data: " + json.dumps(_answer(list(range(100, 100 + k)), None)).encode() + b"\n\n"
        await asyncio.sleep(0.01)
    await asyncio.Event().wait()  # frozen: the connection stays open, nothing more comes


def proxy(tiny_model_dir, tokenizer, tmp_path, engines: list[str], **cfg) -> ProxyServer:
    config = ProxyConfig(
        model_dir=str(tiny_model_dir),
        engines=engines,
        trace_dir=str(tmp_path / "traces"),
        **{**FAST, **cfg},
    )
    return ProxyServer(config, tokenizer)


def post(px: ProxyServer, path: str, body: dict, **kw) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(px.url + path, json=body, headers={"authorization": "Bearer k"}, timeout=60)
    return r, time.monotonic() - t0


def _openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    return err


def test_dead_engine_backs_off_then_503_with_retry_after(tiny_model_dir, tiny_tokenizer, tmp_path):
    dead = f"http://127.0.0.1:{free_ports()[0]}"  # nothing listens there
    with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [dead]) as px:
        r, took = post(px, "/v1/chat/completions", OA)
        err = _openai_error(r, 503)
        assert "4 attempts" in err["message"] and dead in err["message"]
        assert 1 <= int(r.headers["retry-after"]) <= 30
        pool = px.service.pool.counters
        assert pool.engine_errors == 4  # engine_max_attempts, not 17
        assert pool.backoff_waits == 3  # one wait before each try again
        # 3 waits of 0.125-0.25, 0.25-0.5, 0.5-1 s: backed off, and within the budget
        assert 0.8 <= took <= 5.0, took
        r, _ = post(px, "/v1/messages", AN)  # Anthropic shape too
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        assert r.headers["retry-after"]


def test_empty_pool_waits_the_configured_time(tiny_model_dir, tiny_tokenizer, tmp_path):
    with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [], engine_wait_s=0.8) as px:
        r, took = post(px, "/v1/chat/completions", OA)
        err = _openai_error(r, 503)
        assert "0.8 s" in err["message"] and r.headers["retry-after"]
        assert 0.75 <= took <= 2.0, took


@pytest.mark.slow
def test_frozen_engine_process_is_declared_failed(tiny_model_dir, tiny_tokenizer, tmp_path):
    """A real engine process stopped with SIGSTOP: 504 after the timeouts, not a hang."""
    port = free_ports()[0]
    gyre = str(Path(sys.executable).parent / "gyre")
    eng = subprocess.Popen(
        [gyre, "engine", "--kind", "null", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "engine did not start"
            time.sleep(0.2)
        with proxy(  # no hard read limits: the liveness probe alone finds the frozen engine
            tiny_model_dir,
            tiny_tokenizer,
            tmp_path,
            [url],
            engine_max_attempts=2,
            engine_first_byte_timeout_s=None,
            engine_idle_timeout_s=None,
        ) as px:
            r, _ = post(px, "/v1/chat/completions", OA)
            assert r.status_code == 200  # alive: served
            os.kill(eng.pid, signal.SIGSTOP)
            for stream in (False, True):
                r, took = post(px, "/v1/chat/completions", {**OA, "stream": stream})
                err = _openai_error(r, 504)
                assert "did not answer in time" in err["message"] and r.headers["retry-after"]
                assert "liveness probe" in err["message"]
                # 2 attempts x (0.5 s silence + 0.5 s probe) + one back-off wait (<= 0.25 s)
                assert 1.5 <= took <= 6.0, (stream, took)
            counters = px.service.pool.counters
            assert counters.engine_timeouts == 4 and counters.probes_failed >= 2
    finally:
        os.kill(eng.pid, signal.SIGCONT)
        eng.kill()
        eng.wait(10)


def test_frozen_mid_stream_moves_to_another_engine_with_its_output(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """Silent after three tokens: the call moves to a working engine, which continues from there."""
    from gyre.engine.app import create_app
    from gyre.engine.config import NullEngineConfig
    from gyre.engine.null import NullEngine

    null = NullEngine(NullEngineConfig(engine_id="null-good"))
    with (
        FakeEngine("freeze_mid_stream") as frozen,
        ServerRunner(create_app(null), name="null") as good,
    ):
        with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [frozen.url]) as px:
            px.add_engine(good.url)
            ex = "open-" + hashlib.sha256(b"k").hexdigest()[:16]  # the key's execution (open mode)
            px.service.pool.affinity[ex] = frozen.url  # ... is placed on the frozen engine
            r, took = post(px, "/v1/chat/completions", {**OA, "max_tokens": 12, "stream": True})
            assert r.status_code == 200, r.text
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
            assert 0.9 <= took <= 5.0, took  # one idle timeout (1 s), then the rest elsewhere
            assert frozen.calls == 1
            (trace,) = (tmp_path / "traces").glob("*.jsonl")
            rec = json.loads(trace.read_text().splitlines()[-1])
            assert rec["output_ids"][:3] == [100, 101, 102]  # the frozen engine's tokens kept
            assert len(rec["output_ids"]) > 3
            assert [s["engine_id"] for s in rec["segments"]] == [
                "fake-freeze_mid_stream",
                "null-good",
            ]
            assert px.service.pool.counters.engine_timeouts == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_slow_but_alive_engine_is_not_declared_frozen(
    tiny_model_dir, tiny_tokenizer, tmp_path, stream
):
    """2 s to the first byte, probes every 0.5 s answered: served, no retry, no false alarm."""
    with FakeEngine("slow") as slow:
        with proxy(
            tiny_model_dir, tiny_tokenizer, tmp_path, [slow.url], engine_first_byte_timeout_s=None
        ) as px:
            r, took = post(px, "/v1/chat/completions", {**OA, "stream": stream})
            assert r.status_code == 200 and '"error"' not in r.text, r.text
            assert slow.calls == 1 and 1.9 <= took <= 6.0, took
            counters = px.service.pool.counters
            assert counters.probes >= 1 and counters.probes_failed == 0
            assert counters.engine_timeouts == 0


@pytest.mark.parametrize("mode", ["plain_json", "garbage_sse"])
def test_protocol_violation_is_a_502_not_retried(tiny_model_dir, tiny_tokenizer, tmp_path, mode):
    with FakeEngine(mode) as bad:
        with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [bad.url]) as px:
            r, took = post(px, "/v1/chat/completions", {**OA, "stream": True})
            err = _openai_error(r, 502)
            assert "broke the /generate protocol" in err["message"], err
            assert err["code"] == "engine_protocol_error"
            assert bad.calls == 1 and took < 3.0  # no retry as if it were transient
            (st,) = px.service.pool.status()
            assert st["suspect"]  # marked, and shown in the pool status


def test_sdk_retries_do_not_multiply_engine_calls(tiny_model_dir, tiny_tokenizer, tmp_path):
    """The official SDKs retry 5xx; each of their tries costs one engine call, no more."""
    import anthropic
    import openai

    with FakeEngine("plain_json") as bad:
        with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [bad.url]) as px:
            oa = openai.OpenAI(base_url=px.url + "/v1", api_key="k", max_retries=2)
            t0 = time.monotonic()
            with pytest.raises(openai.InternalServerError) as e:
                list(oa.chat.completions.create(**{**OA, "stream": True}))
            assert e.value.status_code == 502
            assert bad.calls == 3  # 1 + 2 SDK retries (was ~170 engine calls)
            an = anthropic.Anthropic(base_url=px.url, api_key="k", max_retries=2)
            with pytest.raises(anthropic.InternalServerError):
                list(an.messages.create(**{**AN, "stream": True}))
            assert bad.calls == 6
            assert time.monotonic() - t0 < 30


async def test_engine_client_names_protocol_violations_and_pings():
    from gyre.engine.client import EngineClient, EngineProtocolError

    for mode in ("plain_json", "garbage_sse"):
        with FakeEngine(mode) as bad:
            async with EngineClient(bad.url) as c:
                with pytest.raises(EngineProtocolError):
                    async for _ in c.generate_stream([1, 2], {"max_new_tokens": 2}):
                        pass
                assert await c.ping()
    async with EngineClient(f"http://127.0.0.1:{free_ports()[0]}") as c:
        assert not await c.ping()


def test_responses_stream_that_loses_its_engine_ends_with_response_failed(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    """Frozen mid-answer with nowhere to move: the Responses stream's last event is
    response.failed carrying the error (the SDK raises nothing, Codex reads it), never a cut."""
    with FakeEngine("freeze_mid_stream") as frozen:
        with proxy(tiny_model_dir, tiny_tokenizer, tmp_path, [frozen.url]) as px:
            body = {"model": "m", "input": "hi", "stream": True, "max_output_tokens": 1000}
            r, took = post(px, "/v1/responses", body)
            assert r.status_code == 200 and took < 20
            events = [json.loads(x[6:]) for x in r.text.split("\n") if x.startswith("data: ")]
            kinds = [e["type"] for e in events]
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert "response.output_text.delta" in kinds  # it had started answering
            assert kinds[-1] == "response.failed", kinds
            err = events[-1]["response"]["error"]
            assert err["message"] and err["code"]
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
