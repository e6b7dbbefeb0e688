"""OpenAI Responses answers: the response object, and the SSE event sequence the SDKs parse.

A turn becomes output items in the order the model wrote them: a ``reasoning``
item (its text as ``reasoning_text`` content), a ``message`` item with one
``output_text`` part, one ``function_call`` item per tool call. Streamed, each
item is announced (``response.output_item.added``), filled (content part +
text deltas, or argument deltas) and closed (``...done`` events, then
``response.output_item.done`` with the whole item), between
``response.created``/``response.in_progress`` and the terminal event:
``response.completed`` with ``usage``, or ``response.incomplete``
(``incomplete_details.reason = max_output_tokens``) when the turn hit its token
limit, or ``response.failed`` when the generation failed mid-stream. Every event
carries ``sequence_number`` (0, 1, 2, ...).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.errors import ApiError
from gyre.proxy.types import (
    AssistantTurn,
    Finished,
    ParsedCall,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
)


def _usage(turn: AssistantTurn) -> dict[str, Any]:
    return {
        "input_tokens": turn.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": turn.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": turn.prompt_tokens + turn.completion_tokens,
    }


def _logprobs(turn: AssistantTurn, tokenizer: Any) -> list[dict[str, Any]]:
    out = []
    for tid, lp in zip(turn.output_ids, turn.output_logprobs):
        tok = tokenizer.decode([tid]) if tokenizer is not None else ""
        out.append({"token": tok, "bytes": list(tok.encode()), "logprob": lp, "top_logprobs": []})
    return out


def _fc_id(call_id: str) -> str:
    return "fc_" + (call_id.split("_", 1)[1] if "_" in call_id else call_id)


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _message(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": parts,
    }


def _reasoning(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def _function_call(tc: ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": _fc_id(tc.id),
        "call_id": tc.id,
        "name": tc.name,
        "arguments": arguments,
        "status": status,
    }


def _status(turn: AssistantTurn | None) -> str:
    if turn is None:
        return "in_progress"
    return "incomplete" if turn.finish == "length" else "completed"


def _envelope(
    call: ParsedCall,
    request_id: str,
    created: int,
    output: list[dict[str, Any]],
    turn: AssistantTurn | None,
    status: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object; ``turn`` None while in progress (no usage yet)."""
    e = call.echo
    st = status or _status(turn)
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": created,
        "status": st,
        "completed_at": int(time.time()) if st == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if st == "incomplete" else None,
        "instructions": e.get("instructions"),
        "max_output_tokens": e.get("max_output_tokens"),
        "model": call.model,
        "output": output,
        "parallel_tool_calls": e.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": e.get("prompt_cache_key"),
        "reasoning": e.get("reasoning") or {"effort": None, "summary": None},
        "store": False,
        "temperature": e.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": e.get("tool_choice", "auto"),
        "tools": e.get("tools", []),
        "top_p": e.get("top_p"),
        "truncation": "disabled",
        "usage": _usage(turn) if turn is not None else None,
        "metadata": e.get("metadata", {}),
    }


def output_items(
    call: ParsedCall, turn: AssistantTurn, tokenizer: Any = None
) -> list[dict[str, Any]]:
    """A finished turn's output items (reasoning, message, function calls)."""
    rid = turn.request_id
    out: list[dict[str, Any]] = []
    if turn.reasoning:
        out.append(_reasoning(f"rs_{rid}", turn.reasoning, "completed"))
    if turn.content or not turn.tool_calls:
        lps = _logprobs(turn, tokenizer) if call.want_logprobs else None
        out.append(_message(f"msg_{rid}", [_text_part(turn.content, lps)], "completed"))
    for tc in turn.tool_calls:
        out.append(_function_call(tc, tc.arguments, "completed"))
    return out


def response(call: ParsedCall, turn: AssistantTurn, tokenizer: Any = None) -> dict[str, Any]:
    return _envelope(
        call, turn.request_id, int(time.time()), output_items(call, turn, tokenizer), turn
    )


class _Events:
    """Builds the numbered SSE events of one streamed response (the open item's state)."""

    def __init__(self, call: ParsedCall, request_id: str, tokenizer: Any) -> None:
        self.call = call
        self.rid = request_id
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items, in order
        self.open: str | None = None  # "message" | "reasoning" while an item is open
        self.open_id = ""
        self.text: list[str] = []
        self.held = ""  # reasoning whitespace not sent yet (the turn's reasoning is stripped)

    def event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + jsonfast.dumps(body) + b"\n\n"

    def envelope(self, turn: AssistantTurn | None, **kw: Any) -> dict[str, Any]:
        return _envelope(self.call, self.rid, self.created, list(self.output), turn, **kw)

    def start(self) -> list[bytes]:
        return [
            self.event("response.created", response=self.envelope(None)),
            self.event("response.in_progress", response=self.envelope(None)),
        ]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open_id, "output_index": len(self.output)}

    def open_item(self, kind: str) -> list[bytes]:
        out = self.close()
        n = len(self.output)
        self.open, self.text, self.held = kind, [], ""
        if kind == "message":
            self.open_id = f"msg_{self.rid}" + (f"_{n}" if n else "")
            item = _message(self.open_id, [], "in_progress")
            part = _text_part("")
        else:
            self.open_id = f"rs_{self.rid}" + (f"_{n}" if n else "")
            item = _reasoning(self.open_id, None, "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        out.append(self.event("response.output_item.added", output_index=n, item=item))
        out.append(
            self.event("response.content_part.added", **self._where(), content_index=0, part=part)
        )
        return out

    def delta(self, kind: str, text: str) -> list[bytes]:
        held = ""
        if kind == "reasoning":  # stripped as the turn's reasoning is: edge whitespace held back
            text = self.held + text if self.open == kind else text.lstrip()
            body = text.rstrip()
            if not body:
                if self.open == kind:
                    self.held = text
                return []
            text, held = body, text[len(body) :]
        out = self.open_item(kind) if self.open != kind else []
        self.held = held
        self.text.append(text)
        if kind == "message":
            ev = self.event(
                "response.output_text.delta",
                **self._where(),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        else:
            ev = self.event(
                "response.reasoning_text.delta", **self._where(), content_index=0, delta=text
            )
        out.append(ev)
        return out

    def close(self, turn: AssistantTurn | None = None) -> list[bytes]:
        """Close the open message/reasoning item (``turn``: the last one, for its logprobs)."""
        if self.open is None:
            return []
        text = "".join(self.text)
        where = {**self._where(), "content_index": 0}
        if self.open == "message":
            lps = _logprobs(turn, self.tokenizer) if turn and self.call.want_logprobs else None
            part = _text_part(text, lps)
            out = [self.event("response.output_text.done", **where, text=text, logprobs=lps or [])]
            item = _message(self.open_id, [part], "completed")
        else:
            part = {"type": "reasoning_text", "text": text}
            out = [self.event("response.reasoning_text.done", **where, text=text)]
            item = _reasoning(self.open_id, text, "completed")
        out.append(self.event("response.content_part.done", **where, part=part))
        out.append(
            self.event("response.output_item.done", output_index=len(self.output), item=item)
        )
        self.output.append(item)
        self.open = None
        return out

    def function_call(self, tc: ToolCall) -> list[bytes]:
        out = self.close()
        n = len(self.output)
        where = {"item_id": _fc_id(tc.id), "output_index": n}
        out.append(
            self.event(
                "response.output_item.added",
                output_index=n,
                item=_function_call(tc, "", "in_progress"),
            )
        )
        out.append(
            self.event("response.function_call_arguments.delta", **where, delta=tc.arguments)
        )
        out.append(
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=tc.name,
                arguments=tc.arguments,
            )
        )
        item = _function_call(tc, tc.arguments, "completed")
        out.append(self.event("response.output_item.done", output_index=n, item=item))
        self.output.append(item)
        return out

    def finish(self, turn: AssistantTurn) -> list[bytes]:
        out = self.close(turn)
        if not self.output:  # an empty answer is still one (empty) message
            out += self.open_item("message") + self.close(turn)
        status = _status(turn)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.append(self.event(kind, response=self.envelope(turn)))
        return out

    def failed(self, e: ApiError) -> list[bytes]:
        err = {
            "code": e.code or ("server_error" if e.status >= 500 else "invalid_request"),
            "message": e.message,
        }
        return [
            self.event("response.failed", response=self.envelope(None, status="failed", error=err))
        ]


async def stream(
    call: ParsedCall,
    request_id: str,
    events: AsyncIterator[StreamEvent],
    prompt_tokens: int,
    tokenizer: Any = None,
) -> AsyncGenerator[bytes, None]:
    """The Responses SSE sequence for one call (see module doc).

    A failure mid-stream ends it with ``response.failed`` (carrying the error)
    and is then re-raised so the service counts it.
    """
    ev = _Events(call, request_id, tokenizer)
    for b in ev.start():
        yield b
    try:
        async for e in events:
            if isinstance(e, TextDelta):
                chunks = ev.delta("message", e.text) if e.text else []
            elif isinstance(e, ReasoningDelta):
                chunks = ev.delta("reasoning", e.text) if e.text else []
            elif isinstance(e, ToolCallEvent):
                chunks = ev.function_call(e.call)
            elif isinstance(e, Finished):
                chunks = ev.finish(e.turn)
            for b in chunks:
                yield b
    except ApiError as err:
        for b in ev.failed(err):
            yield b
        raise
