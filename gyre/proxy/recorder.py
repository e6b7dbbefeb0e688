"""The proxy's records: the TraceRecord of every call, and the execution state it extends.

Records go through :class:`gyre.trace.store.TraceWriter` (append + flush +
fsync per record), written *before* the client gets the end of its answer,
so a proxy crash never loses a call the harness saw. :class:`Recorder` is the
only writer: :mod:`gyre.proxy.service` decides what to answer, this module
what is kept of it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from gyre.proxy.calltally import CallTallies
from gyre.proxy.counters import ProxyCounters
from gyre.proxy.errors import ApiError
from gyre.proxy.pool import GenResult
from gyre.proxy.retries import RetryEntry
from gyre.proxy.session import CallNode, ExecutionState, Plan
from gyre.proxy.types import AssistantTurn, Message, ParsedCall
from gyre.trace.record import OutputSegment, TraceRecord
from gyre.trace.store import TraceWriter

log = logging.getLogger("gyre.proxy")

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


class Recorder:
    """Writes each call's record and, for an answered one, adds it to the execution's state."""

    def __init__(
        self, writer: TraceWriter, fsync: bool, counters: ProxyCounters, calls: CallTallies
    ) -> None:
        self.writer = writer
        self.fsync = fsync
        self.counters = counters
        self.calls = calls

    def meta(
        self, label: str, call: ParsedCall, plan: Plan, headers: Any, extra: dict[str, Any]
    ) -> dict[str, Any]:
        b = plan.bridge
        extra = {"bridge": plan.mode, **call.meta, **extra}
        if b.fork_at is not None:
            extra["fork_at"] = b.fork_at
        if plan.verify_equal is not None:
            extra["bridge_verified"] = plan.verify_equal
        return build_meta(call, b.head, b.norm, headers, label, extra)

    def trace_record(
        self,
        st: ExecutionState,
        call: ParsedCall,
        plan: Plan,
        output: tuple[list[int], list[float], Sequence[OutputSegment]],
        finish: str,
        headers: Any,
        t0: float,
        extra: dict[str, Any],
    ) -> TraceRecord:
        """The record of one call (answered or aborted); takes the execution's next seq."""
        output_ids, logprobs, segments = output
        b = plan.bridge
        seq = st.next_seq
        st.next_seq += 1
        return TraceRecord(
            execution_id=st.execution_id,
            request_id=plan.request_id,
            seq=seq,
            api=call.api,
            base=b.base.request_id if b.base is not None else None,
            base_len=b.base_len,
            input_suffix=tuple(plan.suffix),
            output_ids=tuple(output_ids),
            output_logprobs=tuple(logprobs),
            segments=tuple(segments),
            finish_reason=finish,
            forked=b.forked,
            t_start=t0,
            t_end=time.time(),
            meta=self.meta(st.label, call, plan, headers, extra),
        )

    async def answered(
        self,
        st: ExecutionState,
        call: ParsedCall,
        plan: Plan,
        result: GenResult,
        turn: AssistantTurn,
        headers: Any,
        t0: float,
        entry: RetryEntry | None = None,
    ) -> None:
        """Record an answered call durably, add it to the state later calls bridge from, and
        make it ``entry``'s answer (an SDK retry of the same body replays it).

        A caller cancelled while the record was being written (a proxy killed mid-call) is
        cancelled only after all of that: the record, the counters, the tally and the retry
        entry agree, so the SDK's retry replays the recorded answer instead of sampling a
        second one."""
        rec = self.trace_record(
            st,
            call,
            plan,
            (result.output_ids, result.logprobs, result.segments),
            turn.finish if turn.finish != "tool_calls" else "stop",
            headers,
            t0,
            {
                "moves": result.moves,
                "n_tool_calls": len(turn.tool_calls),
                "n_tool_calls_unparsed": turn.tool_calls_unparsed,
            },
        )
        cut = await self._append(st, rec)
        b = plan.bridge
        node = CallNode(
            request_id=plan.request_id,
            seq=rec.seq,
            norm=b.norm,
            raw_to_norm=b.raw_to_norm,
            n_raw=len(call.raw_items),
            raw_items=None,
            tools_raw=call.tools_raw,
            tools=call.tools,
            head=b.head,
            assistant=turn.as_message(),
            base=b.base,
            base_len=b.base_len,
            suffix=plan.suffix,
            output=list(result.output_ids),
        )
        st.add_node(node, [], call.raw_items, plan.input_parts, call.body_bytes)
        st.counters.note(plan.mode, b.forked)
        self.counters.answered += 1
        self.calls.answer(st.execution_id)
        self.counters.note(plan.mode, b.forked)
        if entry is not None:
            entry.settle(turn)
        if cut:
            raise asyncio.CancelledError

    async def _append(self, st: ExecutionState, rec: TraceRecord) -> bool:
        """Write ``rec``; True when the caller was cancelled meanwhile (see :meth:`answered`)."""
        try:
            if self.fsync:
                return await _to_the_end(self.writer.append, rec)
            self.writer.append(rec)
            return False
        except OSError as e:
            # never answer a call the trace does not hold: the client gets an API error instead
            if st.next_seq == rec.seq + 1:
                st.next_seq = rec.seq
            self.counters.record_failures += 1
            log.error("trace write failed for %s: %s", st.execution_id, e)
            raise ApiError(
                507,
                f"the proxy could not record this call ({e.strerror or e}); retry later",
                "server",
            ) from None

    def aborted(
        self,
        st: ExecutionState,
        call: ParsedCall,
        plan: Plan,
        out: tuple[list[int], list[float]],
        headers: Any,
        t0: float,
    ) -> None:
        """Keep what the policy sampled for a client that went away, marked as such."""
        ids, lps = out
        seg = OutputSegment(start=0, end=len(ids), engine_id="unknown", policy_version=-1)
        rec = self.trace_record(
            st, call, plan, (ids, lps, (seg,)), "abort", headers, t0, {"client_disconnected": True}
        )
        self.writer.append(rec)


async def _to_the_end(fn: Any, *args: Any) -> bool:
    """Run ``fn`` in a thread and wait for it even through cancellations; True if cancelled.

    A cancelled ``asyncio.to_thread`` returns at once while its thread goes on writing: the
    record would reach the disk with no counter, tally or retry entry knowing of it."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    cancelled = False
    while True:
        try:
            await asyncio.shield(fut)
            return cancelled
        except asyncio.CancelledError:
            if fut.cancelled():
                raise
            cancelled = True
