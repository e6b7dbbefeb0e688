"""The vLLM adapter: a Gyre engine whose tokens come from a vLLM server.

Why an engine and not a second client kind in the proxy: the proxy's pool, its drain and
resume, its fault handling and the runtime's cells all speak Gyre's token-level
``/generate`` protocol. Serving that protocol in front of vLLM (``create_app(VllmEngine)``,
``gyre engine --kind vllm``) makes a vLLM server one more engine URL, with nothing in the
proxy changed; the cost is one loopback hop (measured in docs/engine.md).

The vLLM side is its token-in/token-out route ``POST /inference/v1/generate`` (server
started with ``--enable-scale-out``), not ``/v1/completions``: it takes ``token_ids`` and
answers ``token_ids`` with each sampled token's log-prob keyed by id, no detokenising or
text anywhere, and on the final chunk the **weight-version spans** vLLM itself records per
output token (``[{version, start, end}]``), so a weight update in the middle of a request
is attributed exactly, not by when a chunk happened to arrive here.

Log-probs are the config's ``logprob_mode`` as vLLM's ``--logprobs-mode`` (set at launch):
``raw`` (default) is ``raw_logprobs``, the log-softmax of the model's logits before temperature,
penalties and top-k/top-p (what a trainer recomputes); ``processed`` is ``processed_logprobs``,
the distribution actually sampled from. Only the sampled token's log-prob is asked for
(``logprobs: 0``).

Control maps to vLLM's dev-mode routes (``VLLM_SERVER_DEV_MODE=1``):

- abort: ``/inference/v1/abort_requests``; vLLM ends the stream with ``finish_reason:
  abort`` and the partial output; if that answer does not come within ``abort_grace_s`` the
  stream is closed, which aborts it in vLLM too.
- pause ``in_place`` / ``retract``: ``/pause?mode=keep`` (requests freeze with their K/V and
  continue on ``/resume``); ``abort``: ``/pause?mode=abort``.
- weights: ``/pause?mode=keep`` -> ``/collective_rpc reload_weights(weights_path=DIR)``
  (in place, same architecture; checked here first so a mismatch is refused with the old
  weights kept) -> ``/update_weight_version`` (vLLM labels every later token with it) ->
  ``/reset_prefix_cache`` (cached K/V of the old weights must not serve new requests) ->
  ``/resume`` (unless the caller had paused).
- tied embeddings (``tie_word_embeddings``, e.g. SmolLM2, Qwen3 0.6B-4B): vLLM 0.32's plain
  reload leaves the tied ``lm_head``'s packed CPU GEMM weight at its old values, so the
  reload is Gyre's worker extension's ``gyre_reload_weights`` (reload, then the tied head
  re-packed; :mod:`gyre.engine.vllm_plugin.gyre_vllm_worker`). At start the adapter asks
  the server how many tied heads it has (``gyre_tied_heads``); a server started without the
  extension (``gyre.engine.vllm_launch`` passes it) has its tied-model reloads refused with
  the old weights kept.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from gyre.engine.base import Engine, EngineInputError, RequestState
from gyre.engine.config import VllmEngineConfig
from gyre.engine.protocol import (
    FinishReason,
    GenerateRequest,
    ModelInfo,
    PauseMode,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsResponse,
)

VLLM_RID_PREFIX = "generate-tokens-"
"""vLLM's token route names a request ``generate-tokens-<request_id>``; abort uses that name."""

_MAPPED = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop_token_ids"}
_MAPPED |= {"ignore_eos", "seed"}
_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "min_new_tokens": 0,
}
_ARCH_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)


class VllmError(RuntimeError):
    """vLLM answered a control call with an error (or not at all)."""


def _config(model_dir: str | Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EngineInputError(f"{model_dir}: no readable config.json ({e})") from None
    if not isinstance(data, dict):
        raise EngineInputError(f"{model_dir}/config.json is not a JSON object")
    return data


def vllm_sampling(st: RequestState) -> dict[str, Any]:
    """Gyre's sampling params as vLLM's, every field explicit (vLLM fills unset ones from server
    defaults). Unknown extras set to a non-neutral value are refused by :meth:`validate`."""
    p = st.params
    sp: dict[str, Any] = {
        "max_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": 0 if p.top_k in (-1, 0) else p.top_k,
        "min_p": p.min_p,
        "ignore_eos": p.ignore_eos,
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if p.stop_token_ids:
        sp["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        sp["seed"] = p.seed
    return sp


class VllmEngine(Engine):
    kind = "vllm"

    def __init__(self, config: VllmEngineConfig) -> None:
        if config.url is None and config.model_dir is None:
            raise ValueError("the vLLM adapter needs a server url or a model_dir to launch")
        super().__init__(config.engine_id)
        self.config = config
        self.weight_version = config.weight_version
        self.url: str | None = config.url.rstrip("/") if config.url else None
        self.server: Any = None  # a VllmServer when this engine launched it
        self.max_model_len: int | None = None
        self.vocab_size: int | None = None
        self.eos_ids: list[int] = []
        self._arch: dict[str, Any] = {}
        self._tied_heads: int | None = None  # from the worker extension; None: not loaded
        self._http: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        if self.url is None:
            from gyre.engine.vllm_launch import VllmServer

            assert c.model_dir is not None
            self.server = VllmServer(
                c.model_dir,
                python=c.python,
                kv_cache_gb=c.kv_cache_gb,
                logprob_mode=c.logprob_mode,
            )
            self.url = await asyncio.to_thread(self.server.start, c.start_timeout_s)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
        self._http = aiohttp.ClientSession(self.url, timeout=timeout)
        models = await self._call("GET", "/v1/models")
        data = models.get("data") or [{}]
        self.max_model_len = data[0].get("max_model_len")
        served = c.model_dir or data[0].get("root") or data[0].get("id")
        if served and Path(served, "config.json").exists():
            cfg = _config(served)
            self._arch = {k: cfg.get(k) for k in _ARCH_KEYS}
            self.vocab_size = cfg.get("vocab_size")
            eos = cfg.get("eos_token_id")
            self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.model_path = served or self.url
        if self._arch.get("tie_word_embeddings"):
            self._tied_heads = await self._count_tied_heads()
        # vLLM labels every token with this from now on ("default" until told)
        await self._call(
            "POST", "/update_weight_version", {"new_version": str(self.weight_version)}
        )
        await super().start()

    async def stop(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()  # each finishes its request as aborted; closing its stream aborts it in vLLM
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await super().stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None

    async def _count_tied_heads(self) -> int | None:
        """Tied output heads per the worker extension (the least over workers), or None when
        the server was started without it (its collective_rpc then fails)."""
        try:
            out = await self._call("POST", "/collective_rpc", {"method": "gyre_tied_heads"})
            return min(int(r) for r in out["results"])
        except (VllmError, KeyError, TypeError, ValueError):
            return None

    async def _call(self, method: str, path: str, body: Any = None, **params: str) -> dict:
        assert self._http is not None, "engine not started"
        try:
            async with self._http.request(method, path, json=body, params=params or None) as r:
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise VllmError(f"vLLM {self.url}{path} unreachable: {type(e).__name__}: {e}") from e
        if r.status == 404 and path != "/v1/models":
            raise VllmError(
                f"vLLM {self.url} has no {path}: start it with VLLM_SERVER_DEV_MODE=1 "
                "(gyre.engine.vllm_launch does)"
            )
        if r.status >= 400:
            raise VllmError(f"vLLM {self.url}{path} answered {r.status}: {text[:300]}")
        try:
            out = json.loads(text) if text else {}
        except ValueError:
            return {}
        return out if isinstance(out, dict) else {"results": out}

    # -- requests -------------------------------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        if self.vocab_size is not None:
            bad = [t for t in req.input_ids if t >= self.vocab_size]
            if bad:
                raise EngineInputError(
                    f"input_ids contains ids outside the vocabulary [0, {self.vocab_size}): "
                    f"{bad[:5]}"
                )
        n = len(req.input_ids) + req.sampling_params.max_new_tokens
        if self.max_model_len is not None and n > self.max_model_len:
            raise EngineInputError(
                f"input ({len(req.input_ids)} tokens) + max_new_tokens "
                f"({req.sampling_params.max_new_tokens}) = {n} exceeds the context limit "
                f"{self.max_model_len}"
            )
        for k, v in (req.sampling_params.model_extra or {}).items():
            if k == "sampling_seed" or v is None or _NEUTRAL.get(k, object()) == v:
                continue
            raise EngineInputError(
                f"sampling_params.{k} is not supported by the vLLM adapter (refused rather than "
                "sampled from another distribution than asked)"
            )

    async def _enqueue(self, st: RequestState) -> None:
        task = asyncio.create_task(self._run(st))
        self._tasks[st.rid] = task
        task.add_done_callback(lambda _t: self._tasks.pop(st.rid, None))

    async def _run(self, st: RequestState) -> None:
        assert self._http is not None
        body = {
            "request_id": st.rid,
            "token_ids": st.input_ids,
            "sampling_params": vllm_sampling(st),
            "stream": True,
        }
        try:
            async with self._http.post("/inference/v1/generate", json=body) as resp:
                if resp.status >= 400:
                    text = await resp.text()
                    raise VllmError(f"vLLM refused the request ({resp.status}): {text[:300]}")
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    self._chunk(st, json.loads(payload))
            if st.finish is None:
                raise VllmError("vLLM's stream ended without a finish reason")
        except asyncio.CancelledError:  # abort grace ran out or the engine stops
            st.finish_with(FinishReason(type="abort", message=st.abort_message or "cancelled"))
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError, VllmError) as e:
            if st.abort_requested:
                st.finish_with(FinishReason(type="abort", message=st.abort_message))
            else:
                st.fail(e if isinstance(e, VllmError) else VllmError(f"vLLM stream broke: {e}"))

    def _chunk(self, st: RequestState, data: dict[str, Any]) -> None:
        if "error" in data:
            err = data["error"]
            raise VllmError(f"vLLM: {err.get('message', err) if isinstance(err, dict) else err}")
        for ch in data.get("choices") or []:
            ids = ch.get("token_ids") or []
            content = (ch.get("logprobs") or {}).get("content") or []
            lps = [c.get("logprob", 0.0) for c in content]
            if len(lps) != len(ids):
                raise VllmError(f"vLLM sent {len(ids)} token ids with {len(lps)} log-probs")
            for t, lp in zip(ids, lps):
                st.append(t, lp, self.weight_version)
            fin = ch.get("finish_reason")
            if fin is None:
                continue
            spans = ch.get("weight_versions")
            if spans:  # vLLM's own per-token record replaces the labels given on arrival
                st.version_segments = [
                    (int(s["start"]), self._version(s["version"])) for s in spans
                ]
            if fin == "stop":
                stop = ch.get("stop_reason")
                last = st.output_ids[-1] if st.output_ids else None
                matched = stop if isinstance(stop, int) else last
                st.finish_with(FinishReason(type="stop", matched=matched))
            elif fin == "length":
                st.finish_with(FinishReason(type="length", length=len(st.output_ids)))
            elif fin == "abort":
                msg = st.abort_message or "aborted by vLLM"
                st.finish_with(FinishReason(type="abort", message=msg))
            else:
                raise VllmError(f"vLLM finished the request with {fin!r}")

    def _version(self, label: Any) -> int:
        try:
            return int(label)
        except (TypeError, ValueError):
            return self.config.weight_version  # "default": the server's starting weights

    def _on_abort(self, st: RequestState) -> None:
        if st.rid not in self._tasks:
            super()._on_abort(st)
            return
        asyncio.get_running_loop().create_task(self._abort_upstream(st))

    async def _abort_upstream(self, st: RequestState) -> None:
        try:
            await self._call(
                "POST", "/inference/v1/abort_requests", {"request_ids": [VLLM_RID_PREFIX + st.rid]}
            )
        except (VllmError, AssertionError):
            pass  # closing the stream below aborts it in vLLM too
        task = self._tasks.get(st.rid)
        if task is None:
            return
        # the stream ends by itself with vLLM's "abort" answer; past the grace, closing it aborts
        await asyncio.wait({task}, timeout=self.config.abort_grace_s)
        if not task.done():
            task.cancel()

    # -- pause / weights ------------------------------------------------------------------------
    async def pause(self, mode: PauseMode = "in_place") -> None:
        await self._call("POST", "/pause", mode="abort" if mode == "abort" else "keep")
        await super().pause(mode)

    async def resume(self) -> None:
        await self._call("POST", "/resume")
        await super().resume()

    async def update_weights_from_disk(
        self, req: UpdateWeightsFromDiskRequest
    ) -> UpdateWeightsResponse:
        path = str(Path(req.model_path).resolve())
        rpc = self._reload_rpc(path)  # refuses before anything changes
        new = _config(path)
        diff = [k for k in _ARCH_KEYS if self._arch and new.get(k) != self._arch.get(k)]
        if diff:
            raise EngineInputError(
                f"{req.model_path}: not the served architecture ({', '.join(diff)} differ); "
                "old weights kept"
            )
        old = self.weight_version
        self._bump_version(req.weight_version)  # validates before anything changes
        version, self.weight_version = self.weight_version, old
        if req.abort_all_requests:
            await self.abort_all("aborted by weights update")
        was_paused = self.paused
        if not was_paused:
            await self._call("POST", "/pause", mode="keep")
        try:
            out = await self._call("POST", "/collective_rpc", rpc)
            if rpc["method"] == "gyre_reload_weights":
                refreshed = [int(r) for r in out.get("results") or [0]]
                if min(refreshed) < 1:
                    raise VllmError(f"vLLM reloaded {path} but refreshed no tied lm_head")
            await self._call("POST", "/update_weight_version", {"new_version": str(version)})
            await self._call("POST", "/reset_prefix_cache")
            self.weight_version = version
        finally:
            if not was_paused:
                await self._call("POST", "/resume")
        return UpdateWeightsResponse(
            success=True,
            message=f"vLLM reloaded {path}",
            num_paused_requests=self.live_requests,
            weight_version=self.weight_version,
        )

    def _reload_rpc(self, path: str) -> dict[str, Any]:
        """The ``/collective_rpc`` body that reloads ``path`` in place: vLLM's own reload, or for
        a tied model Gyre's extension's (which also re-packs the tied head)."""
        if not self._arch.get("tie_word_embeddings"):
            return {"method": "reload_weights", "kwargs": {"weights_path": path}}
        if not self._tied_heads:
            raise EngineInputError(
                "the served model ties lm_head to the embeddings, and vLLM 0.32's plain reload "
                "leaves a tied lm_head at its old weights (wrong log-probs); the server "
                "answered no tied head to Gyre's worker extension: start it with "
                "--worker-extension-cls gyre_vllm_worker.GyreWorkerExtension and PYTHONPATH="
                "gyre/engine/vllm_plugin (gyre.engine.vllm_launch does); old weights kept"
            )
        return {"method": "gyre_reload_weights", "kwargs": {"weights_path": path}}

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            model_path=str(getattr(self, "model_path", self.config.model_dir or self.url)),
            weight_version=self.weight_version,
            engine_kind=self.kind,
            engine_id=self.engine_id,
            max_context_length=self.max_model_len,
            vocab_size=self.vocab_size,
            eos_token_ids=self.eos_ids,
            paused=self.paused,
        )

    def stats(self) -> dict:
        return {**super().stats(), "vllm_url": self.url}
