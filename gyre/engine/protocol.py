"""The engine wire protocol: SGLang's native ``/generate`` shape, as pydantic types.

Why SGLang's shape: a real SGLang server is then a drop-in engine behind the
proxy (no adapter), and the protocol is token-level (``input_ids`` in,
``output_ids`` + per-token log-probs out), which is what a token-exact trace
needs. Every Gyre engine (embedded torch, scripted, null) speaks it.

Routes (all JSON):

- ``POST /generate``                 :class:`GenerateRequest` -> :class:`GenerateResponse`,
  or with ``stream: true`` an SSE stream of cumulative :class:`GenerateResponse`
  chunks (``data: {...}``), ended by ``data: [DONE]``.
- ``POST /abort_request``            :class:`AbortRequest`
- ``POST /pause_generation``         :class:`PauseRequest`
- ``POST /continue_generation``      (empty body)
- ``POST /update_weights_from_disk`` :class:`UpdateWeightsFromDiskRequest` -> :class:`UpdateWeightsResponse`
- ``POST /init_weights_update_group`` :class:`InitWeightsUpdateGroupRequest` -> :class:`GroupResponse`
- ``POST /update_weights_from_distributed`` :class:`UpdateWeightsFromDistributedRequest` ->
  :class:`UpdateWeightsResponse` (the tensors arrive by broadcast from rank 0 of the group)
- ``POST /destroy_weights_update_group`` :class:`DestroyWeightsUpdateGroupRequest`
- ``GET  /get_model_info``           -> :class:`ModelInfo`
- ``GET  /health``                   -> 200 when the engine can serve
- ``POST /kv_export``                :class:`KVExportRequest` -> the parked K/V as bytes (Gyre,
  :mod:`gyre.engine.kv_migrate`); ``POST /kv_import?rid=R`` those bytes -> JSON

Errors: a 4xx/5xx status with ``{"error": {"message": str, "type": str, "code": int}}``
(SGLang's error shape). Mid-stream errors arrive as one ``data: {"error": ...}`` chunk.

Types accept unknown fields (``extra="allow"``) so a newer SGLang adding
meta fields never breaks the client, and so SGLang-only sampling parameters
pass through untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DONE_SENTINEL = "[DONE]"
"""The payload of the last SSE event of a stream (``data: [DONE]``)."""

WeightVersion = int | str
"""Gyre engines count weight versions with ints; SGLang uses strings (default ``"default"``)."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class SamplingParams(_Open):
    """Per-request sampling parameters (SGLang names and defaults).

    ``seed`` is Gyre's name; SGLang calls it ``sampling_seed`` (both accepted
    here; the client drops unset fields so a real SGLang never sees an unknown
    ``None`` key). ``top_k = -1`` means no top-k cut (SGLang's convention).
    """

    max_new_tokens: int = Field(128, ge=0, description="Upper bound on generated tokens.")
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 (or 0) disables top-k.")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop_token_ids: list[int] | None = Field(None, description="Extra stop tokens besides EOS.")
    ignore_eos: bool = Field(False, description="Do not stop at EOS (benchmarks).")
    seed: int | None = Field(None, description="Per-request sampling seed (SGLang: sampling_seed).")

    @model_validator(mode="before")
    @classmethod
    def _accept_sglang_seed(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("seed") is None
            and data.get("sampling_seed") is not None
        ):
            data = dict(data)
            data["seed"] = data.pop("sampling_seed")
        return data

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError("top_k must be -1 (disabled) or >= 0")
        return v

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class GenerateRequest(_Open):
    """``POST /generate`` body (token-level: Gyre never sends text to an engine)."""

    rid: str | None = Field(None, description="Request id; the engine makes one when absent.")
    input_ids: list[int]
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = True
    stream: bool = False

    @field_validator("input_ids")
    @classmethod
    def _non_empty(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("input_ids must not be empty")
        if any(t < 0 for t in v):
            raise ValueError("input_ids must be non-negative token ids")
        return v


FinishType = Literal["stop", "length", "abort"]


class FinishReason(_Open):
    """Why a request ended. ``stop``: a stop token (``matched``) was sampled and is
    the last output token; ``length``: ``max_new_tokens`` or the context limit was
    reached; ``abort``: aborted (``message`` says why) with partial output."""

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class MetaInfo(_Open):
    id: str
    finish_reason: FinishReason | None = Field(None, description="None while a stream is running.")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_token_logprobs: list[tuple[float, int, str | None]] | None = Field(
        None, description="[[logprob, token_id, token_text_or_null], ...] aligned with output_ids."
    )
    weight_version: WeightVersion | None = Field(
        None, description="Engine weights version at the last token."
    )
    # Gyre additions (SGLang does not send these; keep them optional).
    weight_version_segments: list[tuple[int, WeightVersion]] | None = Field(
        None,
        description="[[first_output_index, version], ...]: output tokens from that index on were "
        "sampled under that weights version (a pause/update can happen mid-request).",
    )
    engine_id: str | None = None


class GenerateResponse(_Open):
    """Non-stream response, and also each (cumulative) stream chunk."""

    text: str | None = None
    output_ids: list[int] = Field(default_factory=list)
    meta_info: MetaInfo

    @property
    def finished(self) -> bool:
        return self.meta_info.finish_reason is not None

    @property
    def logprobs(self) -> list[float]:
        return [lp for lp, _, _ in (self.meta_info.output_token_logprobs or [])]


class AbortRequest(_Open):
    rid: str = ""
    abort_all: bool = False
    keep_kv: bool = Field(
        False,
        description="Gyre: park the request's K/V for /kv_export (KV migration on reroute); "
        "sent only to engines whose model info says kv_migration.",
    )


class KVExportRequest(_Open):
    """Gyre: ``POST /kv_export`` (gyre.engine.kv_migrate)."""

    rid: str
    weight_version: int = Field(description="The target engine's: K/V of other weights stay.")


class AbortResponse(_Open):
    found: bool = Field(description="Whether a live request with that rid existed.")


PauseMode = Literal["in_place", "abort", "retract"]


class PauseRequest(_Open):
    """``in_place``: stop scheduling steps, in-flight requests keep their state and
    wait; ``abort``: also abort every in-flight request (partial output returned);
    ``retract`` (SGLang: drop KV, recompute later) is served as ``in_place``."""

    mode: PauseMode = "in_place"


class UpdateWeightsFromDiskRequest(_Open):
    model_path: str
    load_format: str | None = None
    weight_version: WeightVersion | None = Field(
        None, description="Version to adopt; Gyre engines increment their counter when absent."
    )
    abort_all_requests: bool = False


class InitWeightsUpdateGroupRequest(_Open):
    """SGLang's ``/init_weights_update_group``: join a process group whose rank 0 is the trainer
    (``rank_offset`` is this engine's first rank; a Gyre engine holds one rank)."""

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DestroyWeightsUpdateGroupRequest(_Open):
    group_name: str = "weight_update_group"


class GroupResponse(_Open):
    success: bool
    message: str = ""


DeltaCodec = Literal["raw", "xor-shuffle-zlib"]


class UpdateWeightsFromDistributedRequest(_Open):
    """SGLang's ``/update_weights_from_distributed``: the named tensors of one bucket, which rank
    0 broadcasts over the group in this order right after sending the request.

    Gyre additions (a real SGLang gets ``encoding="raw"`` and none of them): with
    ``encoding="xor-shuffle-zlib"`` each broadcast is a uint8 tensor of ``nbytes[i]`` bytes, the
    delta from version ``base_version`` (:mod:`gyre.engine.delta`); ``checksums`` are the CRC-32
    of each new tensor's bytes, checked before anything is applied."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: WeightVersion | None = None
    load_format: str | None = None
    encoding: DeltaCodec = "raw"
    base_version: int | None = None
    nbytes: list[int] | None = None
    checksums: list[str] | None = None

    @model_validator(mode="after")
    def _same_lengths(self) -> UpdateWeightsFromDistributedRequest:
        n = len(self.names)
        lists: dict[str, list] = {"dtypes": self.dtypes, "shapes": self.shapes}
        lists.update(
            {
                k: v
                for k, v in (("nbytes", self.nbytes), ("checksums", self.checksums))
                if v is not None
            }
        )
        bad = [k for k, v in lists.items() if len(v) != n]
        if bad:
            raise ValueError(f"{', '.join(bad)} must have one entry per name ({n})")
        if self.encoding != "raw" and (
            self.nbytes is None or self.checksums is None or self.base_version is None
        ):
            raise ValueError(f"encoding {self.encoding!r} needs nbytes, checksums and base_version")
        return self


class UpdateWeightsResponse(_Open):
    success: bool
    message: str = ""
    needs_full_copy: bool | None = Field(
        None,
        description="Gyre: the engine refused a delta because it does not hold the delta's base "
        "(it missed a version); send it a full copy.",
    )
    num_paused_requests: int = 0
    weight_version: WeightVersion | None = None
    weights_checksum: float | None = Field(
        None,
        description="Gyre: fingerprint of the weights held in memory (gyre.engine.checksum), "
        "compared with the trainer's after each publication; absent where not computed (vLLM).",
    )
    weights_dtype: str | None = Field(None, description="Gyre: dtype the weights are held in.")


class ModelInfo(_Open):
    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: WeightVersion | None = None
    # Gyre additions.
    engine_kind: str | None = Field(
        None, description="embedded | scripted | null (absent on SGLang)."
    )
    engine_id: str | None = None
    max_context_length: int | None = None
    vocab_size: int | None = None
    eos_token_ids: list[int] | None = None
    max_batch: int | None = None
    paused: bool | None = None
    weights_checksum: float | None = Field(
        None,
        description="Gyre: fingerprint of the weights held in memory (gyre.engine.checksum), "
        "compared with the trainer's after each publication; absent where not computed (vLLM).",
    )
    weights_dtype: str | None = Field(None, description="Gyre: dtype the weights are held in.")
    kv_migration: bool | None = Field(
        None,
        description="Gyre: the engine parks, exports and imports a request's K/V "
        "(/kv_export, /kv_import); absent: a rerouted request is prefilled again.",
    )


class ErrorBody(_Open):
    message: str
    type: str = "invalid_request_error"
    code: int = 400


class ErrorResponse(_Open):
    error: ErrorBody


def error_payload(message: str, code: int = 400, type_: str = "invalid_request_error") -> dict:
    """The JSON body every Gyre engine returns on error."""
    return {"error": {"message": message, "type": type_, "code": code}}
