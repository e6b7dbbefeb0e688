"""Scripted and null engines over HTTP, the ServerRunner, and the `gyre engine` CLI as a process."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import httpx
import pytest

from gyre.engine.app import create_app
from gyre.engine.client import EngineClient, EngineRequestError, EngineServerError
from gyre.engine.config import ScriptedEngineConfig
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.engine.scripted import ScriptBook, ScriptedEngine, ScriptedToolCall, ScriptedTurn


async def test_scripted_engine_over_http_streams_tool_calls(tiny_model_dir, tiny_tokenizer):
    turn = ScriptedTurn(
        text="Running it.", tool_calls=[ScriptedToolCall("bash", {"command": "echo hi"})]
    )
    engine = ScriptedEngine(
        ScriptedEngineConfig(
            tokenizer_dir=str(tiny_model_dir), tokens_per_chunk=2, engine_id="scripted-1"
        ),
        ScriptBook.single([turn]),
    )
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "go"}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
    async with ServerRunner(create_app(engine)) as srv, EngineClient(srv.url) as c:
        info = await c.model_info()
        assert info.engine_kind == "scripted" and info.engine_id == "scripted-1"
        chunks = [ch async for ch in c.generate_stream(list(prompt), {"max_new_tokens": 200})]
        assert len(chunks) > 3 and chunks[-1].finished
        text = tiny_tokenizer.decode(chunks[-1].output_ids)
        assert text == turn.render() + "<|im_end|>"
        assert "<tool_call>" in text and chunks[-1].meta_info.engine_id == "scripted-1"


async def test_null_engine_server_and_runner_restart():
    runner = ServerRunner(create_app(NullEngine(num_tokens=8)))
    await runner.astart()
    url = runner.url
    async with EngineClient(url) as c:
        results = await asyncio.gather(
            *[c.generate([1, 2, 3], {"max_new_tokens": 32}) for _ in range(20)]
        )
        assert all(len(r.output_ids) == 8 for r in results)
        assert len({r.meta_info.id for r in results}) == 20
        with pytest.raises(EngineRequestError, match="must not be empty"):
            await c._request(
                "POST", "/generate", {"input_ids": []}
            )  # raw body: the server's own 400
    await runner.astop()
    assert not runner.running
    async with EngineClient(url, connect_timeout=1) as c:
        assert await c.health() is False
    # a fresh runner (new engine, new port) in the same process
    with ServerRunner(create_app(NullEngine(num_tokens=2))) as again:
        r = httpx.post(
            again.url + "/generate",
            json={"input_ids": [1], "sampling_params": {"max_new_tokens": 5}},
        )
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 2


def test_gyre_engine_cli_serves_and_refuses_bad_arguments(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "gyre.cli",
            "engine",
            "--kind",
            "embedded",
            "--model",
            str(tmp_path / "missing"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode == 2 and "missing: no such directory" in bad.stderr
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gyre.cli",
            "engine",
            "--kind",
            "null",
            "--port",
            "0",
            "--engine-id",
            "cli-null",
            "--null-tokens",
            "3",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        url = m.group(0)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "engine CLI never became healthy"
            time.sleep(0.2)
        info = httpx.get(url + "/get_model_info").json()
        assert info["engine_id"] == "cli-null" and info["engine_kind"] == "null"
        r = httpx.post(
            url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 9}}
        )
        assert len(r.json()["output_ids"]) == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_stream_interval_and_incremental_output():
    def app(**kw):
        return create_app(NullEngine(num_tokens=40, token_delay_s=0.002, eos_token_id=7), **kw)

    sp = {"max_new_tokens": 100}
    async with ServerRunner(app(stream_interval=10)) as srv, EngineClient(srv.url) as c:
        chunks = [ch async for ch in c.generate_stream([1], sp)]
        sizes = [len(ch.output_ids) for ch in chunks]
        assert all(b - a >= 10 for a, b in zip([0] + sizes[:-2], sizes[:-1])) and sizes[-1] == 41
        assert chunks[-1].finished and len(chunks) <= 5
    async with (
        ServerRunner(app(incremental_streaming_output=True)) as srv,
        EngineClient(srv.url) as c,
    ):
        chunks = [ch async for ch in c.generate_stream([1], sp)]
        assert len(chunks) > 2
        ids = [t for ch in chunks for t in ch.output_ids]
        lps = [lp for ch in chunks for lp in ch.logprobs]
        assert ids == ([100, 101, 102, 103] * 10 + [7]) and len(lps) == 41
        assert chunks[-1].meta_info.completion_tokens == 41  # counts stay cumulative
    async with (
        ServerRunner(app(incremental_streaming_output=True)) as srv,
        EngineClient(srv.url, incremental_stream=True) as c,
    ):
        chunks = [ch async for ch in c.generate_stream([1], sp)]
        assert (
            chunks[-1].output_ids == [100, 101, 102, 103] * 10 + [7]
            and len(chunks[-1].logprobs) == 41
        )
        assert all(
            a.output_ids == b.output_ids[: len(a.output_ids)] for a, b in zip(chunks, chunks[1:])
        )
    with pytest.raises(ValueError):
        create_app(NullEngine(), stream_interval=0)


def test_engine_service_start_stop_and_clear_startup_failure(tmp_path):
    from gyre.engine.config import EmbeddedEngineConfig, NullEngineConfig
    from gyre.engine.service import EngineService

    svc = EngineService(NullEngineConfig(engine_id="svc-null", num_tokens=2))
    url = svc.start()
    assert svc.start() == url  # idempotent
    info = httpx.get(url + "/get_model_info").json()
    assert info["engine_id"] == "svc-null" == svc.engine_id
    svc.stop()
    bad = EngineService(EmbeddedEngineConfig(model_dir=str(tmp_path / "nope")))
    with pytest.raises(RuntimeError, match="failed to start: .*nope"):
        bad.start()


async def test_engine_bug_is_a_500_in_protocol_shape():
    class BrokenEngine(NullEngine):  # test double: an engine with a bug in request handling
        def validate(self, req):
            raise RuntimeError("bug in validate")

    async with ServerRunner(create_app(BrokenEngine())) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            resp = await http.post("/generate", json={"input_ids": [1]})
        assert resp.status_code == 500 and "bug in validate" in resp.json()["error"]["message"]
        async with EngineClient(srv.url) as c:
            with pytest.raises(EngineServerError, match="bug in validate"):
                await c.generate([1], {"max_new_tokens": 1})


async def test_long_cumulative_streams_are_coalesced_by_default():
    engine = NullEngine(num_tokens=1500, token_delay_s=0.0005)
    async with (
        ServerRunner(
            create_app(engine, stream_coalesce_after=100, stream_min_interval_s=0.05)
        ) as srv,
        EngineClient(srv.url) as c,
    ):
        t0 = time.monotonic()
        chunks = [ch async for ch in c.generate_stream([1], {"max_new_tokens": 1500})]
        elapsed = time.monotonic() - t0
    sizes = [len(ch.output_ids) for ch in chunks]
    assert sizes[-1] == 1500 and chunks[-1].finished
    assert all(b > a for a, b in zip(sizes, sizes[1:]) if b < 1500)
    long_chunks = [s for s in sizes if s > 100]
    # past 100 tokens: at most one chunk per 50 ms, plus the final one
    assert len(long_chunks) <= elapsed / 0.05 + 2, (len(long_chunks), elapsed)
    assert all(chunks[-1].output_ids[: len(ch.output_ids)] == ch.output_ids for ch in chunks)
