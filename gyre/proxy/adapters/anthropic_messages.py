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
            cid, name = b.get("id"), b.get("name")
            if not isinstance(cid, str) or not isinstance(name, str):
                raise bad_request(
                    f"messages.assistant.content[{i}]: tool_use needs string id and name"
                )
            cached = restore(cid)
            if cached is not None and cached[0] == name:
                args = cached[1]
            else:
                inp = b.get("input", {})
                args = jsonfast.dumps_str(inp if inp is not None else {})
            calls.append(
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            )
        # redacted_thinking, server tool blocks: nothing the template can show
    msg["content"] = "".join(texts)
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return [msg]


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
    index = -1
    open_kind: str | None = None
    reasoning: list[str] = []

    def close() -> bytes:
        return _event("content_block_stop", {"type": "content_block_stop", "index": index})

    def sign() -> bytes:
        """The thinking block's signature delta, sent just before the block closes."""
        delta = {"type": "signature_delta", "signature": _signature("".join(reasoning).strip())}
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    async for ev in events:
        if isinstance(ev, ReasoningDelta) and ev.text:
            if open_kind != "thinking":
                if open_kind is not None:
                    yield close()
                index += 1
                open_kind = "thinking"
                yield _event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": ""},
                    },
                )
            reasoning.append(ev.text)
            yield _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "thinking_delta", "thinking": ev.text},
                },
            )
        elif isinstance(ev, TextDelta) and ev.text:
            if open_kind != "text":
                if open_kind == "thinking":
                    yield sign()
                if open_kind is not None:
                    yield close()
                index += 1
                open_kind = "text"
                yield _event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            yield _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": ev.text},
                },
            )
        elif isinstance(ev, ToolCallEvent):
            if open_kind == "thinking":
                yield sign()
            if open_kind is not None:
                yield close()
            index += 1
            open_kind = None
            tc = ev.call
            yield _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {
                        "type": "tool_use",
                        "id": tc.id,
                        "name": tc.name,
                        "input": {},
                    },
                },
            )
            yield _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": jsonfast.dumps_str(_tool_input(tc.arguments)),
                    },
                },
            )
            yield close()
        elif isinstance(ev, Finished):
            turn = ev.turn
            if open_kind == "thinking":
                yield sign()
            if open_kind is None and index == -1:  # empty answer: still one (empty) text block
                index += 1
                open_kind = "text"
                yield _event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            if open_kind is not None:
                yield close()
            yield _event(
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
            yield _event("message_stop", {"type": "message_stop"})
