"""Token sampling and behaviour log-probs for the embedded engine (torch).

``sample_rows`` serves a decode step: one log-softmax over the whole ``[B, V]`` batch and one
``argmax`` for the greedy rows, then one copy of the chosen ids and log-probs to Python, so a
step pays a handful of tensor ops rather than a few per row; a sampling row (temperature,
top-k/p, min-p, its own generator) still draws from its own row with ``sample_row``.

Three log-probs are computed for every sampled token (``EmbeddedEngineConfig.logprob_mode``
picks the one reported):

- ``raw`` (default): ``log_softmax(logits)[token]``, the model's own distribution at
  temperature 1, before temperature/top-k/top-p/min-p. It is what the trainer
  recomputes with a forward pass, so the importance ratio compares like with like;
  SGLang returns it with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``.
- ``tempered``: ``log_softmax(logits / T)[token]`` (raw for greedy), no truncation:
  SGLang's default.
- ``processed``: the log-prob under the distribution actually sampled from (tempered,
  truncated by top-k/top-p/min-p, renormalised). Greedy samples from a point mass, so
  it is 0.0.

At temperature 1 without truncation all three agree. Greedy is ``argmax`` of the raw
logits, exactly as ``model.generate(do_sample=False)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from gyre.engine.protocol import SamplingParams


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return g


def processed_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p applied to one row of float32 logits (masked entries -inf)."""
    x = logits / p.temperature
    if p.top_k is not None and p.top_k > 0 and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    if p.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return x


class Sampled(NamedTuple):
    token: int
    raw: float
    tempered: float
    processed: float


def sample_row(
    logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
) -> Sampled:
    """Sample one token from a row of logits, with its three log-probs."""
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    if p.greedy:
        tok = int(torch.argmax(logits))
        return Sampled(token=tok, raw=float(raw[tok]), tempered=float(raw[tok]), processed=0.0)
    return _draw(logits, raw, p, generator)


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[Sampled]:
    """``sample_row`` for every row of ``[B, V]`` logits at once; the same tokens and log-probs
    (the log-softmax of a row does not depend on the rows beside it)."""
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    out: list[Sampled | None] = [None] * len(params)
    if greedy:
        idx = torch.tensor(greedy, dtype=torch.long, device=logits.device)
        toks = torch.argmax(logits.index_select(0, idx), dim=-1)
        lps = raw.index_select(0, idx).gather(1, toks.unsqueeze(1)).squeeze(1)
        for i, tok, lp in zip(greedy, toks.tolist(), lps.tolist()):
            out[i] = Sampled(token=tok, raw=lp, tempered=lp, processed=0.0)
    for i, p in enumerate(params):
        if out[i] is None:
            out[i] = _draw(logits[i], raw[i], p, generators[i])
    return [s for s in out if s is not None]


def _draw(
    logits: torch.Tensor, raw: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
) -> Sampled:
    x = processed_logits(logits, p)
    logp = torch.log_softmax(x, dim=-1)
    tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
    tempered = (
        float(torch.log_softmax(logits / p.temperature, dim=-1)[tok])
        if p.temperature != 1.0
        else float(raw[tok])
    )
    return Sampled(token=tok, raw=float(raw[tok]), tempered=tempered, processed=float(logp[tok]))
