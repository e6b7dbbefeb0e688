"""Compute precision of the trainer: bfloat16 matmuls over float32 master weights.

With ``TrainerConfig.compute_dtype = "bfloat16"`` the log-prob function runs under
``torch.autocast``: every linear layer, matmul and attention call casts its inputs
(weights included) to bfloat16, which the AMX units of recent x86 CPUs (and every
modern GPU) run several times faster than float32. Nothing else changes: the
parameters, their ``.grad`` (autocast's cast is differentiable, so gradients arrive
in the parameter's dtype), the optimizer state and the residual stream stay in the
model's ``dtype``, and :func:`gyre.train.packed.token_logprobs` takes the
log-softmax of the (bfloat16) logits in float32.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


def compute_autocast(device: torch.device | str, compute_dtype: str) -> Any:
    """A context manager for one forward (and its backward's graph): autocast or nothing."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {compute_dtype!r}"
        )
    low = COMPUTE_DTYPES[compute_dtype]
    if low is None:
        return contextlib.nullcontext()
    dev = torch.device(device).type
    return torch.autocast(device_type=dev, dtype=low)
