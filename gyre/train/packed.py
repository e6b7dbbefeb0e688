"""Per-token log-probs of a :class:`~gyre.trace.packing.PackedSequence` under a HF causal LM.

``token_logprobs(model, seq)`` returns a length-L tensor holding
``log p(input_ids[i] | ancestors of i)`` at every target position (0 elsewhere),
with gradient, for Hugging Face Qwen2/Qwen3-family models. The same call serves
both packing modes because a row carries its own ``parent`` array.

Three implementations, chosen by ``impl``:

``"segments"`` (default; the tree attention we train with)
    Runs the model's own modules layer by layer over the packed tokens. Every
    per-token piece (embedding, norms, q/k/v/o projections, q_norm/k_norm, MLP)
    runs once over the L packed tokens, so MLP work tracks *unique* tokens.
    Attention runs per *segment*: a maximal run of tokens that each follow
    their predecessor (``parent[i] == i - 1``). In depth-first pre-order the
    ancestors of a segment are a stack of prefixes of earlier segments, so a
    segment's queries attend to the concatenated keys/values of those prefixes
    plus a causal block over itself. Attention work is therefore the sum over
    tokens of their ancestor count (what the expanded paths would cost), never
    the O(L^2) of a dense mask over the packed row. Works on CPU with autograd
    (plain SDPA calls), which ``flex_attention`` does not in torch 2.13.

``"dense"``
    One ordinary HF forward with a 4D boolean ancestor mask (L x L). Simple and
    exact, O(L^2) in the packed length: the reference for the mask semantics,
    and a fine choice on GPU for short rows.

``"expand"``
    One plain HF forward per root-to-leaf chain of the row (no custom mask at
    all), each target taken from the first chain that contains it. The slow,
    obviously-correct reference used by the exactness tests.

``"flex"``
    The same layer loop with ``flex_attention`` and the O(L) interval mask
    ``kv <= q < subtree_end[kv]`` (valid for depth-first pre-order rows, which
    is what ``pack`` emits). Meant for GPUs (compiled there). On CPU, torch
    2.13 runs flex forward only (no backward), so here it is tested for
    forward exactness only; GPU training with it is untested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from gyre.trace.packing import PackedSequence

IMPLS = ("auto", "segments", "dense", "expand", "flex")

# Largest [queries x keys] boolean mask a segment may materialise (64 MiB); a bigger
# segment uses the padded-causal form instead (exact, costs up to ctx^2/2 extra pairs).
MAX_MASK_ELEMENTS = 1 << 26


@dataclass
class SegmentPlan:
    """Where each segment's attention context comes from.

    ``bounds[s] = (start, end)`` of segment s in the row; ``ctx[s]`` is a
    LongTensor of row indices of all ancestors of the segment's first token
    (in root-to-parent order), empty for a segment that starts at a root.
    """

    bounds: list[tuple[int, int]]
    ctx: list[torch.Tensor | None]

    @property
    def attention_pairs(self) -> int:
        """(query, key) pairs the plan computes: sum over tokens of ancestors+1."""
        total = 0
        for (s, e), c in zip(self.bounds, self.ctx):
            n = e - s
            total += n * (0 if c is None else c.numel()) + n * (n + 1) // 2
        return total


def plan_segments(parent: list[int], device: torch.device | None = None) -> SegmentPlan:
    """Split a row into segments and gather each one's ancestor indices."""
    n = len(parent)
    bounds: list[tuple[int, int]] = []
    ranges: list[list[tuple[int, int]]] = []  # per segment: ancestor ranges [a, b)
    seg_of = [0] * n
    start = 0
    for i in range(n + 1):
        if i == n or (i > 0 and parent[i] != i - 1):
            if i > start:
                bounds.append((start, i))
            start = i
        if i < n:
            p = parent[i]
            if not -1 <= p < i:
                raise ValueError(f"token {i}: parent {p} must be -1 or an earlier token")
            seg_of[i] = len(bounds)
    ctx: list[torch.Tensor | None] = []
    for _s, (a, _b) in enumerate(bounds):
        p = parent[a]
        if p < 0:
            ranges.append([])
            ctx.append(None)
            continue
        q = seg_of[p]
        r = ranges[q] + [(bounds[q][0], p + 1)]
        ranges.append(r)
        ctx.append(torch.cat([torch.arange(x, y, device=device) for x, y in r]))
    return SegmentPlan(bounds=bounds, ctx=ctx)


def _modules(model):
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    cfg = model.config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        raise NotImplementedError(
            "sliding-window attention layers are not supported by packed forward"
        )
    return base, head, cfg


def supports_segments(model) -> bool:
    """True for decoder stacks shaped like Qwen2/Qwen3/Llama (what the segment forward re-runs)."""
    try:
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        layer = base.layers[0]
        attn = layer.self_attn
        ok = all(
            hasattr(attn, n)
            for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
        )
        ok = ok and all(
            hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")
        )
        ok = (
            ok
            and hasattr(base, "rotary_emb")
            and hasattr(base, "embed_tokens")
            and hasattr(base, "norm")
        )
        layer_types = getattr(model.config, "layer_types", None) or []
        return bool(ok) and "sliding_attention" not in layer_types
    except (AttributeError, IndexError, TypeError):
        return False


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _layer_loop(model, ids: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
    """Final hidden states (L, D): the model's own modules, with attention done by ``attend``.

    ``attend(q, k, v, scale, gqa) -> (1, H, L, hd)`` gets rotary-embedded
    ``q`` (1, H, L, hd) and ``k``/``v`` (1, Hkv, L, hd).
    """
    base, _head, _cfg = _modules(model)
    x = base.embed_tokens(ids)[None]  # (1, L, D)
    cos, sin = base.rotary_emb(x, pos[None])
    cos, sin = cos[:, None], sin[:, None]  # (1, 1, L, hd)
    # HF's switch (model.gradient_checkpointing_enable()): keep each layer's input only and
    # recompute its inside in the backward
    recompute = getattr(base, "gradient_checkpointing", False) and torch.is_grad_enabled()
    for layer in base.layers:
        if recompute:
            x = torch.utils.checkpoint.checkpoint(
                _decoder_layer, layer, x, cos, sin, attend, use_reentrant=False
            )
        else:
            x = _decoder_layer(layer, x, cos, sin, attend)
    return base.norm(x)[0]


def _decoder_layer(layer, x: torch.Tensor, cos, sin, attend) -> torch.Tensor:
    """One pre-norm decoder layer of a Qwen2/Qwen3/Llama-shaped model on ``x`` (1, L, D)."""
    L = x.shape[1]
    attn = layer.self_attn
    hd = attn.head_dim
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(1, L, -1, hd)
    k = attn.k_proj(h).view(1, L, -1, hd)
    v = attn.v_proj(h).view(1, L, -1, hd).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
        k = attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    o = attend(q, k, v, attn.scaling, q.shape[1] != k.shape[1])
    x = x + attn.o_proj(o.transpose(1, 2).reshape(1, L, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _segment_attention(parent: list[int], device):
    """Per-segment tree attention (see module docstring) as an ``attend`` callback."""
    plan = plan_segments(parent, device=device)
    # One gather (and one split) per layer instead of per-segment slicing: in autograd,
    # every slice/index_select of a full tensor backpropagates into a full-size zero
    # tensor, which made per-segment slicing O(segments x L) in the backward pass.
    sizes = [e - s for s, e in plan.bounds]
    has_ctx = any(c is not None for c in plan.ctx)
    kv_idx, kv_sizes = None, sizes
    if has_ctx:
        kv_idx = torch.cat(
            [
                torch.arange(s, e, device=device)
                if c is None
                else torch.cat((c, torch.arange(s, e, device=device)))
                for (s, e), c in zip(plan.bounds, plan.ctx)
            ]
        )
        kv_sizes = [
            (0 if c is None else c.numel()) + (e - s) for (s, e), c in zip(plan.bounds, plan.ctx)
        ]
    masks: dict[tuple[int, int], torch.Tensor] = {}
    for (s, e), c in zip(plan.bounds, plan.ctx):
        if c is not None and (e - s) * (c.numel() + e - s) > MAX_MASK_ELEMENTS:
            continue  # handled without a mask (see attend)
        if c is not None and (e - s, c.numel()) not in masks:
            n, nc = e - s, c.numel()
            m = torch.ones(n, nc + n, dtype=torch.bool, device=device)
            m[:, nc:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            masks[(n, nc)] = m

    def attend(q, k, v, scale, gqa):
        qs_all = q.split(sizes, dim=2)
        if kv_idx is not None:
            ks_all = k.index_select(2, kv_idx).split(kv_sizes, dim=2)
            vs_all = v.index_select(2, kv_idx).split(kv_sizes, dim=2)
        else:
            ks_all, vs_all = k.split(sizes, dim=2), v.split(sizes, dim=2)
        outs = []
        for qs, ks, vs, c in zip(qs_all, ks_all, vs_all, plan.ctx):
            if c is None:
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
                )
            elif (qs.shape[2], c.numel()) in masks:
                o = F.scaled_dot_product_attention(
                    qs,
                    ks,
                    vs,
                    attn_mask=masks[(qs.shape[2], c.numel())],
                    scale=scale,
                    enable_gqa=gqa,
                )
            else:
                # Mask too big to materialise: prepend nc zero queries so that plain
                # (top-left) causal attention over [ctx; segment] is exactly "all of ctx
                # + causal over the segment" for the real queries; drop the padding rows.
                nc = c.numel()
                pad = qs.new_zeros(qs.shape[0], qs.shape[1], nc, qs.shape[3])
                o = F.scaled_dot_product_attention(
                    torch.cat((pad, qs), dim=2), ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
                )[:, :, nc:]
            outs.append(o)
        return torch.cat(outs, dim=2)

    return attend


def subtree_end(parent: list[int]) -> list[int]:
    """For a row in depth-first pre-order: ``end[j]`` such that j's subtree is rows [j, end[j]).

    Then "j is i or an ancestor of i" is simply ``j <= i < end[j]``: an O(L)
    description of the tree mask (what a flex_attention ``mask_mod`` needs).
    Raises ValueError if the row is not in pre-order (every ``pack`` row is).
    """
    n = len(parent)
    stack: list[int] = []
    for i, p in enumerate(parent):
        while stack and stack[-1] != p:
            stack.pop()
        if p >= 0 and not stack:
            raise ValueError(
                f"token {i}: row is not in depth-first pre-order (parent {p} already closed)"
            )
        stack.append(i)
    end = list(range(1, n + 1))
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0 and end[i] > end[p]:
            end[p] = end[i]
    return end


def _flex_attention(parent: list[int], device):
    """flex_attention with the interval mask ``kv <= q < end[kv]`` (the GPU path).

    On CPU torch 2.13 runs flex forward (eagerly, slowly) but has no backward,
    so this is tested here for forward exactness only; training with it needs
    a CUDA device (untested on this machine).
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    end = torch.tensor(subtree_end(parent), dtype=torch.long, device=device)
    L = len(parent)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx < end[kv_idx])

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=L, KV_LEN=L, device=device)
    fn: Callable[..., torch.Tensor] = flex_attention
    if device.type == "cuda":  # compiled kernels on GPU; eager reference elsewhere
        fn = torch.compile(flex_attention, dynamic=True)

    def attend(q, k, v, scale, gqa):
        return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    return attend


def ancestor_mask(parent: list[int], device: torch.device | None = None) -> torch.Tensor:
    """Dense (L, L) boolean mask: ``m[i, j]`` iff j is i or an ancestor of i."""
    n = len(parent)
    try:
        end = torch.tensor(subtree_end(parent), dtype=torch.long, device=device)
        i = torch.arange(n, device=device)
        return (i[None, :] <= i[:, None]) & (i[:, None] < end[None, :])
    except ValueError:  # not pre-order: build row by row
        m = torch.zeros(n, n, dtype=torch.bool, device=device)
        for r, p in enumerate(parent):
            if p >= 0:
                m[r, : p + 1] = m[p, : p + 1]
            m[r, r] = True
        return m


def _wide(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax in at least float32 (bf16/fp16 models), keeping float64 models in float64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _gather_logprobs(
    model,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    targets: torch.Tensor,
    parents: torch.Tensor,
    L: int,
) -> torch.Tensor:
    head = model.get_output_embeddings()
    logits = _wide(head(hidden.index_select(0, parents)))
    lp = torch.log_softmax(logits, dim=-1).gather(1, ids.index_select(0, targets)[:, None])[:, 0]
    return torch.zeros(L, dtype=lp.dtype, device=lp.device).index_put((targets,), lp)


def token_logprobs(model, seq: PackedSequence, impl: str = "auto") -> torch.Tensor:
    """log p(token | its ancestors) at each target of ``seq`` (0 elsewhere), with grad.

    ``impl``: ``"auto"`` (``"segments"`` for Qwen2/Qwen3/Llama-shaped models,
    else ``"dense"``), ``"segments"``, ``"dense"`` or ``"expand"``; see the
    module docstring.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    seq.validate()
    L = len(seq)
    dev = next(model.parameters()).device
    ids = torch.tensor(seq.input_ids, dtype=torch.long, device=dev)
    pos = torch.tensor(seq.position_ids, dtype=torch.long, device=dev)
    tgt_list = [i for i, t in enumerate(seq.is_target) if t]
    if L == 0 or not tgt_list:
        # Keep the graph connected so callers can still .backward() a zero loss.
        wdt = torch.promote_types(next(model.parameters()).dtype, torch.float32)
        return torch.zeros(L, device=dev, dtype=wdt) + 0.0 * sum(
            p.sum() for p in model.parameters() if p.requires_grad
        )
    targets = torch.tensor(tgt_list, dtype=torch.long, device=dev)
    parents = torch.tensor([seq.parent[i] for i in tgt_list], dtype=torch.long, device=dev)
    if impl == "auto":
        impl = "segments" if supports_segments(model) else "dense"
    if impl in ("segments", "flex"):
        if not supports_segments(model):
            raise NotImplementedError(
                f"impl={impl!r} needs a Qwen2/Qwen3/Llama-shaped model; use impl='dense'"
            )
        attend = (_segment_attention if impl == "segments" else _flex_attention)(seq.parent, dev)
        hidden = _layer_loop(model, ids, pos, attend)
        return _gather_logprobs(model, hidden, ids, targets, parents, L)
    if impl == "dense":
        hidden = _dense_hidden(model, seq.parent, ids, pos)
        return _gather_logprobs(model, hidden, ids, targets, parents, L)
    return _expand_logprobs(model, seq, ids, pos)


def _dense_hidden(model, parent: list[int], ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Last hidden states of one forward over the whole tree, under the dense ancestor mask."""
    L, dev = len(parent), ids.device
    mask = ancestor_mask(parent, device=dev)
    if getattr(model.config, "_attn_implementation", "sdpa") != "sdpa":
        mask = torch.zeros(L, L, device=dev, dtype=next(model.parameters()).dtype).masked_fill(
            ~mask, float("-inf")
        )
    out = model.model(input_ids=ids[None], position_ids=pos[None], attention_mask=mask[None, None])
    return out.last_hidden_state[0]


def _expand_logprobs(
    model, seq: PackedSequence, ids: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """Target log-probs from one plain forward per root-to-leaf chain (each target once)."""
    L, dev = len(seq), ids.device
    has_child = [False] * L
    for p in seq.parent:
        if p >= 0:
            has_child[p] = True
    out = torch.zeros(
        L, device=dev, dtype=torch.promote_types(next(model.parameters()).dtype, torch.float32)
    )
    done = [False] * L
    pieces_idx: list[torch.Tensor] = []
    pieces_val: list[torch.Tensor] = []
    for leaf in range(L):
        if has_child[leaf]:
            continue
        chain = []
        i = leaf
        while i >= 0:
            chain.append(i)
            i = seq.parent[i]
        chain.reverse()
        want = [j for j, t in enumerate(chain) if seq.is_target[t] and not done[t]]
        if not want:
            continue
        cidx = torch.tensor(chain, dtype=torch.long, device=dev)
        logits = _wide(model(input_ids=ids[cidx][None], position_ids=pos[cidx][None]).logits[0])
        lp = torch.log_softmax(logits, dim=-1)
        w = torch.tensor(want, dtype=torch.long, device=dev)
        vals = lp[w - 1].gather(1, ids[cidx][w][:, None])[:, 0]
        for j in want:
            done[chain[j]] = True
        pieces_idx.append(cidx[w])
        pieces_val.append(vals)
    return out.index_put((torch.cat(pieces_idx),), torch.cat(pieces_val))
