"""Proxy benchmarks, each a ratio measured in one run against a baseline from the same run.

1. overhead: wall time per call through the proxy vs calling the null engine
   directly with the same number of input ids (sequential calls, ~1K context).
2. cpu-vs-context: proxy process CPU per call for a request that extends the
   previous one, at 1K / 32K / 500K tokens of context (target: < 2x from 1K to 500K),
   in steady state; the first extension of a conversation (a one-time scan of the
   previous body) is measured and shown apart.
3. concurrency: calls/s with 256 concurrent executions (each extends its own
   conversation) through the proxy, vs the same load sent straight to the engine.

The engine is the null engine (``gyre engine --kind null``: fixed tokens, no
model), the proxy is ``gyre proxy`` in its own process, both started here; the
client is this process. Proxy CPU is read from /proc/<pid>/stat of the proxy process only (the
null engine's own CPU, mostly parsing the multi-MB ``input_ids`` JSON, is shown apart: it is in the
wall time, not in the proxy's CPU). The machine is
shared (2 cores), so absolute numbers are noisy; the ratios are what to read.

    python bench/bench_proxy.py                # all three
    python bench/bench_proxy.py --quick        # smaller sizes (CI smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gyre.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
GYRE = str(Path(sys.executable).parent / "gyre")
WORDS = (
    "alpha beta gamma delta file path read write test error value return import class def self "
    "module function output input result check list dict string number line code fix bug run"
).split()


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Stack:
    def __init__(self, model_dir: str, trace_dir: str, null_tokens: int = 16) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        self.logs = (
            open(Path(trace_dir) / "engine.log", "w"),
            open(Path(trace_dir) / "proxy.log", "w"),
        )
        self.eport, self.pport = free_ports(2)
        self.engine = subprocess.Popen(
            [
                GYRE,
                "engine",
                "--kind",
                "null",
                "--port",
                str(self.eport),
                "--null-tokens",
                str(null_tokens),
                "--engine-id",
                "null0",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.logs[0],
        )
        self.engine_url = f"http://127.0.0.1:{self.eport}"
        wait_http(self.engine_url + "/health")
        self.proxy = subprocess.Popen(
            [
                GYRE,
                "proxy",
                "--model",
                model_dir,
                "--engine",
                self.engine_url,
                "--port",
                str(self.pport),
                "--trace-dir",
                trace_dir,
                "--no-fsync",
                "--max-context",
                "4000000",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.logs[1],
        )
        self.url = f"http://127.0.0.1:{self.pport}"
        wait_http(self.url + "/health")

    def close(self) -> None:
        for p in (self.proxy, self.engine):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


def chat_body(messages: list, max_tokens: int = 16) -> bytes:
    return json.dumps({"model": "tiny", "messages": messages, "max_tokens": max_tokens}).encode()


def bench_cpu_vs_context(
    stack: Stack, contexts: list[int], calls: int, seed: int = 0
) -> list[dict]:
    rows = []
    client = httpx.Client(timeout=600)
    for ctx in contexts:
        rng = random.Random(seed + ctx)
        key = f"cpu-{ctx}-{time.time()}"
        h = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        # history the proxy never produced (~250 tokens a turn): the first call is a full render
        msgs = [{"role": "system", "content": "You are a coding agent. " + text(rng, 60)}]
        approx_tokens = 0
        while approx_tokens < ctx:
            msgs.append({"role": "user", "content": text(rng, 90)})
            msgs.append({"role": "assistant", "content": text(rng, 90)})
            approx_tokens += 240
        msgs.append({"role": "user", "content": text(rng, 60)})
        r = client.post(stack.url + "/v1/chat/completions", content=chat_body(msgs), headers=h)
        r.raise_for_status()
        prompt = r.json()["usage"]["prompt_tokens"]
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        # the first extension of a conversation the proxy has not seen extended yet scans the previous
        # body's message spans once (a Python pass over it): a one-time cost, measured on its own
        time.sleep(0.3)
        f0 = cpu_seconds(stack.proxy.pid)
        for _ in range(2):
            msgs.append({"role": "user", "content": text(rng, 60)})
            r = client.post(stack.url + "/v1/chat/completions", content=chat_body(msgs), headers=h)
            r.raise_for_status()
            msgs.append(
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
            )
        time.sleep(0.3)
        first_ext = (
            cpu_seconds(stack.proxy.pid) - f0
        )  # two calls: the scanning one and a steady one
        walls = []
        body = b""
        c0, e0 = cpu_seconds(stack.proxy.pid), cpu_seconds(stack.engine.pid)
        for _i in range(calls):
            msgs.append({"role": "user", "content": text(rng, 60)})  # ~ one tool result's worth
            body = chat_body(msgs)
            t0 = time.perf_counter()
            r = client.post(stack.url + "/v1/chat/completions", content=body, headers=h)
            walls.append(time.perf_counter() - t0)
            r.raise_for_status()
            assert r.headers.get("x-gyre-request-id")
            msgs.append(
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
            )
        time.sleep(
            0.3
        )  # let the proxy finish its bookkeeping; /proc CPU has 10 ms ticks, so sum over calls
        cpu = (cpu_seconds(stack.proxy.pid) - c0) / calls
        engine_cpu = (cpu_seconds(stack.engine.pid) - e0) / calls
        walls.sort()
        rows.append(
            {
                "context_tokens": prompt,
                "messages": len(msgs),
                "body_mb": len(body) / 1e6,
                "cpu_ms_per_call": 1000 * cpu,
                "wall_ms_median": 1000 * walls[len(walls) // 2],
                "engine_cpu_ms_per_call": 1000 * engine_cpu,
                "first_two_extensions_cpu_ms": 1000 * first_ext,
            }
        )
    client.close()
    return rows


def bench_overhead(stack: Stack, calls: int) -> dict:
    client = httpx.Client(timeout=60)
    rng = random.Random(1)
    h = {"authorization": "Bearer overhead", "content-type": "application/json"}
    msgs = [
        {"role": "system", "content": text(rng, 100)},
        {"role": "user", "content": text(rng, 200)},
    ]
    r = client.post(stack.url + "/v1/chat/completions", content=chat_body(msgs), headers=h).json()
    n_in = r["usage"]["prompt_tokens"]
    msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
    proxy_t, direct_t = [], []
    for _i in range(calls):
        msgs.append({"role": "user", "content": text(rng, 20)})
        t0 = time.perf_counter()
        r = client.post(
            stack.url + "/v1/chat/completions", content=chat_body(msgs), headers=h
        ).json()
        proxy_t.append(time.perf_counter() - t0)
        msgs.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
        ids = list(range(10, 10 + r["usage"]["prompt_tokens"]))
        body = json.dumps(
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 16}, "return_logprob": True}
        ).encode()
        t0 = time.perf_counter()
        client.post(
            stack.engine_url + "/generate",
            content=body,
            headers={"content-type": "application/json"},
        ).json()
        direct_t.append(time.perf_counter() - t0)
    client.close()
    proxy_t.sort()
    direct_t.sort()
    p, d = proxy_t[len(proxy_t) // 2], direct_t[len(direct_t) // 2]
    return {
        "context_tokens": n_in,
        "proxy_ms": 1000 * p,
        "direct_ms": 1000 * d,
        "overhead_ms": 1000 * (p - d),
        "ratio": p / d,
    }


RETRIES = {"count": 0}


async def _post(client: httpx.AsyncClient, url: str, body: bytes, headers: dict) -> httpx.Response:
    """POST with one retry on a broken connection, as the SDKs do (counted and reported)."""
    try:
        return await client.post(url, content=body, headers=headers)
    except httpx.TransportError:
        RETRIES["count"] += 1
        return await client.post(
            url, content=body, headers={**headers, "x-stainless-retry-count": "1"}
        )


async def _load(url: str, n_exec: int, calls_each: int, direct: bool) -> float:
    # one client per 16 executions: httpcore scans its whole pool per request (quadratic in one big pool)
    # idle connections expire before the servers' keep-alive (uvicorn: 5 s) closes them
    clients = [
        httpx.AsyncClient(timeout=300, limits=httpx.Limits(keepalive_expiry=2.0))
        for _ in range((n_exec + 15) // 16)
    ]
    try:

        async def execution(i: int) -> None:
            client = clients[i // 16]
            rng = random.Random(i)
            h = {"authorization": f"Bearer load-{i}-{direct}", "content-type": "application/json"}
            msgs = [
                {"role": "system", "content": "agent"},
                {"role": "user", "content": text(rng, 100)},
            ]
            for _ in range(calls_each):
                if direct:
                    ids = list(range(10, 10 + 40 * len(msgs)))
                    body = json.dumps(
                        {
                            "input_ids": ids,
                            "sampling_params": {"max_new_tokens": 16},
                            "return_logprob": True,
                        }
                    ).encode()
                    r = await _post(client, url + "/generate", body, h)
                    r.raise_for_status()
                    msgs.append({"role": "user", "content": "x"})
                else:
                    r = await _post(client, url + "/v1/chat/completions", chat_body(msgs), h)
                    r.raise_for_status()
                    msgs.append(
                        {
                            "role": "assistant",
                            "content": r.json()["choices"][0]["message"]["content"],
                        }
                    )
                    msgs.append({"role": "user", "content": text(rng, 20)})

        t0 = time.perf_counter()
        await asyncio.gather(*(execution(i) for i in range(n_exec)))
        return n_exec * calls_each / (time.perf_counter() - t0)
    finally:
        for c in clients:
            await c.aclose()


def bench_concurrency(stack: Stack, n_exec: int, calls_each: int) -> dict:
    RETRIES["count"] = 0
    via = asyncio.run(_load(stack.url, n_exec, calls_each, direct=False))
    via_retries = RETRIES["count"]
    RETRIES["count"] = 0
    direct = asyncio.run(_load(stack.engine_url, n_exec, calls_each, direct=True))
    return {
        "executions": n_exec,
        "calls_each": calls_each,
        "proxy_calls_per_s": via,
        "direct_calls_per_s": direct,
        "ratio": via / direct,
        "client_retries_proxy": via_retries,
        "client_retries_direct": RETRIES["count"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--contexts", default=None, help="comma list of context sizes (tokens)")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--only", default="overhead,cpu,concurrency")
    ap.add_argument("--out", default=str(ROOT / "bench/results/bench_proxy.json"))
    args = ap.parse_args()
    from gyre.models.tiny import build_tiny_model

    model_dir = str(build_tiny_model("/tmp/gyre-bench-tiny"))
    contexts = [
        int(x)
        for x in (args.contexts or ("1000,8000" if args.quick else "1000,32000,500000")).split(",")
    ]
    trace_dir = f"/tmp/gyre-bench-proxy-traces-{os.getpid()}"
    stack = Stack(model_dir, trace_dir)
    results: dict = {}
    try:
        only = set(args.only.split(","))
        if "overhead" in only:
            o = bench_overhead(stack, 10 if args.quick else 40)
            results["overhead"] = o
            print("\n## Proxy overhead per call (null engine, sequential)")
            print("| context tokens | via proxy ms | engine direct ms | overhead ms | ratio |")
            print("|---:|---:|---:|---:|---:|")
            print(
                f"| {o['context_tokens']} | {o['proxy_ms']:.1f} | {o['direct_ms']:.1f} | {o['overhead_ms']:.1f} "
                f"| {o['ratio']:.2f}x |"
            )
        if "cpu" in only:
            rows = bench_cpu_vs_context(stack, contexts, 10 if args.quick else args.calls)
            results["cpu_vs_context"] = rows
            base = rows[0]["cpu_ms_per_call"]
            print("\n## Proxy CPU per call, request extending the previous one")
            print(
                "| context tokens | messages | body MB | proxy CPU ms/call | vs smallest | wall ms (median) "
                "| null engine CPU ms/call (not proxy) | one-time: first 2 extensions, proxy CPU ms |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['context_tokens']} | {r['messages']} | {r['body_mb']:.2f} | {r['cpu_ms_per_call']:.2f} "
                    f"| {r['cpu_ms_per_call'] / base:.2f}x | {r['wall_ms_median']:.1f} "
                    f"| {r['engine_cpu_ms_per_call']:.1f} | {r['first_two_extensions_cpu_ms']:.0f} |"
                )
        if "concurrency" in only:
            n = 32 if args.quick else args.concurrency
            c = bench_concurrency(stack, n, 3 if args.quick else 6)
            results["concurrency"] = c
            print(
                f"\n## Calls per second, {c['executions']} concurrent executions ({c['calls_each']} calls each)"
            )
            print(
                "| via proxy calls/s | engine direct calls/s | ratio | connection retries (proxy / direct) |"
            )
            print("|---:|---:|---:|---:|")
            print(
                f"| {c['proxy_calls_per_s']:.0f} | {c['direct_calls_per_s']:.0f} | {c['ratio']:.2f} "
                f"| {c['client_retries_proxy']} / {c['client_retries_direct']} |"
            )
    finally:
        stack.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n(machine shared with other work: absolute numbers are noisy; results in {args.out})")


if __name__ == "__main__":
    main()
