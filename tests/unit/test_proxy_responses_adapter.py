"""The Responses adapter: item grouping and normalisation, tool rules, bad bodies, and the shapes
of what it answers (validated against the OpenAI SDK's own pydantic types, strictly)."""

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.proxy.adapters import responses as rs
from gyre.proxy.errors import ApiError
from gyre.proxy.types import (
    AssistantTurn,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEvent,
)

openai = pytest.importorskip("openai")
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

EVENT = TypeAdapter(ResponseStreamEvent)


def _msg(role, text):
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


CODEX_INPUT = [
    _msg("developer", "sandbox rules"),
    _msg("user", "Fix a.py"),
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Looking."}],
    },
    {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"a": 1}'},
    {"type": "function_call", "call_id": "call_2", "name": "shell", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "file list"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "u"}],
    },
    {"role": "user", "content": "go on"},
]


def _norm(call, restore=lambda _i: None):
    return [m for item in call.raw_items for m in call.normalize_item(item, restore)]


def test_codex_shaped_input_normalises_to_chat_messages():
    call = rs.parse_request({"model": "m", "instructions": "Be a coder.", "input": CODEX_INPUT})
    assert call.api == "openai.responses"
    # the four assistant-side items are one raw item (one turn) at the index the bridge expects
    assert [it.get("role") for it in call.raw_items] == [
        "system",
        "developer",
        "user",
        "assistant",
        None,
        None,
        "user",
    ]
    assert len(call.raw_items[3]["items"]) == 4
    restored = {"call_1": ("shell", '{"a":   1}')}  # the model's own spelling wins
    norm = _norm(call, restored.get)
    assert norm[:3] == [
        {"role": "system", "content": "Be a coder."},
        {"role": "system", "content": "sandbox rules"},
        {"role": "user", "content": "Fix a.py"},
    ]
    a = norm[3]
    assert a["role"] == "assistant" and a["content"] == "Looking."
    assert a["reasoning_content"] == "hmm"
    assert [(t["id"], t["function"]["arguments"]) for t in a["tool_calls"]] == [
        ("call_1", '{"a":   1}'),
        ("call_2", "{}"),
    ]
    assert norm[4] == {"role": "tool", "tool_call_id": "call_1", "content": "file list"}
    assert norm[5]["content"] == "x\n[input_image omitted: text-only model]"
    assert norm[6] == {"role": "user", "content": "go on"}


def test_string_input_summary_reasoning_and_consecutive_turns():
    assert _norm(rs.parse_request({"input": "hi"})) == [{"role": "user", "content": "hi"}]
    call = rs.parse_request(
        {
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}]},
                {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"},
            ]
        }
    )
    norm = _norm(call)
    assert norm[1] == {"role": "assistant", "content": "a1", "reasoning_content": "sum"}
    assert norm[3] == {"role": "assistant", "content": "a2"}


def test_only_function_tools_reach_the_template():
    call = rs.parse_request(
        {
            "input": "x",
            "tools": [
                {"type": "function", "name": "shell", "parameters": {"type": "object"}},
                {"type": "function", "name": "noparams", "parameters": None, "strict": True},
                {"type": "web_search"},
                {"type": "custom", "name": "apply_patch"},
                {"type": "mcp", "server_label": "gh"},
                {"type": "namespace", "name": "ns", "tools": []},
                {"type": "local_shell"},
            ],
        }
    )
    assert call.tool_names() == ["shell", "noparams"]
    assert call.tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert call.meta["dropped_tools"] == [
        "web_search",
        "custom:apply_patch",
        "mcp:gh",
        "namespace:ns",
        "local_shell",
    ]
    assert [t["name"] for t in call.echo["tools"]] == ["shell", "noparams"]
    only_dropped = rs.parse_request({"input": "x", "tools": [{"type": "web_search"}]})
    assert only_dropped.tools is None


@pytest.mark.parametrize(
    "body,needle",
    [
        ([1], "JSON object"),
        ({"model": "m"}, "input: field required"),
        ({"input": 5}, "input"),
        ({"input": []}, "at least one"),
        ({"input": [1]}, "input[0]"),
        ({"input": "x", "previous_response_id": "resp_1"}, "stores no responses"),
        ({"input": "x", "conversation": {"id": "c"}}, "conversation"),
        ({"input": "x", "prompt": {"id": "p"}}, "prompt"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "instructions": 5}, "instructions"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "tools": {}}, "tools"),
        ({"input": "x", "tools": [{"name": "f"}]}, "tools[0]"),
        ({"input": "x", "tools": [{"type": "function", "parameters": 1, "name": "f"}]}, "param"),
        ({"input": "x", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"input": [{"role": "tool", "content": "x"}]}, "role"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"type": "web_search_call"}]}, "web_search_call"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "name"),
        ({"input": [{"role": "user", "content": 5}]}, "content"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "text"),
    ],
)
def test_bad_requests(body, needle):
    with pytest.raises(ApiError) as e:
        _norm(rs.parse_request(body))
    assert e.value.status == 400 and needle in e.value.message
    assert e.value.openai_body()["error"]["type"] == "invalid_request_error"


def test_previous_response_id_has_the_apis_code():
    with pytest.raises(ApiError) as e:
        rs.parse_request({"input": "x", "previous_response_id": "resp_1"})
    assert e.value.code == "previous_response_not_found"
    assert e.value.param == "previous_response_id"
    assert rs.parse_request({"input": "x", "store": True}).stream is False  # store: ignored


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 5) | st.text(max_size=5),
    lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=5), i, max_size=3),
    max_leaves=8,
)
item = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["message", "function_call", "function_call_output", "reasoning", "x", None]
            ),
            "role": st.sampled_from(["user", "assistant", "developer", "system", "tool", None]),
        },
        optional={
            "content": json_values,
            "call_id": json_values,
            "name": json_values,
            "arguments": json_values,
            "output": json_values,
            "summary": json_values,
        },
    ),
)
body_rs = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values,
        "input": st.one_of(json_values, st.lists(item, max_size=5)),
        "instructions": json_values,
        "tools": st.one_of(json_values, st.lists(json_values, max_size=3)),
        "tool_choice": json_values,
        "max_output_tokens": json_values,
        "stream": json_values,
        "store": json_values,
        "include": json_values,
        "reasoning": json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body_rs)
def test_fuzz_responses_schema(body):
    try:
        _norm(rs.parse_request(body))
    except ApiError as e:
        assert e.status == 400 and e.message


# ---- answers ----------------------------------------------------------------------------------
def _turn(**kw):
    base = dict(
        content="Hello.",
        reasoning="think",
        tool_calls=[ToolCall("call_abc", "shell", '{"command": ["ls"]}')],
        finish="tool_calls",
        prompt_tokens=10,
        completion_tokens=4,
        output_ids=[1, 2, 3, 4],
        output_logprobs=[-0.1, -0.2, -0.3, -0.4],
        request_id="r1",
    )
    return AssistantTurn(**{**base, **kw})


def _stream(call, evs):
    async def gen():
        for e in evs:
            if isinstance(e, Exception):
                raise e
            yield e

    async def run():
        out = []
        try:
            async for b in rs.stream(call, "r1", gen(), 10, None):
                out.append(b)
        except ApiError:
            out.append(b"RAISED")
        return out

    raw = asyncio.run(run())
    events = []
    for b in raw:
        if b == b"RAISED":
            events.append("RAISED")
            continue
        head, data = b.decode().rstrip("\n").split("\n")
        d = json.loads(data[len("data: ") :])
        assert head == "event: " + d["type"]
        events.append(d)
    return events


def test_response_object_validates_against_the_sdk_types():
    call = rs.parse_request(
        {
            "model": "m",
            "input": "x",
            "include": ["message.output_text.logprobs"],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        }
    )
    body = rs.response(call, _turn())
    r = Response.model_validate(body, strict=False)
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output[2].call_id == "call_abc" and r.output[2].id == "fc_abc"
    assert len(r.output[1].content[0].logprobs) == 4
    assert r.usage.total_tokens == 14 and r.status == "completed"
    cut = Response.model_validate(rs.response(call, _turn(finish="length", tool_calls=[])))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_stream_sequence_is_what_the_sdk_parses():
    call = rs.parse_request({"model": "m", "input": "x"})
    turn = _turn(content="Hello.", reasoning="I think so")
    evs = _stream(
        call,
        [
            ReasoningDelta("\n"),
            ReasoningDelta("I think "),
            ReasoningDelta("so"),
            ReasoningDelta("\n\n"),
            TextDelta("Hel"),
            TextDelta("lo."),
            ToolCallEvent(turn.tool_calls[0]),
            Finished(turn),
        ],
    )
    for e in evs:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    kinds = [e["type"] for e in evs]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    # reasoning deltas add up to the stripped text the turn records (edge whitespace held back)
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta")
    assert deltas == "I think so"
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    final = evs[-1]["response"]
    assert final["output"] == done and final["usage"]["output_tokens"] == 4
    assert [e["output_index"] for e in evs if e["type"] == "response.output_item.added"] == [
        0,
        1,
        2,
    ]


def test_empty_answer_is_one_empty_message_and_failure_ends_with_response_failed():
    call = rs.parse_request({"model": "m", "input": "x"})
    evs = _stream(call, [Finished(_turn(content="", reasoning=None, tool_calls=[], finish="stop"))])
    assert evs[-1]["response"]["output"][0]["content"][0]["text"] == ""
    evs = _stream(call, [TextDelta("par"), ApiError(503, "engine went away", "server")])
    assert evs[-1] == "RAISED"
    failed = evs[-2]
    EVENT.validate_python(failed)
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "engine went away"}
