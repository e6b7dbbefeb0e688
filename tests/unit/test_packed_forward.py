"""Exactness of gyre.train.packed.token_logprobs against plain HF forwards.

Rows are built by hand here (independent of the tree builder) so a bug in the
packer cannot hide a bug in the forward, and vice versa.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre.trace.packing import PackedSequence
from gyre.train.packed import (
    ancestor_mask,
    plan_segments,
    subtree_end,
    supports_segments,
    token_logprobs,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    m.eval()
    return m


def _paths(seed: int = 0, vocab: int = 2000):
    """Root-to-leaf token paths sharing prefixes: a small branchy tree."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    trunk = tok(40)
    a = trunk + tok(15)
    b = trunk[:25] + tok(12)  # branch off the middle of the trunk
    c = a + tok(9)  # extends a (a is not a leaf)
    d = a[:48] + tok(7)
    e = tok(11)  # a second root
    return [c, b, d, e]


def _tree_row(paths: list[list[int]]) -> tuple[PackedSequence, list[list[int]]]:
    """DFS pre-order serialisation of the trie of ``paths``; returns row + per-path row indices."""
    trie: dict = {}
    for p in paths:
        node = trie
        for t in p:
            node = node.setdefault(t, {})
    ids, parent, pos = [], [], []

    def walk(node, par, depth):
        for t, child in node.items():
            ids.append(t)
            parent.append(par)
            pos.append(depth)
            walk(child, len(ids) - 1, depth + 1)

    walk(trie, -1, 0)
    n = len(ids)
    seq = PackedSequence(
        ids, pos, parent, [p >= 0 for p in parent], [0.0] * n, [0] * n, [0] * n, [0.0] * n
    )
    # map each path to its row indices
    index = {}
    for i in range(n):
        key = (index[parent[i]] if parent[i] >= 0 else ()) + (ids[i],)
        index[i] = key
    rev = {v: k for k, v in index.items()}
    rows = [[rev[tuple(p[: j + 1])] for j in range(len(p))] for p in paths]
    return seq, rows


def _paths_row(paths):
    ids, parent, pos, off = [], [], [], []
    for p in paths:
        off.append(len(ids))
        for j, t in enumerate(p):
            parent.append(len(ids) - 1 if j else -1)
            ids.append(t)
            pos.append(j)
    n = len(ids)
    seq = PackedSequence(
        ids, pos, parent, [p >= 0 for p in parent], [0.0] * n, [0] * n, [0] * n, [0.0] * n
    )
    rows = [list(range(o, o + len(p))) for o, p in zip(off, paths)]
    return seq, rows


def _reference(model, path):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([path])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return torch.tensor([lp[j - 1, path[j]].item() for j in range(1, len(path))])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("impl", ["segments", "dense", "expand", "flex"])
@pytest.mark.parametrize("mode", ["tree", "paths"])
def test_packed_logprobs_match_plain_forward(model, impl, mode):
    paths = _paths()
    seq, rows = (_tree_row if mode == "tree" else _paths_row)(paths)
    with torch.no_grad():
        got = token_logprobs(model, seq, impl=impl)
    assert got.shape == (len(seq),)
    for p, r in zip(paths, rows):
        ref = _reference(model, p)
        torch.testing.assert_close(got[r[1:]], ref, atol=2e-5, rtol=1e-5)
    # non-targets (roots) are exactly zero
    assert all(got[i].item() == 0.0 for i, t in enumerate(seq.is_target) if not t)


def test_tree_row_is_smaller_and_gradients_match(model):
    paths = _paths(seed=3)
    tseq, trows = _tree_row(paths)
    pseq, prows = _paths_row(paths)
    assert len(tseq) < len(pseq)
    # weight each unique target once (first path containing it) in both modes
    seen, wt, wp = set(), torch.zeros(len(tseq)), torch.zeros(len(pseq))
    for tr, pr in zip(trows, prows):
        for a, b in zip(tr[1:], pr[1:]):
            if a not in seen:
                seen.add(a)
                wt[a] = 1.0
                wp[b] = 1.0
    grads = []
    for seq, w in ((tseq, wt), (pseq, wp)):
        model.zero_grad()
        (token_logprobs(model, seq) * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-4, rtol=1e-4)


def test_plan_attention_pairs_track_the_tree():
    paths = _paths()
    tseq, _ = _tree_row(paths)
    plan = plan_segments(tseq.parent)
    mask = ancestor_mask(tseq.parent)
    assert plan.attention_pairs == int(mask.sum())
    # expanded paths compute each path's full triangle
    assert _paths_row(paths)[0] and plan.attention_pairs < sum(
        len(p) * (len(p) + 1) // 2 for p in paths
    )


def test_interval_mask_equals_ancestor_walk_and_rejects_non_preorder():
    seq, _ = _tree_row(_paths(seed=2))
    fast = ancestor_mask(seq.parent)
    slow = torch.zeros_like(fast)
    for i in range(len(seq)):
        j = i
        while j >= 0:
            slow[i, j] = True
            j = seq.parent[j]
    assert torch.equal(fast, slow)
    # 0 -> 1, 0 -> 2, then 3 under 1: not pre-order (1's subtree was closed by 2)
    with pytest.raises(ValueError, match="pre-order"):
        subtree_end([-1, 0, 0, 1])
    m = ancestor_mask([-1, 0, 0, 1])  # still correct via the row-by-row fallback
    assert m[3].tolist() == [True, True, False, True]


def test_auto_picks_segments_for_qwen3(model):
    assert supports_segments(model)


def test_bad_parent_rejected(model):
    seq = PackedSequence.from_chain([1, 2, 3])
    seq.parent[2] = 5
    with pytest.raises(ValueError):
        token_logprobs(model, seq)


# ---------------------------------------------------------------- end to end: trace -> tree -> pack -> forward
def _request_reference(model, tree):
    """tree index -> log-prob of that target computed by running its original request alone."""
    ref = {}
    for ri, info in enumerate(tree.requests):
        if not info.n_output:
            continue
        seqt = tree.request_sequence(ri)
        idx = [g for _d, g0, ln in info.pieces for g in range(g0, g0 + ln)]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([seqt])).logits[0].float(), -1)
        for j in range(info.n_input, info.length):
            ref.setdefault(idx[j], lp[j - 1, seqt[j]].item())
    return ref


@pytest.mark.parametrize("j_max", [None, 3])
def test_end_to_end_paths_tree_and_original_requests_agree(model, j_max):
    from gyre.trace import admit, build_tree, pack
    from gyre.trace.synthetic import small_execution

    trees = [build_tree(small_execution(f"x{i}", seed=10 + i, vocab=2000)) for i in range(2)]
    adms = [admit(t, j_max, seed=5) for t in trees]
    refs = {t.execution_id: _request_reference(model, t) for t in trees}
    results = {}
    for mode, budget in (("paths", 100_000), ("tree", 100_000), ("tree", 150)):
        got = {}
        for step in pack(adms, mode, budget):
            for row in step.sequences:
                with torch.no_grad():
                    lp = token_logprobs(model, row)
                for i, t in enumerate(row.is_target):
                    if t:
                        got[(step.executions[row.execution_index[i]], row.tree_index[i])] = lp[
                            i
                        ].item()
        results[(mode, budget)] = got
    keys = {(a.execution_id, g) for a in adms for p in a.paths for g in p.targets.tolist()}
    for got in results.values():
        assert set(got) == keys
        for (eid, g), v in got.items():
            assert v == pytest.approx(refs[eid][g], abs=3e-5)


def test_end_to_end_loss_gradients_match_between_modes(model):
    from gyre.trace import admit, build_tree, pack
    from gyre.trace.synthetic import small_execution

    adm = admit(build_tree(small_execution("g", seed=3, vocab=2000)), None, seed=1)
    grads = []
    for mode in ("paths", "tree"):
        model.zero_grad()
        loss = 0.0
        for step in pack([adm], mode, 100_000):
            for row in step.sequences:
                lp = token_logprobs(model, row)
                loss = loss + (lp * torch.tensor(row.token_weight)).sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4)


def test_qwen2_family_with_biases_is_exact():
    """Qwen2 has q/k/v biases and no q_norm/k_norm; the segment forward must handle both."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:  # make the biases matter
            layer.self_attn.q_proj.bias.normal_()
            layer.self_attn.k_proj.bias.normal_()
    paths = _paths(seed=5, vocab=300)
    seq, rows = _tree_row(paths)
    with torch.no_grad():
        got = token_logprobs(m, seq)
    for p, r in zip(paths, rows):
        torch.testing.assert_close(got[r[1:]], _reference(m, p), atol=2e-5, rtol=1e-5)


def test_segments_without_materialised_masks_are_exact(model, monkeypatch):
    """Segments whose mask would be too big use padded causal attention; same numbers, same grads."""
    import gyre.train.packed as packed

    seq, rows = _tree_row(_paths(seed=4))
    w = torch.tensor([1.0 if t else 0.0 for t in seq.is_target])
    outs = []
    for limit in (packed.MAX_MASK_ELEMENTS, 0):
        monkeypatch.setattr(packed, "MAX_MASK_ELEMENTS", limit)
        model.zero_grad()
        lp = token_logprobs(model, seq, impl="segments")
        (lp * w).sum().backward()
        outs.append(
            (
                lp.detach(),
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            )
        )
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=1e-5)
    for n in outs[0][1]:
        torch.testing.assert_close(outs[0][1][n], outs[1][1][n], atol=1e-5, rtol=1e-4)


@st.composite
def _random_rows(draw):
    """Random forests in pre-order: each new token hangs off some token on the current DFS stack."""
    n = draw(st.integers(2, 60))
    parent, stack = [], []
    for i in range(n):
        if not stack or draw(st.integers(0, 9)) == 0:
            p = -1
            stack = []
        else:
            k = draw(st.integers(0, len(stack) - 1))  # branch from any ancestor on the stack
            p = stack[k]
            stack = stack[: k + 1]
        parent.append(p)
        stack.append(i)
    depth = []
    for p in parent:
        depth.append(0 if p < 0 else depth[p] + 1)
    ids = draw(st.lists(st.integers(0, 1999), min_size=n, max_size=n))
    tgt = [p >= 0 and draw(st.booleans()) for p in parent]
    return PackedSequence(ids, depth, parent, tgt, [0.0] * n, [0] * n, [0] * n, [0.0] * n)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(row=_random_rows())
def test_segments_equal_expand_on_random_trees(model, row):
    with torch.no_grad():
        a = token_logprobs(model, row, impl="segments")
        b = token_logprobs(model, row, impl="expand")
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


def test_llama_shaped_model_is_exact():
    """The docs say Llama-shaped stacks work too; check it (random weights, rope scaling on)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=512,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    m = LlamaForCausalLM(cfg).eval()
    assert supports_segments(m)
    paths = _paths(seed=6, vocab=300)
    seq, rows = _tree_row(paths)
    with torch.no_grad():
        got = token_logprobs(m, seq)
    for p, r in zip(paths, rows):
        torch.testing.assert_close(got[r[1:]], _reference(m, p), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["segments", "dense", "expand"])
def test_float64_models_stay_float64(tiny_model_dir, impl):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    paths = _paths(seed=7)
    seq, rows = _tree_row(paths)
    with torch.no_grad():
        got = token_logprobs(m, seq, impl=impl)
    assert got.dtype == torch.float64
    ref = torch.log_softmax(m(input_ids=torch.tensor([paths[0]])).logits[0], -1)
    want = torch.stack([ref[j - 1, paths[0][j]] for j in range(1, len(paths[0]))])
    torch.testing.assert_close(got[rows[0][1:]], want.detach(), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("impl", ["segments", "dense"])
def test_activation_checkpointing_gives_the_same_logprobs_and_gradients(tiny_model_dir, impl):
    """``trainer.activation_checkpointing``: HF's switch, honoured by Gyre's own layer loop
    (segments) and by HF's (dense); the backward recomputes each layer instead of keeping its
    inside, so fewer tensors are saved, and nothing else changes."""
    from gyre.train.replica import load_causal_lm

    seq, _ = _tree_row(_paths(seed=5))
    out = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        m = load_causal_lm(tiny_model_dir, checkpointing=ckpt)
        saved: list[int] = []

        def keep(t, saved=saved):
            saved.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            lp = token_logprobs(m, seq, impl=impl)
        lp.sum().backward()
        out.append((lp.detach(), {n: p.grad for n, p in m.named_parameters()}, sum(saved)))
    (lp0, g0, s0), (lp1, g1, s1) = out
    torch.testing.assert_close(lp0, lp1, atol=0, rtol=0)
    for n in g0:
        torch.testing.assert_close(g0[n], g1[n], atol=1e-6, rtol=1e-5)
    assert s1 < s0 / 2, (s0, s1)  # elements kept for the backward
