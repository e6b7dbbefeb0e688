"""What the embedded engine checks before it serves: the model (a cache layout its batch code
handles, the end-of-sequence ids) and each request (ids in the vocabulary, the context limit,
no sampling parameter it would silently ignore). Kept apart from the engine so the engine's
module is its threads and scheduling."""

from __future__ import annotations

from gyre.engine.base import EngineInputError
from gyre.engine.protocol import GenerateRequest


def eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        v = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


# SGLang sampling parameters this engine does not implement, with their neutral values: a
# request that sets one to anything else is refused (400) rather than silently sampled from a
# different distribution than the caller asked for.
UNSUPPORTED_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "min_new_tokens": 0,
}
UNSUPPORTED_EMPTY = (
    "stop",
    "regex",
    "json_schema",
    "ebnf",
    "structural_tag",
    "logit_bias",
    "custom_params",
)


def check_cache_layout(model) -> None:
    """The batch code re-pads and slices K/V along the sequence axis, which is only right for
    full-attention layers (Llama/Qwen2/Qwen3 families). Refuse others clearly instead of
    decoding garbage (sliding-window, linear-attention or hybrid caches)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    odd = sorted(
        {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    )
    if odd:
        raise ValueError(
            f"the embedded engine supports full-attention decoder models only; this model's cache "
            f"has {', '.join(odd)} layers (use SGLang or vLLM for it)"
        )


def check_request(req: GenerateRequest, vocab_size: int, max_context_length: int) -> None:
    """Refuse (``EngineInputError``, a 400) what this engine cannot serve as asked."""
    bad = [t for t in req.input_ids if t >= vocab_size]
    if bad:
        raise EngineInputError(
            f"input_ids contains ids outside the model's vocabulary [0, {vocab_size}): {bad[:5]}"
        )
    n_in, n_new = len(req.input_ids), req.sampling_params.max_new_tokens
    if n_in + n_new > max_context_length:
        raise EngineInputError(
            f"input ({n_in} tokens) + max_new_tokens ({n_new}) = {n_in + n_new} exceeds the context limit "
            f"{max_context_length} tokens; shorten the input or lower max_new_tokens"
        )
    extra = req.sampling_params.model_extra or {}
    for key, neutral in UNSUPPORTED_NEUTRAL.items():
        if extra.get(key) is not None and extra[key] != neutral:
            raise EngineInputError(
                f"sampling_params.{key}={extra[key]!r} is not supported by the embedded "
                f"engine (only {neutral!r}); use an SGLang engine for it"
            )
    for key in UNSUPPORTED_EMPTY:
        if extra.get(key):
            raise EngineInputError(
                f"sampling_params.{key} is not supported by the embedded engine "
                f"(stop on token ids with stop_token_ids); use an SGLang engine for it"
            )
    bad_stops = [t for t in (req.sampling_params.stop_token_ids or []) if not 0 <= t < vocab_size]
    if bad_stops:
        raise EngineInputError(f"stop_token_ids outside the vocabulary: {bad_stops[:5]}")
