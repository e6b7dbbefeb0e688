"""An engine plus its HTTP server as one object with start/stop: what a Ray actor holds.

    svc = EngineService(EmbeddedEngineConfig(model_dir=DIR, engine_id="cell-0"))
    url = svc.start()            # serves on 127.0.0.1, free port
    ...                          # the proxy gets `url`; the controller calls svc.stop()

As a Ray actor: ``ray.remote(num_cpus=0)(EngineService).remote(cfg)`` then
``ray.get(actor.start.remote())``. Nothing here imports Ray, and the engine
runs in the server's own thread and loop, so the actor's methods never block
on generation.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gyre.engine.client import API_KEY_ENV
from gyre.engine.config import (
    EmbeddedEngineConfig,
    NullEngineConfig,
    ScriptedEngineConfig,
    VllmEngineConfig,
)

if TYPE_CHECKING:
    from gyre.engine.base import Engine
    from gyre.engine.runner import ServerRunner

RELOAD_ROOT_ENV = "GYRE_ENGINE_RELOAD_ROOT"
"""Set by ``gyre run`` for its cells (with :data:`~gyre.engine.client.API_KEY_ENV`): the only
folder their engines reload weights from."""

AnyEngineConfig = EmbeddedEngineConfig | ScriptedEngineConfig | NullEngineConfig | VllmEngineConfig


def make_engine(config: AnyEngineConfig, book=None) -> Engine:
    """An unstarted engine for a config (``book``: the ScriptBook of a scripted engine)."""
    if isinstance(config, EmbeddedEngineConfig):
        from gyre.engine.embedded import EmbeddedEngine

        return EmbeddedEngine(config)
    if isinstance(config, ScriptedEngineConfig):
        from gyre.engine.scripted import ScriptedEngine

        if book is None:
            raise ValueError("a scripted engine needs a ScriptBook")
        return ScriptedEngine(config, book)
    if isinstance(config, NullEngineConfig):
        from gyre.engine.null import NullEngine

        return NullEngine(config)
    if isinstance(config, VllmEngineConfig):
        from gyre.engine.vllm import VllmEngine

        return VllmEngine(config)
    raise TypeError(f"not an engine config: {type(config).__name__}")


class EngineService:
    def __init__(
        self,
        config: AnyEngineConfig,
        book=None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        stream_interval: int = 1,
        incremental_streaming_output: bool = False,
        api_key: str | None = None,
        reload_root: str | None = None,
    ):
        """``api_key`` / ``reload_root`` (the server's guards, :mod:`gyre.engine.app`)
        default to ``GYRE_ENGINE_API_KEY`` / ``GYRE_ENGINE_RELOAD_ROOT``: ``gyre run`` sets them
        in its cells' environment only, so the cell code needs no argument for them."""
        self.config = config
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.reload_root = reload_root or os.environ.get(RELOAD_ROOT_ENV) or None
        self.book = book
        self.host = host
        self.port = port
        self.stream_options: dict[str, Any] = dict(
            stream_interval=stream_interval,
            incremental_streaming_output=incremental_streaming_output,
        )
        self.engine: Engine | None = None
        self._runner: ServerRunner | None = None

    def start(self, timeout: float = 120.0) -> str:
        """Build the engine, serve it, return its URL (blocks until it accepts requests)."""
        from gyre.engine.app import create_app
        from gyre.engine.runner import ServerRunner

        if self._runner is not None:
            return self._runner.url
        engine = self.engine = make_engine(self.config, self.book)
        runner = ServerRunner(
            create_app(
                engine, api_key=self.api_key, reload_root=self.reload_root, **self.stream_options
            ),
            host=self.host,
            port=self.port,
            name=f"engine-{engine.engine_id}",
        )
        runner.start(timeout)
        self._runner = runner
        return runner.url

    @property
    def url(self) -> str | None:
        return self._runner.url if self._runner is not None else None

    @property
    def engine_id(self) -> str | None:
        return self.engine.engine_id if self.engine is not None else None

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
