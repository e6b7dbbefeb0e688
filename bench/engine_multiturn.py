"""Prefix reuse across turns (bench_engine.py): time to first token on the last turn of a
conversation that grows by tool output each turn, the prefix cache against a fresh prefill.

The conversation: a first prompt (system prompt, task, files: the bulk of the context), then
each turn ``n_out`` generated tokens and a ``tool`` token tool result, so that the last turn's
input is ``context`` tokens. With the cache, the last turn prefills only what is new since the
previous turn (its output's last token and the tool result), so the best speed-up is about
``context / (tool + 1)`` on the linear layers (more on attention, which is quadratic); the
table prints that count beside the measured time.

An agent's turn k+1 is turn k's input + turn k's output + a tool result, token for token (the
proxy keeps it so), so an engine that kept turn k's K/V prefills only the new tool result. Two
engines of the same model serve the last turn's input: one that served the conversation with
its prefix cache (big enough for the conversation's K/V), and a fresh one without a cache; the
last turn asks for one token, so its latency is the time to first token (prefill + one sample +
HTTP). Earlier turns generate ``n_out`` tokens each (greedy).
"""

from __future__ import annotations

import time


def tool_output(turn: int, n: int, vocab: int) -> list[int]:
    """``n`` token ids standing for a tool's output (ordinary ids, no special tokens)."""
    span = max(16, min(vocab, 30000) - 200)
    return [(9973 * turn + 31 * i) % span + 100 for i in range(n)]


async def conversation_ttft(
    model_dir: str,
    context: int,
    turns: int,
    n_out: int,
    tool: int,
    threads: int,
    cache_mb: float,
    final: list[int] | None = None,
) -> tuple[dict[str, float], list[int]]:
    """Run one ``turns``-turn conversation ending near ``context`` tokens on an engine with
    ``cache_mb`` MiB of prefix cache (0: off); the last turn's TTFT, its reused tokens and the
    conversation's hit rate, and the last turn's input. With ``final``, only that input is sent
    (a fresh prefill of it)."""
    from gyre.engine.app import create_app
    from gyre.engine.client import EngineClient
    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.runner import ServerRunner

    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_dir=model_dir, torch_threads=threads, prefix_cache_mb=cache_mb)
    )
    first = max(32, context - (turns - 1) * (n_out + tool))
    sp = {"max_new_tokens": n_out, "temperature": 0.0, "ignore_eos": True}
    async with ServerRunner(create_app(engine)) as srv, EngineClient(srv.url) as c:
        await c.generate([100, 101, 102], {**sp, "max_new_tokens": 2})  # warm-up (no reuse)
        st0 = engine.stats()
        ids: list[int] = []
        fed = reused = 0
        for k in range(1, turns if final is None else 1):
            ids = ids + tool_output(k, first if k == 1 else tool, engine.vocab_size)
            r = await c.generate(ids, sp)
            fed, reused = fed + len(ids), reused + r.meta_info.cached_tokens
            ids = ids + list(r.output_ids)
        ids = ids + tool_output(turns, tool, engine.vocab_size) if final is None else final
        t, cpu = time.perf_counter(), time.process_time()
        r = await c.generate(ids, {**sp, "max_new_tokens": 1})
        ttft, ttft_cpu = time.perf_counter() - t, time.process_time() - cpu
        fed, reused = fed + len(ids), reused + r.meta_info.cached_tokens
        st = engine.stats()
        hits = st.get("prefix_cache_hits", 0) - st0.get("prefix_cache_hits", 0)
        misses = st.get("prefix_cache_misses", 0) - st0.get("prefix_cache_misses", 0)
    return {
        "context": len(ids),
        "prefilled": len(ids) - r.meta_info.cached_tokens,
        "ttft_s": ttft,
        "ttft_cpu_s": ttft_cpu,  # this process's CPU time (engine, server and client all here)
        "last_turn_cached_tokens": r.meta_info.cached_tokens,
        "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "hits": hits,
        "lookups": hits + misses,
        "token_reuse": reused / fed if fed else 0.0,
    }, ids
