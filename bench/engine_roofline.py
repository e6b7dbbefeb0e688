"""The decode roofline of this machine for a model, and the engine against it (bench_engine.py).

What a decode step must do, at the least: read every weight once (one step serves the whole
batch) and every live row's K/V, and compute ``2 * params`` FLOPs per row (plus attention).
So, with ``BW`` the measured memory bandwidth and ``PEAK`` the measured matmul peak, both on the
threads the engine runs on:

    bytes(B)  = weight_bytes + B * ctx * kv_bytes_per_token
    flops(B)  = B * (2 * linear_params + 4 * n_layers * attn_width * ctx)
    step(B)  >= max(bytes(B) / BW, flops(B) / PEAK)
    bound(B)  = B / step(B)   tokens/s

``ctx`` is a row's mean context over the measured generation (prompt + half the new tokens);
``kv_bytes_per_token = n_layers * 2 * n_kv_heads * head_dim * dtype bytes``. Both terms are
measured here, not taken from a datasheet: ``BW`` is the best of a few reductions over a 512 MiB
float32 tensor (far past the caches), ``PEAK`` the best of a few ``n x n`` matmuls, both timed
in CPU time on one thread (:func:`clock`). The bound ignores prefill (the measured figures include
it) and everything that is not a matmul or a memory read, so a real engine stays below it.
"""

from __future__ import annotations

import asyncio
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def clock(threads: int):
    """The clock the roofline is timed with: this process's CPU time on one thread (what other
    work on a shared machine does not inflate), wall time on several (CPU time would add the
    threads up)."""
    return time.process_time if threads == 1 else time.perf_counter


def _best(fn, threads: int, repeats: int) -> float:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fn()  # warm-up: page faults, kernel choice
        now, best = clock(threads), float("inf")
        for _ in range(repeats):
            t = now()
            fn()
            best = min(best, now() - t)
        return best
    finally:
        torch.set_num_threads(old)


def bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a sum over a ``mib`` MiB float32 tensor (read bandwidth, best of ``repeats``)."""
    x = torch.ones(mib * 2**20 // 4)
    return x.numel() * 4 / _best(x.sum, threads, repeats)


def matmul_peak(dtype: torch.dtype, threads: int, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` matmul in ``dtype`` (best of ``repeats``; the same measurement as
    :func:`gyre.train.flops.matmul_peak`, on :func:`clock`)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    return 2.0 * n**3 / _best(lambda: torch.mm(a, b), threads, repeats)


@dataclass(frozen=True)
class DecodeCost:
    weight_bytes: int  # every parameter, read once per step (a tied head counted once)
    linear_params: int  # weights of every matmul a token goes through (the head included)
    kv_bytes_per_token: int
    n_layers: int
    attn_width: int

    @classmethod
    def of(cls, model) -> DecodeCost:
        from gyre.train.flops import ModelShape

        shape = ModelShape.of(model)
        cfg = model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        params = {id(p): p for p in model.parameters()}.values()
        elt = next(iter(params)).element_size()
        return cls(
            weight_bytes=sum(p.numel() * p.element_size() for p in params),
            linear_params=shape.body_params + shape.head_params,
            kv_bytes_per_token=int(cfg.num_hidden_layers * 2 * kv_heads * hd * elt),
            n_layers=shape.n_layers,
            attn_width=shape.attn_width,
        )

    def in_bf16(self) -> DecodeCost:
        """The cost with ``compute_dtype = "bfloat16"``: every matmul weight read as bfloat16
        (the float32 embedding is only looked up, B rows a step) and bfloat16 K/V."""
        return DecodeCost(
            weight_bytes=2 * self.linear_params,
            linear_params=self.linear_params,
            kv_bytes_per_token=self.kv_bytes_per_token // 2,
            n_layers=self.n_layers,
            attn_width=self.attn_width,
        )

    def step_bound_s(self, batch: int, ctx: float, bw: float, peak: float) -> tuple[float, str]:
        """The least time of one decode step, and which term sets it ('memory' or 'compute')."""
        mem = (self.weight_bytes + batch * ctx * self.kv_bytes_per_token) / bw
        flops = batch * (2.0 * self.linear_params + 4.0 * self.n_layers * self.attn_width * ctx)
        comp = flops / peak
        return (mem, "memory") if mem >= comp else (comp, "compute")

    def tps_bound(self, batch: int, ctx: float, bw: float, peak: float) -> tuple[float, str]:
        step, kind = self.step_bound_s(batch, ctx, bw, peak)
        return batch / step, kind


def chat_prompts(model_dir: str, n: int) -> list[list[int]]:
    """``n`` short chat prompts (arithmetic questions) through the model's chat template; token
    ids of varied lengths where the tokenizer has no template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if not getattr(tok, "chat_template", None):
        return [
            [5, 17, 300, 42, 9, 77, 120, 8][: 3 + i % 5] + [50 + i] * (2 + i % 4) for i in range(n)
        ]
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"What is {17 + 7 * i} + {5 + 3 * i}? Answer briefly."}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out


def hf_static_tps(model, ps: list[list[int]], n_tok: int) -> tuple[float, float]:
    """HF ``generate`` on one left-padded static batch of all the prompts: generated tokens per
    second of wall time and per second of this process's CPU time."""
    width = max(map(len, ps))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    kw = dict(max_new_tokens=n_tok, min_new_tokens=n_tok, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        t, cpu = time.perf_counter(), time.process_time()
        model.generate(ids, attention_mask=mask, **kw)
        n = len(ps) * n_tok
        return n / (time.perf_counter() - t), n / (time.process_time() - cpu)


async def sweep(
    model_dir: str,
    concs: list[int],
    n_tok: int,
    repeat: int,
    threads: int,
    compute: str = "float32",
) -> tuple[dict[int, dict[str, float]], DecodeCost]:
    """Engine (HTTP, continuous batching) and HF static batch, best of ``repeat`` per
    concurrency, the two interleaved so both see the same contention. Each is timed in wall
    time and in this process's CPU time (``*_cpu``: the engine's figure includes its HTTP
    server and client, in this process too); on a shared machine the CPU-time rate is the one
    other work does not slow down, and with one torch thread it is comparable to the bound.
    ``compute`` is the engine's ``compute_dtype`` (HF generate stays float32: the default a
    user gets)."""
    from transformers import AutoModelForCausalLM

    from gyre.engine.app import create_app
    from gyre.engine.client import EngineClient
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.runner import ServerRunner

    torch.set_num_threads(threads)
    ps = chat_prompts(model_dir, max(concs))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    cfg = EmbeddedEngineConfig(
        model_dir=model_dir,
        max_batch=max(concs),
        torch_threads=threads,
        prefix_cache_mb=0,
        compute_dtype=compute,
    )
    engine = EmbeddedEngine(cfg)
    sp = {"max_new_tokens": n_tok, "temperature": 0.0, "ignore_eos": True}
    res = {
        c: {"hf": 0.0, "engine": 0.0, "hf_cpu": 0.0, "engine_cpu": 0.0, "rows": 0.0} for c in concs
    }
    async with ServerRunner(create_app(engine)) as srv, EngineClient(srv.url) as client:
        hf_static_tps(hf, ps[:2], 4)  # warm-ups
        await client.generate(ps[0], {**sp, "max_new_tokens": 4})
        for _ in range(repeat):
            for c in concs:
                wall, cpu = hf_static_tps(hf, ps[:c], n_tok)
                res[c]["hf"], res[c]["hf_cpu"] = max(res[c]["hf"], wall), max(res[c]["hf_cpu"], cpu)
                engine.max_rows_seen = 0
                t, t_cpu = time.perf_counter(), time.process_time()
                outs = await asyncio.gather(*[client.generate(p, sp) for p in ps[:c]])
                n = sum(len(o.output_ids) for o in outs)
                res[c]["engine"] = max(res[c]["engine"], n / (time.perf_counter() - t))
                res[c]["engine_cpu"] = max(res[c]["engine_cpu"], n / (time.process_time() - t_cpu))
                res[c]["rows"] = max(res[c]["rows"], engine.max_rows_seen)
    for c in concs:
        res[c]["ctx"] = sum(map(len, ps[:c])) / c + n_tok / 2
    return res, DecodeCost.of(hf)
