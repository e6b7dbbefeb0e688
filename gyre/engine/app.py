"""The HTTP face of an engine: a FastAPI app speaking the wire protocol.

``create_app(engine)`` works for every :class:`~gyre.engine.base.Engine`; the
app's lifespan starts and stops the engine, so serving it with uvicorn (or
:class:`~gyre.engine.runner.ServerRunner`) is all it takes. Bad input is a 400
with ``{"error": {"message": ...}}`` naming the field; it is never a 500.

Two guards, both off unless asked for (a standalone ``gyre engine`` on loopback needs neither;
every engine ``gyre run`` starts has both):

- ``api_key``: every route but ``/health`` wants ``Authorization: Bearer <key>``, else 401.
  Generation too, not only control: a harness must reach the policy through the proxy only
  (which records the trace and enforces the execution's key), never an engine directly.
- ``reload_root``: ``/update_weights_from_disk`` loads only a directory inside it (the run's
  published-weights folder), after resolving links, else 403: nobody can point the run's
  engines at weights of their own choosing.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from gyre.engine.base import Engine, EngineInputError, KVRefused
from gyre.engine.protocol import (
    DONE_SENTINEL,
    AbortRequest,
    AbortResponse,
    DestroyWeightsUpdateGroupRequest,
    GenerateRequest,
    InitWeightsUpdateGroupRequest,
    KVExportRequest,
    PauseRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    error_payload,
)
from gyre.validation import validation_line

_DISCONNECT_POLL_S = 0.25
OPEN_PATHS = frozenset({"/health"})
"""Routes that answer without the API key: liveness only, nothing that changes or generates."""


class ReloadRefused(Exception):
    """A reload outside the engine's allowed weights root (403)."""


class RequireKey:
    """ASGI middleware: HTTP requests outside :data:`OPEN_PATHS` must carry the bearer key.

    Plain ASGI rather than a FastAPI dependency or ``BaseHTTPMiddleware``: nothing is added
    to a streaming response's path, and the check (one constant-time compare) runs before any
    body is read."""

    def __init__(self, app: Any, key: str) -> None:
        if not key:
            raise ValueError("an engine API key must not be empty")
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, self.expected):
                msg = "missing or wrong engine API key (Authorization: Bearer ...)"
                body = json.dumps(error_payload(msg, 401, "unauthorized")).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def allowed_reload(model_path: str, root: str | Path) -> str:
    """``model_path`` resolved (links followed, ``..`` gone) if it lies inside ``root`` (itself
    resolved), else :class:`ReloadRefused`. The engine then loads the resolved path: what was
    checked is what is read."""
    base = Path(root).resolve()
    try:
        path = Path(model_path).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a link loop, a NUL byte
        raise ReloadRefused(f"model_path {model_path!r} cannot be resolved: {e}") from None
    if path != base and not path.is_relative_to(base):
        raise ReloadRefused(
            f"model_path {model_path!r} (resolved: {path}) is outside this engine's reload "
            f"root {base}; it reloads only the run's published weights"
        )
    return str(path)


def _kv_refused(e: KVRefused) -> JSONResponse:
    """A K/V the engine cannot give or take: 409 with the reason (the caller re-prefills)."""
    code = 404 if e.reason in ("missing", "unsupported") else 409
    body = error_payload(str(e), code, "kv_refused")
    body["error"]["reason"] = e.reason
    return JSONResponse(body, status_code=code)


def _validation_message(exc: RequestValidationError) -> str:
    return "invalid request: " + validation_line(exc.errors(), root=None, drop=("body",))


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
        raise EngineInputError(f"invalid request: {validation_line(e, root=None)}") from None


def create_app(
    engine: Engine,
    *,
    stream_interval: int = 1,
    incremental_streaming_output: bool = False,
    stream_min_interval_s: float = 0.05,
    stream_coalesce_after: int = 256,
    api_key: str | None = None,
    reload_root: str | None = None,
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

    ``api_key`` / ``reload_root``: the guards of the module doc (None: off).
    """
    if stream_interval < 1:
        raise ValueError("stream_interval must be >= 1")
    if api_key is not None and not api_key:
        raise ValueError("an engine API key must not be empty (None: no key)")

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
    if api_key is not None:
        app.add_middleware(RequireKey, key=api_key)

    @app.exception_handler(ReloadRefused)
    async def _forbidden(_req: Request, exc: ReloadRefused) -> JSONResponse:
        return JSONResponse(error_payload(str(exc), 403, "forbidden"), status_code=403)

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
        if req.keep_kv:
            return AbortResponse(found=await engine.park(req.rid))
        return AbortResponse(found=await engine.abort(req.rid))

    # KV migration (gyre.engine.kv_migrate): a parked request's K/V out as bytes, and in
    @app.post("/kv_export")
    async def kv_export(request: Request) -> Response:
        req = await _parse(KVExportRequest, request)
        try:
            packet = await engine.export_kv(req.rid, req.weight_version)
        except KVRefused as e:
            return _kv_refused(e)
        from gyre.engine.kv_migrate import encode

        data = await asyncio.to_thread(encode, packet)  # ~100 MB at 2K tokens: off the loop
        return Response(content=data, media_type="application/octet-stream")

    @app.post("/kv_import")
    async def kv_import(request: Request, rid: str) -> JSONResponse:
        from gyre.engine.kv_migrate import decode

        body = await request.body()
        try:
            packet = await asyncio.to_thread(decode, body)
            out = await engine.import_kv(rid, packet)
        except KVRefused as e:
            return _kv_refused(e)
        return JSONResponse(out)

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
        if reload_root is not None:
            resolved = allowed_reload(req.model_path, reload_root)
            req = req.model_copy(update={"model_path": resolved})
        out = await engine.update_weights_from_disk(req)
        return JSONResponse(out.model_dump(mode="json"), status_code=200 if out.success else 400)

    # weights in memory, SGLang's routes: the engine joins a group whose rank 0 is the trainer,
    # then receives each bucket's tensors by broadcast (docs/engine.md, "Weights in memory")
    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request) -> JSONResponse:
        req = await _parse(InitWeightsUpdateGroupRequest, request)
        out = await engine.init_weights_update_group(req)
        return JSONResponse(out.model_dump(mode="json"), status_code=200 if out.success else 400)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request) -> JSONResponse:
        req = await _parse(UpdateWeightsFromDistributedRequest, request)
        out = await engine.update_weights_from_distributed(req)
        return JSONResponse(
            out.model_dump(mode="json", exclude_none=True), status_code=200 if out.success else 400
        )

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request) -> JSONResponse:
        req = await _parse(DestroyWeightsUpdateGroupRequest, request, empty_ok=True)
        out = await engine.destroy_weights_update_group(req.group_name)
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
