"""Prompts queued together share one padded prefill forward (gyre.engine.batch) and give what
each prompt prefilled alone gives: the same greedy tokens as HF ``generate``, log-probs within
rounding; a long prompt is not padded up beside short ones."""

from __future__ import annotations

import pytest
import torch

from gyre.engine.batch import DecodeBatch, Row
from gyre.engine.protocol import SamplingParams

PROMPTS = [[5, 17, 300, 42, 9, 77], [11, 12, 13, 900, 1500], [7] * 7, [400, 401, 402, 3, 4]]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _run(model, prompts, shared: bool, steps: int = 12):
    batch = DecodeBatch(model)
    batch.batch_prefill = shared
    p = SamplingParams(temperature=0.0, max_new_tokens=steps + 1, ignore_eos=True)
    for i, ids in enumerate(prompts):
        batch.admit(Row(rid=f"r{i}", params=p, stops=frozenset(), generator=None), ids)
    with torch.inference_mode():
        events = batch.prefill_some(0)
        while len(batch):
            events += batch.step()
    out: dict[str, list] = {}
    for ev in events:
        out.setdefault(ev.rid, []).append((ev.token, ev.raw_logprob))
    return out, batch.shared_prefills


def test_co_arriving_prompts_share_a_prefill_and_match_alone_and_hf(model):
    alone, n_alone = _run(model, PROMPTS, shared=False)
    shared, n_shared = _run(model, PROMPTS, shared=True)
    assert n_alone == 0 and n_shared == len(PROMPTS)
    for i, ids in enumerate(PROMPTS):
        a, s = alone[f"r{i}"], shared[f"r{i}"]
        assert [t for t, _ in s] == [t for t, _ in a]
        assert [lp for _, lp in s] == pytest.approx([lp for _, lp in a], abs=1e-5)
        ref = model.generate(
            torch.tensor([ids]), max_new_tokens=len(a), min_new_tokens=len(a), do_sample=False
        )[0, len(ids) :].tolist()
        assert [t for t, _ in s] == ref


def test_a_long_prompt_is_not_padded_up_beside_short_ones(model):
    long = [(7 * i) % 1900 + 20 for i in range(60)]
    out, n = _run(model, [PROMPTS[0], PROMPTS[1], long], shared=True, steps=4)
    assert n == 2  # the two short ones together; the long one alone (padding would be 3x)
    alone, _ = _run(model, [long], shared=False, steps=4)
    assert [t for t, _ in out["r2"]] == [t for t, _ in alone["r0"]]
