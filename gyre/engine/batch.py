"""Continuous batching for a Hugging Face causal LM: one padded KV cache for all live rows.

How it works (and why):

- A new request is prefilled into its own ``DynamicCache``: in one forward
  when the prompt fits the step's prefill budget, else in chunks across steps
  (chunked prefill), so live rows keep decoding meanwhile. Prompts queued
  together (requests that arrived within one step) share that forward,
  left-padded to the longest when the padding adds at most a quarter
  (``PAD_SLACK``): one multiplication per weight instead of one per prompt;
  each row keeps only its real K/V columns. A prompt prefilled alone is
  bit-identical to ``model.generate``; a shared one agrees to rounding.
- It then joins the decode batch: its K/V tensors are **left-padded** to the
  batch's cache length and concatenated along the batch dimension; a 2D
  attention mask marks the pad columns. Each decode step runs ONE forward of
  shape ``[B, 1]`` for all rows, with per-row ``position_ids`` (the row's real
  length, so RoPE sees true positions), exactly like HF's left-padded batched
  generation.
- The cache's layers are :class:`gyre.engine.kv_slab.SlabLayer`: a step writes
  its new K/V column into spare columns of a buffer instead of concatenating
  the whole cache again (O(1) rather than O(context) bytes per step), and the
  step samples every row from one ``[B, V]`` log-softmax
  (:func:`gyre.engine.sampling.sample_rows`).
- When rows finish or are aborted they are dropped from the batch dimension
  and leading all-pad columns are trimmed, so a batch that shrinks back to one
  row has no padding left (and is again identical to unbatched decoding).

Padded rows can differ from unpadded ones in the last floating-point bits
(a masked softmax over a longer row); greedy tokens agree except at exact
near-ties. Everything here runs in the engine's single worker thread.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gyre.engine.prefix_cache import PrefixCache
from gyre.engine.protocol import FinishReason, SamplingParams
from gyre.engine.sampling import Sampled, sample_row, sample_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# a co-arriving group's padded prefill may compute at most this many times its real tokens
PAD_SLACK = 1.25


@dataclass
class Row:
    """One live request as the worker sees it (no asyncio state here)."""

    rid: str
    params: SamplingParams
    stops: frozenset[int]
    generator: torch.Generator | None
    n_cached: int = 0  # real tokens in the KV cache (prompt + fed outputs)
    fed: list[int] = field(default_factory=list)  # those tokens (for the prefix cache)
    kv_version: int = 0  # weights version its K/V started under (stale K/V never enter the cache)
    n_out: int = 0  # tokens sampled so far
    next_token: int = -1  # sampled, not yet fed to the model


@dataclass
class Prefill:
    """A request whose prompt is (partly) not yet in its cache."""

    row: Row
    ids: list[int]
    cache: Any  # its own DynamicCache (see DecodeBatch.cache)
    done: int  # prompt tokens already in `cache`
    cached: int  # of those, how many came from the prefix cache


@dataclass
class TokenEvent:
    rid: str
    token: int
    raw_logprob: float
    tempered_logprob: float
    processed_logprob: float
    finish: FinishReason | None = None
    cached_tokens: int = 0  # prefill only: input tokens whose K/V came from the prefix cache


def _cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class DecodeBatch:
    model: PreTrainedModel
    rows: list[Row] = field(default_factory=list)
    # A DynamicCache of full-attention layers ([B, H, Lc, D] keys/values each; the engine checks
    # the layout at load), None while no row is live. Any: transformers types its layers as a
    # union of layer kinds, most without .keys/.values.
    cache: Any = None
    mask: torch.Tensor | None = None  # [B, Lc] long, 1 = real token
    prefix_cache: PrefixCache | None = None
    pending: list[Prefill] = field(default_factory=list)  # prefills not finished yet, in order
    version: int = 0  # weights version now loaded
    batch_prefill: bool = True  # prompts queued together share one padded prefill forward
    shared_prefills: int = 0  # prompts prefilled in a forward shared with others (stats, tests)

    def __post_init__(self) -> None:
        self._cache_kw = _cache_kwarg(self.model)
        self.device = next(self.model.parameters()).device

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    # -- rows in and out ------------------------------------------------------------------------
    def _new_cache(self):
        # lazy: transformers stays out of a process that only imports the engine package
        from transformers import DynamicCache

        from gyre.engine.kv_slab import slab_layers

        return slab_layers(DynamicCache(config=self.model.config))

    def admit(self, row: Row, input_ids: list[int]) -> None:
        """Queue a new request's prefill (its own cache, seeded from the prefix cache when possible)."""
        cache = self._new_cache()
        hit = self.prefix_cache.lookup(input_ids) if self.prefix_cache is not None else None
        start = 0
        if hit is not None:
            start, kv = hit
            for i, (k, v) in enumerate(kv):
                cache.update(k, v, i)
        row.fed = list(input_ids)
        row.kv_version = self.version
        self.pending.append(
            Prefill(row=row, ids=list(input_ids), cache=cache, done=start, cached=start)
        )

    def prefill_some(self, budget: int = 0) -> list[TokenEvent]:
        """Run queued prefills, at most ``budget`` prompt tokens (0: no limit; at least one chunk runs).

        A prompt that fits the budget runs in ONE forward (bit-identical to
        ``model.generate``'s prefill); a longer one is split across jobs so the
        decode steps of live rows go on between its chunks (chunked prefill).
        A finished prefill samples the row's first token and the row joins the batch.
        """
        events: list[TokenEvent] = []
        left = budget if budget > 0 else None
        group = self._co_arrived(left)
        if len(group) > 1:
            events.extend(self._prefill_together(group))
            if left is not None:
                left -= sum(len(p.ids) for p in group)
        while self.pending and (left is None or left > 0):
            p = self.pending[0]
            total = len(p.ids)
            n = total - p.done if left is None else min(left, total - p.done)
            ids = torch.tensor([p.ids[p.done : p.done + n]], dtype=torch.long, device=self.device)
            kwargs = {}
            if p.done:
                kwargs["position_ids"] = torch.arange(
                    p.done, p.done + n, device=self.device
                ).unsqueeze(0)
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones((1, p.done + n), dtype=torch.long, device=self.device),
                **{self._cache_kw: p.cache},
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
            p.done += n
            if left is not None:
                left -= n
            if p.done < total:
                continue
            self.pending.pop(0)
            events.append(self._prefilled(p, out.logits[0, -1]))
        return events

    def _prefilled(self, p: Prefill, last_logits: torch.Tensor) -> TokenEvent:
        """A prompt is all in ``p.cache``: sample its first token, and the row joins the batch
        (or, finished at once, leaves its K/V to the prefix cache)."""
        row = p.row
        row.n_cached = len(p.ids)
        ev = self._sampled(row, last_logits)
        ev.cached_tokens = p.cached
        if ev.finish is None:
            self._merge(row, p.cache)
        elif self.prefix_cache is not None:
            self.prefix_cache.put(row.fed, [(layer.keys, layer.values) for layer in p.cache.layers])
        return ev

    def _co_arrived(self, left: int | None) -> list[Prefill]:
        """The queued prefills at the front that can share one forward: whole prompts with
        nothing in their cache yet (no prefix hit, no chunk run), within the token budget."""
        if not self.batch_prefill:
            return []
        group: list[Prefill] = []
        used = width = 0
        for p in self.pending:
            n = len(p.ids)
            if p.done or (left is not None and used + n > left):
                break
            # padding is computed like real tokens: a long prompt beside short ones goes alone
            if (len(group) + 1) * max(width, n) > PAD_SLACK * (used + n):
                break
            group.append(p)
            used, width = used + n, max(width, n)
        return group

    def _prefill_together(self, group: list[Prefill]) -> list[TokenEvent]:
        """Prefill several whole prompts in ONE forward, left-padded to the longest (as HF
        ``generate`` runs a static batch): the linear layers multiply all their tokens at once,
        one call per weight instead of one per prompt. Each row then gets its own cache with
        only its real columns, exactly as if prefilled alone (up to rounding: a padded batch
        sums in another order, as a padded decode step does)."""
        width = max(len(p.ids) for p in group)
        z: dict[str, Any] = dict(dtype=torch.long, device=self.device)
        ids = torch.tensor([[0] * (width - len(p.ids)) + p.ids for p in group], **z)
        mask = torch.tensor([[0] * (width - len(p.ids)) + [1] * len(p.ids) for p in group], **z)
        # real positions 0..n-1 per row (pads get 0: masked, their K/V are dropped below)
        positions = (mask.cumsum(1) - 1).clamp_(min=0)
        cache = self._new_cache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{self._cache_kw: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        del self.pending[: len(group)]  # the group is the queue's front (_co_arrived)
        self.shared_prefills += len(group)
        events = []
        for i, p in enumerate(group):
            lo = width - len(p.ids)
            for li, layer in enumerate(cache.layers):
                p.cache.update(
                    layer.keys[i : i + 1, :, lo:, :].contiguous(),
                    layer.values[i : i + 1, :, lo:, :].contiguous(),
                    li,
                )
            p.done = len(p.ids)
            events.append(self._prefilled(p, out.logits[i, -1]))
        return events

    def _merge(self, row: Row, cache) -> None:
        length = row.n_cached
        if not self.rows:
            self.rows, self.cache = [row], cache
            self.mask = torch.ones((1, length), dtype=torch.long, device=self.device)
            return
        assert self.mask is not None  # live rows have a mask
        width = max(self.width, length)
        pad_batch, pad_row = width - self.width, width - length
        for lb, lr in zip(self.cache.layers, cache.layers):
            lb.keys = torch.cat([_left_pad(lb.keys, pad_batch), _left_pad(lr.keys, pad_row)], dim=0)
            lb.values = torch.cat(
                [_left_pad(lb.values, pad_batch), _left_pad(lr.values, pad_row)], dim=0
            )
        z: dict[str, Any] = dict(dtype=torch.long, device=self.device)
        row_mask = torch.cat([torch.zeros((1, pad_row), **z), torch.ones((1, length), **z)], 1)
        batch_mask = torch.cat([torch.zeros((len(self.rows), pad_batch), **z), self.mask], 1)
        self.mask = torch.cat([batch_mask, row_mask], 0)
        self.rows.append(row)

    def new_weights(self, version: int) -> None:
        """Weights changed: cached prefixes are stale; live rows keep their K/V (SGLang's in_place)."""
        self.version = version
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def remove(self, rids: set[str]) -> None:
        """Drop rows (finished or aborted) and trim pad columns no row needs any more."""
        self.pending = [p for p in self.pending if p.row.rid not in rids]
        keep = [i for i, r in enumerate(self.rows) if r.rid not in rids]
        if len(keep) == len(self.rows):
            return
        if self.prefix_cache is not None:  # leave their K/V for a continuation of the conversation
            width = self.width
            for i, r in enumerate(self.rows):
                if r.rid in rids and r.kv_version == self.version:
                    lo = (
                        width - r.n_cached
                    )  # rows are left-padded: real tokens are the last n_cached
                    self.prefix_cache.put(
                        r.fed,
                        [
                            (layer.keys[i : i + 1, :, lo:, :], layer.values[i : i + 1, :, lo:, :])
                            for layer in self.cache.layers
                        ],
                    )
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            return
        assert self.mask is not None  # live rows have a mask
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask.index_select(0, idx)
        first = int(torch.nonzero(self.mask.sum(0) > 0)[0])
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first:, :]
            layer.values = layer.values.index_select(0, idx)[:, :, first:, :]

    # -- one decode step ------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Feed every row's pending token in one ``[B, 1]`` forward and sample the next ones.
        Finished rows leave the batch."""
        if not self.rows:
            return []
        assert self.mask is not None  # live rows have a mask
        tokens = torch.tensor(
            [[r.next_token] for r in self.rows], dtype=torch.long, device=self.device
        )
        positions = torch.tensor(
            [[r.n_cached] for r in self.rows], dtype=torch.long, device=self.device
        )
        self.mask = torch.cat(
            [self.mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=self.device)], 1
        )
        out = self.model(
            input_ids=tokens,
            attention_mask=self.mask,
            position_ids=positions,
            **{self._cache_kw: self.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        sampled = sample_rows(
            out.logits[:, -1].cpu(), [r.params for r in self.rows], [r.generator for r in self.rows]
        )
        events = []
        for row, s in zip(self.rows, sampled):
            row.n_cached += 1
            row.fed.append(row.next_token)
            events.append(self._event(row, s))
        self.remove({ev.rid for ev in events if ev.finish is not None})
        return events

    def _sampled(self, row: Row, logits: torch.Tensor) -> TokenEvent:
        return self._event(row, sample_row(logits.cpu(), row.params, row.generator))

    def _event(self, row: Row, s: Sampled) -> TokenEvent:
        tok, raw_lp, temp_lp, proc_lp = s
        row.n_out += 1
        row.next_token = tok
        finish = None
        if tok in row.stops:
            finish = FinishReason(type="stop", matched=tok)
        elif row.n_out >= row.params.max_new_tokens:
            finish = FinishReason(type="length", length=row.n_out)
        return TokenEvent(
            rid=row.rid,
            token=tok,
            raw_logprob=raw_lp,
            tempered_logprob=temp_lp,
            processed_logprob=proc_lp,
            finish=finish,
        )


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """Left-pad a [B, H, L, D] tensor with n zero columns along L."""
    if n == 0:
        return t
    pad = torch.zeros((t.shape[0], t.shape[1], n, t.shape[3]), dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=2)
