"""KV migration on reroute: a rerouted call's wait on the new engine, K/V moved vs re-prefilled.

Two embedded engines serve over HTTP (real servers on 127.0.0.1, this process). A call with a
context of L tokens runs on engine A until it has sampled a few tokens, then it is parked as a
drain parks it (abort ``keep_kv``). The time measured is what the call waits on engine B for its
next token:

- migrated: ``/kv_export`` from A, ``/kv_import`` into B (gyre.proxy.kvmove.move_kv, the proxy's
  own code, bytes over HTTP), then ``/generate`` on B, to its first token;
- re-prefilled: ``/generate`` on B with the same input and no K/V (what a reroute did before),
  to its first token.

B has no prefix cache, so the re-prefill computes the whole context. Models: a tiny Qwen3 built
from a config (4 layers, hidden 256, 2 K/V heads of 64; max position 65536) at 2K, 8K and 32K
tokens, and SmolLM2-135M (runs/smollm2) when present, at 2K and 8K (its context is 8192: 32K
does not fit; the 8K point uses 8192 - 32 tokens).

    python bench/bench_kv_migration.py [--sizes 2048,8192,32768] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _first_token(client, rid: str, ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = await client.generate(
        ids, {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}, rid=rid
    )
    return time.perf_counter() - t0, int(r.meta_info.cached_tokens or 0)


async def _park(client, ids: list[int], new: int) -> tuple[str, list[int]]:
    """A call on A that has sampled ``new`` tokens, parked: its rid and output."""
    rid = f"bench-{uuid.uuid4().hex[:8]}"
    sampling = {"max_new_tokens": new + 24, "temperature": 0.0, "ignore_eos": True}
    out: list[int] = []
    parked = False
    async for chunk in client.generate_stream(ids, sampling, rid=rid):
        out = list(chunk.output_ids)
        if not parked and len(out) >= new:
            await client.abort(rid, keep_kv=True)
            parked = True
        if chunk.meta_info.finish_reason is not None:
            assert chunk.meta_info.finish_reason.type == "abort", "finished before its park"
            break
    return rid, out


async def measure(model_dir: str, sizes: list[int], threads: int, vocab: int) -> list[dict]:
    from gyre.engine.app import create_app
    from gyre.engine.client import EngineClient
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.runner import ServerRunner
    from gyre.proxy.attempts import open_engine
    from gyre.proxy.config import PoolConfig
    from gyre.proxy.counters import PoolCounters
    from gyre.proxy.kvmove import move_kv

    def engine(name: str):
        cfg = EmbeddedEngineConfig(
            model_dir=model_dir,
            engine_id=name,
            torch_threads=threads,
            prefix_cache_mb=0,
            kv_migration_mb=8192,
        )
        return ServerRunner(create_app(EmbeddedEngine(cfg)), name=name).start(timeout=600)

    rows = []
    a, b = engine("A"), engine("B")
    try:
        cfg = PoolConfig()
        ha, hb = await open_engine(a.url, cfg, None), await open_engine(b.url, cfg, None)
        # generation without a read timeout: a 32K-token prefill takes minutes on 2 loaded cores
        ca, cb = EngineClient(a.url, read_timeout=None), EngineClient(b.url, read_timeout=None)
        rng = random.Random(0)
        for n in sizes:
            ids = [rng.randrange(20, vocab) for _ in range(n)]
            rid, out = await _park(ca, ids, 4)
            ctx = ids + out
            counters = PoolCounters()
            new_rid = f"bench-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            moved = await move_kv(ha, hb, rid, new_rid, counters, 600.0)
            transfer = time.perf_counter() - t0
            assert moved is not None, counters
            gen_s, cached = await _first_token(cb, new_rid, ctx)
            assert cached == len(ctx) - 1, (cached, len(ctx))
            migrated = transfer + gen_s
            reprefill, cached = await _first_token(cb, f"bench-{uuid.uuid4().hex[:8]}", ctx)
            assert cached == 0
            row = {
                "context_tokens": len(ctx),
                "kv_bytes": moved.nbytes,
                "transfer_s": round(transfer, 4),
                "migrated_wait_s": round(migrated, 4),
                "reprefill_wait_s": round(reprefill, 4),
                "speedup": round(reprefill / migrated, 1),
                "target_estimate_s": None
                if moved.prefill_estimate_s is None
                else round(moved.prefill_estimate_s, 3),
                "load": load(),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        for h in (ha, hb):
            await h.session.close()
            await h.ctl.aclose()
        await ca.aclose()
        await cb.aclose()
    finally:
        a.stop()
        b.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2048,8192,32768")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-real", action="store_true", help="skip SmolLM2-135M")
    ap.add_argument("--no-tiny", action="store_true", help="skip the tiny model")
    args = ap.parse_args()
    import torch

    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"CPU: {cpu_model()}  ({os.cpu_count()} cores, torch {torch.__version__})")
    print(f"load average at start: {load()}  threads per engine: {args.threads}")
    result: dict = {"cpu": cpu_model(), "load_start": load(), "threads": args.threads}

    from gyre.models.tiny import build_tiny_model

    if not args.no_tiny:
        with tempfile.TemporaryDirectory() as tmp:
            tiny = str(build_tiny_model(Path(tmp) / "tiny", layers=4, hidden=256, head_dim=64))
            print("\ntiny Qwen3 (4 layers, hidden 256, 2 K/V heads x 64, float32): 4 KiB/token")
            result["tiny"] = asyncio.run(measure(tiny, sizes, args.threads, 2000))
    real = ROOT / "runs" / "smollm2"
    if not args.no_real and (real / "config.json").exists():
        cfg = json.loads((real / "config.json").read_text())
        limit = int(cfg.get("max_position_embeddings", 8192))
        fit = sorted({min(n, limit - 32) for n in sizes})  # + 4 sampled + 24 budget
        print(
            f"\nSmolLM2-135M ({cfg['num_hidden_layers']} layers, {cfg['num_key_value_heads']} K/V "
            f"heads x {cfg['hidden_size'] // cfg['num_attention_heads']}, float32: 45 KiB/token); "
            f"context limit {limit}: sizes {fit}"
        )
        result["smollm2"] = asyncio.run(measure(str(real), fit, args.threads, 40000))
    else:
        print(f"\n{real} absent: SmolLM2-135M skipped")
    result["load_end"] = load()
    print(f"\nload average at end: {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
