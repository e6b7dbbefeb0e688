"""Incremental body parsing re-uses unchanged history objects and always equals a full parse."""

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.proxy.bodyparse import BodyParser, _common_prefix

TEXT = st.text(alphabet=st.sampled_from(list('ab é中"\\\n\t]}[{,:') + ["\u2028", "x"]), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(TEXT, st.booleans(), st.booleans()), min_size=1, max_size=12),
    st.booleans(),
    st.booleans(),
)
def test_equals_full_parse_for_growing_conversations(steps, ascii_, indent):
    bp = BodyParser(min_reuse_bytes=0)
    msgs = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    for text, marker, tool in steps:
        for m in msgs:  # Claude Code moves its cache marker to the newest message
            if isinstance(m["content"], list):
                for b in m["content"]:
                    b.pop("cache_control", None)
        block = {"type": "text", "text": text}
        if marker:
            block["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user", "content": [block]})
        if tool:
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"arguments": "[1]"}}],
                }
            )
        body = json.dumps(
            {"model": "m", "messages": msgs, "tools": [{"n": "]}"}], "stream": True},
            ensure_ascii=ascii_,
            indent=2 if indent else None,
        ).encode()
        assert bp.parse(body) == json.loads(body)


def test_history_objects_are_reused_and_bad_json_still_fails():
    bp = BodyParser(min_reuse_bytes=0)
    msgs = [{"role": "user", "content": "x" * 100}]
    first = bp.parse(json.dumps({"messages": msgs, "model": "m"}).encode())
    msgs.append({"role": "assistant", "content": "y"})
    second = bp.parse(json.dumps({"messages": msgs, "model": "m"}).encode())
    assert second["messages"][0] is first["messages"][0] and bp.reused_messages == 1
    for bad in (
        b'{"messages": [1, 2',
        b'{"messages": [{"role": "user", "content": "x" * 100}], "model": "m"} trailing',
    ):
        try:
            bp.parse(bad)
        except ValueError:
            pass
        else:
            raise AssertionError("malformed JSON accepted")
    # a body with no messages array at all
    assert bp.parse(b'{"model": "m"}') == {"model": "m"}


def test_responses_input_items_are_reused_too():
    """A Responses body (Codex: instructions, then ``input``, then tools) re-uses its input items."""
    bp = BodyParser(min_reuse_bytes=0)
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}]
    tail = {"tools": [{"type": "function", "name": "shell"}], "stream": True}
    body = {"model": "m", "instructions": "I" * 50, "input": items, **tail}
    first = bp.parse(json.dumps(body).encode())
    for k in range(3):
        items = items + [
            {"type": "function_call", "call_id": f"c{k}", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{k}", "output": "ok ]}"},
        ]
        raw = json.dumps({**body, "input": items}).encode()
        got = bp.parse(raw)
        assert got == json.loads(raw)
        assert got["input"][0] is first["input"][0]
    assert bp.reused_messages == 1 + 3 + 5
    # a chat body after Responses ones still parses right
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    assert bp.parse(chat) == json.loads(chat)


def test_common_prefix_matches_naive():
    rng = random.Random(0)
    for _ in range(500):
        a = bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 900)))
        b = a[: rng.randint(0, len(a))] + bytes(
            rng.choice(b"ab") for _ in range(rng.randint(0, 900))
        )
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        assert _common_prefix(a, b) == k
        assert _common_prefix(a, b, rng.randint(0, 1000)) == k


def _body(msgs) -> bytes:
    return json.dumps({"model": "m", "messages": msgs, "max_tokens": 8}).encode()


def test_one_full_compare_per_call_when_extending_the_newest_body():
    """Kept bodies other than the newest are ruled out by one byte, not compared in full."""
    bp = BodyParser(min_reuse_bytes=0)
    msgs = [{"role": "system", "content": "s" * 200}]
    for i in range(8):
        msgs.append({"role": "user", "content": f"question {i} " + "q" * 50})
        before = bp.full_compares
        assert bp.parse(_body(msgs)) == json.loads(_body(msgs))
        if i >= 1:
            assert bp.full_compares - before == 1, (i, bp.full_compares - before)
        msgs.append({"role": "assistant", "content": f"answer {i} " + "a" * 50})
    assert bp.reused_messages > 0


def test_an_older_body_that_matches_further_is_still_chosen_and_verified():
    bp = BodyParser(min_reuse_bytes=0)
    base = [{"role": "system", "content": "s" * 100}] + [
        {"role": "user", "content": f"u{i} " + "x" * 40} for i in range(5)
    ]
    a = base + [{"role": "assistant", "content": "A-branch " + "a" * 40}]
    first = bp.parse(_body(a))
    b = base + [
        {"role": "assistant", "content": "B-branch " + "b" * 40},
        {"role": "user", "content": "more"},
    ]
    bp.parse(_body(b))  # newer body, diverges from A inside message 6
    n = a + [{"role": "user", "content": "continue A"}]
    reused = bp.reused_messages
    out = bp.parse(_body(n))
    assert out == json.loads(_body(n))
    assert bp.reused_messages - reused == len(a)  # all of A's messages, not only the shared base
    assert out["messages"][len(a) - 1] is first["messages"][len(a) - 1]
    # a body that differs inside the history re-uses nothing past the difference (byte-verified)
    c = [dict(m) for m in n]
    c[2] = {"role": "user", "content": "u1 " + "y" * 40}  # same length, different bytes
    reused = bp.reused_messages
    out = bp.parse(_body(c))
    assert out == json.loads(_body(c)) and out["messages"][2]["content"].endswith("y" * 40)
    assert bp.reused_messages - reused <= 2
