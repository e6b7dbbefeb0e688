"""The proxy fuzz corpus, extended (issue 13 items 6, 8): huge prompts, tool results that answer no
tool call, image blocks and parts (with and without a source, bad base64): never a 5xx; a prompt
that cannot fit is refused early and cheaply; an oversized body is a 413 (sized or chunked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.engine.app import create_app
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.ports import free_ports
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer

CONTEXT = 4096
LIMIT = 8 << 20
B64 = "iVBORw0KGgo="


@pytest.fixture(scope="module")
def px(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    cfg = ProxyConfig(
        model_dir=str(tiny_model_dir),
        engines=[],
        trace_dir=str(tmp_path_factory.mktemp("traces")),
        fsync=False,
        max_context_tokens=CONTEXT,
        max_body_bytes=LIMIT,
    )
    with (
        ServerRunner(create_app(NullEngine(NullEngineConfig(engine_id="null"))), name="n") as eng,
        ProxyServer(cfg.model_copy(update={"engines": [eng.url]}), tiny_tokenizer) as server,
    ):
        yield server


def post(px, path: str, body=None, raw: bytes | None = None, key: str = "fuzz"):
    content = raw if raw is not None else json.dumps(body).encode()
    h = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(px.url + path, content=content, headers=h, timeout=120)


def test_huge_prompt_is_refused_early_in_both_dialects(px):
    words = "alpha beta gamma delta " * (6 << 20 >> 5)  # ~6 MB of text, under the body limit
    for path, body in [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": words}]}),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": words}]},
        ),
        (
            "/v1/messages/count_tokens",
            {"model": "m", "messages": [{"role": "user", "content": words}]},
        ),
        ("/v1/responses", {"model": "m", "input": words}),
        (
            "/v1/responses",
            {"model": "m", "input": [{"role": "user", "content": [_input_text(words)]}]},
        ),
    ]:
        t0 = time.monotonic()
        r = post(px, path, body)
        took = time.monotonic() - t0
        assert r.status_code == 400, r.text[:300]
        assert "at least" in r.text and ("context length" in r.text or "too long" in r.text)
        assert took < 10, (path, took)  # rendering + tokenizing 6 MB took ~20 s before
    # a tool result that is huge (the usual shape of an agent's long context)
    tool = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [_tc("t1")]},
            {"role": "tool", "tool_call_id": "t1", "content": words},
        ],
    }
    r = post(px, "/v1/chat/completions", tool)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    tool = {
        "model": "m",
        "input": [
            {"role": "user", "content": "run it"},
            {"type": "function_call", "call_id": "t1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "t1", "output": words},
        ],
    }
    t0 = time.monotonic()
    r = post(px, "/v1/responses", tool)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "input"
    assert time.monotonic() - t0 < 10


def test_oversized_body_is_413_sized_or_chunked(px):
    r = post(px, "/v1/chat/completions", raw=b" " * (LIMIT + 1))
    assert r.status_code == 413 and r.json()["error"]["message"]

    def chunks():  # no Content-Length: the running count trips
        for _ in range(LIMIT // (1 << 20) + 2):
            yield b" " * (1 << 20)

    r = httpx.post(
        px.url + "/v1/messages",
        content=chunks(),
        headers={"authorization": "Bearer fuzz", "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_image_without_source_is_400(px):
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}
        ],
    }
    r = post(px, "/v1/messages", body)
    assert r.status_code == 400 and "source" in r.json()["error"]["message"]


def _input_text(text: str) -> dict:
    return {"type": "input_text", "text": text}


def _tc(cid: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "bash", "arguments": "{}"}}


ids = st.sampled_from(["t1", "t2", "unknown", "", "toolu_x"])
big_text = st.sampled_from([0, 10, 5000, 300_000, 3_000_000]).map(lambda n: "word " * (n // 5))
b64 = st.sampled_from([B64, "", "abc", "%%%%", "QUFB" * 50_000])
an_image = st.one_of(
    st.just({"type": "image"}),
    st.builds(
        lambda d, mt: {"type": "image", "source": {"type": "base64", "media_type": mt, "data": d}},
        b64,
        st.sampled_from(["image/png", "", None]),
    ),
    st.builds(
        lambda u: {"type": "image", "source": {"type": "url", "url": u}},
        st.sampled_from(["https://x/y.png", ""]),
    ),
    st.just({"type": "image", "source": {"type": "bogus"}}),
)
oa_image = st.one_of(
    st.just({"type": "image_url"}),
    st.builds(
        lambda d: {"type": "image_url", "image_url": {"url": "data:image/png;base64," + d}}, b64
    ),
    st.just({"type": "image_url", "image_url": {"url": "https://x/y.png"}}),
    st.just({"type": "image_url", "image_url": "https://x/y.png"}),
)
oa_message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, big_text),
    st.builds(
        lambda p: {"role": "user", "content": [p, {"type": "text", "text": "what is it?"}]},
        oa_image,
    ),
    st.builds(lambda i: {"role": "assistant", "content": None, "tool_calls": [_tc(i)]}, ids),
    st.builds(lambda i, t: {"role": "tool", "tool_call_id": i, "content": t}, ids, big_text),
)
an_block = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, big_text),
    an_image,
    st.builds(
        lambda i, c: {"type": "tool_result", "tool_use_id": i, "content": c},
        ids,
        st.one_of(big_text, st.lists(an_image, max_size=2)),
    ),
)
an_message = st.one_of(
    st.builds(
        lambda bs: {"role": "user", "content": bs}, st.lists(an_block, min_size=1, max_size=3)
    ),
    st.builds(
        lambda i: {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": i, "name": "bash", "input": {}}],
        },
        ids,
    ),
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(msgs=st.lists(oa_message, min_size=1, max_size=4), stream=st.booleans())
def test_fuzz_openai_huge_tools_images_never_5xx(px, msgs, stream):
    r = post(
        px,
        "/v1/chat/completions",
        {"model": "m", "max_tokens": 4, "stream": stream, "messages": msgs},
    )
    assert r.status_code < 500, r.text[:300]
    if r.status_code == 200 and stream:
        assert '"error"' not in r.text


rs_image = st.one_of(
    st.just({"type": "input_image"}),
    st.builds(lambda d: {"type": "input_image", "image_url": "data:image/png;base64," + d}, b64),
    st.just({"type": "input_file", "file_id": "f"}),
)
rs_item = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, big_text),
    st.builds(
        lambda p, t: {"type": "message", "role": "user", "content": [p, _input_text(t)]},
        rs_image,
        big_text,
    ),
    st.builds(lambda t: {"role": "developer", "content": [_input_text(t)]}, big_text),
    st.builds(
        lambda i: {"type": "function_call", "call_id": i, "name": "bash", "arguments": "{}"}, ids
    ),
    st.builds(
        lambda i, t: {"type": "function_call_output", "call_id": i, "output": t}, ids, big_text
    ),
    st.builds(
        lambda i, p: {"type": "function_call_output", "call_id": i, "output": [p]}, ids, rs_image
    ),
    st.builds(
        lambda t: {"type": "reasoning", "summary": [{"type": "summary_text", "text": t}]}, big_text
    ),
    st.builds(
        lambda t: {"role": "assistant", "content": [{"type": "output_text", "text": t}]}, big_text
    ),
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=st.lists(rs_item, min_size=1, max_size=4), stream=st.booleans())
def test_fuzz_responses_huge_tools_images_never_5xx(px, items, stream):
    body = {"model": "m", "max_output_tokens": 4, "stream": stream, "input": items}
    body["tools"] = [{"type": "function", "name": "bash"}, {"type": "web_search"}]
    r = post(px, "/v1/responses", body)
    assert r.status_code < 500, r.text[:300]
    if r.status_code == 200 and stream:
        assert "response.failed" not in r.text
        assert "response.completed" in r.text or "response.incomplete" in r.text


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    msgs=st.lists(an_message, min_size=1, max_size=4),
    path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]),
)
def test_fuzz_anthropic_huge_tools_images_never_5xx(px, msgs, path):
    r = post(px, path, {"model": "m", "max_tokens": 4, "messages": msgs})
    assert r.status_code < 500, r.text[:300]
    no_source = any(
        b.get("type") == "image" and "source" not in b
        for m in msgs
        if m["role"] == "user"
        for b in m["content"]
    )
    if no_source:
        assert r.status_code == 400


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.mark.slow
def test_refusing_a_20mb_prompt_costs_a_few_times_its_size(tiny_model_dir, tmp_path):
    """A real `gyre proxy` process: peak RSS growth per MB of a refused 20 MB prompt (was ~150)."""
    (port,) = free_ports()
    gyre = str(Path(sys.executable).parent / "gyre")
    cmd = [gyre, "proxy", "--model", str(tiny_model_dir), "--engine", "http://127.0.0.1:9"]
    cmd += ["--port", str(port), "--trace-dir", str(tmp_path), "--no-fsync"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(url + "/v1/models", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "proxy did not start"
                time.sleep(0.3)
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "alpha beta " * (2 << 20)}]}
        ).encode()
        mb = len(body) / (1 << 20)
        before = _kb(proc.pid, "VmRSS")
        t0 = time.monotonic()
        r = httpx.post(
            url + "/v1/chat/completions",
            content=body,
            headers={"authorization": "Bearer k"},
            timeout=120,
        )
        took = time.monotonic() - t0
        growth_mb = (_kb(proc.pid, "VmHWM") - before) / 1024
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert growth_mb / mb < 8, (growth_mb, mb)
        assert took < 20, took
    finally:
        proc.terminate()
        proc.wait(20)
