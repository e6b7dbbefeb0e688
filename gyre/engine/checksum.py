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
training): :func:`fingerprints` gives the core's fingerprint for each layout an engine may use,
computed on the values rounded to that layout, which is what such an engine holds. A layout is
a dtype (every parameter in it) or ``"<dtype>+<dtype>-linear"``: the linear layers' weights
in the second, everything else in the first, which is what the embedded engine's
``compute_dtype = "bfloat16"`` holds (gyre.engine.precision). Tied weights count under each
of their names, so an engine that unties a tied head for its bf16 copy sums the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model exists (importing the engine stays cheap)
    import torch

SAMPLE = 4096
DTYPES = ("float32", "bfloat16", "float16")
LINEAR_LAYOUTS = ("float32+bfloat16-linear",)


def layout_name(dtype: str, compute_dtype: str) -> str:
    """The layout an embedded engine holds: its ``dtype``, or linears in ``compute_dtype``."""
    if compute_dtype in (dtype, "float32"):
        return dtype
    return f"{dtype}+{compute_dtype}-linear"


def weights_checksum(
    model: torch.nn.Module, dtype: torch.dtype | None = None, linear: torch.dtype | None = None
) -> float:
    """The fingerprint of ``model``'s parameters as if held in ``dtype`` (None: as they are),
    with the weights and biases of its linear layers in ``linear`` when given."""
    import torch

    lin: set[str] = set()
    if linear is not None:
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                lin.update(f"{name}.{p}" if name else p for p, _ in mod.named_parameters())
    total = 0.0
    named = sorted(model.named_parameters(remove_duplicate=False), key=lambda kv: kv[0])
    with torch.no_grad():
        for rank, (name, p) in enumerate(named):
            flat = p.detach().reshape(-1)
            x = flat[:: max(1, flat.numel() // SAMPLE)]
            to = linear if name in lin else dtype
            if to is not None:
                x = x.to(to)
            total += (rank + 1) * float(x.to(torch.float64).sum())
    return total


def fingerprints(model: torch.nn.Module) -> dict[str, float]:
    """``{layout: fingerprint}`` for every layout an engine may hold the weights in."""
    import torch

    out = {d: weights_checksum(model, getattr(torch, d)) for d in DTYPES}
    for layout in LINEAR_LAYOUTS:
        rest, lin = layout.removesuffix("-linear").split("+")
        out[layout] = weights_checksum(model, getattr(torch, rest), getattr(torch, lin))
    return out
