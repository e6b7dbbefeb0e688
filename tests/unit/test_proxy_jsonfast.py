"""gyre.proxy.jsonfast: orjson, compact UTF-8 out, one decode error class in."""

from __future__ import annotations

import json

import pytest

from gyre.proxy import jsonfast


def test_dumps_is_compact_utf8_and_round_trips():
    obj = {"text": "héllo ✓", "ids": [1, 2, 3], "nested": {"ok": True, "none": None}}
    out = jsonfast.dumps(obj)
    assert out == json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert jsonfast.loads(out) == jsonfast.loads(out.decode("utf-8")) == obj
    assert jsonfast.dumps_str(obj) == out.decode("utf-8")


def test_ids_json_pieces_concatenate_into_one_list():
    a, b = jsonfast.ids_json(range(3)), jsonfast.ids_json([7, 8])
    assert a == b"0,1,2"
    assert jsonfast.loads(b"[" + a + b"," + b + b"]") == [0, 1, 2, 7, 8]


@pytest.mark.parametrize("bad", [b"{not json", b'{"a": 1', b"\xff\xfe", b""])
def test_malformed_json_raises_the_decode_error_the_proxy_catches(bad):
    with pytest.raises(jsonfast.JSONDecodeError) as e:
        jsonfast.loads(bad)
    assert isinstance(e.value, ValueError)
