"""Start real engines and a proxy on 127.0.0.1 in-process (test-only; not part of the package).

    with running_engine("scripted", model_dir, turns=[...]) as eng, \\
         running_proxy(model_dir, [eng.url], trace_dir) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="any")

Named plainly: the scripted engine is a test double (fixed turns through the
real tokenizer); the embedded engine runs the real tiny model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.runner import ProxyServer


def make_engine(
    kind: str, model_dir: str, *, turns: Any = None, engine_id: str | None = None, **kw: Any
):
    if kind == "embedded":
        from gyre.engine.config import EmbeddedEngineConfig
        from gyre.engine.embedded import EmbeddedEngine

        return EmbeddedEngine(
            EmbeddedEngineConfig(model_dir=str(model_dir), engine_id=engine_id, **kw)
        )
    if kind == "scripted":
        from gyre.engine.config import ScriptedEngineConfig
        from gyre.engine.scripted import ScriptBook, ScriptedEngine

        return ScriptedEngine(
            ScriptedEngineConfig(tokenizer_dir=str(model_dir), engine_id=engine_id, **kw),
            ScriptBook.from_json(turns),
        )
    if kind == "null":
        from gyre.engine.config import NullEngineConfig
        from gyre.engine.null import NullEngine

        return NullEngine(NullEngineConfig(engine_id=engine_id, **kw))
    raise ValueError(f"unknown engine kind {kind!r}")


@contextlib.contextmanager
def running_engine(kind: str, model_dir: str, **kw: Any) -> Iterator[ServerRunner]:
    from gyre.engine.app import create_app

    runner = ServerRunner(
        create_app(make_engine(kind, model_dir, **kw)), name=f"engine-{kind}"
    ).start()
    try:
        yield runner
    finally:
        runner.stop()


@contextlib.contextmanager
def running_proxy(
    model_dir: str, engines: list[str], trace_dir: str, tokenizer: Any = None, **cfg: Any
) -> Iterator[ProxyServer]:
    server = ProxyServer(
        ProxyConfig(model_dir=str(model_dir), engines=engines, trace_dir=str(trace_dir), **cfg),
        tokenizer,
    ).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def scripted_proxy_stack(
    model_dir: str, book: dict, trace_dir: Path, parser: str = "hermes"
) -> Iterator[tuple]:
    """A scripted engine behind a managed proxy on 127.0.0.1, the end-to-end harness tests'
    stack; yields (proxy_url, register, trace_dir), ``register`` an async admin call.
    ``parser``: the proxy's output parser."""
    from gyre.engine.app import create_app
    from gyre.engine.config import ScriptedEngineConfig
    from gyre.engine.scripted import ScriptBook, ScriptedEngine
    from gyre.proxy.admin import ProxyAdminClient

    engine = ScriptedEngine(
        ScriptedEngineConfig(tokenizer_dir=str(model_dir)), ScriptBook.from_json(book)
    )
    eng = ServerRunner(create_app(engine), name="scripted-engine").start()
    proxy = ProxyServer(
        ProxyConfig(
            model_dir=str(model_dir),
            engines=[eng.url],
            mode="managed",
            trace_dir=str(trace_dir),
            max_context_tokens=1 << 20,
            fsync=False,
            parser=parser,
        )
    ).start()
    admin = ProxyAdminClient(proxy.admin_socket, proxy.admin_token)

    async def register(execution_id: str, label: str) -> str:
        return await asyncio.to_thread(admin.register, execution_id, label)

    try:
        yield proxy.url, register, trace_dir
    finally:
        admin.close()
        proxy.stop()
        eng.stop()
