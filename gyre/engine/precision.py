"""bfloat16 serving for the embedded engine: bf16 linear weights under torch.autocast.

``EmbeddedEngineConfig.compute_dtype = "bfloat16"`` keeps the weights loaded in
``dtype`` (float32) for everything that is not a matmul (embedding lookup, RMSNorm
scales, the residual stream) and stores a bfloat16 copy of every ``nn.Linear``
weight. Each forward runs under ``torch.autocast``, which casts activations to
bfloat16 at each linear/attention call and finds the weight already there, so a
decode step pays no per-step weight cast. The arithmetic is the one a trainer with
``compute_dtype = "bfloat16"`` runs (autocast over float32 masters: the same
bf16-rounded weights, the same ops in the same precision), which keeps the
behaviour log-probs close to the trainer's. Sampling and the reported log-probs
use float32 (``sample_row`` widens the bf16 logits before the log-softmax).

A tied output head (``lm_head.weight is embed_tokens.weight``, e.g. SmolLM2) is
untied into its own bfloat16 copy so that the input embedding stays in float32;
weight reloads still fill both (``state_dict`` names both keys).
"""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)

COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


def to_compute_dtype(model: M, compute_dtype: str) -> M:
    """Give every linear layer a ``compute_dtype`` copy of its weight (no-op for float32)."""
    low = COMPUTE_DTYPES[compute_dtype]
    if low is None:
        return model
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and mod.weight.dtype != low:
            # A new Parameter (not .data = ...) so a weight shared with an embedding is untied.
            mod.weight = torch.nn.Parameter(mod.weight.detach().to(low), requires_grad=False)
            if mod.bias is not None:
                mod.bias = torch.nn.Parameter(mod.bias.detach().to(low), requires_grad=False)
    return model


def compute_autocast(device: torch.device | str, compute_dtype: str) -> Any:
    """Autocast for one worker job, or nothing for float32."""
    low = COMPUTE_DTYPES[compute_dtype]
    if low is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=low)
