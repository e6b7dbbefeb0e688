"""Issue 37 finding 4: text the template renders but the size floor did not count (tool
definitions, reasoning, ``<think>`` blocks, Anthropic ``thinking``) is counted now, so 5 MB of it
gets the context-length 400 before any render; and a request's tools are capped. The official
openai and anthropic SDKs are the clients; a null engine stands behind the proxy."""

from __future__ import annotations

import pytest

from gyre.engine.app import create_app
from gyre.engine.config import NullEngineConfig
from gyre.engine.null import NullEngine
from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

BIG = "alpha beta gamma delta " * (5 << 20 >> 5)  # ~5 MB of words
MAX_TOOLS = 64


@pytest.fixture(scope="module")
def px(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    cfg = ProxyConfig(
        model_dir=str(tiny_model_dir),
        engines=[],
        trace_dir=str(tmp_path_factory.mktemp("traces")),
        fsync=False,
        max_context_tokens=32768,
        max_tools=MAX_TOOLS,
    )
    with (
        ServerRunner(create_app(NullEngine(NullEngineConfig(engine_id="null"))), name="n") as eng,
        ProxyServer(cfg.model_copy(update={"engines": [eng.url]}), tiny_tokenizer) as server,
    ):
        yield server


def _oa(px):
    return openai.OpenAI(base_url=px.url + "/v1", api_key="oa", max_retries=0, timeout=120)


def _an(px):
    return anthropic.Anthropic(base_url=px.url, api_key="an", max_retries=0, timeout=120)


def _oa_tool(name: str, description: str = "Run a command") -> dict:
    params = {"type": "object", "properties": {"command": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


def _an_tool(name: str, description: str = "Run a command", schema: dict | None = None) -> dict:
    schema = schema or {"type": "object", "properties": {"command": {"type": "string"}}}
    return {"name": name, "description": description, "input_schema": schema}


USER = {"role": "user", "content": "hi"}


def _too_long_openai(px, **kw) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _oa(px).chat.completions.create(model="m", max_tokens=4, **kw)
    assert e.value.status_code == 400
    assert e.value.code == "context_length_exceeded"
    assert "at least" in e.value.message  # the floor refused it, before any render


def _too_long_anthropic(px, **kw) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        _an(px).messages.create(model="m", max_tokens=4, **kw)
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long: at least" in e.value.body["error"]["message"]


def test_huge_openai_tool_description_is_refused_by_the_floor(px):
    _too_long_openai(px, messages=[USER], tools=[_oa_tool("bash", BIG)])


def test_huge_openai_tool_parameters_are_refused_by_the_floor(px):
    tool = _oa_tool("bash")
    tool["function"]["parameters"]["properties"]["command"]["enum"] = BIG.split()[:1] + [BIG]
    _too_long_openai(px, messages=[USER], tools=[tool])


def test_huge_openai_reasoning_content_is_refused_by_the_floor(px):
    turn = {"role": "assistant", "content": "ok", "reasoning_content": BIG}
    _too_long_openai(px, messages=[USER, turn, {"role": "user", "content": "again"}])


def test_huge_think_block_is_refused_by_the_floor(px):
    turn = {"role": "assistant", "content": f"<think>{BIG}</think>ok"}
    _too_long_openai(px, messages=[USER, turn, {"role": "user", "content": "again"}])


def test_huge_anthropic_tool_description_and_schema_are_refused_by_the_floor(px):
    _too_long_anthropic(px, messages=[USER], tools=[_an_tool("bash", BIG)])
    schema = {"type": "object", "properties": {"command": {"type": "string", "description": BIG}}}
    _too_long_anthropic(px, messages=[USER], tools=[_an_tool("bash", schema=schema)])


def test_huge_anthropic_thinking_block_is_refused_by_the_floor(px):
    thinking = {"type": "thinking", "thinking": BIG, "signature": "s"}
    turn = {"role": "assistant", "content": [thinking, {"type": "text", "text": "ok"}]}
    _too_long_anthropic(px, messages=[USER, turn, {"role": "user", "content": "again"}])


def test_too_many_tools_is_a_400_in_each_dialect(px):
    with pytest.raises(openai.BadRequestError) as e:
        _oa(px).chat.completions.create(
            model="m",
            max_tokens=4,
            messages=[USER],
            tools=[_oa_tool(f"t{i}") for i in range(20000)],
        )
    assert e.value.status_code == 400 and e.value.param == "tools"
    assert f"20000 tools exceed this proxy's limit of {MAX_TOOLS}" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e:
        _an(px).messages.create(
            model="m",
            max_tokens=4,
            messages=[USER],
            tools=[_an_tool(f"t{i}") for i in range(20000)],
        )
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "limit of 64 per request" in e.value.body["error"]["message"]
    n = _an(px).messages.count_tokens(
        model="m", messages=[USER], tools=[_an_tool(f"t{i}") for i in range(MAX_TOOLS)]
    )
    assert n.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError):
        _an(px).messages.count_tokens(
            model="m", messages=[USER], tools=[_an_tool(f"t{i}") for i in range(MAX_TOOLS + 1)]
        )


def test_a_normal_request_with_tools_and_reasoning_is_answered(px):
    turn = {"role": "assistant", "content": "<think>hm</think>ok", "reasoning_content": "hm"}
    r = _oa(px).chat.completions.create(
        model="m",
        max_tokens=4,
        messages=[USER, turn, {"role": "user", "content": "again"}],
        tools=[_oa_tool(f"t{i}") for i in range(MAX_TOOLS)],
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    m = _an(px).messages.create(
        model="m",
        max_tokens=4,
        messages=[USER, {"role": "assistant", "content": [thinking]}, USER],
        tools=[_an_tool("bash")],
    )
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
