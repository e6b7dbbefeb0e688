"""Start real engines and a proxy on 127.0.0.1 in-process (test-only; not part of the package).

    with running_engine("scripted", model_dir, turns=[...]) as eng, \\
         running_proxy(model_dir, [eng.url], trace_dir) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="any")

Named plainly: the scripted engine is a test double (fixed turns through the
real tokenizer); the embedded engine runs the real tiny model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gyre.engine.runner import ServerRunner
from gyre.proxy.config import ProxyConfig
from gyre.proxy.server import ProxyServer


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
    from gyre.engine.server import create_app

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
