"""A cheap fingerprint of a model's weights, so a publication can be checked end to end.

After every publication the core and each engine compute the same number from what they
hold in memory, and the runtime compares them: an engine whose reload silently kept the old
weights (or loaded another directory) is caught at once instead of sampling the next burst
from a policy nobody trains. Hashing the safetensors file would only show that the file was
read; this shows what the engine serves.

The fingerprint is a float64 sum over a fixed strided sample of every parameter (at most
:data:`SAMPLE` elements each), each tensor's sum weighted by its rank in name order, so
swapping two tensors changes it too. A training step moves every element with a gradient
(Adam: by about the learning rate), so it moves the sample; the sum is exact in float64 for a
given set of values, so equal weights give bit-equal fingerprints. It costs a few milliseconds
for a 135M model.

An engine may hold its weights in another dtype than the trainer (bfloat16 serving of float32
training): :func:`fingerprints` gives the core's fingerprint for each dtype an engine may use,
computed on the values rounded to that dtype, which is what such an engine holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model exists (importing the engine stays cheap)
    import torch

SAMPLE = 4096
DTYPES = ("float32", "bfloat16", "float16")


def weights_checksum(model: torch.nn.Module, dtype: torch.dtype | None = None) -> float:
    """The fingerprint of ``model``'s parameters (tied weights once), as if held in ``dtype``."""
    import torch

    total = 0.0
    with torch.no_grad():
        for rank, (_, p) in enumerate(sorted(model.named_parameters(), key=lambda kv: kv[0])):
            flat = p.detach().reshape(-1)
            x = flat[:: max(1, flat.numel() // SAMPLE)]
            if dtype is not None:
                x = x.to(dtype)
            total += (rank + 1) * float(x.to(torch.float64).sum())
    return total


def fingerprints(model: torch.nn.Module) -> dict[str, float]:
    """``{dtype name: fingerprint}`` for every dtype an engine may hold the weights in."""
    import torch

    return {d: weights_checksum(model, getattr(torch, d)) for d in DTYPES}
