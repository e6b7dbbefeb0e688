"""The decode step's batched sampler and its in-place K/V layer agree with the per-row
sampler and transformers' concatenating layer, bit for bit."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from gyre.engine.kv_slab import SlabLayer, slab_layers
from gyre.engine.protocol import SamplingParams
from gyre.engine.sampling import make_generator, sample_row, sample_rows


def test_sample_rows_equals_sample_row_per_row():
    torch.manual_seed(0)
    logits = torch.randn(6, 300) * 3
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # an exact tie: the first index wins
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=20),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=1.3, min_p=0.05),
        SamplingParams(temperature=0.0),
    ]
    got = sample_rows(
        logits, params, [None if p.greedy else make_generator(i) for i, p in enumerate(params)]
    )
    want = [
        sample_row(logits[i], p, None if p.greedy else make_generator(i))
        for i, p in enumerate(params)
    ]
    assert got == want  # tokens and all three log-probs, exactly
    assert got[2].token == 7


def _updates(layer, steps):
    out = []
    for k, v in steps:
        keys, values = layer.update(k, v)
        out.append((keys.clone(), values.clone()))
    return out


def test_slab_layer_matches_dynamic_layer_through_growth_and_reassignment():
    torch.manual_seed(1)
    b, h, d = 3, 2, 4
    steps = [(torch.randn(b, h, 5, d), torch.randn(b, h, 5, d))]
    steps += [(torch.randn(b, h, 1, d), torch.randn(b, h, 1, d)) for _ in range(200)]
    slab, ref = SlabLayer(), DynamicLayer()
    for (ks, vs), (kr, vr) in zip(_updates(slab, steps), _updates(ref, steps)):
        assert torch.equal(ks, kr) and torch.equal(vs, vr)
    assert slab.get_seq_length() == ref.get_seq_length() == 205
    buf = slab._buf_k
    one = (torch.randn(b, h, 1, d), torch.randn(b, h, 1, d))
    _updates(slab, [one]), _updates(ref, [one])
    assert slab._buf_k is buf  # a decode step writes into the spare columns: no new buffer
    # the batch drops a row and trims columns (as DecodeBatch.remove does): the layer adopts it
    for layer in (slab, ref):
        layer.keys = layer.keys.index_select(0, torch.tensor([0, 2]))[:, :, 3:]
        layer.values = layer.values.index_select(0, torch.tensor([0, 2]))[:, :, 3:]
    more = [(torch.randn(2, h, 1, d), torch.randn(2, h, 1, d)) for _ in range(3)]
    for (ks, vs), (kr, vr) in zip(_updates(slab, more), _updates(ref, more)):
        assert torch.equal(ks, kr) and torch.equal(vs, vr)
    assert slab.keys.shape == (2, h, 206, d)


def test_slab_layers_converts_a_dynamic_cache():
    from transformers import DynamicCache, LlamaConfig

    cfg = LlamaConfig(num_hidden_layers=3, hidden_size=8, num_attention_heads=2, vocab_size=10)
    cache = slab_layers(DynamicCache(config=cfg))
    assert [type(layer) for layer in cache.layers] == [SlabLayer] * 3
