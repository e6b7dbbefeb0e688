"""The HTTP face of an engine: a FastAPI app speaking the wire protocol.

``create_app(engine)`` works for every :class:`~gyre.engine.base.Engine`; the
app's lifespan starts and stops the engine, so serving it with uvicorn (or
:class:`~gyre.engine.runner.ServerRunner`) is all it takes. Bad input is a 400
with ``{"error": {"message": ...}}`` naming the field; it is never a 500.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from gyre.engine.base import Engine, EngineInputError
from gyre.engine.protocol import (
    DONE_SENTINEL,
    AbortRequest,
    AbortResponse,
    GenerateRequest,
    PauseRequest,
    UpdateWeightsFromDiskRequest,
    error_payload,
)

_DISCONNECT_POLL_S = 0.25


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = err.get("msg", "invalid")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request: " + "; ".join(parts)


async def _parse(model, request: Request, *, empty_ok: bool = False):
    """Parse a JSON body into ``model`` whatever the Content-Type (curl -d sends form type)."""
    body = await request.body()
    if not body.strip():
        if empty_ok:
            return model()
        raise EngineInputError("invalid request: empty body; send a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(
                f"{loc}: {err.get('msg', 'invalid')}" if loc else err.get("msg", "invalid")
            )
        raise EngineInputError("invalid request: " + "; ".join(parts)) from None


def create_app(
    engine: Engine,
    *,
    stream_interval: int = 1,
    incremental_streaming_output: bool = False,
    stream_min_interval_s: float = 0.05,
    stream_coalesce_after: int = 256,
) -> FastAPI:
    """A FastAPI app serving ``engine`` (started/stopped by the app's lifespan).

    Streaming options (SGLang's server flags of the same names): ``stream_interval``
    = emit a chunk once at least this many new tokens exist (the final chunk always
    goes out); ``incremental_streaming_output`` = each chunk carries only the new
    ``output_ids`` and ``output_token_logprobs`` instead of everything so far. The
    protocol default is cumulative chunks; with long outputs that is quadratic in
    bytes, which these two options bound. By default a cumulative stream also coalesces once
    an output is ``stream_coalesce_after`` tokens long: at most one chunk per
    ``stream_min_interval_s`` (still cumulative, still ending with the finished chunk), which
    keeps a long stream's bytes bounded without changing the protocol.
    """
    if stream_interval < 1:
        raise ValueError("stream_interval must be >= 1")

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await engine.start()
        except Exception as e:  # kept so whoever started the server can say why it failed
            _app.state.startup_error = e
            raise
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title=f"gyre engine ({engine.kind})", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_payload(_validation_message(exc), 400), status_code=400)

    @app.exception_handler(EngineInputError)
    async def _refused(_req: Request, exc: EngineInputError) -> JSONResponse:
        return JSONResponse(error_payload(str(exc), 400), status_code=400)

    @app.exception_handler(Exception)
    async def _failed(
        _req: Request, exc: Exception
    ) -> JSONResponse:  # a bug, not bad input: say so, in shape
        return JSONResponse(
            error_payload(f"engine error: {type(exc).__name__}: {exc}", 500, "engine_error"),
            status_code=500,
        )

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        req = await _parse(GenerateRequest, request)
        handle = await engine.submit(req)  # EngineInputError -> 400 before any streaming
        if req.stream:
            return StreamingResponse(_sse(handle), media_type="text/event-stream")
        final = asyncio.ensure_future(handle.result())
        try:
            while not final.done():
                await asyncio.wait({final}, timeout=_DISCONNECT_POLL_S)
                if not final.done() and await request.is_disconnected():
                    await engine.abort(handle.rid)  # no orphan keeps decoding
        except asyncio.CancelledError:
            final.cancel()
            raise
        if (err := final.exception()) is not None:  # an engine failure: answered, not re-raised
            payload = error_payload(f"engine failed: {err}", 500, "engine_error")
            return JSONResponse(payload, status_code=500)
        return JSONResponse(final.result().model_dump(mode="json"))

    async def _sse(handle) -> AsyncIterator[str]:
        # Leaving this generator early (client disconnect -> cancellation) closes
        # handle.updates(), whose finally aborts the request.
        updates = handle.updates(
            min_new=stream_interval,
            incremental=incremental_streaming_output,
            min_interval_s=stream_min_interval_s,
            coalesce_after=stream_coalesce_after,
        )
        try:
            async for snap in updates:
                yield f"data: {json.dumps(snap.model_dump(mode='json'))}\n\n"
        except Exception as e:  # an engine failure mid-stream: tell the client in-band
            yield f"data: {json.dumps(error_payload(f'engine failed: {e}', 500, 'engine_error'))}\n\n"
        finally:
            await updates.aclose()
        yield f"data: {DONE_SENTINEL}\n\n"

    @app.post("/abort_request")
    async def abort_request(request: Request) -> AbortResponse:
        req = await _parse(AbortRequest, request)
        if req.abort_all:
            return AbortResponse(found=await engine.abort_all() > 0)
        return AbortResponse(found=await engine.abort(req.rid))

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> dict:
        req = await _parse(PauseRequest, request, empty_ok=True)
        await engine.pause(req.mode)
        return {"success": True, "paused": True}

    @app.post("/continue_generation")
    async def continue_generation() -> dict:
        await engine.resume()
        return {"success": True, "paused": False}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        req = await _parse(UpdateWeightsFromDiskRequest, request)
        out = await engine.update_weights_from_disk(req)
        return JSONResponse(out.model_dump(mode="json"), status_code=200 if out.success else 400)

    @app.get("/get_model_info")
    async def get_model_info() -> dict:
        return engine.model_info().model_dump(mode="json", exclude_none=True)

    @app.get("/health")
    async def health() -> Response:
        if engine.healthy():
            return Response(status_code=200)
        return JSONResponse(error_payload("engine not ready", 503, "unavailable"), status_code=503)

    @app.get("/get_server_info")
    async def get_server_info() -> dict:
        info = engine.model_info().model_dump(mode="json", exclude_none=True)
        info.update(engine.stats())
        return info

    return app
