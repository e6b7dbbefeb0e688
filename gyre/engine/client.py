"""Async client for the engine wire protocol (any Gyre engine or a real SGLang server).

Errors are split by what the caller should do about them:

- :class:`EngineConnectionError`: the engine could not be reached or the
  connection broke (mid-stream too). The request may be retried elsewhere
  (the proxy's drain/resume path).
- :class:`EngineRequestError` (4xx): the request itself is bad (empty or
  out-of-vocab ids, context too long, ...). Retrying will not help.
- :class:`EngineServerError` (5xx): the engine failed while serving.
- :class:`EngineProtocolError`: the engine answered, but not in the protocol (a
  stream request answered with a plain body, data that is not the expected JSON).
  Not transient: retrying the same engine will not help.

One client owns one ``httpx.AsyncClient`` (connection pooling); close it with
``await client.aclose()`` or ``async with EngineClient(url) as c``. Create it in
the event loop that uses it.

An engine started with an API key (every engine of ``gyre run``) answers 401 without it:
``EngineClient(url, api_key=KEY)``, or ``GYRE_ENGINE_API_KEY`` in the environment (how a
cell's own control calls get it).
"""

from __future__ import annotations

import functools
import json
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from gyre.engine.protocol import (
    DONE_SENTINEL,
    AbortRequest,
    GenerateRequest,
    GenerateResponse,
    GroupResponse,
    InitWeightsUpdateGroupRequest,
    ModelInfo,
    PauseMode,
    PauseRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
    UpdateWeightsResponse,
)
from gyre.validation import validation_line


class EngineError(Exception):
    """Base class of every error raised by :class:`EngineClient`."""

    def __init__(self, message: str, *, url: str = "", status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.url = url
        self.status_code = status_code


class EngineConnectionError(EngineError):
    """Engine unreachable, timed out, or the connection dropped."""


class EngineHTTPError(EngineError):
    """The engine answered with an error status."""


class EngineRequestError(EngineHTTPError):
    """4xx: the request is invalid for this engine (clear message from the engine)."""


class EngineServerError(EngineHTTPError):
    """5xx: the engine failed."""


class EngineProtocolError(EngineError):
    """The engine's answer is not the /generate protocol (see module doc); the proxy's pool
    raises it too, for the answers it reads itself."""


def _error_message(resp_text: str) -> str:
    try:
        body = json.loads(resp_text)
    except ValueError:
        return resp_text.strip() or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        return str(err)
    return str(body)


def _raise_for_status(status: int, text: str, url: str) -> None:
    if status < 400:
        return
    msg = f"engine {url} returned {status}: {_error_message(text)}"
    cls = EngineRequestError if status < 500 else EngineServerError
    raise cls(msg, url=url, status_code=status)


SamplingLike = SamplingParams | dict | None

API_KEY_ENV = "GYRE_ENGINE_API_KEY"
"""The engine API key of this process, when no explicit one is given (clients and servers)."""


def use_api_key(key: str | None) -> None:
    """Make ``key`` this process's engine key (servers and clients built from now on use it).

    Set in ``os.environ`` by the process itself, so it is not in the environment block the
    kernel shows in ``/proc/PID/environ`` (that is the one the process started with), nor in
    any Ray log: ``gyre run`` passes it as an actor argument, never through ``runtime_env``,
    whose env vars Ray's runtime-env agent writes to its world-readable log."""
    if key:
        os.environ[API_KEY_ENV] = key


def auth_headers(api_key: str | None = None) -> dict[str, str]:
    """The ``Authorization`` header for ``api_key`` (default: ``$GYRE_ENGINE_API_KEY``); empty
    when there is none."""
    key = api_key or os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process: httpx otherwise builds one (and
    loads the CA bundle into it) for every client, 0.1-0.3 s of CPU on the creating event loop, which
    the proxy pays for each engine it adds (a switch to rollout) and the runtime for each engine it
    reloads (a publication)."""
    return httpx.create_ssl_context()


def _build_request(
    input_ids: list[int] | GenerateRequest,
    sampling_params: SamplingLike,
    rid: str | None,
    return_logprob: bool,
    stream: bool,
) -> dict:
    if isinstance(input_ids, GenerateRequest):
        req = input_ids.model_copy(update={"stream": stream})
    else:
        try:
            sp = (
                sampling_params
                if isinstance(sampling_params, SamplingParams)
                else SamplingParams(**(sampling_params or {}))
            )
            req = GenerateRequest(
                rid=rid,
                input_ids=list(input_ids),
                sampling_params=sp,
                return_logprob=return_logprob,
                stream=stream,
            )
        except ValidationError as e:  # refused before sending: same error class as the engine's 400
            msgs = validation_line(e, root=None)
            raise EngineRequestError(f"invalid request (not sent): {msgs}") from None
    # exclude_none: a real SGLang constructs SamplingParams(**dict) and rejects unknown keys.
    body = req.model_dump(exclude_none=True)
    sp = body.get("sampling_params", {})
    if "seed" in sp:  # SGLang's name; Gyre engines accept both
        sp["sampling_seed"] = sp.pop("seed")
    return body


class EngineClient:
    """Typed async client of one engine at ``base_url`` (e.g. ``http://127.0.0.1:30000``)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        incremental_stream: bool = False,
        api_key: str | None = None,
    ):
        # read_timeout None: a long generation may legitimately take minutes.
        # incremental_stream: the server sends only new tokens per chunk (SGLang's
        # --incremental-streaming-output); generate_stream() still yields cumulative chunks.
        self.base_url = base_url.rstrip("/")
        self.incremental_stream = incremental_stream
        timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=60.0, pool=None)
        # generous keep-alive: with httpx's default (20) a burst of concurrent requests closes and
        # reopens connections on every wave
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout,
            transport=transport,
            limits=limits,
            verify=_tls_context(),
            headers=auth_headers(api_key),
        )

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plumbing ---------------------------------------------------------------------------
    async def _request(self, method: str, path: str, json_body: Any = None) -> httpx.Response:
        url = self.base_url + path
        try:
            resp = await self._http.request(method, path, json=json_body)
        except httpx.TransportError as e:  # connect/read/write errors and timeouts
            raise EngineConnectionError(
                f"engine {url} unreachable: {type(e).__name__}: {e}", url=url
            ) from e
        _raise_for_status(resp.status_code, resp.text, url)
        return resp

    @staticmethod
    def _json(resp: httpx.Response) -> Any:
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            return {}

    # -- generation -------------------------------------------------------------------------
    async def generate(
        self,
        input_ids: list[int] | GenerateRequest,
        sampling_params: SamplingLike = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
    ) -> GenerateResponse:
        """Non-streaming generation; returns the final response."""
        body = _build_request(input_ids, sampling_params, rid, return_logprob, stream=False)
        resp = await self._request("POST", "/generate", body)
        try:
            data = resp.json()
            if isinstance(data, list) and data:  # SGLang answers a batch request with a list
                data = data[0]
            return GenerateResponse.model_validate(data)
        except (ValueError, ValidationError) as e:
            raise EngineProtocolError(
                f"engine {self.base_url}/generate: not a /generate answer ({type(e).__name__})",
                url=self.base_url,
            ) from None

    async def generate_stream(
        self,
        input_ids: list[int] | GenerateRequest,
        sampling_params: SamplingLike = None,
        *,
        rid: str | None = None,
        return_logprob: bool = True,
    ) -> AsyncIterator[GenerateResponse]:
        """Streaming generation: yields cumulative chunks; the last has ``finish_reason`` set.

        Closing the iterator early (``break`` / ``aclose()``) closes the HTTP
        stream, which Gyre engines treat as an abort of the request.
        """
        body = _build_request(input_ids, sampling_params, rid, return_logprob, stream=True)
        url = self.base_url + "/generate"
        ids_so_far: list[int] = []
        lps_so_far: list = []
        try:
            async with self._http.stream("POST", "/generate", json=body) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _raise_for_status(resp.status_code, resp.text, url)
                ctype = resp.headers.get("content-type", "")
                if not ctype.startswith("text/event-stream"):
                    raise EngineProtocolError(
                        f"engine {url} answered a stream request with {ctype or 'no content-type'}",
                        url=url,
                    )
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == DONE_SENTINEL:
                        return
                    try:
                        data = json.loads(payload)
                    except ValueError:
                        raise EngineProtocolError(
                            f"engine {url}: a stream event is not JSON: {payload[:120]!r}", url=url
                        ) from None
                    if isinstance(data, dict) and "error" in data:
                        err = data["error"]
                        code = int(err.get("code", 500)) if isinstance(err, dict) else 500
                        _raise_for_status(code if code >= 400 else 500, json.dumps(data), url)
                    try:
                        chunk = GenerateResponse.model_validate(data)
                    except ValidationError:
                        raise EngineProtocolError(
                            f"engine {url}: a stream event is not a /generate answer", url=url
                        ) from None
                    if self.incremental_stream:
                        ids_so_far.extend(chunk.output_ids)
                        lps_so_far.extend(chunk.meta_info.output_token_logprobs or [])
                        chunk.output_ids = list(ids_so_far)
                        if chunk.meta_info.output_token_logprobs is not None:
                            chunk.meta_info.output_token_logprobs = list(lps_so_far)
                    yield chunk
        except httpx.TransportError as e:
            raise EngineConnectionError(
                f"engine {url} stream broke: {type(e).__name__}: {e}", url=url
            ) from e

    # -- control ----------------------------------------------------------------------------
    async def abort(self, rid: str, *, keep_kv: bool = False) -> bool:
        """Abort request ``rid``; it ends with finish_reason ``abort`` and its partial output.
        ``keep_kv``: the engine parks its K/V for ``/kv_export`` (only for engines whose model
        info says ``kv_migration``; others never see the field).
        Returns whether the engine knew the request (always True for SGLang, which does not say)."""
        body = AbortRequest(rid=rid).model_dump(exclude={"keep_kv"})
        if keep_kv:
            body["keep_kv"] = True
        resp = await self._request("POST", "/abort_request", body)
        return bool(self._json(resp).get("found", True))

    async def abort_all(self) -> None:
        body = AbortRequest(abort_all=True).model_dump(exclude={"keep_kv"})
        await self._request("POST", "/abort_request", body)

    async def pause(self, mode: PauseMode = "in_place") -> None:
        """Stop scheduling generation steps (mode sent explicitly: SGLang's default is ``abort``)."""
        await self._request("POST", "/pause_generation", PauseRequest(mode=mode).model_dump())

    async def resume(self) -> None:
        await self._request("POST", "/continue_generation", {})

    async def update_weights_from_disk(
        self, path: str, *, weight_version: int | str | None = None
    ) -> UpdateWeightsResponse:
        req = UpdateWeightsFromDiskRequest(model_path=str(path), weight_version=weight_version)
        resp = await self._request(
            "POST", "/update_weights_from_disk", req.model_dump(exclude_none=True)
        )
        out = UpdateWeightsResponse.model_validate(self._json(resp))
        if not out.success:
            raise EngineRequestError(
                f"engine {self.base_url} refused weights update: {out.message}",
                url=self.base_url,
                status_code=resp.status_code,
            )
        return out

    async def init_weights_update_group(self, req: InitWeightsUpdateGroupRequest) -> GroupResponse:
        """Join the trainer's weight-update group (returns once every member joined: call it
        while rank 0 opens its end)."""
        resp = await self._request("POST", "/init_weights_update_group", req.model_dump())
        return GroupResponse.model_validate(self._json(resp))

    async def update_weights_from_distributed(
        self, req: UpdateWeightsFromDistributedRequest
    ) -> UpdateWeightsResponse:
        """Receive one bucket (returns after rank 0's broadcasts). A refusal is returned, not
        raised: the caller reads ``needs_full_copy`` to seed the engine with a full copy."""
        url = self.base_url + "/update_weights_from_distributed"
        try:
            resp = await self._http.post(
                "/update_weights_from_distributed",
                # defaults left out: a real SGLang gets only the fields it knows
                json=req.model_dump(exclude_none=True, exclude_defaults=True),
            )
        except httpx.TransportError as e:
            raise EngineConnectionError(f"engine {url} unreachable: {e}", url=url) from e
        if resp.status_code == 400:
            data = self._json(resp)
            if "success" in data:
                return UpdateWeightsResponse.model_validate(data)
        _raise_for_status(resp.status_code, resp.text, url)
        return UpdateWeightsResponse.model_validate(self._json(resp))

    async def weight_update_session(self, step: Literal["begin", "end"]) -> None:
        """SGLang's ``/begin_weight_update`` or ``/end_weight_update``: since 0.5.2x a real SGLang
        refuses ``update_weights_from_distributed`` outside such a session (it unpacks in-place
        quantized weights at the start and finalizes them at the end). Gyre engines have no
        session and do not serve these routes."""
        await self._request("POST", f"/{step}_weight_update", {})

    async def destroy_weights_update_group(self, group_name: str) -> None:
        await self._request("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def model_info(self) -> ModelInfo:
        resp = await self._request("GET", "/get_model_info")
        return ModelInfo.model_validate(self._json(resp))

    async def server_info(self) -> dict:
        """``GET /get_server_info``: model info plus load figures (Gyre engines: live_requests,
        waiting, running, ...; SGLang: its own server args and stats)."""
        return self._json(await self._request("GET", "/get_server_info"))

    async def ping(self) -> bool:
        """True when the engine's HTTP server answers at all (any status): a liveness probe that,
        unlike SGLang's /health, never asks the model for a token, so a busy engine still passes
        and only a frozen or gone one fails."""
        try:
            await self._http.get("/get_model_info")
        except httpx.TransportError:
            return False
        return True

    async def health(self) -> bool:
        """True when the engine answers ``/health`` with 200; False on any error status or no connection."""
        try:
            await self._request("GET", "/health")
        except EngineError:
            return False
        return True
