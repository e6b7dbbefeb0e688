"""JSON with orjson when installed (3-10x faster on multi-MB bodies), stdlib otherwise.

The proxy parses every request body in full (a 500K-token context is ~2 MB of
JSON) and sends long ``input_ids`` lists to engines, so JSON speed is a real
part of the per-call cost.
"""

from __future__ import annotations

import json
from typing import Any

try:  # pragma: no cover - depends on the environment
    import orjson

    HAVE_ORJSON = True
except ImportError:  # pragma: no cover
    HAVE_ORJSON = False


def loads(data: bytes | str) -> Any:
    if HAVE_ORJSON:
        return orjson.loads(data)
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (non-ASCII kept as UTF-8)."""
    if HAVE_ORJSON:
        return orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def dumps_str(obj: Any) -> str:
    return dumps(obj).decode("utf-8")


def ids_json(ids: Any) -> bytes:
    """``1,2,3`` (no brackets): pieces of one list can be concatenated with b','."""
    return dumps(list(ids))[1:-1]


JSONDecodeError = (
    ValueError,
)  # orjson.JSONDecodeError and json.JSONDecodeError subclass ValueError
