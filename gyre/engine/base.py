"""What every Gyre engine shares: request bookkeeping, abort, pause, weights version.

An engine is an asyncio object (explicit ``await start()`` / ``await stop()``,
no global state; two engines live happily in one process). The HTTP layer
(:mod:`gyre.engine.app`) only translates routes into these calls, so a Ray
actor or a test can also drive an engine in-process without HTTP.

A request's life: :meth:`Engine.submit` validates (raising
:class:`EngineInputError` for bad input, before anything is streamed) and
registers a :class:`RequestState`; the concrete engine appends tokens to it;
:meth:`RequestHandle.updates` yields cumulative snapshots. Slow consumers get
coalesced snapshots (every snapshot is complete, so nothing is lost). Leaving
the iterator before the end (client disconnect) aborts the request, so no
orphan keeps decoding or holding KV.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gyre.engine.protocol import (
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    GroupResponse,
    InitWeightsUpdateGroupRequest,
    MetaInfo,
    ModelInfo,
    PauseMode,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsResponse,
)


class EngineInputError(ValueError):
    """A request the engine refuses (HTTP 400). The message says what is wrong and how to fix it."""


class KVRefused(Exception):
    """An engine cannot give or take a request's K/V (:mod:`gyre.engine.kv_migrate`): the caller
    re-prefills instead. ``reason`` is one word for counters: unsupported, missing, version,
    weights, layout, room, format."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class RequestState:
    """One request's mutable state; written by the engine, read by its handle."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = True
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_segments: list[tuple[int, int]] = field(default_factory=list)
    finish: FinishReason | None = None
    abort_message: str | None = None
    cached_tokens: int = 0
    error: Exception | None = None
    created_s: float = field(default_factory=time.monotonic)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def abort_requested(self) -> bool:
        return self.abort_message is not None

    def append(self, token_id: int, logprob: float, version: int) -> None:
        if not self.version_segments or self.version_segments[-1][1] != version:
            self.version_segments.append((len(self.output_ids), version))
        self.output_ids.append(int(token_id))
        self.logprobs.append(float(logprob))
        self.changed.set()

    def fail(self, exc: Exception) -> None:
        """The producer failed (an engine behind an adapter went away): the handle raises ``exc``,
        which the server turns into an error (in-band for a stream), so the proxy retries elsewhere."""
        if self.finish is None and self.error is None:
            self.error = exc
        self.changed.set()

    def finish_with(self, reason: FinishReason) -> None:
        if self.finish is None:
            self.finish = reason
        self.changed.set()

    def snapshot(self, engine_id: str, weight_version: int, start: int = 0) -> GenerateResponse:
        """The response so far; ``start > 0`` keeps only output tokens from that index on
        (incremental streaming), counts stay cumulative."""
        # model_construct: the engine's own data needs no validation, and a cumulative stream
        # builds one snapshot per chunk (validation would make long streams quadratic in CPU too)
        meta = MetaInfo.model_construct(
            id=self.rid,
            finish_reason=self.finish,
            prompt_tokens=len(self.input_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens,
            output_token_logprobs=(
                [(lp, t, None) for lp, t in zip(self.logprobs[start:], self.output_ids[start:])]
                if self.return_logprob
                else None
            ),
            weight_version=self.version_segments[-1][1]
            if self.version_segments
            else weight_version,
            weight_version_segments=list(self.version_segments) or None,
            engine_id=engine_id,
        )
        return GenerateResponse.model_construct(
            text=None, output_ids=self.output_ids[start:], meta_info=meta
        )


class RequestHandle:
    """The caller's side of one request."""

    def __init__(self, engine: Engine, state: RequestState):
        self.engine = engine
        self.state = state

    @property
    def rid(self) -> str:
        return self.state.rid

    async def updates(
        self,
        min_new: int = 1,
        incremental: bool = False,
        min_interval_s: float = 0.0,
        coalesce_after: int = 0,
    ) -> AsyncIterator[GenerateResponse]:
        """Snapshots whenever output grew by at least ``min_new`` tokens; the last one is finished.
        Cumulative, or with ``incremental`` only the tokens since the previous snapshot. Once the
        output is ``coalesce_after`` tokens long, at most one snapshot per ``min_interval_s``
        (cumulative snapshots of long outputs would otherwise cost bytes quadratic in length)."""
        st = self.state
        sent = -1
        last_emit = 0.0
        try:
            while True:
                await st.changed.wait()
                st.changed.clear()
                if st.error is not None:
                    raise st.error
                n = len(st.output_ids)
                due = n - max(sent, 0) >= min_new and (
                    n < coalesce_after or time.monotonic() - last_emit >= min_interval_s
                )
                if due or st.finish is not None:
                    last_emit = time.monotonic()
                    start = max(sent, 0) if incremental else 0
                    sent = len(st.output_ids)
                    snap = st.snapshot(self.engine.engine_id, self.engine.weight_version, start)
                    yield snap
                    if snap.meta_info.finish_reason is not None:
                        return
                    # a finish that happened while the consumer held the snapshot set `changed`: loop again
        finally:
            if st.finish is None:
                self.engine.abort_state(st, "client went away before the request finished")
            self.engine._requests.pop(st.rid, None)

    async def result(self) -> GenerateResponse:
        """The final response; no intermediate snapshots are built (they cost O(n) each)."""
        st = self.state
        try:
            while st.finish is None:
                if st.error is not None:
                    raise st.error
                await st.changed.wait()
                st.changed.clear()
        finally:
            if st.finish is None:
                self.engine.abort_state(st, "client went away before the request finished")
            self.engine._requests.pop(st.rid, None)
        return st.snapshot(self.engine.engine_id, self.engine.weight_version)


class Engine(ABC):
    """Base engine: request registry, abort, pause/resume, weights version."""

    kind: str = "engine"

    def __init__(self, engine_id: str | None = None):
        self.engine_id = engine_id or f"{self.kind}-{uuid.uuid4().hex[:8]}"
        self.weight_version: int = 0
        self._requests: dict[str, RequestState] = {}
        self._unpaused: asyncio.Event | None = None
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._started = True

    async def stop(self) -> None:
        for st in list(self._requests.values()):
            self.abort_state(st, "engine stopped")
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    async def wait_unpaused(self) -> None:
        """Return at once, or when the engine is resumed (producers call it between tokens)."""
        assert self._unpaused is not None, "engine not started"
        await self._unpaused.wait()

    @property
    def paused(self) -> bool:
        return self._unpaused is not None and not self._unpaused.is_set()

    def healthy(self) -> bool:
        return self._started

    # -- requests -------------------------------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:  # noqa: B027 (optional hook)
        """Engine-specific checks beyond the protocol's (vocab, context length). Raise EngineInputError."""

    async def submit(self, req: GenerateRequest) -> RequestHandle:
        if not self._started:
            raise EngineInputError("engine is not started")
        self.validate(req)
        rid = req.rid or uuid.uuid4().hex
        if rid in self._requests:
            raise EngineInputError(
                f"rid {rid!r} is already in use by a live request; use a unique rid"
            )
        st = RequestState(
            rid=rid,
            input_ids=list(req.input_ids),
            params=req.sampling_params,
            return_logprob=req.return_logprob,
        )
        self._requests[rid] = st
        handle = RequestHandle(self, st)
        if req.sampling_params.max_new_tokens == 0:
            st.finish_with(FinishReason(type="length", length=0))
            return handle
        await self._enqueue(st)
        return handle

    async def generate(self, req: GenerateRequest) -> GenerateResponse:
        """In-process convenience: submit and wait for the final response."""
        return await (await self.submit(req)).result()

    @abstractmethod
    async def _enqueue(self, st: RequestState) -> None:
        """Start producing tokens for ``st`` (it is registered and valid)."""

    def abort_state(self, st: RequestState, message: str) -> None:
        """Mark ``st`` aborted. Engines finish it at their next step boundary (or now, if idle)."""
        if st.finish is None and st.abort_message is None:
            st.abort_message = message
            self._on_abort(st)

    def _on_abort(self, st: RequestState) -> None:
        # Default: finish now. Engines with an in-flight step override to finish at a boundary.
        st.finish_with(FinishReason(type="abort", message=st.abort_message))

    async def abort(self, rid: str) -> bool:
        st = self._requests.get(rid)
        if st is None:
            return False
        self.abort_state(st, "aborted by /abort_request")
        return True

    async def park(self, rid: str) -> bool:
        """Abort ``rid`` keeping its K/V for :meth:`export_kv` (KV migration on reroute). Engines
        without migration simply abort."""
        return await self.abort(rid)

    async def export_kv(self, rid: str, weight_version: int) -> Any:
        """The parked K/V of ``rid`` (a :class:`gyre.engine.kv_migrate.KVPacket`)."""
        raise KVRefused("unsupported", f"the {self.kind} engine does not migrate K/V")

    async def import_kv(self, rid: str, packet: Any) -> dict[str, Any]:
        """Keep ``packet`` for the coming request ``rid``; raises :class:`KVRefused`."""
        raise KVRefused("unsupported", f"the {self.kind} engine does not migrate K/V")

    async def abort_all(self, message: str = "aborted by /abort_request abort_all") -> int:
        live = [st for st in self._requests.values() if st.finish is None]
        for st in live:
            self.abort_state(st, message)
        return len(live)

    # -- pause / weights ------------------------------------------------------------------------
    async def pause(self, mode: PauseMode = "in_place") -> None:
        assert self._unpaused is not None, "engine not started"
        self._unpaused.clear()
        if mode == "abort":
            await self.abort_all("aborted by /pause_generation mode=abort")

    async def resume(self) -> None:
        assert self._unpaused is not None, "engine not started"
        self._unpaused.set()

    async def update_weights_from_disk(
        self, req: UpdateWeightsFromDiskRequest
    ) -> UpdateWeightsResponse:
        """Default (engines without weights): accept and bump the version."""
        if req.abort_all_requests:
            await self.abort_all("aborted by weights update")
        self._bump_version(req.weight_version)
        return UpdateWeightsResponse(
            success=True,
            message="no weights to load; version bumped",
            weight_version=self.weight_version,
        )

    async def init_weights_update_group(self, req: InitWeightsUpdateGroupRequest) -> GroupResponse:
        """Default (engines without tensors to receive): refused before joining, so the trainer's
        rendezvous fails by its timeout and it publishes through disk instead."""
        return GroupResponse(
            success=False, message=f"the {self.kind} engine does not receive weights in memory"
        )

    async def update_weights_from_distributed(
        self, req: UpdateWeightsFromDistributedRequest
    ) -> UpdateWeightsResponse:
        return UpdateWeightsResponse(
            success=False,
            message=f"the {self.kind} engine does not receive weights in memory",
            weight_version=self.weight_version,
        )

    async def destroy_weights_update_group(self, group_name: str) -> GroupResponse:
        return GroupResponse(success=False, message=f"no weight-update group {group_name!r}")

    def _bump_version(self, requested: int | str | None) -> None:
        if requested is not None:
            try:
                self.weight_version = int(requested)
                return
            except (TypeError, ValueError):
                raise EngineInputError(
                    f"weight_version must be an integer for Gyre engines, got {requested!r}"
                ) from None
        self.weight_version += 1

    @abstractmethod
    def model_info(self) -> ModelInfo: ...

    def stats(self) -> dict:
        """Load figures for schedulers and dashboards (``GET /get_server_info``)."""
        return {
            "live_requests": self.live_requests,
            "paused": self.paused,
            "weight_version": self.weight_version,
        }

    @property
    def live_requests(self) -> int:
        return sum(1 for st in self._requests.values() if st.finish is None)
