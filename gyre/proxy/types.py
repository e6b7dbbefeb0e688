"""The proxy's internal, API-neutral view of a call: chat messages in, an assistant turn out.

Both API dialects normalise to the message shape Hugging Face chat templates
take (``role``/``content``/``tool_calls``/``tool_call_id``/``reasoning_content``),
so rendering, matching and recording are written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, Any]
Restore = Callable[[str], tuple[str, str] | None]  # call id -> (name, original arguments text)


TurnFinish = Literal["stop", "length", "tool_calls", "abort"]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON object text, exactly as the model wrote it (re-dumped compactly only if it had to be)

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclass
class ParsedCall:
    """One API request, validated and split into the parts the proxy uses.

    ``raw_items`` are the request's message objects as received (Anthropic's
    ``system`` parameter first, as a synthetic system item), kept so that the
    next request's unchanged history is recognised by a cheap C-level equality
    check instead of being normalised again.
    """

    api: str  # "openai.chat" | "anthropic.messages" | "openai.responses"
    model: str
    raw_items: list[Any]
    normalize_item: Callable[[Any, Restore], list[Message]]
    tools: list[dict[str, Any]] | None  # OpenAI function-tool shape (what chat templates take)
    tools_raw: Any
    stream: bool
    sampling: Sampling
    tool_choice: Any = None
    include_usage: bool = False
    want_logprobs: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # merged into the trace record's meta
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the answer repeats
    body_bytes: int = 0  # size of the request body (what keeping raw_items costs, about)

    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools or []]


@dataclass
class AssistantTurn:
    """What the model produced, parsed; the response both dialects are written from."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish: TurnFinish
    tool_calls_unparsed: int = 0  # written as a tool call, not parseable: sent back as text
    prompt_tokens: int = 0
    completion_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    request_id: str = ""

    def as_message(self) -> Message:
        m: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [tc.as_openai() for tc in self.tool_calls]
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        return m


# Streaming events from the output parser (see parsing.py).
@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallEvent:
    call: ToolCall


@dataclass
class Finished:
    turn: AssistantTurn


StreamEvent = TextDelta | ReasoningDelta | ToolCallEvent | Finished
