"""Anthropic messages: ``POST /v1/messages`` (``?beta=true`` too), streaming SSE and not.

Shapes follow what Claude Code sends: ``system`` as a string or text blocks
(with ``cache_control``), a ``role: "system"`` message inside ``messages``,
``tool_use``/``tool_result``/``thinking`` blocks, and many fields the proxy
ignores (``thinking``, ``context_management``, ``output_config``, ``metadata``).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.adapters.common import (
    check,
    opt_bool,
    opt_int,
    opt_number,
    parse_arguments,
    require,
)
from gyre.proxy.adapters.media import check_anthropic_image
from gyre.proxy.errors import bad_request
from gyre.proxy.types import (
    AssistantTurn,
    Finished,
    Message,
    ParsedCall,
    ReasoningDelta,
    Restore,
    Sampling,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
)

API = "anthropic.messages"


def _blocks_text(content: Any, where: str) -> str:
    """Text of a string or a list of blocks (text kept; images/documents noted)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of content blocks")
    out = []
    for i, b in enumerate(content):
        if not isinstance(b, dict):
            raise bad_request(f"{where}[{i}]: expected a content block object")
        t = b.get("type")
        if t == "text":
            if not isinstance(b.get("text"), str):
                raise bad_request(f"{where}[{i}].text: expected a string")
            out.append(b["text"])
        else:
            if t == "image":
                check_anthropic_image(b, f"{where}[{i}]")
            out.append(f"[{t} omitted: text-only model]")
    return "\n".join(out)


def normalize_item(m: Any, restore: Restore) -> list[Message]:
    """One Anthropic message -> chat-template messages.

    A user message's ``tool_result`` blocks become ``tool`` messages (in order),
    its text blocks one user message after them; an assistant message's
    ``thinking``/``text``/``tool_use`` blocks become one assistant message.
    """
    if not isinstance(m, dict):
        raise bad_request("messages: every message must be an object")
    role = m.get("role")
    content = m.get("content")
    if role == "system":
        return [{"role": "system", "content": _blocks_text(content, "messages.system")}]
    if role not in ("user", "assistant"):
        raise bad_request(f"messages: unsupported role {role!r}")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"messages.{role}.content: expected a string or a list of content blocks")
    if role == "user":
        return _user_messages(content)
    return [_assistant_message(content, restore)]


def _user_messages(content: list[Any]) -> list[Message]:
    """``tool_result`` blocks become ``tool`` messages (in order), the rest one user message."""
    out: list[Message] = []
    texts: list[str] = []
    for i, b in enumerate(content):
        if not isinstance(b, dict):
            raise bad_request(f"messages.user.content[{i}]: expected a content block object")
        if b.get("type") == "tool_result":
            tid = b.get("tool_use_id")
            if not isinstance(tid, str):
                raise bad_request(f"messages.user.content[{i}].tool_use_id: expected a string")
            text = _blocks_text(b.get("content"), f"messages.user.content[{i}].content")
            if b.get("is_error"):
                text = "Error: " + text
            out.append({"role": "tool", "tool_call_id": tid, "content": text})
        else:
            texts.append(_blocks_text([b], f"messages.user.content[{i}]"))
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(content: list[Any], restore: Restore) -> Message:
    """``thinking``/``text``/``tool_use`` blocks become one assistant message."""
    msg: Message = {"role": "assistant", "content": ""}
    texts = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, b in enumerate(content):
        if not isinstance(b, dict):
            raise bad_request(f"messages.assistant.content[{i}]: expected a content block object")
        t = b.get("type")
        if t == "text":
            block_text = b.get("text")
            texts.append(block_text if isinstance(block_text, str) else "")
        elif t == "thinking":
            thinking = b.get("thinking")
            reasoning.append(thinking if isinstance(thinking, str) else "")
        elif t == "tool_use":
            calls.append(_tool_call(b, i, restore))
        # redacted_thinking, server tool blocks: nothing the template can show
    msg["content"] = "".join(texts)
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_call(b: dict[str, Any], i: int, restore: Restore) -> dict[str, Any]:
    """A ``tool_use`` block as a chat-template tool call, with the arguments' JSON as the model
    wrote it when the proxy still has it (so the re-rendered history is token-exact)."""
    cid, name = b.get("id"), b.get("name")
    if not isinstance(cid, str) or not isinstance(name, str):
        raise bad_request(f"messages.assistant.content[{i}]: tool_use needs string id and name")
    cached = restore(cid)
    if cached is not None and cached[0] == name:
        args = cached[1]
    else:
        inp = b.get("input", {})
        args = jsonfast.dumps_str(inp if inp is not None else {})
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    check(tools, list, "tools", "a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad_request(f"tools[{i}]: expected an object")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}].name: expected a non-empty string")
        schema = t.get("input_schema", {"type": "object", "properties": {}})
        if not isinstance(schema, dict):
            schema = {
                "type": "object",
                "properties": {},
            }  # server tools (web_search, ...) have none
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": t.get("description") or "",
                    "parameters": schema,
                },
            }
        )
    return out or None


def parse_request(body: Any) -> ParsedCall:
    check(body, dict, "body", "a JSON object")
    model = require(body, "model", str, "a string")
    max_tokens = require(body, "max_tokens", int, "an integer")
    if max_tokens < 1:
        raise bad_request("max_tokens: must be >= 1")
    messages = require(body, "messages", list, "a list of messages")
    if not messages:
        raise bad_request("messages: must contain at least one message")
    system = body.get("system")
    items: list[Any] = []
    if system is not None and system != "" and system != []:
        if not isinstance(system, (str, list)):
            raise bad_request("system: expected a string or a list of text blocks")
        items.append({"role": "system", "content": system})
    items.extend(messages)
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", 0.0, 1.0),
        top_p=opt_number(body, "top_p", 0.0, 1.0),
        top_k=opt_int(body, "top_k", lo=0),
    )
    if sampling.top_p == 0.0:
        sampling.top_p = None
    tc = body.get("tool_choice")
    if tc is not None and not isinstance(tc, dict):
        raise bad_request("tool_choice: expected an object")
    return ParsedCall(
        api=API,
        model=model,
        raw_items=items,
        normalize_item=normalize_item,
        tools=_tools(body),
        tools_raw=body.get("tools"),
        stream=opt_bool(body, "stream"),
        sampling=sampling,
        tool_choice=tc,
    )


# ---- responses ------------------------------------------------------------------------------
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "abort": "end_turn"}


def _signature(text: str) -> str:
    return "gyre-" + hashlib.sha1(text.encode()).hexdigest()


def _tool_input(args: str) -> dict[str, Any]:
    v = parse_arguments(args)
    return v if v is not None else {}


def _usage(turn: AssistantTurn) -> dict[str, int]:
    return {
        "input_tokens": turn.prompt_tokens,
        "output_tokens": turn.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def response(call: ParsedCall, turn: AssistantTurn, tokenizer: Any = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.reasoning:
        content.append(
            {
                "type": "thinking",
                "thinking": turn.reasoning,
                "signature": _signature(turn.reasoning),
            }
        )
    if turn.content or not turn.tool_calls:
        content.append({"type": "text", "text": turn.content})
    for tc in turn.tool_calls:
        content.append(
            {"type": "tool_use", "id": tc.id, "name": tc.name, "input": _tool_input(tc.arguments)}
        )
    return {
        "id": f"msg_{turn.request_id}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": content,
        "stop_reason": _STOP.get(turn.finish, "end_turn"),
        "stop_sequence": None,
        "usage": _usage(turn),
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + jsonfast.dumps(data) + b"\n\n"


async def stream(
    call: ParsedCall,
    request_id: str,
    events: AsyncIterator[StreamEvent],
    prompt_tokens: int,
    tokenizer: Any = None,
) -> AsyncGenerator[bytes, None]:
    """The standard SSE sequence: message_start, content blocks (start/delta/stop), message_delta, message_stop."""
    yield _event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": f"msg_{request_id}",
                "type": "message",
                "role": "assistant",
                "model": call.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": prompt_tokens,
                    "output_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
            },
        },
    )
    blocks = _ContentBlocks()
    async for ev in events:
        if isinstance(ev, ReasoningDelta) and ev.text:
            chunks = blocks.thinking(ev.text)
        elif isinstance(ev, TextDelta) and ev.text:
            chunks = blocks.text(ev.text)
        elif isinstance(ev, ToolCallEvent):
            chunks = blocks.tool_use(ev.call.id, ev.call.name, ev.call.arguments)
        elif isinstance(ev, Finished):
            chunks = blocks.finish(ev.turn)
        else:
            continue
        for chunk in chunks:
            yield chunk


class _ContentBlocks:
    """The content blocks of one streamed answer, as SSE events: which block is open and its
    index, and the thinking so far (a thinking block is signed just before it closes)."""

    def __init__(self) -> None:
        self.index = -1
        self.open_kind: str | None = None
        self.reasoning: list[str] = []

    def thinking(self, text: str) -> list[bytes]:
        out = []
        if self.open_kind != "thinking":
            out += self._end_open()
            out.append(self._start("thinking", {"type": "thinking", "thinking": ""}))
        self.reasoning.append(text)
        out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def text(self, text: str) -> list[bytes]:
        out = []
        if self.open_kind != "text":
            out += self._end_open()
            out.append(self._start("text", {"type": "text", "text": ""}))
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def tool_use(self, call_id: str, name: str, arguments: str) -> list[bytes]:
        """A whole tool call: its block opens, gets its input in one delta, and closes."""
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        partial = jsonfast.dumps_str(_tool_input(arguments))
        return [
            *self._end_open(),
            self._start(None, block),
            self._delta({"type": "input_json_delta", "partial_json": partial}),
            self._close(),
        ]

    def finish(self, turn: AssistantTurn) -> list[bytes]:
        out = []
        if (
            self.open_kind is None and self.index == -1
        ):  # empty answer: still one (empty) text block
            out.append(self._start("text", {"type": "text", "text": ""}))
        out += self._end_open()
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _STOP.get(turn.finish, "end_turn"),
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": turn.completion_tokens},
                },
            )
        )
        out.append(_event("message_stop", {"type": "message_stop"}))
        return out

    def _start(self, kind: str | None, block: dict[str, Any]) -> bytes:
        self.index += 1
        self.open_kind = kind
        return _event(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _end_open(self) -> list[bytes]:
        """Close the open block, if any (a thinking block gets its signature delta first)."""
        out = []
        if self.open_kind == "thinking":
            out.append(self._sign())
        if self.open_kind is not None:
            out.append(self._close())
        return out

    def _sign(self) -> bytes:
        """The thinking block's signature delta, sent just before the block closes."""
        signature = _signature("".join(self.reasoning).strip())
        return self._delta({"type": "signature_delta", "signature": signature})

    def _close(self) -> bytes:
        return _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
