"""Gyre against a real SGLang server on CPU (one per module; ~1-3 min to start on 2 cores).

Skipped with a reason when SGLang is not installed (``scripts/install-sglang-cpu.sh`` puts it
in ``.venv-sglang``; ``GYRE_SGLANG_PYTHON`` points elsewhere). CI does not install it (~7 min,
~7 GB); docs/engine.md ("Real SGLang on CPU") has the command and the latest result.

SGLang speaks the wire protocol itself, so these are Gyre's own client, proxy and in-memory
publication (:class:`~gyre.runtime.publication.MemoryPublisher`, SGLang's
``update_weights_from_distributed`` over gloo) pointed at it, with a transformers float32
forward of the same weights as the reference.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from helpers.servers import running_proxy

from gyre.engine.client import EngineClient
from gyre.engine.sglang_launch import SglangServer, sglang_python

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200)]

if sglang_python() is None:
    pytest.skip(
        "SGLang is not installed: run scripts/install-sglang-cpu.sh (or set GYRE_SGLANG_PYTHON)",
        allow_module_level=True,
    )

PROMPT = [5, 17, 42, 8, 99, 3, 11]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def sglang_url(tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("sglang-log") / "sglang.log"
    server = SglangServer(str(tiny_model_dir), log_path=str(log))
    server.start(timeout=900)
    print(f"\nSGLang server started in {server.start_s:.1f} s ({server.url})")
    try:
        yield server.url
    finally:
        server.stop()


def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy ids and their raw log-probs from a transformers forward."""
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            ids.append(int(lp.argmax()))
            lps.append(float(lp[ids[-1]]))
    return ids[len(prompt) :], lps


async def test_generate_streamed_and_plain_match_transformers(sglang_url, tiny_model_dir):
    """Gyre's client reads SGLang's answer and its SSE stream of cumulative chunks."""
    want_ids, want_lps = hf_greedy(hf_model(tiny_model_dir), PROMPT, GREEDY["max_new_tokens"])
    async with EngineClient(sglang_url) as c:
        plain = await c.generate(PROMPT, GREEDY)
        chunks = [ch async for ch in c.generate_stream(PROMPT, GREEDY)]
    assert plain.output_ids == want_ids
    got_lps = [lp for lp, _, _ in plain.meta_info.output_token_logprobs or []]
    assert got_lps == pytest.approx(want_lps, abs=1e-3)
    assert plain.meta_info.finish_reason.type == "length"
    # cumulative: every chunk extends the previous one; the last is the whole answer
    for a, b in zip(chunks, chunks[1:]):
        assert b.output_ids[: len(a.output_ids)] == a.output_ids
        assert len(b.output_ids) > len(a.output_ids)
    assert chunks[-1].output_ids == want_ids
    assert chunks[-1].meta_info.finish_reason is not None


def test_raw_stream_is_sse_ending_in_done(sglang_url):
    """The wire itself: ``data:`` events of cumulative ids, closed by ``data: [DONE]``."""
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", sglang_url + "/generate", json=body, timeout=300) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    lens = [len(json.loads(e)["output_ids"]) for e in events[:-1]]
    assert lens == sorted(lens) and lens[-1] == GREEDY["max_new_tokens"]


def test_proxy_keeps_a_conversation_token_exact(sglang_url, tiny_model_dir, tmp_path):
    """The proxy in front of SGLang: turn 2's prompt starts with turn 1's ids plus its output."""
    from gyre.trace.store import read_trace

    with running_proxy(tiny_model_dir, [sglang_url], tmp_path, fsync=False) as px:
        c = openai.OpenAI(base_url=px.url + "/v1", api_key="sglang", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "hello there"}]
        kw = dict(model="m", temperature=0, max_tokens=5)
        first = c.chat.completions.create(messages=msgs, **kw).choices[0].message.content
        msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
        chunks = list(c.chat.completions.create(messages=msgs, stream=True, **kw))
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    (path,) = list(tmp_path.glob("*.jsonl"))
    recs = read_trace(path).records
    assert len(recs) == 2 and len(recs[0].output_ids) > 0
    assert recs[1].base == recs[0].request_id and recs[1].meta["bridge"] == "continuation"
    assert recs[1].base_len == len(recs[0].input_suffix) + len(recs[0].output_ids)


def test_in_memory_publication_over_sglang(sglang_url, tiny_model_dir):
    """MemoryPublisher (rank 0, gloo) sends changed weights twice; SGLang then serves exactly
    what transformers computes with them, and reports the published version."""
    from gyre.runtime.publication import MemoryPublisher
    from gyre.train.weights import named_params

    model = hf_model(tiny_model_dir)
    before, _ = hf_greedy(model, PROMPT, GREEDY["max_new_tokens"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mlp" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    want, _ = hf_greedy(model, PROMPT, GREEDY["max_new_tokens"])
    assert want != before  # the check below can tell the new weights from the old
    publisher = MemoryPublisher()
    try:
        for version in (1, 2):  # the second reuses the group: a fresh begin/end session
            out = publisher.publish(version, named_params(model), [sglang_url])
            assert out["encoding"] == "raw" and all(r.success for r in out["replies"])
    finally:
        if publisher.channel is not None:
            asyncio.run(publisher.channel.close())

    async def served():
        async with EngineClient(sglang_url) as c:
            return await c.generate(PROMPT, GREEDY), await c.model_info()

    resp, info = asyncio.run(served())
    assert resp.output_ids == want
    assert info.weight_version == "2"
