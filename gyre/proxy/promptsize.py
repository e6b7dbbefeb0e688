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

Counted is the text this model's template renders: what every template shows (user,
system and tool message text, assistant text after its last ``</think>``, tool calls' names and
the keys and string values of their parsed JSON arguments; arguments that are not JSON are not
counted), and what the template was seen to show when the proxy probed it at start
(:mod:`gyre.proxy.rendered`): tool definitions (as JSON, or their names and descriptions),
assistant reasoning (``reasoning_content``, Anthropic ``thinking`` blocks, Responses
``reasoning`` items) and the ``<think>`` part of assistant text, for the turns the template
shows them in. Images and other non-text parts are not counted. Without the assistant side,
10 MB of tool-call arguments were rendered in full (12 s, +2 GB) to learn that they do not fit;
without tools and reasoning, 5 MB of ``tools[].description`` took 57 s and +1.6 GB.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from gyre.proxy.adapters.dialects import Adapter, too_long
from gyre.proxy.errors import ApiError
from gyre.proxy.rendered import Placement, RenderedShape, ToolsShown

SLICE_CHARS = 1 << 16
BOUNDARY_SLACK = 2
COUNT_FROM_CHARS_PER_TOKEN = 4
"""Slice counting runs only when the text has more than this many characters per token of context
(ordinary text has 3-4): below that the full render is cheap and exact anyway."""

_COUNTED_ROLES = frozenset({"user", "system", "developer", "tool"})
_THINK_START, _THINK_END = "<think>", "</think>"
NOTHING_MORE = RenderedShape()  # a template seen to show no tools and no reasoning


def max_token_chars(tokenizer: Any) -> int:
    """Characters in the longest vocabulary entry (added/special tokens included)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary view: no usable bound
        return 0
    return max((len(t) for t in vocab), default=0)


def text_pieces(
    raw_items: list[Any], shape: RenderedShape = NOTHING_MORE, tools: list[Any] | None = None
) -> Iterator[str]:
    """The strings of ``raw_items`` (every dialect's shapes) and of ``tools`` (the call's
    function tools, OpenAI-shaped) that a template of ``shape`` renders."""
    yield from _tool_strings(tools, shape.tools)
    extra = shape.reasoning != "none" or shape.think != "none"
    last_user = _last_user(raw_items) if extra else -1
    last_turn = _last_assistant(raw_items) if extra else -1
    for i, m in enumerate(raw_items):
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in _COUNTED_ROLES:
            yield from _content_strings(m.get("content"))
        elif role == "assistant":
            r = _shown(shape.reasoning, i, last_user, last_turn)
            t = _shown(shape.think, i, last_user, last_turn)
            yield from _assistant_strings(m, r, t)
        elif m.get("type") == "function_call_output":  # a Responses tool result
            yield from _content_strings(m.get("output"))
        elif m.get("type") == "function_call":  # a Responses tool call
            yield from _call_strings(m.get("name"), m.get("arguments"))


def _assistant_strings(m: dict[str, Any], reasoning: bool, think: bool) -> Iterator[str]:
    """An assistant turn's text, calls and (when shown) reasoning, in any dialect's shape."""
    if isinstance(m.get("items"), list):  # a Responses turn, wrapped by its adapter
        for it in m["items"]:
            if not isinstance(it, dict) or "items" in it:
                continue
            if it.get("type") == "reasoning":
                if reasoning:
                    yield from _reasoning_item_strings(it)
            elif it.get("type") == "function_call":
                yield from _call_strings(it.get("name"), it.get("arguments"))
            elif it.get("role") == "assistant":
                yield from _assistant_strings(it, reasoning, think)
    for text in _content_strings(m.get("content"), assistant=True, reasoning=reasoning):
        if think:
            yield _thought(text)
        yield _answer(text)
    rc = m.get("reasoning_content", m.get("reasoning"))
    if reasoning and isinstance(rc, str):
        yield rc
    calls = m.get("tool_calls")
    for c in calls if isinstance(calls, list) else ():
        f = c.get("function") if isinstance(c, dict) else None
        if isinstance(f, dict):
            yield from _call_strings(f.get("name"), f.get("arguments"))


def _reasoning_item_strings(item: dict[str, Any]) -> Iterator[str]:
    """A Responses reasoning item's text: its content, else its summary (as its adapter takes
    it)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            for p in parts:
                if isinstance(p, dict) and isinstance(p.get("text"), str):
                    yield p["text"]
            return


def _tool_strings(tools: list[Any] | None, shown: ToolsShown) -> Iterator[str]:
    if shown == "none":
        return
    for t in tools or ():
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict):
            continue
        if shown == "json":
            yield from _json_strings(f)
            continue
        if isinstance(f.get("name"), str):
            yield f["name"]
        if shown == "described" and isinstance(f.get("description"), str):
            yield f["description"]


def _real_user(m: Any) -> bool:
    """A user turn, not only tool results (Anthropic sends those as user messages)."""
    if not isinstance(m, dict) or m.get("role") != "user":
        return False
    c = m.get("content")
    if not isinstance(c, list):
        return True
    return any(not isinstance(b, dict) or b.get("type") != "tool_result" for b in c)


def _last_user(raw_items: list[Any]) -> int:
    return max((i for i, m in enumerate(raw_items) if _real_user(m)), default=-1)


def _last_assistant(raw_items: list[Any]) -> int:
    return max(
        (
            i
            for i, m in enumerate(raw_items)
            if isinstance(m, dict) and m.get("role") == "assistant"
        ),
        default=-1,
    )


def _shown(where: Placement, i: int, last_user: int, last_turn: int) -> bool:
    """Does a template that shows reasoning ``where`` show assistant turn ``i``'s?"""
    if where == "all":
        return True
    if where == "since_user":
        return i > last_user
    return where == "last" and i == last_turn and i > last_user


def _answer(text: str) -> str:
    """What of an assistant text no template trims: after its last ``</think>``."""
    i = text.rfind(_THINK_END)
    return text if i < 0 else text[i + len(_THINK_END) :].lstrip("\n")


def _thought(text: str) -> str:
    """The reasoning part of an assistant text: between its last ``</think>`` and the
    ``<think>`` before it (templates that show it re-render it between the same tags)."""
    i = text.rfind(_THINK_END)
    if i < 0:
        return ""
    j = text.rfind(_THINK_START, 0, i)
    return text[j + len(_THINK_START) if j >= 0 else 0 : i].strip("\n")


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


def _content_strings(
    content: Any, assistant: bool = False, reasoning: bool = False
) -> Iterator[str]:
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
            elif t == "thinking" and assistant and reasoning:  # Anthropic
                if isinstance(b.get("thinking"), str):
                    yield b["thinking"]


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

    def __init__(
        self,
        tokenizer: Any,
        max_context: int,
        slice_chars: int = SLICE_CHARS,
        shape: RenderedShape = NOTHING_MORE,
    ) -> None:
        self.tok = tokenizer
        self.shape = shape  # what the template shows besides every template's text
        self.max_context = max_context
        self.slice_chars = slice_chars
        self.max_token_chars = max_token_chars(tokenizer)

    def chars(self, raw_items: list[Any], tools: list[Any] | None = None) -> int:
        return sum(len(s) for s in text_pieces(raw_items, self.shape, tools))

    def floor_from_chars(self, chars: int) -> int:
        return chars // self.max_token_chars if self.max_token_chars > 0 else 0

    def needs_count(self, chars: int) -> bool:
        return chars > COUNT_FROM_CHARS_PER_TOKEN * self.max_context

    def floor_by_counting(self, raw_items: list[Any], tools: list[Any] | None = None) -> int:
        """Tokens of the counted text, slice by slice, minus the boundary slack; stops once the
        floor reaches the context (CPU-bound: run it off the event loop)."""
        total = 0
        boundaries = 0
        for piece in text_pieces(raw_items, self.shape, tools):
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
        self,
        raw_items: list[Any],
        adapter: Adapter,
        body_bytes: int | None = None,
        tools: list[Any] | None = None,
    ) -> None:
        """Raise the API's context-length 400 when a floor shows the prompt (``tools``: the
        call's function tools) cannot fit."""
        if body_bytes is not None and self.cannot_trigger(body_bytes):
            return
        chars = self.chars(raw_items, tools)
        floor = self.floor_from_chars(chars)
        if floor < self.max_context and self.needs_count(chars):
            floor = await asyncio.to_thread(self.floor_by_counting, raw_items, tools)
        if floor >= self.max_context:
            raise self.too_long(floor, adapter)

    def too_long(self, floor: int, adapter: Adapter) -> ApiError:
        """The same 400 as a fully counted prompt that does not fit, with the floor as count."""
        return too_long(adapter, f"at least {floor}", self.max_context)
