"""The one seam between the proxy's pipeline and an API dialect: the :class:`Adapter` protocol.

The pipeline (:mod:`gyre.proxy.service`) never asks which dialect it serves; it asks the
route's adapter to parse the body, write the answer (whole or as SSE), shape an error, name
tool-call ids and word the context-length refusal. Adding a dialect is one class here and one
route in :mod:`gyre.proxy.app`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from gyre.proxy import jsonfast
from gyre.proxy.adapters import anthropic_messages, openai_chat, responses
from gyre.proxy.errors import ApiError
from gyre.proxy.types import AssistantTurn, ParsedCall, StreamEvent


class Adapter(Protocol):
    """What the pipeline needs from a dialect (OpenAI chat, OpenAI Responses, Anthropic)."""

    name: str
    tool_id_prefix: str  # ids the proxy mints for the model's tool calls start with it
    context_param: str  # the request field a context-length 400 names

    def parse(self, body: Any) -> ParsedCall: ...

    def respond(self, call: ParsedCall, turn: AssistantTurn, tokenizer: Any) -> dict[str, Any]: ...

    def stream(
        self,
        call: ParsedCall,
        request_id: str,
        events: AsyncIterator[StreamEvent],
        prompt_tokens: int,
        tokenizer: Any,
    ) -> AsyncGenerator[bytes, None]: ...

    def error_body(self, err: ApiError) -> dict[str, Any]: ...

    def stream_error(self, err: ApiError) -> bytes:
        """The SSE bytes that end a stream failing mid-way (b"" when the stream did it)."""
        ...

    def too_long_message(self, tokens: str, max_context: int) -> str:
        """The context-length 400's text; ``tokens`` is "N" or "at least N"."""
        ...


class OpenAIChat:
    name = "openai"
    tool_id_prefix = "call_"
    context_param = "messages"

    def parse(self, body: Any) -> ParsedCall:
        return openai_chat.parse_request(body)

    def respond(self, call: ParsedCall, turn: AssistantTurn, tokenizer: Any) -> dict[str, Any]:
        return openai_chat.response(call, turn, tokenizer)

    def stream(
        self,
        call: ParsedCall,
        request_id: str,
        events: AsyncIterator[StreamEvent],
        prompt_tokens: int,
        tokenizer: Any,
    ) -> AsyncGenerator[bytes, None]:
        # chat chunks carry usage from the Finished turn: no prompt count needed up front
        return openai_chat.stream(call, request_id, events, tokenizer)

    def error_body(self, err: ApiError) -> dict[str, Any]:
        return err.openai_body()

    def stream_error(self, err: ApiError) -> bytes:
        return b"data: " + jsonfast.dumps(err.openai_body()) + b"\n\n"

    def too_long_message(self, tokens: str, max_context: int) -> str:
        return (
            f"This model's maximum context length is {max_context} tokens; the messages "
            f"resulted in {tokens} tokens."
        )


class OpenAIResponses(OpenAIChat):
    name = "responses"
    context_param = "input"

    def parse(self, body: Any) -> ParsedCall:
        return responses.parse_request(body)

    def respond(self, call: ParsedCall, turn: AssistantTurn, tokenizer: Any) -> dict[str, Any]:
        return responses.response(call, turn, tokenizer)

    def stream(
        self,
        call: ParsedCall,
        request_id: str,
        events: AsyncIterator[StreamEvent],
        prompt_tokens: int,
        tokenizer: Any,
    ) -> AsyncGenerator[bytes, None]:
        return responses.stream(call, request_id, events, prompt_tokens, tokenizer)

    def stream_error(self, err: ApiError) -> bytes:
        return b""  # the stream already ended with its response.failed event


class Anthropic:
    name = "anthropic"
    tool_id_prefix = "toolu_"
    context_param = "messages"

    def parse(self, body: Any) -> ParsedCall:
        return anthropic_messages.parse_request(body)

    def respond(self, call: ParsedCall, turn: AssistantTurn, tokenizer: Any) -> dict[str, Any]:
        return anthropic_messages.response(call, turn, tokenizer)

    def stream(
        self,
        call: ParsedCall,
        request_id: str,
        events: AsyncIterator[StreamEvent],
        prompt_tokens: int,
        tokenizer: Any,
    ) -> AsyncGenerator[bytes, None]:
        return anthropic_messages.stream(call, request_id, events, prompt_tokens, tokenizer)

    def error_body(self, err: ApiError) -> dict[str, Any]:
        return err.anthropic_body()

    def stream_error(self, err: ApiError) -> bytes:
        return b"event: error\ndata: " + jsonfast.dumps(err.anthropic_body()) + b"\n\n"

    def too_long_message(self, tokens: str, max_context: int) -> str:
        return f"prompt is too long: {tokens} tokens > {max_context - 1} maximum"


OPENAI = OpenAIChat()
RESPONSES = OpenAIResponses()
ANTHROPIC = Anthropic()
ADAPTERS: dict[str, Adapter] = {a.name: a for a in (OPENAI, RESPONSES, ANTHROPIC)}


def for_path(path: str) -> Adapter:
    """The adapter whose error shape a route's framework-level errors (404, 500) take."""
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI


def too_long(adapter: Adapter, tokens: str, max_context: int) -> ApiError:
    """The API's context-length 400 (the same for a counted prompt and an early floor)."""
    return ApiError(
        400,
        adapter.too_long_message(tokens, max_context),
        "invalid_request",
        param=adapter.context_param,
        code="context_length_exceeded",
    )
