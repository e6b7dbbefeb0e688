"""The proxy's request pipeline, independent of the HTTP framework's routing.

identify (key -> execution, :mod:`gyre.proxy.executions`) -> read + parse body ->
validate into a :class:`ParsedCall` -> SDK-retry check -> bridge (token-exact
continuation, or a full render: :mod:`gyre.proxy.planner`) -> generate on the engine
pool (survives drains) -> parse the output -> record (durable) -> answer in the
request's dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gyre.proxy import jsonfast
from gyre.proxy.adapters.dialects import ANTHROPIC, Adapter
from gyre.proxy.calltally import CallTallies
from gyre.proxy.config import ProxyConfig
from gyre.proxy.counters import ProxyCounters
from gyre.proxy.detok import Detokenizer
from gyre.proxy.errors import ApiError, bad_request
from gyre.proxy.executions import Execution, Executions
from gyre.proxy.identity import Identity, KeyRegistry, key_from_headers
from gyre.proxy.parsing import OutputParser, make_parser
from gyre.proxy.planner import Planner
from gyre.proxy.pool import EnginePool, GenResult
from gyre.proxy.promptsize import PromptBound
from gyre.proxy.recorder import Recorder
from gyre.proxy.render import Renderer, RenderError
from gyre.proxy.rendered import probe
from gyre.proxy.retries import RetryEntry, retry_count
from gyre.proxy.session import Plan
from gyre.proxy.types import (
    AssistantTurn,
    Finished,
    ParsedCall,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    TurnFinish,
)
from gyre.trace.store import TraceWriter


class ClientGone(Exception):
    pass


def load_tokenizer(model_dir: str) -> Any:
    """The served model's tokenizer. Most of its cost is the first import of ``transformers``
    (2-3 s on a quiet 2-core machine), which ``gyre run`` pays in a thread while its cells start."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class ProxyService:
    """Holds the tokenizer, renderer, engine pool, key registry, execution states and trace writer."""

    def __init__(self, config: ProxyConfig, tokenizer: Any = None) -> None:
        self.config = config
        if tokenizer is None:
            tokenizer = load_tokenizer(config.model_dir)
        self.tokenizer = tokenizer
        self.renderer = Renderer(tokenizer, time_limit_s=config.template_time_limit_s)
        self.max_context = config.max_context_tokens or _model_max_context(config.model_dir)
        self.prompt_bound = PromptBound(
            tokenizer, self.max_context, shape=probe(self.renderer.text_for_probe)
        )
        self.served_model = config.served_model_name or Path(config.model_dir).name
        self.keys = KeyRegistry(config.mode)
        self.pool = EnginePool(config.engines, config)
        self.writer = TraceWriter(
            config.trace_dir, fsync=config.fsync, max_open=config.max_open_traces
        )
        self.calls = CallTallies()  # per execution: attempted / answered (did the policy act?)
        self.counters = ProxyCounters()
        self.executions = Executions(config, self.pool, self.writer, self.counters)
        self.planner = Planner(config, self.renderer, self.max_context, self.counters)
        self.recorder = Recorder(self.writer, config.fsync, self.counters, self.calls)
        self._stop_ids = frozenset(self.renderer.stop_token_ids)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.pool.start()
        self._sweeper = self.loop.create_task(self._sweep_forever())

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper
        await self.pool.aclose()
        self.writer.close()

    async def _sweep_forever(self) -> None:
        every = max(0.05, min(30.0, self.config.execution_idle_s / 4))
        while True:
            await asyncio.sleep(every)
            self.executions.sweep()

    # -- identity / state ----------------------------------------------------------------------
    def _identify(self, headers: Any) -> Identity:
        ident = self.keys.resolve(key_from_headers(headers))
        if ident is None:
            raise ApiError(
                401,
                "invalid or missing API key (send it as x-api-key or Authorization: Bearer)",
                "authentication",
            )
        return ident

    def close_execution(self, execution_id: str) -> None:
        self.keys.revoke(execution_id)
        self.calls.drop(execution_id)
        self.executions.drop(execution_id)

    # -- body --------------------------------------------------------------------------------
    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > limit:
            raise ApiError(
                413, f"request body of {cl} bytes exceeds the limit of {limit} bytes", "too_large"
            )
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes", "too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _parse(
        self, adapter: Adapter, request: Request
    ) -> tuple[Execution, bytes, ParsedCall]:
        ident = self._identify(request.headers)
        self.calls.attempt(ident.execution_id)
        body = await self._read_body(request)
        ex = self.executions.get(ident)
        try:
            data = ex.bodies.parse(
                body
            )  # re-uses the history objects of this execution's last bodies
        except jsonfast.JSONDecodeError:
            raise bad_request("request body is not valid JSON") from None
        try:
            self._check_tool_count(data)
            call = adapter.parse(data)
            # a prompt that cannot fit is refused before it is rendered (gyre.proxy.promptsize)
            await self.prompt_bound.check(call.raw_items, adapter, len(body), call.tools)
        except ApiError:
            ex.bodies.discard(body)
            raise
        finally:
            self.executions.account(ex)  # the parser may keep this body: within the budget
        call.body_bytes = len(body)
        return ex, body, call

    def _check_tool_count(self, data: Any) -> None:
        """At most ``max_tools`` tools: each is rendered into the prompt (20,000 small ones took
        10.7 s and +306 MB to render and tokenize), and no agent offers a model that many."""
        tools = data.get("tools") if isinstance(data, dict) else None
        cap = self.config.max_tools
        if isinstance(tools, list) and len(tools) > cap:
            raise bad_request(
                f"tools: {len(tools)} tools exceed this proxy's limit of {cap} per request",
                param="tools",
            )

    # -- the pipeline --------------------------------------------------------------------------
    async def handle(self, adapter: Adapter, request: Request) -> Response:
        self.counters.requests += 1
        t0 = time.time()
        try:
            ex, body, call = await self._parse(adapter, request)
            entry: RetryEntry | None = None
            if retry_count(request.headers) > 0:
                entry = ex.retries.find(body)
            if entry is not None:
                done = entry.result.done()
                turn = await asyncio.shield(entry.result)
                if turn is not None and turn.finish != "abort":
                    if done:
                        self.counters.retries_replayed += 1
                    else:
                        self.counters.retries_coalesced += 1
                    return self._replay(adapter, call, turn)
            # registered before planning: a retry that arrives during a long full render still coalesces
            entry = ex.retries.add(body) if self.config.retry_window > 0 else None
            try:
                plan = await self.planner.plan(ex.state, call)
                sampling = self.planner.sampling(call, plan.input_len, adapter)
            except BaseException:
                if entry is not None:
                    entry.settle(None)
                raise
            events = self._produce(adapter, ex, call, plan, sampling, entry, request.headers, t0)
            if call.stream:
                # wait for the first event so an early failure is still a plain HTTP error
                first = await self._until_hangup(events.__anext__(), request)
                return StreamingResponse(
                    self._sse(adapter, call, plan, first, events),
                    media_type="text/event-stream",
                    headers={"cache-control": "no-cache", "x-gyre-request-id": plan.request_id},
                )
            turn = await self._collect(events, request)
            body_out = adapter.respond(call, turn, self.tokenizer)
            return Response(
                jsonfast.dumps(body_out),
                media_type="application/json",
                headers={"x-gyre-request-id": plan.request_id},
            )
        except ApiError as e:
            self.counters.error(e.status)
            self._note_failure(request, f"HTTP {e.status}: {e.message}")
            return JSONResponse(adapter.error_body(e), status_code=e.status, headers=e.headers)
        except ClientGone:
            self.counters.client_disconnects += 1
            self._note_failure(request, "the client went away before the answer")
            with contextlib.suppress(Exception):
                await events.aclose()  # a stream that never started: end the generation
            return Response(status_code=499)

    def _note_failure(self, request: Request, error: str) -> None:
        ident = self.keys.resolve(key_from_headers(request.headers))
        if ident is not None:
            self.calls.fail(ident.execution_id, error)

    def _replay(self, adapter: Adapter, call: ParsedCall, turn: AssistantTurn) -> Response:
        if call.stream:

            async def events() -> AsyncIterator[StreamEvent]:
                if turn.reasoning:
                    yield ReasoningDelta(turn.reasoning)
                if turn.content:
                    yield TextDelta(turn.content)
                for tc in turn.tool_calls:
                    yield ToolCallEvent(tc)
                yield Finished(turn)

            gen = adapter.stream(
                call, turn.request_id, events(), turn.prompt_tokens, self.tokenizer
            )
            return StreamingResponse(gen, media_type="text/event-stream")
        return Response(
            jsonfast.dumps(adapter.respond(call, turn, self.tokenizer)),
            media_type="application/json",
        )

    async def _sse(
        self,
        adapter: Adapter,
        call: ParsedCall,
        plan: Plan,
        first: StreamEvent,
        events: AsyncGenerator[StreamEvent, None],
    ) -> AsyncGenerator[bytes, None]:
        async def chained() -> AsyncIterator[StreamEvent]:
            yield first
            async for ev in events:
                yield ev

        gen = adapter.stream(call, plan.request_id, chained(), plan.input_len, self.tokenizer)
        try:
            async with contextlib.aclosing(gen):
                async for chunk in gen:
                    yield chunk
        except ApiError as e:  # mid-stream: the dialect's error event, never a dropped connection
            self.counters.error(e.status)
            if tail := adapter.stream_error(e):
                yield tail
        finally:
            await events.aclose()

    async def _collect(
        self, events: AsyncGenerator[StreamEvent, None], request: Request
    ) -> AssistantTurn:
        """Run a non-streaming call; a client that hangs up cancels it (and its engine request)."""

        async def consume() -> AssistantTurn:
            async with contextlib.aclosing(events):
                async for ev in events:
                    if isinstance(ev, Finished):
                        return ev.turn
            raise ApiError(503, "generation ended without a result", "server")

        return await self._until_hangup(consume(), request)

    async def _until_hangup(self, coro: Any, request: Request) -> Any:
        """Await ``coro`` unless the client disconnects first (then cancel it and raise ClientGone)."""

        async def hangup() -> None:
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    return

        work = asyncio.ensure_future(coro)
        watch = asyncio.ensure_future(hangup())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientGone()

    def _parser(self, adapter: Adapter, call: ParsedCall) -> OutputParser:
        """The output parser for one call: ``plain`` when tools are off for it; tool call ids
        in the adapter's dialect. The ``bash`` parser also needs tools offered: a text-based
        harness (mini-swe-agent) parses its own bash blocks out of the content."""
        prefix = adapter.tool_id_prefix
        no_tools = call.tool_choice == "none" or (
            isinstance(call.tool_choice, dict) and call.tool_choice.get("type") == "none"
        )
        no_tools = no_tools or (self.config.parser == "bash" and not call.tools)
        return make_parser(
            "plain" if no_tools else self.config.parser,
            lambda: prefix + uuid.uuid4().hex[:24],
            self.renderer.generation_opens_reasoning,
        )

    async def _produce(
        self,
        adapter: Adapter,
        ex: Execution,
        call: ParsedCall,
        plan: Plan,
        sampling: dict[str, Any],
        entry: RetryEntry | None,
        headers: Any,
        t0: float,
    ) -> AsyncGenerator[StreamEvent, None]:
        st = ex.state
        ex.active += 1
        parser = self._parser(adapter, call)
        detok = Detokenizer(self.tokenizer, self._stop_ids)
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        out_ids: list[int] = []
        out_lps: list[float] = []
        result: GenResult | None = None

        def note(evs: list[StreamEvent]) -> list[StreamEvent]:
            for ev in evs:
                if isinstance(ev, TextDelta):
                    texts.append(ev.text)
                elif isinstance(ev, ReasoningDelta):
                    reasoning.append(ev.text)
                elif isinstance(ev, ToolCallEvent):
                    calls.append(ev.call)
            return evs

        try:
            gen = self.pool.generate(
                st.execution_id, plan.input_parts, plan.input_len, sampling, stream=call.stream
            )
            async with contextlib.aclosing(gen):
                async for item in gen:
                    if isinstance(item, GenResult):
                        result = item
                        break
                    ids, lps = item
                    out_ids.extend(ids)
                    out_lps.extend(lps)
                    if call.stream:
                        for ev in note(parser.feed(detok.add(ids))):
                            yield ev
            assert result is not None
            tail = [] if call.stream else note(parser.feed(detok.add(result.output_ids)))
            tail += note(parser.feed(detok.flush()) + parser.finish())
            turn = _assistant_turn(texts, reasoning, calls, result, plan, parser.n_unparsed)
            await self.recorder.answered(st, call, plan, result, turn, headers, t0, entry)
            for ev in tail:
                yield ev
            yield Finished(turn)
        except BaseException as e:
            if entry is not None:
                entry.settle(None)
            if result is None and out_ids and not isinstance(e, ApiError):
                # the client went away mid-generation: keep what the policy sampled, marked as such
                with contextlib.suppress(Exception):
                    self.recorder.aborted(st, call, plan, (out_ids, out_lps), headers, t0)
            raise
        finally:
            ex.active -= 1
            ex.last_used = time.monotonic()
            self.executions.account(ex)  # its call's raw messages and retry entry are kept

    # -- other routes ----------------------------------------------------------------------------
    async def count_tokens(self, request: Request) -> Response:
        try:
            self._identify(request.headers)
            body = await self._read_body(request)
            try:
                data = jsonfast.loads(body)
            except jsonfast.JSONDecodeError:
                raise bad_request("request body is not valid JSON") from None
            if isinstance(data, dict) and "max_tokens" not in data:
                data = {**data, "max_tokens": 1}
            self._check_tool_count(data)
            call = ANTHROPIC.parse(data)
            await self.prompt_bound.check(call.raw_items, ANTHROPIC, len(body), call.tools)
            norm = [
                m for item in call.raw_items for m in call.normalize_item(item, lambda _id: None)
            ]
            try:
                ids = await asyncio.to_thread(self.renderer.full, norm, call.tools)
            except RenderError as e:
                raise bad_request(str(e)) from None
            return JSONResponse({"input_tokens": len(ids)})
        except ApiError as e:
            return JSONResponse(ANTHROPIC.error_body(e), status_code=e.status)

    def stats(self) -> dict[str, Any]:
        return {
            "counters": self.counters.as_dict(),
            "pool": {"counters": self.pool.counters.as_dict(), "engines": self.pool.status()},
            "executions": len(self.executions),
            "held_body_bytes": self.executions.held_bytes,
            "open_trace_files": self.writer.open_files,
        }


def _assistant_turn(
    texts: list[str],
    reasoning: list[str],
    calls: list[ToolCall],
    result: GenResult,
    plan: Plan,
    unparsed: int,
) -> AssistantTurn:
    """The answered turn from what the parser produced and what the engines sampled."""
    finish: TurnFinish = "tool_calls" if calls and result.finish == "stop" else result.finish
    return AssistantTurn(
        content="".join(texts),
        reasoning="".join(reasoning).strip() or None,
        tool_calls=calls,
        finish=finish,
        tool_calls_unparsed=unparsed,
        prompt_tokens=plan.input_len,
        completion_tokens=len(result.output_ids),
        output_ids=result.output_ids,
        output_logprobs=result.logprobs,
        request_id=plan.request_id,
    )


def _model_max_context(model_dir: str) -> int:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return int(cfg.get("max_position_embeddings") or 32768)
    except (OSError, ValueError):
        return 32768
