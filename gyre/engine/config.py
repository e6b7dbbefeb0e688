"""Typed configuration of the engines (composed into Gyre's top-level config by the lead)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class NullEngineConfig(BaseModel):
    """Null engine: answers every request at once with ``num_tokens`` fixed tokens
    (overhead benchmarks of the proxy and the runtime, no model)."""

    engine_id: str | None = None
    num_tokens: int = Field(16, ge=0, description="Tokens per response (capped by max_new_tokens).")
    token_ids: list[int] = Field(
        default_factory=lambda: [100, 101, 102, 103], description="Output cycles through these ids."
    )
    eos_token_id: int | None = Field(
        None, description="If set, the last token is EOS and the finish 'stop'."
    )
    logprob: float = Field(-0.03, le=0.0, description="Log-prob reported for every token.")
    vocab_size: int = Field(1 << 20, ge=1, description="Ids >= this are refused (400).")
    max_context_length: int = Field(1 << 24, ge=1)
    token_delay_s: float = Field(0.0, ge=0.0, description="Sleep per token (0: one instant chunk).")


class ScriptedEngineConfig(BaseModel):
    """Scripted engine (a test double, named as such): replays fixed assistant turns
    through a real tokenizer. The script itself is a :class:`gyre.engine.scripted.ScriptBook`."""

    engine_id: str | None = None
    tokenizer_dir: str = Field(description="HF tokenizer directory (the served model's).")
    tokens_per_chunk: int = Field(
        4, ge=1, description="Tokens released per step (streams in several chunks)."
    )
    token_delay_s: float = Field(
        0.0, ge=0.0, description="Sleep per chunk, to exercise streaming and aborts."
    )
    max_context_length: int = Field(1 << 20, ge=1)


class EmbeddedEngineConfig(BaseModel):
    """Embedded engine: a Hugging Face causal LM on CPU with continuous batching."""

    engine_id: str | None = None
    model_dir: str
    max_batch: int = Field(
        8, ge=1, description="Most requests decoded together in one batched forward."
    )
    max_context_length: int | None = Field(
        None,
        ge=1,
        description="Limit on input + max_new_tokens (default: the model's max_position_embeddings).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="precision of the matmuls: 'bfloat16' keeps a bfloat16 copy of the linear "
        "weights (embeddings and norms stay in `dtype`) and runs every forward under "
        "torch.autocast, the same arithmetic as a trainer with compute_dtype='bfloat16'; "
        "log-probs are computed in float32 from the bfloat16 logits",
    )
    device: str = "cpu"
    packed_linears: bool = Field(
        True,
        description="multiply by oneDNN-packed copies of the linear weights (gyre.engine.packed): "
        "1.7x faster matmuls at 16 rows on an AVX-512 CPU, the same arithmetic to the last bits, "
        "one more copy of the linear weights in memory; a no-op off CPU or without oneDNN",
    )
    attn_implementation: str | None = Field(
        "sdpa", description="HF attn_implementation (sdpa, eager)."
    )
    logprob_mode: Literal["raw", "tempered", "processed"] = Field(
        "raw",
        description="raw: log-softmax of the model's logits at temperature 1 (what a trainer recomputes; "
        "SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB=1); tempered: log-softmax(logits / T) (SGLang's default); "
        "processed: log-prob under the distribution actually sampled from (temperature, top-k, top-p, "
        "min-p applied and renormalised; 0 for greedy).",
    )
    prefill_chunk_tokens: int = Field(
        2048,
        ge=0,
        description="Most prompt tokens prefilled per scheduler step; longer prompts are split so "
        "live requests keep decoding between the chunks (0: whole prompts at once).",
    )
    prefix_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Byte budget (MiB) of the prefix K/V cache reused by continuations (0: off).",
    )
    prefix_cache_min_tokens: int = Field(
        16, ge=1, description="Shortest shared prefix worth reusing."
    )
    kv_migration_mb: float = Field(
        2048.0,
        ge=0,
        description="Byte budget (MiB) for K/V of rerouted requests, parked to leave and imported "
        "to continue (gyre.engine.kv_migrate; 0: off, rerouted requests are prefilled again).",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch.set_num_threads for the worker (None: leave)."
    )
    seed: int = Field(0, description="Engine RNG seed for requests without their own seed.")
    weight_version: int = Field(
        0,
        ge=0,
        description="Policy version of the weights in model_dir (a runtime cell "
        "starting from published weights stamps outputs with it).",
    )


class VllmLaunchConfig(BaseModel):
    """How a vLLM server is launched: ``gyre run``'s ``[engine.vllm]``, and the launch half of
    :class:`VllmEngineConfig` (one model, so each default is written once)."""

    model_config = ConfigDict(extra="forbid")

    python: str | None = Field(
        None, description="the vLLM venv's python (default GYRE_VLLM_PYTHON, then .venv-vllm)"
    )
    kv_cache_gb: int = Field(
        1, ge=1, description="VLLM_CPU_KVCACHE_SPACE per server (whole GiB: vLLM reads an int)"
    )
    start_timeout_s: float = Field(600.0, gt=0, description="wait this long for a server's /health")
    abort_grace_s: float = Field(
        2.0,
        gt=0,
        description="after an abort, wait this long for vLLM's own 'abort' answer (with the "
        "partial output's version spans) before closing the stream",
    )


class VllmEngineConfig(VllmLaunchConfig):
    """vLLM adapter (:mod:`gyre.engine.vllm`): a Gyre engine whose tokens come from a vLLM server's
    token-in/token-out route. ``url`` names a running server; without it the adapter launches one
    from ``model_dir`` with the launch settings (:mod:`gyre.engine.vllm_launch`) and stops it
    with itself."""

    model_config = ConfigDict(extra="ignore")

    engine_id: str | None = None
    model_dir: str | None = Field(
        None, description="The served HF directory (config, vocab, EOS; launched when no url)."
    )
    url: str | None = Field(None, description="A running vLLM server (started with dev mode on).")
    weight_version: int = Field(
        0, ge=0, description="Policy version of the weights the server starts with."
    )
    logprob_mode: Literal["raw", "processed"] = Field(
        "raw",
        description="the log-prob a launched server records (its --logprobs-mode): raw = "
        "raw_logprobs, processed = processed_logprobs (the embedded engine's meanings; vLLM has "
        "no 'tempered'). A server at `url` must have been started with the matching flag.",
    )


class EngineServerConfig(BaseModel):
    """``gyre engine``: which engine, where to listen."""

    kind: Literal["embedded", "scripted", "null", "vllm"] = "embedded"
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
