"""Small validators shared by the dialects: clear 400s naming the bad parameter."""

from __future__ import annotations

from typing import Any

from gyre.proxy.errors import bad_request


def require(body: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    if key not in body or body[key] is None:
        raise bad_request(f"{key}: field required", param=key)
    return check(body[key], types, key, what)


def check(value: Any, types: type | tuple[type, ...], name: str, what: str) -> Any:
    # bool is an int subclass; never accept it where a number is meant
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise bad_request(f"{name}: expected {what}, got a boolean", param=name)
    if not isinstance(value, types):
        raise bad_request(f"{name}: expected {what}, got {type(value).__name__}", param=name)
    return value


def opt_number(
    body: dict[str, Any], key: str, lo: float | None = None, hi: float | None = None
) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    check(v, (int, float), key, "a number")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad_request(f"{key}: {v} is out of range [{lo}, {hi}]", param=key)
    return float(v)


def opt_int(body: dict[str, Any], key: str, lo: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    check(v, int, key, "an integer")
    if lo is not None and v < lo:
        raise bad_request(f"{key}: must be >= {lo}, got {v}", param=key)
    return int(v)


def opt_bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    check(v, bool, key, "a boolean")
    return v


def openai_tool_choice(body: dict[str, Any]) -> Any:
    """OpenAI's ``tool_choice`` (chat and Responses alike): a mode string or an object."""
    tc = body.get("tool_choice")
    if tc is not None and not (tc in ("none", "auto", "required") or isinstance(tc, dict)):
        raise bad_request(
            "tool_choice: expected none, auto, required or an object", param="tool_choice"
        )
    return tc


def parse_arguments(text: str) -> dict[str, Any] | None:
    """Tool-call arguments as a dict, or None when they are not a JSON object."""
    import json

    try:
        v = json.loads(text)
    except (ValueError, TypeError):
        return None
    return v if isinstance(v, dict) else None
