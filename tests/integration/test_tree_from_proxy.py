"""A trajectory tree from a real trace: OpenAI SDK -> gyre proxy -> embedded engine (tiny model).

The client plays a small agent that continues, retries a turn, compacts
(summary request, then a restart with the summary pasted) and delegates to a
sub-agent with its own system prompt. The proxy records token-in/token-out; we
build the tree, admit, pack both ways and recompute every target's log-prob
with the same weights: on-policy, it must equal the engine's behaviour
log-prob (raw log-softmax), in both packing modes.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gyre.trace import admit, pack, read_trace
from gyre.trace.stats import load_tree

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def trace_file(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    from helpers.servers import running_engine, running_proxy

    traces = tmp_path_factory.mktemp("tree-traces")
    with (
        running_engine("embedded", tiny_model_dir) as eng,
        running_proxy(tiny_model_dir, [eng.url], traces, tiny_tokenizer, fsync=False) as px,
    ):
        c = openai.OpenAI(base_url=px.url + "/v1", api_key="tree-test", max_retries=0)

        def ask(messages):
            return (
                c.chat.completions.create(model="m", messages=messages, max_tokens=10)
                .choices[0]
                .message.content
                or ""
            )

        msgs = [
            {"role": "system", "content": "You are the main agent."},
            {"role": "user", "content": "Fix the bug in a.py"},
        ]
        for k in range(3):
            msgs += [
                {"role": "assistant", "content": ask(msgs)},
                {"role": "user", "content": f"tool output {k}"},
            ]
        ask(
            msgs[:4] + [{"role": "user", "content": "that failed, try another way"}]
        )  # a retry: branch
        summary = ask(msgs + [{"role": "user", "content": "Summarize the conversation so far."}])
        ask(
            msgs[:2] + [{"role": "user", "content": "Continue. Earlier work: " + summary}]
        )  # restart
        ask(
            [
                {"role": "system", "content": "You are a sub-agent."},
                {"role": "user", "content": "Read b.py"},
            ]
        )
    (path,) = list(traces.glob("*.jsonl"))
    return path


def test_tree_from_real_trace(trace_file, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from gyre.train.packed import token_logprobs

    res = read_trace(trace_file)
    assert not res.errors and len(res.records) == 7
    tree = load_tree(trace_file)
    assert not tree.errors
    # every request's full sequence is a path of the tree
    full = {}
    for r in sorted(res.records, key=lambda r: r.seq):
        inp = (full[r.base][: r.base_len] if r.base else []) + list(r.input_suffix)
        full[r.request_id] = inp + list(r.output_ids)
        ri = tree.by_id[r.request_id]
        assert tree.request_sequence(ri) == full[r.request_id]
    assert tree.n_targets == sum(
        len(r.output_ids) for r in res.records
    )  # no output re-sampled in place
    roles = Counter(tree.leaf_role(lf).value for lf in tree.leaves)
    # The summary request extends the chain's last turn, so the chain is not a leaf of its
    # own: leaves are the retry and the restart (main), the summary, and the sub-agent.
    assert roles == {"main": 2, "main-summary": 1, "sub-agent": 1}
    # the turns the chain shares with the retry and the summary are stored once
    assert len(tree) < sum(len(s) for s in full.values())

    adm = admit(tree, None, seed=0)
    assert adm.n_targets == tree.n_targets
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for mode in ("paths", "tree"):
        (step,) = pack([adm], mode, 100_000)
        row = step.sequences[0]
        with torch.no_grad():
            lp = token_logprobs(model, row)
        tgt = torch.tensor(row.is_target)
        behaviour = torch.tensor(row.behaviour_logprob)
        assert int(tgt.sum()) == tree.n_targets
        torch.testing.assert_close(lp[tgt], behaviour[tgt].to(lp.dtype), atol=1e-4, rtol=1e-4)
        assert all(v == 0 for v, t in zip(row.policy_version, row.is_target) if t)
