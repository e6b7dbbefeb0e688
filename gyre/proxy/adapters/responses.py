"""OpenAI Responses: ``POST /v1/responses`` requests (streamed or not) -> a :class:`ParsedCall`.

The Responses API sends a flat list of *items*, not messages: one model turn is
several items (``reasoning``, an assistant ``message``, one ``function_call``
per call) and each tool result is its own ``function_call_output``. The
session's bridge matches whole assistant turns, so every run of consecutive
assistant-side items is wrapped into one synthetic raw item
``{"role": "assistant", "items": [...]}`` (see :func:`group_items`): a turn the
proxy answered then sits at exactly the raw index the next call's history puts
it, and is normalised to one assistant message whose tool calls are restored
by ``call_id`` (the model's original argument text, so the prefix stays
token-exact however the client re-serialises it).

Rules (docs/proxy.md, "OpenAI Responses"):
- ``instructions`` is the first system message; ``developer`` and ``system``
  input messages are system messages, in place.
- ``reasoning`` items: the text of their ``reasoning_text`` content (else of
  their ``summary``) becomes the turn's ``reasoning_content``, as for the other
  dialects; ``encrypted_content`` is opaque and ignored.
- Only ``function`` tools reach the chat template. Every other tool type
  (``web_search``, ``local_shell``, ``custom``/freeform, ``namespace``, ``mcp``,
  ``file_search``, ...) is dropped and its name noted in the trace record's
  ``meta["dropped_tools"]``: the policy cannot serve them, and Codex sends some
  by default.
- Nothing is stored: ``previous_response_id``, ``conversation``, ``prompt``
  and ``item_reference`` items are a 400 (send the whole conversation);
  ``store`` is accepted and ignored; ``background: true`` is a 400.
"""

from __future__ import annotations

import logging
from typing import Any

from gyre.proxy import jsonfast
from gyre.proxy.adapters.common import (
    check,
    openai_tool_choice,
    opt_bool,
    opt_int,
    opt_number,
)
from gyre.proxy.adapters.responses_out import response, stream
from gyre.proxy.errors import bad_request
from gyre.proxy.types import Message, ParsedCall, Restore, Sampling

__all__ = ["API", "group_items", "normalize_item", "parse_request", "response", "stream"]

API = "openai.responses"
log = logging.getLogger("gyre.proxy.responses")

# items that belong to the model's side of the conversation (grouped into one assistant turn)
_ASSISTANT_SIDE = frozenset({"reasoning", "function_call"})
_SYSTEM_ROLES = frozenset({"system", "developer"})
_NOT_STORED = ("previous_response_id", "conversation", "prompt")


def _kind(item: dict[str, Any]) -> str:
    """An item's type; a bare ``{"role", "content"}`` (EasyInputMessage) is a message."""
    t = item.get("type")
    return t if isinstance(t, str) else ("message" if "role" in item else "")


def _assistant_side(item: dict[str, Any]) -> bool:
    k = _kind(item)
    return k in _ASSISTANT_SIDE or (k == "message" and item.get("role") == "assistant")


def group_items(items: list[Any]) -> list[Any]:
    """The raw items the session sees: every run of assistant-side items wrapped into one."""
    out: list[Any] = []
    run: list[Any] = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise bad_request(f"input[{i}]: expected an item object", param="input")
        if _assistant_side(it):
            run.append(it)
            continue
        if run:
            out.append({"role": "assistant", "items": run})
            run = []
        out.append(it)
    if run:
        out.append({"role": "assistant", "items": run})
    return out


def _parts_text(content: Any, where: str) -> str:
    """Text of a string or a list of content parts (text kept; images, files, audio noted)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of content parts", param="input")
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad_request(f"{where}[{i}]: expected a content part object", param="input")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            t = part.get("text")
            if not isinstance(t, str):
                raise bad_request(f"{where}[{i}].text: expected a string", param="input")
            out.append(t)
        elif kind == "refusal":
            r = part.get("refusal")
            out.append(r if isinstance(r, str) else "")
        else:
            out.append(f"[{kind} omitted: text-only model]")
    return "\n".join(out)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    content = item.get("content")
    if isinstance(content, list) and content:
        return _parts_text(content, f"{where}.content")
    summary = item.get("summary")
    if isinstance(summary, list):
        return _parts_text(summary, f"{where}.summary")
    return ""


def _function_call(item: dict[str, Any], where: str, restore: Restore) -> dict[str, Any]:
    cid, name = item.get("call_id"), item.get("name")
    if not isinstance(cid, str) or not cid or not isinstance(name, str) or not name:
        raise bad_request(f"{where}: a function_call needs string call_id and name", param="input")
    args = item.get("arguments", "{}")
    if not isinstance(args, str):
        args = jsonfast.dumps_str(args if args is not None else {})
    cached = restore(cid)
    if cached is not None and cached[0] == name:
        args = cached[1]
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def _assistant(group: list[Any], restore: Restore) -> Message:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, it in enumerate(group):
        where = f"input.assistant[{j}]"
        k = _kind(it)
        if k == "message":
            texts.append(_parts_text(it.get("content"), f"{where}.content"))
        elif k == "reasoning":
            r = _reasoning_text(it, where)
            if r:
                reasoning.append(r)
        else:
            calls.append(_function_call(it, where, restore))
    msg: Message = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def normalize_item(item: Any, restore: Restore) -> list[Message]:
    """One raw item (after :func:`group_items`) -> chat-template messages."""
    if not isinstance(item, dict):
        raise bad_request("input: every item must be an object", param="input")
    group = item.get("items")
    if item.get("role") == "assistant" and isinstance(group, list):
        return [_assistant(group, restore)]
    k = _kind(item)
    if k == "message":
        role = item.get("role")
        text = _parts_text(item.get("content"), f"input.{role}.content")
        if role in _SYSTEM_ROLES:
            return [{"role": "system", "content": text}]
        if role == "user":
            return [{"role": "user", "content": text}]
        raise bad_request(f"input: unsupported message role {role!r}", param="input")
    if k == "function_call_output":
        cid = item.get("call_id")
        if not isinstance(cid, str) or not cid:
            raise bad_request("input: a function_call_output needs a string call_id", param="input")
        out = item.get("output")
        text = _parts_text(out, "input.function_call_output.output")
        return [{"role": "tool", "tool_call_id": cid, "content": text}]
    if k == "item_reference":
        raise bad_request(
            "input: item_reference needs stored items; this proxy stores nothing "
            "(send the items themselves)",
            param="input",
        )
    raise bad_request(f"input: item type {k or '(none)'!r} is not supported", param="input")


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """Function tools in the chat-template shape, and the names of the tools dropped."""
    tools = body.get("tools")
    if tools is None:
        return None, []
    check(tools, list, "tools", "a list")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("type"), str):
            raise bad_request(f"tools[{i}]: expected an object with a type", param="tools")
        if t["type"] != "function":
            name = t.get("name") or t.get("server_label")
            dropped.append(t["type"] + (f":{name}" if isinstance(name, str) else ""))
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}].name: expected a non-empty string", param="tools")
        params = t.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise bad_request(f"tools[{i}].parameters: expected an object", param="tools")
        desc = t.get("description")
        fn = {
            "name": name,
            "description": desc if isinstance(desc, str) else "",
            "parameters": params,
        }
        out.append({"type": "function", "function": fn})
    if dropped:
        log.debug("responses: dropped tools the policy cannot serve: %s", ", ".join(dropped))
    return out or None, dropped


def _input(body: dict[str, Any]) -> list[Any]:
    if "input" not in body or body["input"] is None:
        raise bad_request("input: field required", param="input")
    inp = body["input"]
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    check(inp, list, "input", "a string or a list of items")
    if not inp:
        raise bad_request("input: must contain at least one item", param="input")
    return inp


def parse_request(body: Any) -> ParsedCall:
    check(body, dict, "body", "a JSON object")
    for key in _NOT_STORED:
        if body.get(key) not in (None, ""):
            raise bad_request(
                f"{key}: this proxy stores no responses or conversations; send the whole "
                "conversation in input (store: false)",
                param=key,
                code="previous_response_not_found" if key == "previous_response_id" else None,
            )
    if opt_bool(body, "background"):
        raise bad_request("background: background responses are not supported", param="background")
    model = body.get("model", "")
    check(model, str, "model", "a string")
    items = _input(body)
    instructions = body.get("instructions")
    raw: list[Any] = []
    if instructions is not None and instructions != "":
        check(instructions, str, "instructions", "a string")
        raw.append({"role": "system", "content": instructions})
    raw.extend(group_items(items))
    sampling = Sampling(
        max_tokens=opt_int(body, "max_output_tokens", lo=1),
        temperature=opt_number(body, "temperature", 0.0, 2.0),
        top_p=opt_number(body, "top_p", 0.0, 1.0),
    )
    if sampling.top_p == 0.0:
        sampling.top_p = None
    tc = openai_tool_choice(body)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        check(parallel, bool, "parallel_tool_calls", "a boolean")
    include = body.get("include")
    if include is not None:
        check(include, list, "include", "a list of strings")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        check(reasoning, dict, "reasoning", "an object")
    tools, dropped = _tools(body)
    call = ParsedCall(
        api=API,
        model=model,
        raw_items=raw,
        normalize_item=normalize_item,
        tools=tools,
        tools_raw=body.get("tools"),
        stream=opt_bool(body, "stream"),
        sampling=sampling,
        tool_choice=tc,
        want_logprobs="message.output_text.logprobs" in (include or ()),
    )
    if dropped:
        call.meta["dropped_tools"] = dropped
    call.echo = {
        "instructions": instructions if isinstance(instructions, str) else None,
        "max_output_tokens": sampling.max_tokens,
        "parallel_tool_calls": parallel if parallel is not None else True,
        "reasoning": reasoning,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "tool_choice": tc if tc is not None else "auto",
        "tools": [t for t in body.get("tools") or () if t.get("type") == "function"],
        "prompt_cache_key": body.get("prompt_cache_key"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
    }
    return call
