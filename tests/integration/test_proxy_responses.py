"""The OpenAI SDK's ``client.responses`` against the proxy (scripted engine, real tokenizer).

A Codex-shaped tool loop (instructions, developer + user input messages, function
tools next to tools the policy cannot serve (a namespace, as Codex 0.171 sends), ``store: false``, reasoning,
``include``): streamed and not, the client sending back the output items with
re-serialised arguments and ``function_call_output`` items. Every call after the
first must be a token-exact continuation of the one before (no ``forked`` record).
"""

import hashlib
import json

import httpx
import pytest
from helpers.servers import running_engine, running_proxy

from gyre.trace.store import read_trace, trace_path

openai = pytest.importorskip("openai")

TURNS = [
    {
        "reasoning": "I should list the files first.",
        "text": "Let me look around.",
        "tool_calls": [{"name": "shell", "arguments": {"command": ["ls", "-la"], "timeout": 30}}],
    },
    {
        "tool_calls": [
            {"name": "shell", "arguments": {"command": ["cat", "a.py"]}},
            {"name": "update_plan", "arguments": {"plan": [{"step": "fix", "status": "pending"}]}},
        ]
    },
    {"text": "All done."},
]

TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    },
    {"type": "function", "name": "update_plan", "parameters": {"type": "object"}},
    {"type": "web_search"},
    {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
    {"type": "local_shell"},
    {  # Codex 0.171 offers its sub-agent tools as a namespace
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "agents",
        "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}],
    },
]
CODEX = dict(
    model="tiny",
    instructions="You are a coding agent.",
    tools=TOOLS,
    store=False,
    reasoning={"effort": "medium", "summary": "auto"},
    include=["reasoning.encrypted_content"],
    parallel_tool_calls=False,
    prompt_cache_key="session-1",
    tool_choice="auto",
    extra_body={"client_metadata": {"x-codex-turn-metadata": '{"request_kind": "turn"}'}},
)


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    with (
        running_engine("scripted", tiny_model_dir, turns=TURNS) as eng,
        running_proxy(tiny_model_dir, [eng.url], traces, tiny_tokenizer, fsync=False) as px,
    ):
        yield px, traces


def _inputs(records):
    full, inputs = {}, {}
    for r in records:
        base = full[r.base][: r.base_len] if r.base else []
        inputs[r.request_id] = base + list(r.input_suffix)
        full[r.request_id] = inputs[r.request_id] + list(r.output_ids)
    return inputs


def _records(traces, key):
    """The records of the execution an open-mode key names."""
    return read_trace(
        trace_path(traces, "open-" + hashlib.sha256(key.encode()).hexdigest()[:16])
    ).records


def _echo(item, keep_ids):
    """What a client sends back for an output item: ids kept (Codex 0.171) or dropped (earlier
    Codex versions), arguments re-serialised its own way."""
    d = item.model_dump(exclude_none=True)
    if not keep_ids:
        d.pop("id", None)
        d.pop("status", None)
    if d["type"] == "function_call":
        d["arguments"] = json.dumps(json.loads(d["arguments"]), indent=2, sort_keys=True)
    return d


def _run(c, mode):
    """One tool loop over TURNS; returns the outputs (list of item lists)."""
    inp = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "ok"}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Fix a.py"}],
        },
    ]
    outs = []
    for k in range(len(TURNS)):
        how = mode if mode != "mixed" else ("stream", "create", "helper")[k % 3]
        if how == "create":
            r = c.responses.create(input=inp, **CODEX)
        elif how == "stream":
            events = list(c.responses.create(input=inp, stream=True, **CODEX))
            seqs = [e.sequence_number for e in events]
            assert seqs == list(range(len(events)))
            assert events[0].type == "response.created" and events[1].type == "response.in_progress"
            assert events[-1].type == "response.completed"
            r = events[-1].response
            done = [e.item for e in events if e.type == "response.output_item.done"]
            assert [i.model_dump() for i in done] == [i.model_dump() for i in r.output]
        else:
            with c.responses.stream(input=inp, **CODEX) as s:
                r = s.get_final_response()
        assert r.status == "completed" and r.usage.output_tokens > 0
        assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
        outs.append(r.output)
        inp = inp + [_echo(i, keep_ids=mode != "create") for i in r.output]
        calls = [i for i in r.output if i.type == "function_call"]
        for i, fc in enumerate(calls):
            out = {"type": "function_call_output", "call_id": fc.call_id, "output": f"out {i}"}
            inp.append({**out, "id": f"fco_{k}_{i}"})
        if not calls:
            inp.append({"role": "user", "content": "thanks"})
    return outs


def _check_chain(records):
    assert len(records) == len(TURNS)
    inputs = _inputs(records)
    for prev, cur in zip(records, records[1:]):
        assert cur.base == prev.request_id and not cur.forked, cur.meta
        assert cur.meta["bridge"] == "continuation"
        assert cur.base_len == len(inputs[prev.request_id]) + len(prev.output_ids)
        assert inputs[cur.request_id][: cur.base_len] == inputs[prev.request_id] + list(
            prev.output_ids
        )
    for r in records:
        assert r.api == "openai.responses"
        assert r.meta["tools"] == ["shell", "update_plan"]
        assert r.meta["dropped_tools"] == [
            "web_search",
            "custom:apply_patch",
            "local_shell",
            "namespace:multi_agent_v1",
        ]


@pytest.mark.parametrize("mode", ["create", "stream", "mixed"])
def test_responses_tool_loop_is_token_exact(stack, mode):
    px, traces = stack
    key = f"resp-{mode}"
    c = openai.OpenAI(base_url=px.url + "/v1", api_key=key, max_retries=0)
    outs = _run(c, mode)
    first = outs[0]
    assert [i.type for i in first] == ["reasoning", "message", "function_call"]
    assert first[0].content[0].text == TURNS[0]["reasoning"]
    assert first[1].content[0].text == "Let me look around."
    assert first[2].name == "shell"
    assert json.loads(first[2].arguments) == TURNS[0]["tool_calls"][0]["arguments"]
    assert first[2].call_id.startswith("call_")
    assert [i.type for i in outs[1]] == ["function_call", "function_call"]
    assert [i.type for i in outs[2]] == ["message"] and outs[2][0].content[0].text == "All done."
    _check_chain(_records(traces, key))


def test_string_input_logprobs_and_stored_state_rules(stack):
    px, traces = stack
    c = openai.OpenAI(base_url=px.url + "/v1", api_key="resp-misc", max_retries=0)
    r = c.responses.create(
        model="tiny",
        input="hello",
        store=True,  # accepted, nothing is stored
        include=["message.output_text.logprobs"],
        max_output_tokens=50,
    )
    assert r.output_text and r.store is False
    lps = r.output[-1].content[0].logprobs if r.output[-1].type == "message" else None
    assert (
        lps is not None and len(lps) == r.usage.output_tokens and all(x.logprob <= 0 for x in lps)
    )
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", input="again", previous_response_id=r.id)
    assert e.value.status_code == 400 and e.value.code == "previous_response_not_found"
    # a stream that hits max_output_tokens ends with response.incomplete
    events = list(c.responses.create(model="tiny", input="more", max_output_tokens=1, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "at least one"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "call_id"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_bad_bodies_are_openai_shaped_400(stack, body, needle):
    px, _ = stack
    r = httpx.post(
        px.url + "/v1/responses", json=body, headers={"authorization": "Bearer resp-bad"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_retry_of_an_answered_call_is_replayed_not_resampled(stack, stream):
    px, traces = stack
    key = f"resp-retry-{stream}"
    body = json.dumps({"model": "m", "input": "retry me", "stream": stream}).encode()
    h = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def call(extra):
        r = httpx.post(px.url + "/v1/responses", content=body, headers={**h, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()
        data = [json.loads(x[6:]) for x in r.text.split("\n") if x.startswith("data: ")]
        assert [e["sequence_number"] for e in data] == list(range(len(data)))
        assert data[-1]["type"] == "response.completed"
        return data[-1]["response"]

    first = call({})
    again = call({"x-stainless-retry-count": "1"})
    assert again["id"] == first["id"] and again["output"] == first["output"]
    assert len(_records(traces, key)) == 1
