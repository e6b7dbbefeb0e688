"""Output parsing: generated text -> reasoning, content and tool calls, incrementally.

A parser is fed decoded text as it arrives and emits events; the non-streaming
path feeds everything at once, so both paths agree by construction.

:class:`HermesParser` reads the Hermes/Qwen format: ``<think>...</think>``
reasoning and ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
calls; :class:`BashBlockParser` reads fenced bash blocks as shell tool calls.
A tool call whose JSON is broken (or that is cut off) comes back as
plain text: the client sees exactly what the model wrote, and nothing crashes.
The parser counts those (``n_unparsed``) so the trace says how many calls the
model meant but the client never saw as calls (tool-call health, docs/runtime.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from gyre.proxy.types import ReasoningDelta, StreamEvent, TextDelta, ToolCall, ToolCallEvent


class OutputParser(Protocol):
    n_unparsed: int  # tool calls written but not parseable (returned as text)

    def feed(self, text: str) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


IdFactory = Callable[[], str]


class PlainParser:
    """Everything is content (for models without a tool format, or tool_choice none)."""

    def __init__(self, new_id: IdFactory, start_in_reasoning: bool = False) -> None:
        self.n_unparsed = 0

    def feed(self, text: str) -> list[StreamEvent]:
        return [TextDelta(text)] if text else []

    def finish(self) -> list[StreamEvent]:
        return []


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


def _partial_tag_len(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:k]):
                best = k
                break
    return best


class HermesParser:
    def __init__(self, new_id: IdFactory, start_in_reasoning: bool = False) -> None:
        self.new_id = new_id
        self.state = "reasoning" if start_in_reasoning else "content"
        self.buf = ""
        self.n_calls = 0
        self.n_unparsed = 0
        self.content_started = False  # leading whitespace of content is dropped
        self.pending_ws = ""  # trailing whitespace, emitted only if more text follows

    def _text(self, s: str, out: list[StreamEvent]) -> None:
        # Content is what a chat template would wrap: no leading/trailing whitespace
        # (the template adds its own separators around tool calls and think blocks).
        if not self.content_started:
            s = s.lstrip()
            if not s:
                return
            self.content_started = True
        body = s.rstrip()
        if not body:
            self.pending_ws += s
            return
        out.append(TextDelta(self.pending_ws + body))
        self.pending_ws = s[len(body) :]

    def feed(self, text: str) -> list[StreamEvent]:
        self.buf += text
        out: list[StreamEvent] = []
        while True:
            if self.state == "content":
                i_t, i_c = self.buf.find(_THINK_OPEN), self.buf.find(_CALL_OPEN)
                hits = [(i, tag) for i, tag in ((i_t, _THINK_OPEN), (i_c, _CALL_OPEN)) if i >= 0]
                if hits:
                    i, tag = min(hits)
                    before = self.buf[:i]
                    if before.strip() or (before and not self.n_calls):
                        self._text(before, out)
                    self.buf = self.buf[i + len(tag) :]
                    self.state = "reasoning" if tag == _THINK_OPEN else "tool"
                    continue
                keep = _partial_tag_len(self.buf, (_THINK_OPEN, _CALL_OPEN))
                emit = self.buf[: len(self.buf) - keep]
                if emit and (emit.strip() or not self.n_calls):
                    self._text(emit, out)
                    self.buf = self.buf[len(emit) :]
                elif emit:  # whitespace between tool calls: hold it (dropped unless text follows)
                    pass
                return out
            if self.state == "reasoning":
                i = self.buf.find(_THINK_CLOSE)
                if i >= 0:
                    if self.buf[:i]:
                        out.append(ReasoningDelta(self.buf[:i]))
                    self.buf = self.buf[i + len(_THINK_CLOSE) :]
                    self.state = "content"
                    continue
                keep = _partial_tag_len(self.buf, (_THINK_CLOSE,))
                emit = self.buf[: len(self.buf) - keep]
                if emit:
                    out.append(ReasoningDelta(emit))
                    self.buf = self.buf[len(emit) :]
                return out
            # state == "tool": wait for the closing tag, then parse the whole call
            i = self.buf.find(_CALL_CLOSE)
            if i < 0:
                return out
            inner, self.buf = self.buf[:i], self.buf[i + len(_CALL_CLOSE) :]
            call = self._parse_call(inner)
            if call is None:
                self.n_unparsed += 1
                self._text(_CALL_OPEN + inner + _CALL_CLOSE, out)
            else:
                self.n_calls += 1
                out.append(ToolCallEvent(call))
            self.state = "content"

    def _parse_call(self, inner: str) -> ToolCall | None:
        try:
            obj = json.loads(inner)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(
            id=self.new_id(), name=obj["name"], arguments=json.dumps(args, ensure_ascii=False)
        )

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self.state == "tool":  # cut off inside a call: what was written is text
            self.n_unparsed += 1
            self._text(_CALL_OPEN + self.buf, out)
        elif self.state == "reasoning":
            if self.buf:
                out.append(ReasoningDelta(self.buf))
        elif self.buf.strip() or (self.buf and not self.n_calls):
            self._text(self.buf, out)
        self.buf = ""
        return out


_FENCES = ("```bash\n", "```sh\n")
_FENCE_CLOSE = "```"


class BashBlockParser(HermesParser):
    """Fenced bash blocks as shell tool calls: each ```` ```bash ```` (or ```` ```sh ````)
    block of a reply becomes a ``run_command`` call ``{"command": <the block>}``, the text
    around it content. For models that write a shell block but never a JSON tool call
    (SmolLM2-135M, ``gyre.harness.families.toolproto``); the harness sees ordinary OpenAI
    tool calls. A block left open (cut off) is text, counted in ``n_unparsed``."""

    tool_name = "run_command"

    def __init__(self, new_id: IdFactory, start_in_reasoning: bool = False) -> None:
        super().__init__(new_id, False)  # no reasoning format: everything is content or calls
        self.fence = ""

    def feed(self, text: str) -> list[StreamEvent]:
        self.buf += text
        out: list[StreamEvent] = []
        while True:
            if self.state == "content":
                hits = [(i, f) for f in _FENCES if (i := self.buf.find(f)) >= 0]
                if hits:
                    i, fence = min(hits)
                    before = self.buf[:i]
                    if before.strip() or (before and not self.n_calls):
                        self._text(before, out)
                    self.buf, self.state = self.buf[i + len(fence) :], "tool"
                    self.fence = fence
                    continue
                keep = _partial_tag_len(self.buf, _FENCES)
                emit = self.buf[: len(self.buf) - keep]
                if emit and (emit.strip() or not self.n_calls):
                    self._text(emit, out)
                    self.buf = self.buf[len(emit) :]
                return out
            i = self.buf.find(_FENCE_CLOSE)
            if i < 0:
                return out
            inner, self.buf = self.buf[:i], self.buf[i + len(_FENCE_CLOSE) :]
            command = inner[:-1] if inner.endswith("\n") else inner
            if command.strip():
                self.n_calls += 1
                args = json.dumps({"command": command}, ensure_ascii=False)
                out.append(
                    ToolCallEvent(ToolCall(id=self.new_id(), name=self.tool_name, arguments=args))
                )
            else:  # an empty block is not a call
                self.n_unparsed += 1
                self._text(self.fence + inner + _FENCE_CLOSE, out)
            self.state = "content"

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self.state == "tool":  # cut off inside a block: what was written is text
            self.n_unparsed += 1
            self._text(self.fence + self.buf, out)
        elif self.buf.strip() or (self.buf and not self.n_calls):
            self._text(self.buf, out)
        self.buf = ""
        return out


PARSERS: dict[str, type] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "plain": PlainParser,
    "bash": BashBlockParser,
}


def make_parser(name: str, new_id: IdFactory, start_in_reasoning: bool = False) -> OutputParser:
    try:
        cls = PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown output parser {name!r}; known: {sorted(PARSERS)}") from None
    return cls(new_id, start_in_reasoning)
