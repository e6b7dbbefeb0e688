"""Refuse a prompt that cannot fit the context before rendering and tokenizing all of it.

Rendering a conversation with the chat template and tokenizing it costs ~150 bytes
of memory and ~0.1 s of CPU per byte of text (jinja copies, the tokenizer's offsets
and ids), so rendering a 50 MB prompt would cost the proxy ~10 GB just to learn that it
is too long. Two cheap lower bounds on the prompt's token count come first:

1. **Characters.** No token covers more characters than the longest entry of the
   vocabulary (``max_token_chars``; a byte-level entry spells one byte per
   character, a character is at least one byte), so ``chars // max_token_chars``
   tokens is a floor. Costs one walk over the messages, no copies.
2. **Counting in slices** (only when the text is long enough for the full render to
   be costly): the text is tokenized in ~64K-character slices cut at whitespace,
   and counting stops as soon as the floor passes the context. A slice boundary
   (and a message boundary in the rendered prompt) can merge at most a couple of
   tokens, so ``BOUNDARY_SLACK`` tokens per boundary are taken off before deciding.
   Memory and time are bounded by the context, not by the prompt.

Only text that every chat template renders is counted: user, system and tool
message text, assistant text after its last ``</think>`` (templates may trim
earlier reasoning, never the answer), and tool calls' names and arguments (the
keys and string values of the parsed JSON: every template renders at least
those; arguments that are not JSON are not counted). Thinking blocks, reasoning
items, images and other non-text parts are not counted. Without the assistant
side, 10 MB of tool-call arguments were rendered in full (12 s, +2 GB) to learn
that they do not fit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from gyre.proxy.adapters.dialects import Adapter, too_long
from gyre.proxy.errors import ApiError

SLICE_CHARS = 1 << 16
BOUNDARY_SLACK = 2
COUNT_FROM_CHARS_PER_TOKEN = 4
"""Slice counting runs only when the text has more than this many characters per token of context
(ordinary text has 3-4): below that the full render is cheap and exact anyway."""

_COUNTED_ROLES = frozenset({"user", "system", "developer", "tool"})
_THINK_END = "</think>"


def max_token_chars(tokenizer: Any) -> int:
    """Characters in the longest vocabulary entry (added/special tokens included)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary view: no usable bound
        return 0
    return max((len(t) for t in vocab), default=0)


def text_pieces(raw_items: list[Any]) -> Iterator[str]:
    """The strings of ``raw_items`` that any template renders (every dialect's shapes)."""
    for m in raw_items:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in _COUNTED_ROLES:
            yield from _content_strings(m.get("content"))
        elif role == "assistant":
            if isinstance(m.get("items"), list):  # a Responses turn, wrapped by its adapter
                yield from text_pieces(
                    [i for i in m["items"] if isinstance(i, dict) and "items" not in i]
                )
            for text in _content_strings(m.get("content"), assistant=True):
                yield _answer(text)
            calls = m.get("tool_calls")
            for c in calls if isinstance(calls, list) else ():
                f = c.get("function") if isinstance(c, dict) else None
                if isinstance(f, dict):
                    yield from _call_strings(f.get("name"), f.get("arguments"))
        elif m.get("type") == "function_call_output":  # a Responses tool result
            yield from _content_strings(m.get("output"))
        elif m.get("type") == "function_call":  # a Responses tool call
            yield from _call_strings(m.get("name"), m.get("arguments"))


def _answer(text: str) -> str:
    """What of an assistant text no template trims: after its last ``</think>``."""
    i = text.rfind(_THINK_END)
    return text if i < 0 else text[i + len(_THINK_END) :].lstrip("\n")


def _call_strings(name: Any, arguments: Any) -> Iterator[str]:
    """A tool call's name, and the keys and string values of its arguments (parsed when a
    JSON string; re-serialised by templates, so only what survives that is counted)."""
    if isinstance(name, str):
        yield name
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:  # a template shows it somehow; no floor claimed
            return
    yield from _json_strings(arguments)


def _json_strings(value: Any) -> Iterator[str]:
    """Keys and string leaves of a parsed JSON value, walked without recursion."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str):
                    yield k
                todo.append(x)
        elif isinstance(v, list):
            todo.extend(reversed(v))


def _content_strings(content: Any, assistant: bool = False) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for b in content:
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            if t in ("text", "input_text", "output_text") and isinstance(b.get("text"), str):
                yield b["text"]
            elif t == "tool_result":
                yield from _content_strings(b.get("content"))
            elif t == "tool_use" and assistant:
                yield from _call_strings(b.get("name"), b.get("input"))


def _slices(text: str, size: int) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut just before a whitespace when one
    is near (a word is never split, so each slice tokenizes as it does inside the whole)."""
    i, n = 0, len(text)
    while i < n:
        j = min(i + size, n)
        if j < n:
            lo = max(i + 1, j - 256)
            k = max(text.rfind(" ", lo, j), text.rfind("\n", lo, j))
            if k > i:
                j = k
        yield text[i:j]
        i = j


class PromptBound:
    """Early refusal of prompts longer than ``max_context`` tokens (see module doc)."""

    def __init__(self, tokenizer: Any, max_context: int, slice_chars: int = SLICE_CHARS) -> None:
        self.tok = tokenizer
        self.max_context = max_context
        self.slice_chars = slice_chars
        self.max_token_chars = max_token_chars(tokenizer)

    def chars(self, raw_items: list[Any]) -> int:
        return sum(len(s) for s in text_pieces(raw_items))

    def floor_from_chars(self, chars: int) -> int:
        return chars // self.max_token_chars if self.max_token_chars > 0 else 0

    def needs_count(self, chars: int) -> bool:
        return chars > COUNT_FROM_CHARS_PER_TOKEN * self.max_context

    def floor_by_counting(self, raw_items: list[Any]) -> int:
        """Tokens of the counted text, slice by slice, minus the boundary slack; stops once the
        floor reaches the context (CPU-bound: run it off the event loop)."""
        total = 0
        boundaries = 0
        for piece in text_pieces(raw_items):
            for s in _slices(piece, self.slice_chars):
                total += len(self.tok.encode(s, add_special_tokens=False))
                boundaries += 1
                if total - BOUNDARY_SLACK * boundaries >= self.max_context:
                    return total - BOUNDARY_SLACK * boundaries
        return max(total - BOUNDARY_SLACK * boundaries, 0)

    def cannot_trigger(self, body_bytes: int) -> bool:
        """True when a body this size cannot reach either floor: its text has at most as many
        characters as the body has bytes. Spares the walk over every message of every call
        (~15% of the proxy's CPU per call at 4K messages) for the bodies that are not huge."""
        return not self.needs_count(body_bytes) and self.floor_from_chars(body_bytes) < (
            self.max_context
        )

    async def check(
        self, raw_items: list[Any], adapter: Adapter, body_bytes: int | None = None
    ) -> None:
        """Raise the API's context-length 400 when a floor shows the prompt cannot fit."""
        if body_bytes is not None and self.cannot_trigger(body_bytes):
            return
        chars = self.chars(raw_items)
        floor = self.floor_from_chars(chars)
        if floor < self.max_context and self.needs_count(chars):
            floor = await asyncio.to_thread(self.floor_by_counting, raw_items)
        if floor >= self.max_context:
            raise self.too_long(floor, adapter)

    def too_long(self, floor: int, adapter: Adapter) -> ApiError:
        """The same 400 as a fully counted prompt that does not fit, with the floor as count."""
        return too_long(adapter, f"at least {floor}", self.max_context)
