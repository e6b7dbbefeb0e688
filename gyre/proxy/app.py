"""The proxy as two ASGI apps (Starlette) over one service: the API, and the admin routes.

The API app is what harnesses reach (TCP port, sandbox bridge); it has no admin
routes at all, and its ``/health`` says only counts. The admin app is served on a
private unix socket (:mod:`gyre.proxy.listeners`) and still checks the token.

API routes
  POST /v1/chat/completions          OpenAI chat completions (stream or not)
  POST /v1/messages                  Anthropic messages (``?beta=true`` accepted)
  POST /v1/messages/count_tokens     Anthropic token count
  POST /v1/responses                 OpenAI Responses (stream or not; nothing stored)
  GET  /v1/models, /health           (health: status + engine counts, no URLs)
Admin routes (``Authorization: Bearer <admin token>``, admin socket only):
  GET    /health                     status + every engine (url, state, reachable, ...)
  POST   /admin/executions           {"execution_id", "label"?, "key"?} -> {"api_key", ...}
  DELETE /admin/executions/{id}      revoke its keys, close its trace file
  GET    /admin/executions/{id}      its model calls: attempted, answered, last error
  GET    /admin/executions
  POST   /admin/engines              {"url"}: add an engine (or re-activate a drained one)
  POST   /admin/engines/drain        {"url"} -> {"moved": n} once nothing is in flight there
  POST   /admin/engines/remove       {"url"}: drain, then forget it
  GET    /admin/stats                counters (bridged / forked / retries / disconnects / moves ...)
"""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gyre.proxy import jsonfast
from gyre.proxy.adapters.dialects import ANTHROPIC, OPENAI, RESPONSES, for_path
from gyre.proxy.config import ProxyConfig
from gyre.proxy.errors import ApiError
from gyre.proxy.service import ProxyService

log = logging.getLogger("gyre.proxy.app")


async def _probe(svc: ProxyService) -> tuple[bool, list[dict[str, Any]]]:
    """Ask every engine's /health (2 s each, concurrently); ok when an active one answers."""
    import asyncio

    engines = svc.pool.status()
    handles = list(svc.pool.engines.values())
    alive = await asyncio.gather(
        *(asyncio.wait_for(h.ctl.health(), 2.0) for h in handles), return_exceptions=True
    )
    for e, a in zip(engines, alive):
        e["reachable"] = a is True
    return any(e["state"] == "active" and e["reachable"] for e in engines), engines


async def _http_error(request: Request, exc: Exception) -> Response:
    # Starlette types every handler as taking Exception; this one is registered for HTTPException
    assert isinstance(exc, HTTPException)
    err = ApiError(
        exc.status_code,
        exc.detail or "error",
        "not_found" if exc.status_code == 404 else "invalid_request",
    )
    return JSONResponse(for_path(request.url.path).error_body(err), status_code=exc.status_code)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that hangs up mid-body: one line, no traceback (nobody reads the answer)."""
    log.info("client disconnected before sending its whole request (%s)", request.url.path)
    svc = getattr(request.app.state, "service", None)
    if svc is not None:
        svc.counters.client_disconnects += 1
    return Response(status_code=499)


def _model_list(name: str) -> dict[str, Any]:
    """``/v1/models`` in a shape both SDKs read (OpenAI's list, Anthropic's paging fields)."""
    m = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "gyre",
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
    }
    return {
        "object": "list",
        "data": [m],
        "has_more": False,
        "first_id": m["id"],
        "last_id": m["id"],
    }


def build_app(
    config: ProxyConfig, tokenizer: Any = None, service: ProxyService | None = None
) -> Starlette:
    """The API app; the service (tokenizer, pool, traces) starts and stops with its lifespan."""
    svc = service or ProxyService(config, tokenizer)

    async def chat(request: Request) -> Response:
        return await svc.handle(OPENAI, request)

    async def messages(request: Request) -> Response:
        return await svc.handle(ANTHROPIC, request)

    async def responses(request: Request) -> Response:
        return await svc.handle(RESPONSES, request)

    async def count_tokens(request: Request) -> Response:
        return await svc.count_tokens(request)

    async def models(request: Request) -> Response:
        return JSONResponse(_model_list(svc.served_model))

    async def health(request: Request) -> Response:
        """200 when at least one active engine answers its own /health; counts only (no URLs)."""
        ok, engines = await _probe(svc)
        counts = {
            "total": len(engines),
            "active": sum(e["state"] == "active" for e in engines),
            "reachable": sum(e["reachable"] for e in engines),
        }
        return JSONResponse(
            {"status": "ok" if ok else "no_engine", "engines": counts},
            status_code=200 if ok else 503,
        )

    @asynccontextmanager
    async def lifespan(app):
        await svc.start()
        try:
            yield
        finally:
            await svc.aclose()

    async def crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        err = ApiError(500, f"internal proxy error: {type(exc).__name__}", "server")
        return JSONResponse(for_path(request.url.path).error_body(err), status_code=500)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: crash,
        },
    )
    app.state.service = svc
    return app


def build_admin_app(config: ProxyConfig, svc: ProxyService) -> Starlette:
    """The admin routes over ``svc`` (no lifespan: the API app starts and stops the service)."""

    async def denied(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)  # registered for ApiError only
        return JSONResponse(exc.openai_body(), status_code=exc.status)

    app = Starlette(
        routes=_AdminRoutes(config, svc).routes(),
        exception_handlers={
            HTTPException: _http_error,
            ApiError: denied,
            ClientDisconnect: _client_gone,
        },
    )
    app.state.service = svc
    return app


class _AdminRoutes:
    """The admin handlers over one service; every one checks the admin token first."""

    def __init__(self, config: ProxyConfig, svc: ProxyService) -> None:
        self.config = config
        self.svc = svc

    def routes(self) -> list[Route]:
        g = self._guarded
        return [
            Route("/health", g(self.health), methods=["GET"]),
            Route("/admin/health", g(self.health), methods=["GET"]),
            Route("/admin/executions", g(self.register), methods=["POST"]),
            Route("/admin/executions", g(self.list_executions), methods=["GET"]),
            Route("/admin/executions/{execution_id:path}", g(self.revoke), methods=["DELETE"]),
            Route(
                "/admin/executions/{execution_id:path}", g(self.execution_calls), methods=["GET"]
            ),
            Route("/admin/engines", g(self.add_engine), methods=["POST"]),
            Route("/admin/engines/drain", g(self.drain_engine), methods=["POST"]),
            Route("/admin/engines/remove", g(self.remove_engine), methods=["POST"]),
            Route("/admin/stats", g(self.stats), methods=["GET"]),
        ]

    def _guarded(self, fn):
        async def wrapped(request: Request) -> Response:
            try:
                self._check_token(request)
                return await fn(request)
            except ApiError as e:
                return JSONResponse(e.openai_body(), status_code=e.status)

        return wrapped

    def _check_token(self, request: Request) -> None:
        token = self.config.admin_token
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not token or not hmac.compare_digest(given.encode(), token.encode()):
            raise ApiError(
                401, "admin routes need Authorization: Bearer <admin token>", "authentication"
            )

    @staticmethod
    async def _json(request: Request) -> dict:
        try:
            data = jsonfast.loads(await request.body())
        except ValueError:
            raise ApiError(400, "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise ApiError(400, "expected a JSON object")
        return data

    async def register(self, request: Request) -> Response:
        data = await self._json(request)
        ex = data.get("execution_id")
        if not isinstance(ex, str) or not ex:
            raise ApiError(400, "execution_id: expected a non-empty string")
        if len(ex) > 512 or any(ord(c) < 32 or c == "\x7f" for c in ex):
            raise ApiError(400, "execution_id: at most 512 characters, no control characters")
        label = data.get("label") or ""
        key = data.get("key")
        if key is not None and (not isinstance(key, str) or not key):
            raise ApiError(400, "key: expected a non-empty string")
        try:
            api_key = self.svc.keys.register(ex, str(label), key)
        except ValueError as e:
            raise ApiError(409, str(e)) from None
        return JSONResponse({"execution_id": ex, "label": label, "api_key": api_key})

    async def revoke(self, request: Request) -> Response:
        ex = request.path_params["execution_id"]
        n = self.svc.keys.revoke(ex)
        self.svc.close_execution(ex)
        return JSONResponse({"execution_id": ex, "revoked_keys": n})

    async def execution_calls(self, request: Request) -> Response:
        return JSONResponse(self.svc.calls.get(request.path_params["execution_id"]))

    async def list_executions(self, request: Request) -> Response:
        return JSONResponse({"executions": self.svc.keys.executions()})

    async def add_engine(self, request: Request) -> Response:
        url = (await self._json(request)).get("url")
        if not isinstance(url, str):
            raise ApiError(400, "url: expected a string")
        await self.svc.pool.add(url)
        return JSONResponse({"engines": self.svc.pool.status()})

    async def drain_engine(self, request: Request) -> Response:
        url = (await self._json(request)).get("url")
        try:
            moved = await self.svc.pool.drain(str(url))
        except KeyError as e:
            raise ApiError(404, str(e), "not_found") from None
        return JSONResponse({"moved": moved, "engines": self.svc.pool.status()})

    async def remove_engine(self, request: Request) -> Response:
        url = (await self._json(request)).get("url")
        if str(url).rstrip("/") not in self.svc.pool.engines:
            raise ApiError(404, f"unknown engine {url}", "not_found")
        await self.svc.pool.remove(str(url))
        return JSONResponse({"engines": self.svc.pool.status()})

    async def stats(self, request: Request) -> Response:
        return JSONResponse(self.svc.stats())

    async def health(self, request: Request) -> Response:
        ok, engines = await _probe(self.svc)
        return JSONResponse(
            {"status": "ok" if ok else "no_engine", "engines": engines},
            status_code=200 if ok else 503,
        )
