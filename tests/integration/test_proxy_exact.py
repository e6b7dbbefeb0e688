"""Token exactness over a multi-turn tool conversation whose JSON the client re-serialises.

The scripted engine (a test double: fixed turns through the real tokenizer)
writes tool calls with its own spacing; the clients send them back re-serialised
(indent/sorted keys for OpenAI, compact dicts via the Anthropic SDK). The
recorded prefix of turn k+1 must be turn k's input plus output, token for token.
"""

import json

import pytest
from helpers.servers import running_engine, running_proxy

from gyre.proxy.render import Renderer
from gyre.trace.store import read_trace, trace_path

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

TURNS = [
    {
        "text": "Let me look around.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls   -la", "timeout": 30}}],
    },
    {
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "cat a.py"}},
            {"name": "read", "arguments": {"path": "b.py", "limit": 10, "nested": {"k": [1, 2]}}},
        ]
    },
    {
        "reasoning": "The bug is on line 2.",
        "text": "Fixing it.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "sed -i 's/x/y/' a.py"}}],
    },
    {"text": "All done."},
]


def _inputs(records):
    full, inputs = {}, {}
    for r in records:
        base = full[r.base][: r.base_len] if r.base else []
        inputs[r.request_id] = base + list(r.input_suffix)
        full[r.request_id] = inputs[r.request_id] + list(r.output_ids)
    return inputs


def _check_chain(records):
    inputs = _inputs(records)
    assert len(records) == len(TURNS)
    for prev, cur in zip(records, records[1:]):
        assert cur.base == prev.request_id and not cur.forked
        assert cur.meta["bridge"] == "continuation"
        assert cur.base_len == len(inputs[prev.request_id]) + len(prev.output_ids)
        assert inputs[cur.request_id][: cur.base_len] == inputs[prev.request_id] + list(
            prev.output_ids
        )
    return inputs


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    with (
        running_engine("scripted", tiny_model_dir, turns=TURNS) as eng,
        running_proxy(tiny_model_dir, [eng.url], traces, tiny_tokenizer, fsync=False) as px,
    ):
        yield px, traces


def test_openai_reserialised_tool_json_stays_token_exact(stack, tiny_tokenizer):
    px, traces = stack
    c = openai.OpenAI(base_url=px.url + "/v1", api_key="exact-openai", max_retries=0)
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("bash", "read")
    ]
    msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix a.py"}]
    for k in range(len(TURNS)):
        stream = k % 2 == 1
        if stream:
            chunks = list(
                c.chat.completions.create(model="m", messages=msgs, tools=tools, stream=True)
            )
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            calls = [
                tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])
            ]
            calls = [
                {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.function.name, "arguments": t.function.arguments},
                }
                for t in calls
            ]
        else:
            m = c.chat.completions.create(model="m", messages=msgs, tools=tools).choices[0].message
            content = m.content
            calls = [t.model_dump() for t in m.tool_calls or []]
        for t in calls:  # the client re-serialises the arguments its own way
            t["function"]["arguments"] = json.dumps(
                json.loads(t["function"]["arguments"]), indent=2, sort_keys=True
            )
        msg = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        msgs.append(msg)
        for t in calls:
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": t["id"],
                    "content": f"output of {t['function']['name']}",
                }
            )
        if not calls:
            msgs.append({"role": "user", "content": "thanks"})
    res = read_trace(
        trace_path(
            traces,
            next(
                p.stem
                for p in traces.glob("*.jsonl")
                if read_trace(p).records[0].meta["system_head"] == "You fix bugs."
            ),
        )
    )
    inputs = _check_chain(res.records)
    # ...and a naive full re-render of what the client sent would NOT have reproduced the tokens
    r = Renderer(tiny_tokenizer)
    last = res.records[-1]
    naive = r.full(r_norm(msgs[:-1]), tools)
    assert naive != inputs[last.request_id]


def r_norm(msgs):
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def test_anthropic_sdk_tool_loop_stays_token_exact(stack):
    px, traces = stack
    a = anthropic.Anthropic(base_url=px.url, api_key="exact-anthropic", max_retries=0)
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("bash", "read")]
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix a.py", "cache_control": {"type": "ephemeral"}}
            ],
        }
    ]
    for k in range(len(TURNS)):
        kw = dict(
            model="m",
            max_tokens=200,
            system="You fix bugs (anthropic).",
            tools=tools,
            messages=msgs,
        )
        if k % 2:
            with a.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = a.messages.create(**kw)
        for old in msgs:  # Claude Code moves its cache marker to the newest message
            if isinstance(old["content"], list):
                for b in old["content"]:
                    b.pop("cache_control", None)
        msgs.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        )
        uses = [b for b in m.content if b.type == "tool_use"]
        if uses:
            msgs.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": f"result {i}"}
                        for i, b in enumerate(uses)
                    ]
                    + [{"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}],
                }
            )
        else:
            msgs.append({"role": "user", "content": "thanks"})
    p = next(
        p
        for p in traces.glob("*.jsonl")
        if read_trace(p).records[0].meta["system_head"] == "You fix bugs (anthropic)."
    )
    _check_chain(read_trace(p).records)


def test_broken_tool_json_from_the_model_comes_back_as_text(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    broken = 'Try: <tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
    with (
        running_engine("scripted", tiny_model_dir, turns=[{"text": broken}]) as eng,
        running_proxy(tiny_model_dir, [eng.url], tmp_path, tiny_tokenizer, fsync=False) as px,
    ):
        a = anthropic.Anthropic(base_url=px.url, api_key="broken", max_retries=0)
        kw = dict(
            model="m",
            max_tokens=100,
            messages=[{"role": "user", "content": "go"}],
            tools=[{"name": "bash", "input_schema": {"type": "object"}}],
        )
        with a.messages.stream(**kw) as s:
            m = s.get_final_message()
        assert [b.type for b in m.content] == ["text"] and m.content[0].text == broken
        assert m.stop_reason == "end_turn"
        c = openai.OpenAI(base_url=px.url + "/v1", api_key="broken2", max_retries=0)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
        assert r.choices[0].message.content == broken and not r.choices[0].message.tool_calls
