"""Incremental body parsing re-uses unchanged history objects and always equals a full parse."""

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.proxy.bodyparse import BodyParser, _common_prefix

TEXT = st.text(alphabet=st.sampled_from(list('ab é中"\\\n\t]}[{,:') + ["\u2028", "x"]), max_size=30)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(TEXT, st.booleans(), st.booleans()), min_size=1, max_size=12), st.booleans(), st.booleans())
def test_equals_full_parse_for_growing_conversations(steps, ascii_, indent):
    bp = BodyParser(min_reuse_bytes=0)
    msgs = [{"role": "system", "content": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]}]
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
            msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"arguments": "[1]"}}]})
        body = json.dumps({"model": "m", "messages": msgs, "tools": [{"n": "]}"}], "stream": True},
                          ensure_ascii=ascii_, indent=2 if indent else None).encode()
        assert bp.parse(body) == json.loads(body)


def test_history_objects_are_reused_and_bad_json_still_fails():
    bp = BodyParser(min_reuse_bytes=0)
    msgs = [{"role": "user", "content": "x" * 100}]
    first = bp.parse(json.dumps({"messages": msgs, "model": "m"}).encode())
    msgs.append({"role": "assistant", "content": "y"})
    second = bp.parse(json.dumps({"messages": msgs, "model": "m"}).encode())
    assert second["messages"][0] is first["messages"][0] and bp.reused_messages == 1
    for bad in (b'{"messages": [1, 2', b'{"messages": [{"role": "user", "content": "x" * 100}], "model": "m"} trailing'):
        try:
            bp.parse(bad)
        except ValueError:
            pass
        else:
            raise AssertionError("malformed JSON accepted")
    # a body with no messages array at all
    assert bp.parse(b'{"model": "m"}') == {"model": "m"}


def test_common_prefix_matches_naive():
    rng = random.Random(0)
    for _ in range(500):
        a = bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 900)))
        b = a[: rng.randint(0, len(a))] + bytes(rng.choice(b"ab") for _ in range(rng.randint(0, 900)))
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        assert _common_prefix(a, b) == k
        assert _common_prefix(a, b, rng.randint(0, 1000)) == k
