"""Linear layers on prepacked oneDNN weights: the embedded engine's matmuls at small batches.

A decode step multiplies a handful of rows (the live requests) by every weight matrix of the
model once. ``torch.nn.functional.linear`` hands that to MKL's sgemm, which repacks the
weight into its blocked panel layout on every call: at 16 rows the repacking costs about as
much as the multiplication, and a 16-row step of SmolLM2-135M ran its linears at ~44 GFLOP/s
on one thread of this machine's AVX-512 EPYC. oneDNN can pack a weight once, ahead of time,
for a given batch size (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's CPU
freezing pass uses); the step then reads the packed copy straight: 76 GFLOP/s at 16 rows in
float32 and 141 in bfloat16 (30 layers' weights cycled past the caches, measured in
docs/measurements.md), the same at one row, and ~10 % more for a prefill.

The values are the same float32 (or bfloat16) arithmetic, summed in another order: outputs
differ from MKL's in the last bits (~4e-6 on unit-scale activations), as padded and unpadded
rows already do, far inside the engine/trainer agreement bound
(tests/integration/test_real_model_mismatch.py).

:func:`pack_linears` turns a model's ``nn.Linear`` layers into :class:`PackedLinear` (same
parameters, same ``state_dict``; the packed copy is a plain attribute), and :func:`repack`
refreshes every packed copy after the weights changed in place (a reload, a received
bucket): a stale packed copy would serve the old policy, so the engine calls it wherever it
writes weights. The packed copy costs one more copy of the linear weights in memory (538 MB
for SmolLM2-135M in float32: its tied head is packed too). Without oneDNN (or off CPU, or
with gradients on) a layer computes as ``nn.Linear`` does.
"""

from __future__ import annotations

from typing import Any

import torch

PACKABLE = (torch.float32, torch.bfloat16)
# The batch size the weights are packed for. Any batch runs on them; measured on SmolLM2's
# shapes (1 thread, rows 1/8/16/32, GFLOP/s): packed for 8: 6/47/68/78, for 16: 7/50/72/82,
# for 32: 5/40/62/74. So 16, whatever the engine's max_batch.
BATCH_HINT = 16


def available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build can pack and run linears of ``dtype`` with oneDNN here."""
    ops = torch.ops.mkldnn
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    ):
        return False
    if dtype == torch.bfloat16:
        return bool(ops._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` that multiplies by a oneDNN-packed copy of its weight when it can."""

    _packed: torch.Tensor | None = None

    def pack(self, batch_hint: int) -> None:
        """(Re)build the packed copy from ``weight`` (after any change to its values)."""
        w = self.weight.detach()
        if w.device.type != "cpu" or w.dtype not in PACKABLE or not available(w.dtype):
            self._packed = None
            return
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w, max(1, batch_hint))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed
        if packed is None or torch.is_grad_enabled() or x.device.type != "cpu":
            return super().forward(x)
        w = self.weight
        if x.dtype != w.dtype:
            # under CPU autocast (compute_dtype = "bfloat16") F.linear casts its input to the
            # autocast dtype, which is the weight's; do the same, anything else as nn.Linear
            if not (
                torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == w.dtype
            ):
                return super().forward(x)
            x = x.to(w.dtype)
        bias = self.bias
        if bias is not None and bias.dtype != w.dtype:
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def pack_linears(model: torch.nn.Module, batch_hint: int = BATCH_HINT) -> int:
    """Make every ``nn.Linear`` of ``model`` a :class:`PackedLinear` packed for ``batch_hint``
    rows; returns how many got a packed copy (0 where oneDNN cannot serve them)."""
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear:
            mod.__class__ = PackedLinear
        if isinstance(mod, PackedLinear):
            mod.pack(batch_hint)
            n += mod._packed is not None
    return n


def repack(model: torch.nn.Module, batch_hint: int = BATCH_HINT) -> None:
    """Refresh every packed copy from the current weights (after they changed in place)."""
    for mod in model.modules():
        if isinstance(mod, PackedLinear):
            mod.pack(batch_hint)


def unpack(model: torch.nn.Module) -> None:
    """Back to plain ``nn.Linear`` (the packed copies freed)."""
    for mod in model.modules():
        if isinstance(mod, PackedLinear):
            mod._packed = None
            plain: Any = mod  # the instance changes class; its type as narrowed above does not
            plain.__class__ = torch.nn.Linear
