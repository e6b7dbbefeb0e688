"""OpenAI chat completions: ``POST /v1/chat/completions``, streaming and not, tools.

Unknown fields are accepted and ignored (clients send many). ``n > 1`` is
refused: each call is one branch of one execution's trace.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.adapters.common import (
    check,
    openai_tool_choice,
    opt_bool,
    opt_int,
    opt_number,
    require,
)
from gyre.proxy.adapters.media import check_openai_image
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

API = "openai.chat"
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, null, or a list of parts (text kept, others noted)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise bad_request(f"{where}.content[{i}]: expected an object", param="messages")
            kind = part.get("type")
            if kind == "text":
                t = part.get("text")
                if not isinstance(t, str):
                    raise bad_request(
                        f"{where}.content[{i}].text: expected a string", param="messages"
                    )
                out.append(t)
            else:
                if kind == "image_url":
                    check_openai_image(part, f"{where}.content[{i}]")
                out.append(f"[{kind} omitted: text-only model]")
        return "\n".join(out)
    raise bad_request(
        f"{where}.content: expected a string, null or a list of parts", param="messages"
    )


def normalize_item(m: Any, restore: Restore) -> list[Message]:
    """One OpenAI message -> chat-template messages (restoring cached tool-call payloads)."""
    if not isinstance(m, dict):
        raise bad_request("messages: every message must be an object", param="messages")
    role = m.get("role")
    if role not in _ROLES:
        raise bad_request(f"messages: unsupported role {role!r}", param="messages")
    if role in ("system", "developer"):
        return [{"role": "system", "content": _text(m.get("content"), role)}]
    if role == "user":
        return [{"role": "user", "content": _text(m.get("content"), role)}]
    if role == "tool":
        tid = m.get("tool_call_id")
        if not isinstance(tid, str):
            raise bad_request(
                "messages: a tool message needs a string tool_call_id", param="messages"
            )
        return [{"role": "tool", "tool_call_id": tid, "content": _text(m.get("content"), role)}]
    out: Message = {"role": "assistant", "content": _text(m.get("content"), role)}
    rc = m.get("reasoning_content", m.get("reasoning"))
    if isinstance(rc, str) and rc:
        out["reasoning_content"] = rc
    tcs = m.get("tool_calls")
    if tcs:
        if not isinstance(tcs, list):
            raise bad_request("messages: assistant tool_calls must be a list", param="messages")
        calls = []
        for tc in tcs:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request("messages: each tool call needs function.name", param="messages")
            args = fn.get("arguments", "{}")
            if not isinstance(args, str):
                args = jsonfast.dumps_str(args)
            cid = tc.get("id") if isinstance(tc.get("id"), str) else ""
            cached = restore(cid) if cid else None
            if cached is not None and cached[0] == fn["name"]:
                args = cached[1]
            calls.append(
                {"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": args}}
            )
        out["tool_calls"] = calls
    return [out]


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    check(tools, list, "tools", "a list")
    out = []
    for i, t in enumerate(tools):
        if (
            not isinstance(t, dict)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), dict)
        ):
            raise bad_request(
                f"tools[{i}]: expected {{type: function, function: {{...}}}}", param="tools"
            )
        fn = t["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(
                f"tools[{i}].function.name: expected a non-empty string", param="tools"
            )
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters: expected an object", param="tools")
        f = {"name": fn["name"], "description": fn.get("description") or "", "parameters": params}
        out.append({"type": "function", "function": f})
    return out or None


def parse_request(body: Any) -> ParsedCall:
    check(body, dict, "body", "a JSON object")
    model = body.get("model", "")
    check(model, str, "model", "a string")
    messages = require(body, "messages", list, "a list of messages")
    if not messages:
        raise bad_request("messages: must contain at least one message", param="messages")
    n = opt_int(body, "n", lo=1)
    if n is not None and n > 1:
        raise bad_request(
            "n: only n=1 is supported (each call is one branch of an execution's trace)", param="n"
        )
    max_tokens = opt_int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = opt_int(body, "max_tokens", lo=1)
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=opt_number(body, "temperature", 0.0, 2.0),
        top_p=opt_number(body, "top_p", 0.0, 1.0),
        top_k=opt_int(body, "top_k", lo=-1),
        seed=opt_int(body, "seed"),
    )
    if sampling.top_p == 0.0:
        sampling.top_p = None
    tc = openai_tool_choice(body)
    so = body.get("stream_options")
    include_usage = isinstance(so, dict) and so.get("include_usage") is True
    return ParsedCall(
        api=API,
        model=model,
        raw_items=messages,
        normalize_item=normalize_item,
        tools=_tools(body),
        tools_raw=body.get("tools"),
        stream=opt_bool(body, "stream"),
        sampling=sampling,
        tool_choice=tc,
        include_usage=include_usage,
        want_logprobs=opt_bool(body, "logprobs"),
    )


# ---- responses ------------------------------------------------------------------------------
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "stop"}


def _logprobs(turn: AssistantTurn, tokenizer: Any) -> dict[str, Any]:
    toks = (
        tokenizer.convert_ids_to_tokens(turn.output_ids)
        if tokenizer is not None
        else [""] * len(turn.output_ids)
    )
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(toks, turn.output_logprobs)
        ]
    }


def _usage(turn: AssistantTurn) -> dict[str, int]:
    return {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "total_tokens": turn.prompt_tokens + turn.completion_tokens,
    }


def response(call: ParsedCall, turn: AssistantTurn, tokenizer: Any = None) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": turn.content if (turn.content or not turn.tool_calls) else None,
    }
    if turn.tool_calls:
        msg["tool_calls"] = [tc.as_openai() for tc in turn.tool_calls]
    if turn.reasoning:
        msg["reasoning_content"] = turn.reasoning
    return {
        "id": f"chatcmpl-{turn.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [
            {
                "index": 0,
                "message": msg,
                "finish_reason": _FINISH.get(turn.finish, "stop"),
                "logprobs": _logprobs(turn, tokenizer) if call.want_logprobs else None,
            }
        ],
        "usage": _usage(turn),
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + jsonfast.dumps(obj) + b"\n\n"


async def stream(
    call: ParsedCall, request_id: str, events: AsyncIterator[StreamEvent], tokenizer: Any = None
) -> AsyncGenerator[bytes, None]:
    """SSE chunks in OpenAI's order: role, content/reasoning/tool-call deltas, finish, [usage], [DONE]."""
    base = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": call.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        return _sse(
            {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
                ],
            }
        )

    yield chunk({"role": "assistant", "content": ""})
    n_tools = 0
    async for ev in events:
        if isinstance(ev, TextDelta):
            if ev.text:
                yield chunk({"content": ev.text})
        elif isinstance(ev, ReasoningDelta):
            if ev.text:
                yield chunk({"reasoning_content": ev.text})
        elif isinstance(ev, ToolCallEvent):
            tc = ev.call
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": n_tools,
                            "id": tc.id,
                            "type": "function",
                            "function": {"name": tc.name, "arguments": tc.arguments},
                        }
                    ]
                }
            )
            n_tools += 1
        elif isinstance(ev, Finished):
            turn = ev.turn
            extra = {"logprobs": _logprobs(turn, tokenizer)} if call.want_logprobs else {}
            yield chunk({}, _FINISH.get(turn.finish, "stop"), **extra)
            if call.include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(turn)})
    yield b"data: [DONE]\n\n"
