"""One line for a pydantic validation error, wherever Gyre reports one.

A config mistake on the command line (``gyre <command>: invalid config: ...``) and a bad request
body at the engine (its HTTP 400, or the client refusing to send one) read the same way:
``field.path: message (got X); ...``, only the wrong fields, no documentation links. A leaf
module: it imports nothing from Gyre (nor pydantic at import time), so every package may use it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

MAX_INPUT_SHOWN = 60
"""Longest offending value quoted back in a validation message."""


def validation_line(
    e: ValidationError | Sequence[Mapping[str, Any]],
    *,
    root: str | None = "config",
    drop: Container[object] = (),
) -> str:
    """``e`` (a pydantic ``ValidationError``, or the error list FastAPI's
    ``RequestValidationError.errors()`` gives) as ``loc: message (got X); ...``.

    ``root`` names an error about the whole input (an empty location; ``None``: the message
    alone); ``drop`` leaves location parts out (FastAPI's ``"body"``). The offending value is
    quoted when it is a short scalar, never for a missing field.
    """
    errors = e if isinstance(e, Sequence) else e.errors(include_url=False)
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in drop) or root
        msg = err.get("msg", "invalid")
        value = err.get("input")
        if err.get("type") != "missing" and isinstance(value, str | int | float | bool):
            shown = repr(value)
            if len(shown) <= MAX_INPUT_SHOWN:
                msg = f"{msg} (got {shown})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid value"
