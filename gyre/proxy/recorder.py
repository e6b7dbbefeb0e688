"""TraceRecord construction: what the proxy writes for every answered call.

Records go through :class:`gyre.trace.store.TraceWriter` (append + flush +
fsync per record), written *before* the client gets the end of its answer,
so a proxy crash never loses a call the harness saw.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gyre.proxy.types import Message, ParsedCall

# Request headers copied into meta["headers"] (lower-case). Never authorization / x-api-key.
RECORDED_HEADERS = (
    "user-agent",
    "anthropic-beta",
    "anthropic-version",
    "x-claude-code-session-id",
    "x-app",
    "x-stainless-retry-count",
    "x-stainless-lang",
    "x-stainless-package-version",
    "x-stainless-runtime",
    "x-stainless-timeout",
    "openai-organization",
    "openai-project",
    # Codex CLI: marks its sub-agents' requests (x-openai-subagent) and says what each
    # request is for (x-codex-turn-metadata: request_kind, thread_source), see gyre.harness.roles
    "x-openai-subagent",
    "x-codex-turn-metadata",
)


def _text(m: Message) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else ""


def build_meta(
    call: ParsedCall,
    head: list[Message],
    norm: list[Message],
    headers: Any,
    label: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    system = "\n".join(_text(m) for m in head)
    last_user = ""
    for m in reversed(norm):  # the newest user message is near the end: O(1) in practice
        if m.get("role") == "user":
            last_user = _text(m)
            break
    meta: dict[str, Any] = {
        "model": call.model,
        "tools": call.tool_names(),
        "system_sha1": hashlib.sha1(system.encode("utf-8")).hexdigest(),
        "system_head": system[:2000],
        "last_user_head": last_user[:2000],
        "n_messages": len(norm),
        "headers": {h: headers[h] for h in RECORDED_HEADERS if h in headers},
        "key_label": label,
        "stream": call.stream,
    }
    if extra:
        meta.update(extra)
    return meta
