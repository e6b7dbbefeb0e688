"""Request validation: every bad request is a 400 naming the problem; fuzzed bodies never crash."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.proxy.adapters import anthropic_messages as an
from gyre.proxy.adapters import openai_chat as oa
from gyre.proxy.errors import ApiError

OK_OA = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK_AN = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body,needle",
    [
        ([1, 2], "JSON object"),
        ({"model": "m"}, "messages: field required"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": []}, "at least one"),
        ({**OK_OA, "n": 2}, "n=1"),
        ({**OK_OA, "max_tokens": "10"}, "max_tokens"),
        ({**OK_OA, "max_tokens": 0}, "max_tokens"),
        ({**OK_OA, "temperature": 9}, "temperature"),
        ({**OK_OA, "stream": "yes"}, "stream"),
        ({**OK_OA, "tools": [{"type": "function"}]}, "tools[0]"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "content"),
    ],
)
def test_openai_bad_requests(body, needle):
    with pytest.raises(ApiError) as e:
        call = oa.parse_request(body)
        [m for item in call.raw_items for m in call.normalize_item(item, lambda _i: None)]
    assert e.value.status == 400 and needle in e.value.message
    assert e.value.openai_body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({**OK_AN, "max_tokens": -1}, "max_tokens"),
        ({**OK_AN, "system": 5}, "system"),
        ({**OK_AN, "tools": [{"description": "no name"}]}, "tools[0].name"),
        (
            {**OK_AN, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "tool_use_id",
        ),
        (
            {
                **OK_AN,
                "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}],
            },
            "tool_use",
        ),
    ],
)
def test_anthropic_bad_requests(body, needle):
    with pytest.raises(ApiError) as e:
        call = an.parse_request(body)
        [m for item in call.raw_items for m in call.normalize_item(item, lambda _i: None)]
    assert e.value.status == 400 and needle in e.value.message
    assert e.value.anthropic_body()["type"] == "error"


def test_claude_code_shapes_and_unknown_fields_accepted():
    body = {
        "model": "claude-x",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "More."},
        ],
        "messages": [
            {"role": "system", "content": "reminder inside messages"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "do it", "cache_control": {"type": "ephemeral"}}
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "a.py"}],
                    },
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "run",
                "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1000},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "u"},
        "temperature": 1,
    }
    call = an.parse_request(body)
    norm = [m for item in call.raw_items for m in call.normalize_item(item, lambda _i: None)]
    assert [m["role"] for m in norm] == ["system", "system", "user", "assistant", "tool", "user"]
    assert norm[0]["content"] == "You are Claude Code.\nMore."
    assert norm[3]["reasoning_content"] == "hmm"
    assert norm[3]["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"command":"ls"}'}
    assert call.tool_names() == ["Bash"] and call.stream


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
    optional={"content": json_values, "tool_calls": json_values, "tool_call_id": json_values},
)
body_oa = st.fixed_dictionaries(
    {"messages": st.lists(message, max_size=3) | json_values},
    optional={
        "model": json_values,
        "n": json_values,
        "max_tokens": json_values,
        "temperature": json_values,
        "tools": json_values,
        "stream": json_values,
        "tool_choice": json_values,
    },
)
body_an = st.fixed_dictionaries(
    {
        "messages": st.lists(message, max_size=3) | json_values,
        "max_tokens": json_values,
        "model": json_values,
    },
    optional={
        "system": json_values,
        "tools": json_values,
        "stream": json_values,
        "top_k": json_values,
    },
)


def _only_api_errors(parse, body):
    try:
        call = parse(body)
        for item in call.raw_items:
            call.normalize_item(item, lambda _i: None)
    except ApiError as e:
        assert 400 <= e.status < 500


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body_oa)
def test_fuzz_openai_schema(body):
    _only_api_errors(oa.parse_request, body)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body_an)
def test_fuzz_anthropic_schema(body):
    _only_api_errors(an.parse_request, body)
