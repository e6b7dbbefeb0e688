"""Model FLOPs and model FLOPs utilisation (MFU) against this machine's measured matmul peak.

Counting rule (the standard one, made exact for packed rows):

- a forward pass costs 2 FLOPs per weight of every linear layer per token that goes
  through it (the "2N" rule), plus attention: ``QK^T`` and ``AV`` cost
  ``2 * 2 * n_layers * n_heads * head_dim`` FLOPs per (query, key) pair actually
  computed (what :attr:`gyre.train.packed.SegmentPlan.attention_pairs` counts);
- the output head runs only on the rows whose logits are needed: the parents of the
  target tokens in training (``token_logprobs`` gathers them first), one row per
  generated token in decoding;
- training (forward + backward) is 3x the forward (the "6N" rule: the backward
  costs two matmuls per forward matmul);
- the input embedding is a lookup, not a matmul, and is not counted (it is still
  counted once as the head's weight when the head is tied to it).

MFU = model FLOPs / (seconds * peak), with the peak measured here by
:func:`matmul_peak` (an ``n^3`` matmul in the compute dtype, on the threads the
work itself ran on), so the ratio says how close the step came to what this CPU's
matmul units can do, not to a datasheet figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs from a causal LM."""

    body_params: int  # weights of every linear layer except the output head
    head_params: int  # weights of the output head (vocab x hidden)
    n_layers: int
    attn_width: int  # n_heads * head_dim (queries)

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """From a Hugging Face causal LM (``get_output_embeddings`` and ``config``)."""
        head = model.get_output_embeddings()
        head_w = head.weight if head is not None else None
        body = sum(
            m.weight.numel()
            for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        )
        cfg = model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(
            body_params=int(body),
            head_params=int(head_w.numel()) if head_w is not None else 0,
            n_layers=int(cfg.num_hidden_layers),
            attn_width=int(cfg.num_attention_heads * hd),
        )

    def forward_flops(self, tokens: int, head_rows: int, attention_pairs: int) -> float:
        """FLOPs of one forward over ``tokens`` tokens, ``head_rows`` logit rows."""
        return (
            2.0 * self.body_params * tokens
            + 2.0 * self.head_params * head_rows
            + 4.0 * self.n_layers * self.attn_width * attention_pairs
        )

    def train_flops(self, tokens: int, head_rows: int, attention_pairs: int) -> float:
        """FLOPs of forward + backward (3x the forward)."""
        return 3.0 * self.forward_flops(tokens, head_rows, attention_pairs)

    def decode_flops(self, generated: int, context_pairs: int) -> float:
        """FLOPs of generating ``generated`` tokens that attended to ``context_pairs`` keys in all."""
        return self.forward_flops(generated, generated, context_pairs)


def causal_pairs(prompt_len: int, new_tokens: int) -> int:
    """(query, key) pairs of decoding ``new_tokens`` after a ``prompt_len`` prompt (with KV cache)."""
    return sum(prompt_len + i + 1 for i in range(new_tokens))


def matmul_peak(
    dtype: torch.dtype, n: int = 2048, threads: int | None = None, repeats: int = 5
) -> float:
    """Measured FLOP/s of an ``n x n @ n x n`` matmul (best of ``repeats``, after a warm-up).

    ``threads`` sets torch's intra-op threads for the measurement only (default: as
    they are). On a shared machine the best of several runs is the closest to the
    hardware's rate; it is an achievable peak, not a datasheet one.
    """
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g).to(dtype)
        b = torch.randn(n, n, generator=g).to(dtype)
        torch.mm(a, b)  # warm-up (kernel selection, page faults)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n**3 / best
    finally:
        torch.set_num_threads(old)


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak (0 when nothing was timed)."""
    if seconds <= 0 or peak_flops <= 0:
        return 0.0
    return flops / seconds / peak_flops
