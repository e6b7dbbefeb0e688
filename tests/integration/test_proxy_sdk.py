"""The official openai and anthropic SDKs against the proxy + the embedded engine (real tiny model)."""

import pytest
from helpers.servers import running_engine, running_proxy

from gyre.trace.store import read_trace

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

OA_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
AN_TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    with (
        running_engine("embedded", tiny_model_dir, max_batch=4) as eng,
        running_proxy(tiny_model_dir, [eng.url], traces, tiny_tokenizer, fsync=False) as px,
    ):
        yield px, traces, tiny_tokenizer


def _records(traces, key_prefix=None):
    out = []
    for p in sorted(traces.glob("*.jsonl")):
        res = read_trace(p, vocab_size=2048)
        assert res.errors == []
        out.extend(res.records)
    return out


def test_openai_sdk_nonstream_and_stream_with_tools(stack):
    px, traces, tok = stack
    c = openai.OpenAI(base_url=px.url + "/v1", api_key="sdk-openai", max_retries=0)
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List the files."},
    ]
    r = c.chat.completions.create(
        model="tiny", messages=msgs, tools=OA_TOOLS, max_tokens=12, temperature=0.0, logprobs=True
    )
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.completion_tokens == len(ch.logprobs.content) > 0
    assert all(t.logprob <= 0 for t in ch.logprobs.content)
    # the second turn extends the first: recorded as a token-exact continuation
    msgs2 = msgs + [ch.message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=msgs2,
            tools=OA_TOOLS,
            max_tokens=12,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
    finish = [
        x.choices[0].finish_reason for x in chunks if x.choices and x.choices[0].finish_reason
    ]
    usage = [x.usage for x in chunks if x.usage]
    assert finish and usage and usage[0].completion_tokens > 0
    recs = [r for r in _records(traces) if r.meta["model"] == "tiny" and r.api == "openai.chat"]
    first, second = recs[0], recs[1]
    assert second.base == first.request_id and second.base_len == len(first.input_suffix) + len(
        first.output_ids
    )
    assert second.meta["bridge"] == "continuation" and second.meta["stream"] is True
    # what the client read is exactly the decoded recorded output (minus EOS and structure)
    dec = tok.decode(
        [t for t in second.output_ids if t != tok.eos_token_id], skip_special_tokens=False
    )
    assert text.strip() in dec
    assert [s.engine_id for s in second.segments] and second.segments[-1].end == len(
        second.output_ids
    )


def test_anthropic_sdk_nonstream_and_stream_with_tools(stack):
    px, traces, tok = stack
    a = anthropic.Anthropic(base_url=px.url, api_key="sdk-anthropic", max_retries=0)
    kw = dict(
        model="tiny-claude",
        max_tokens=12,
        extra_body={"temperature": 0.0},
        tools=AN_TOOLS,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    )
    m = a.messages.create(messages=[{"role": "user", "content": "hello"}], **kw)
    assert m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert m.usage.output_tokens > 0 and m.usage.input_tokens > 0
    follow = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": "more"},
    ]
    with a.messages.stream(messages=follow, **kw) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert events[0] == "message_start" and "message_stop" in events
    assert final.usage.output_tokens > 0
    n = a.messages.count_tokens(
        model="tiny-claude", messages=[{"role": "user", "content": "hello"}]
    )
    assert n.input_tokens > 0
    recs = [r for r in _records(traces) if r.meta["model"] == "tiny-claude"]
    assert (
        len(recs) == 2
        and recs[1].base == recs[0].request_id
        and recs[1].meta["bridge"] == "continuation"
    )
    assert recs[0].meta["tools"] == ["bash"] and recs[0].meta["system_head"] == "You are terse."


def test_models_and_health(stack):
    px, _, _ = stack
    c = openai.OpenAI(base_url=px.url + "/v1", api_key="x")
    assert [m.id for m in c.models.list().data]
    import httpx

    assert httpx.get(px.url + "/health").json()["status"] == "ok"
