"""Engine benchmarks: the decode roofline, embedded engine vs HF generate, prefix reuse, null engine.

    OMP_NUM_THREADS=1 python bench/bench_engine.py [--tokens 64] [--requests 8] [--model DIR]
    python bench/bench_engine.py --section roofline --model runs/smollm2 --threads 1
    python bench/bench_engine.py --section multiturn --model runs/smollm2 --contexts 2048

Sections (``--section``, comma-separated; default all):

- ``roofline``: this machine's measured memory bandwidth and matmul peak, the decode bound
  they give the model at concurrency 1, 8, 16, 32 (formula in ``engine_roofline.py``), and
  the embedded engine (HTTP, continuous batching) and HF ``generate`` on one static batch of
  the same prompts, each as tokens/s and as a share of the bound, measured interleaved;
- ``multiturn``: time to first token on turn 5 of a conversation growing by tool output,
  prefix cache against a fresh prefill, and the cache's hit rate (``engine_multiturn.py``);
- ``classic``: the tables below (batch 1 vs a batch, null engine, conversation, streaming).

Everything goes through HTTP (uvicorn on 127.0.0.1 + EngineClient), as the
proxy uses it. The baseline is Hugging Face ``model.generate`` on the same
prompts in the same run (batch 1 sequential, and one left-padded batch of 8),
so the ratios are comparable across machines; absolute numbers on a shared
2-core machine are noisy, so each timed section runs ``--repeat`` times and
the best is kept (contention only ever slows a run down).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sections' modules beside this file

from engine_multiturn import conversation_ttft
from engine_roofline import bandwidth, cpu_model, matmul_peak, sweep


def prompts(n: int) -> list[list[int]]:
    return [[5, 17, 300, 42, 9, 77, 120, 8][: 3 + i % 5] + [50 + i] * (2 + i % 4) for i in range(n)]


def hf_generate_tps(
    model_dir: str, ps: list[list[int]], n_tok: int, repeat: int
) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    kw = dict(max_new_tokens=n_tok, min_new_tokens=n_tok, do_sample=False)
    with torch.inference_mode():
        model.generate(torch.tensor([ps[0]]), **kw)  # warm-up
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        seq = batched = 0.0
        for _ in range(repeat):
            t = time.perf_counter()
            for p in ps:
                model.generate(
                    torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **kw
                )
            seq = max(seq, len(ps) * n_tok / (time.perf_counter() - t))
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, pad_token_id=0, **kw)
            batched = max(batched, len(ps) * n_tok / (time.perf_counter() - t))
    return seq, batched


async def embedded_tps(
    model_dir: str, ps: list[list[int]], n_tok: int, repeat: int
) -> tuple[float, float, int]:
    from gyre.engine.app import create_app
    from gyre.engine.client import EngineClient
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.runner import ServerRunner

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_dir=model_dir, max_batch=len(ps)))
    sp = {"max_new_tokens": n_tok, "temperature": 0.0, "ignore_eos": True}
    async with ServerRunner(create_app(engine)) as srv, EngineClient(srv.url) as c:
        await c.generate(ps[0], sp)  # warm-up
        seq = conc = 0.0
        for _ in range(repeat):
            t = time.perf_counter()
            for p in ps:
                await c.generate(p, sp)
            seq = max(seq, len(ps) * n_tok / (time.perf_counter() - t))
            engine.max_rows_seen = 0
            t = time.perf_counter()
            outs = await asyncio.gather(*[c.generate(p, sp) for p in ps])
            conc = max(conc, sum(len(o.output_ids) for o in outs) / (time.perf_counter() - t))
        return seq, conc, engine.max_rows_seen


async def null_rps(n_req: int, concurrency: int) -> tuple[float, float]:
    """The null engine in its own process (`gyre engine --kind null`), as the proxy would see it;
    in-process, client and server would share one GIL and measure each other."""
    import re
    import subprocess
    import sys

    from gyre.engine.client import EngineClient

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gyre.cli",
            "engine",
            "--kind",
            "null",
            "--port",
            "0",
            "--null-tokens",
            "16",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = re.search(r"http://[\d.]+:\d+", proc.stderr.readline()).group(0)
        async with EngineClient(url) as c:
            while not await c.health():
                await asyncio.sleep(0.1)
            seq, conc = await _null_load(c, n_req, concurrency)
        raw = await _aiohttp_load(url, n_req, concurrency)
        return seq, conc, raw
    finally:
        proc.terminate()
        proc.wait(30)


async def _aiohttp_load(url: str, n_req: int, concurrency: int) -> tuple[float, float] | None:
    """The same load from aiohttp (installed with ray[default]): separates the engine server's
    capacity from httpx's own cost, which grows with concurrency."""
    try:
        import aiohttp
    except ImportError:
        return None
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 16}}
    out = []
    async with aiohttp.ClientSession() as s:
        for k in (1, concurrency):
            sem = asyncio.Semaphore(k)

            async def one():
                async with sem:
                    async with s.post(url + "/generate", json=body) as r:
                        await r.read()

            await asyncio.gather(*[one() for _ in range(20)])
            t = time.perf_counter()
            await asyncio.gather(*[one() for _ in range(n_req)])
            out.append(n_req / (time.perf_counter() - t))
    return out[0], out[1]


async def _null_load(c, n_req: int, concurrency: int) -> tuple[float, float]:
    sp = {"max_new_tokens": 16}
    for _ in range(20):
        await c.generate([1, 2, 3], sp)
    t = time.perf_counter()
    for _ in range(n_req):
        await c.generate([1, 2, 3], sp)
    seq = n_req / (time.perf_counter() - t)
    sem = asyncio.Semaphore(concurrency)

    async def one():
        async with sem:
            await c.generate([1, 2, 3], sp)

    t = time.perf_counter()
    await asyncio.gather(*[one() for _ in range(n_req)])
    conc = n_req / (time.perf_counter() - t)
    return seq, conc


async def conversation_s(
    model_dir: str, turns: int, grow: int, n_tok: int, prefix_cache_mb: float
) -> tuple[float, int]:
    """Seconds for one agent-like conversation (each turn = previous input + output + `grow` new
    tokens), and the input tokens the engine reused from its prefix cache."""
    from gyre.engine.app import create_app
    from gyre.engine.client import EngineClient
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.runner import ServerRunner

    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=model_dir, prefix_cache_mb=prefix_cache_mb)
    )
    sp = {"max_new_tokens": n_tok, "temperature": 0.0, "ignore_eos": True}
    async with ServerRunner(create_app(engine)) as srv, EngineClient(srv.url) as c:
        await c.generate([1, 2, 3], sp)  # warm-up
        ids, reused = [], 0
        t = time.perf_counter()
        for k in range(turns):
            ids = ids + [(97 * k + i) % 1500 + 10 for i in range(grow)]
            r = await c.generate(ids, sp)
            reused += r.meta_info.cached_tokens
            ids = ids + r.output_ids
        return time.perf_counter() - t, reused


async def stream_cost(n_tok: int, **app_options) -> tuple[float, int, int]:
    """Seconds and bytes to stream one n_tok-token output from a null engine emitting a token
    every 0.2 ms, with the given create_app streaming options; and the number of chunks."""
    import httpx

    from gyre.engine.app import create_app
    from gyre.engine.null import NullEngine
    from gyre.engine.runner import ServerRunner

    engine = NullEngine(num_tokens=n_tok, token_delay_s=0.0002)
    body = {"input_ids": [1], "sampling_params": {"max_new_tokens": n_tok}, "stream": True}
    async with (
        ServerRunner(create_app(engine, **app_options)) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=None) as http,
    ):
        t = time.perf_counter()
        nbytes = chunks = 0
        async with http.stream("POST", "/generate", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    nbytes += len(line)
                    chunks += 1
        return time.perf_counter() - t, nbytes, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=None, help="HF model dir (default: build the tiny model in a temp dir)"
    )
    ap.add_argument(
        "--section", default="roofline,multiturn,classic", help="which sections (comma-separated)"
    )
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    ap.add_argument("--requests", type=int, default=8, help="requests (= concurrent batch)")
    ap.add_argument("--null-requests", type=int, default=500)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per timed section; the best is kept"
    )
    ap.add_argument("--concurrency", default="1,8,16,32", help="roofline: concurrent requests")
    ap.add_argument(
        "--engine-compute",
        default="float32",
        choices=["float32", "bfloat16"],
        help="roofline: the engine's compute_dtype (HF generate stays float32)",
    )
    ap.add_argument("--sweep-tokens", type=int, default=32, help="roofline: new tokens per request")
    ap.add_argument(
        "--threads", type=int, default=0, help="roofline/multiturn: torch threads (0: as set)"
    )
    ap.add_argument(
        "--contexts", default="2048,8000", help="multiturn: turn-5 context sizes (tokens)"
    )
    ap.add_argument(
        "--tool-tokens", type=int, default=128, help="multiturn: tool output per turn (tokens)"
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    import torch

    sections = set(args.section.split(","))
    unknown = sections - {"roofline", "multiturn", "classic"}
    if unknown:
        sys.exit(f"bench_engine: unknown section(s) {sorted(unknown)}")
    model_dir = args.model
    if model_dir is None:
        from gyre.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="gyre-bench-tiny-")))
    elif not Path(model_dir).is_dir():
        sys.exit(f"bench_engine: --model {model_dir!r} is not a directory")
    threads = args.threads or torch.get_num_threads()
    res: dict = {"model": model_dir, "cpu": cpu_model(), "torch_threads": threads}
    if "roofline" in sections:
        res["roofline"] = roofline(args, model_dir, threads)
    if "multiturn" in sections:
        res["multiturn"] = multiturn(args, model_dir, threads)
    if "classic" in sections:
        res["classic"] = classic(args, model_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


def roofline(args, model_dir: str, threads: int) -> dict:
    concs = [int(c) for c in args.concurrency.split(",")]
    bw = bandwidth(threads)
    peak = matmul_peak(torch_dtype("float32"), threads)
    peak_bf16 = matmul_peak(torch_dtype("bfloat16"), threads)
    rows, cost = asyncio.run(
        sweep(model_dir, concs, args.sweep_tokens, args.repeat, threads, args.engine_compute)
    )
    print(
        f"\ndecode roofline: {cpu_model()}, {threads} torch thread(s); memory bandwidth "
        f"{bw / 1e9:.1f} GB/s (sum over 512 MiB), matmul peak float32 {peak / 1e9:.1f} GFLOP/s, "
        f"bfloat16 {peak_bf16 / 1e9:.1f} GFLOP/s; model {model_dir}: "
        f"{cost.weight_bytes / 1e6:.0f} MB of weights, {cost.linear_params / 1e6:.1f} M matmul "
        f"weights, {cost.kv_bytes_per_token / 1e3:.1f} kB of K/V per token\n"
        f"step >= max((weights + B * ctx * kv) / bandwidth, B * (2 * params + 4 * layers * "
        f"attn_width * ctx) / peak); bound = B / step. {args.sweep_tokens} new tokens per "
        f"request, greedy, best of {args.repeat}; tok/s (and tokens per CPU second) include the "
        f"prefill\n"
    )
    print(
        "| concurrency | bound tok/s (set by) | HF generate, static batch: wall / CPU time "
        f"| embedded engine (HTTP, {args.engine_compute}): wall / CPU time "
        "| engine / HF, wall / CPU |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    out = {"bandwidth_Bps": bw, "peak_f32": peak, "peak_bf16": peak_bf16, "rows": {}}
    for c in concs:
        r = rows[c]
        bound, kind = cost.tps_bound(c, r["ctx"], bw, peak)
        own = ""
        if args.engine_compute == "bfloat16":  # its own bound too: half the bytes, bf16 peak
            b16, _ = cost.in_bf16().tps_bound(c, r["ctx"], bw, peak_bf16)
            r["bound_bf16"] = b16
            own = f", {r['engine_cpu'] / b16:.0%} of its bf16 bound {b16:.0f}"
        print(
            f"| {c} | {bound:7.1f} ({kind}) "
            f"| {r['hf']:6.1f} ({r['hf'] / bound:.0%}) / {r['hf_cpu']:6.1f} ({r['hf_cpu'] / bound:.0%}) "
            f"| {r['engine']:6.1f} ({r['engine'] / bound:.0%}) / {r['engine_cpu']:6.1f} "
            f"({r['engine_cpu'] / bound:.0%}), batch {int(r['rows'])}{own} "
            f"| {r['engine'] / r['hf']:.2f} / {r['engine_cpu'] / r['hf_cpu']:.2f} |"
        )
        out["rows"][c] = {**r, "bound": bound, "bound_set_by": kind}
    return out


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def multiturn(args, model_dir: str, threads: int) -> dict:
    turns, n_out = 5, 16
    print(
        f"\nprefix reuse: TTFT on turn {turns} of a conversation growing by tool output "
        f"(a first prompt, then {n_out} tokens out and {args.tool_tokens} tokens of tool output "
        f"per turn, greedy), prefix cache vs fresh prefill, {threads} thread(s)\n"
    )
    print(
        "| context at turn 5 | fresh prefill TTFT: wall / CPU | cached prefix TTFT: wall / CPU "
        "| speed-up, wall / CPU "
        "| turn-5 tokens prefilled, fresh / cached | hit rate (lookups) | input tokens reused |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    out = {}
    for ctx in [int(c) for c in args.contexts.split(",")]:
        run = (model_dir, ctx, turns, n_out, args.tool_tokens, threads)
        cached, ids = asyncio.run(conversation_ttft(*run, cache_mb=4096))
        fresh, _ = asyncio.run(conversation_ttft(*run, cache_mb=0, final=ids))
        print(
            f"| {int(cached['context'])} | {fresh['ttft_s']:.3f} s / {fresh['ttft_cpu_s']:.3f} s "
            f"| {cached['ttft_s']:.3f} s / {cached['ttft_cpu_s']:.3f} s "
            f"| {fresh['ttft_s'] / cached['ttft_s']:.1f}x / "
            f"{fresh['ttft_cpu_s'] / cached['ttft_cpu_s']:.1f}x "
            f"| {int(fresh['prefilled'])} / {int(cached['prefilled'])} "
            f"| {cached['hit_rate']:.0%} ({int(cached['lookups'])}) | {cached['token_reuse']:.0%} |"
        )
        out[ctx] = {"fresh": fresh, "cached": cached}
    return out


def classic(args, model_dir: str) -> dict:
    import torch

    ps = prompts(args.requests)
    hf_seq, hf_batch = hf_generate_tps(model_dir, ps, args.tokens, args.repeat)
    e_seq, e_conc, rows = asyncio.run(embedded_tps(model_dir, ps, args.tokens, args.repeat))
    n_seq, n_conc, n_raw = asyncio.run(null_rps(args.null_requests, 32))
    turns, grow = 12, 512
    conv_off = conv_on = float("inf")
    for _ in range(max(1, args.repeat - 1)):  # alternate, so both see similar contention
        conv_off = min(conv_off, asyncio.run(conversation_s(model_dir, turns, grow, 32, 0))[0])
        t_on, reused = asyncio.run(conversation_s(model_dir, turns, grow, 32, 256))
        conv_on = min(conv_on, t_on)
    n_stream = 4000
    streams = {
        name: asyncio.run(stream_cost(n_stream, **opts))
        for name, opts in [
            (
                "cumulative, no coalescing",
                {"stream_coalesce_after": 0, "stream_min_interval_s": 0.0},
            ),
            ("cumulative, default coalescing after 256 tokens", {}),
            (
                "--stream-interval 32 (no time coalescing)",
                {"stream_interval": 32, "stream_coalesce_after": 0, "stream_min_interval_s": 0.0},
            ),
            (
                "--incremental-streaming-output (no time coalescing)",
                {
                    "incremental_streaming_output": True,
                    "stream_coalesce_after": 0,
                    "stream_min_interval_s": 0.0,
                },
            ),
        ]
    }
    res = {
        "torch_threads": torch.get_num_threads(),
        "tokens": args.tokens,
        "requests": args.requests,
        "hf_generate_b1_tps": hf_seq,
        "hf_generate_b8_tps": hf_batch,
        "embedded_b1_tps": e_seq,
        "embedded_conc_tps": e_conc,
        "embedded_max_rows": rows,
        "null_seq_rps": n_seq,
        "null_c32_rps": n_conc,
        "conversation_no_prefix_cache_s": conv_off,
        "conversation_prefix_cache_s": conv_on,
        "conversation_reused_tokens": reused,
        "null_aiohttp_seq_rps": n_raw and n_raw[0],
        "null_aiohttp_c32_rps": n_raw and n_raw[1],
        "stream_4000": {k: {"s": v[0], "bytes": v[1], "chunks": v[2]} for k, v in streams.items()},
    }
    print(
        f"\nengine benchmark (tiny model, {args.requests} requests x {args.tokens} tokens, greedy, "
        f"torch threads {res['torch_threads']}, best of {args.repeat})\n"
    )
    print("| measurement | value | ratio |")
    print("| --- | ---: | ---: |")
    print(f"| HF generate, batch 1 sequential (baseline) | {hf_seq:8.1f} tok/s | 1.00 |")
    print(
        f"| HF generate, one padded batch of {args.requests} | {hf_batch:8.1f} tok/s | {hf_batch / hf_seq:.2f} |"
    )
    print(f"| embedded engine via HTTP, 1 at a time | {e_seq:8.1f} tok/s | {e_seq / hf_seq:.2f} |")
    print(
        f"| embedded engine via HTTP, {args.requests} concurrent (max batch seen {rows}) | {e_conc:8.1f} tok/s "
        f"| {e_conc / hf_seq:.2f} |"
    )
    print(f"| embedded: concurrent / sequential | | {e_conc / e_seq:.2f} |")
    print(f"| null engine (own process), EngineClient (httpx), sequential | {n_seq:8.1f} req/s | |")
    print(
        f"| null engine (own process), EngineClient (httpx), 32 in flight | {n_conc:8.1f} req/s | {n_conc / n_seq:.2f} |"
    )
    if n_raw:
        print(f"| null engine, aiohttp client, sequential | {n_raw[0]:8.1f} req/s | |")
        print(
            f"| null engine, aiohttp client, 32 in flight | {n_raw[1]:8.1f} req/s | {n_raw[1] / n_raw[0]:.2f} |"
        )
    print(
        f"| {turns}-turn conversation (+{grow} tokens/turn, 32 out), no prefix cache | {conv_off:8.2f} s | 1.00 |"
    )
    print(
        f"| same, prefix cache on ({reused} input tokens reused) | {conv_on:8.2f} s | {conv_off / conv_on:.2f}x faster |"
    )
    base_s = streams["cumulative, no coalescing"][0]
    for name, (sec, nbytes, chunks) in streams.items():
        print(
            f"| stream {n_stream} tokens, {name}: {chunks} chunks, {nbytes / 2**20:.1f} MiB | {sec:8.2f} s "
            f"| {base_s / sec:.2f}x |"
        )
    return res


if __name__ == "__main__":
    main()
