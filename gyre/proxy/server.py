"""Start/stop a proxy on 127.0.0.1 from Python (tests, the harness executor, the runtime).

    server = ProxyServer(ProxyConfig(model_dir=..., engines=[url], mode="managed",
                                     admin_token="t", trace_dir=...)).start()
    key = ProxyAdminClient(server.url, "t").register("exec-1", label="main")
    ... harness uses base_url=server.url (+"/v1" for OpenAI clients), api key = key ...
    server.stop()

The server runs uvicorn in its own thread with its own event loop; ``drain``
and friends are forwarded to that loop, so a sync caller (or a Ray actor) can
drive the pool directly.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from gyre.engine.runner import ServerRunner
from gyre.proxy.app import build_app
from gyre.proxy.config import ProxyConfig
from gyre.proxy.service import ProxyService

KEEP_ALIVE_S = 75
"""Idle keep-alive before the proxy closes a client connection. Longer than SDK connection pools
keep idle connections (httpx: 5 s), so a client never sends on a connection being closed."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, tokenizer: Any = None) -> None:
        if config.mode == "managed" and not config.admin_token:
            config = config.model_copy(update={"admin_token": secrets.token_urlsafe(24)})
        self.config = config
        self.service = ProxyService(config, tokenizer)
        self.app = build_app(config, service=self.service)
        self._runner: ServerRunner | None = None

    @property
    def url(self) -> str:
        assert self._runner is not None, "proxy not started"
        return self._runner.url

    @property
    def admin_token(self) -> str | None:
        return self.config.admin_token

    def start(self, timeout: float = 60.0) -> ProxyServer:
        self._runner = ServerRunner(
            self.app,
            host=self.config.host,
            port=self.config.port,
            name="gyre-proxy",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._runner.start(timeout)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None

    def call(self, coro, timeout: float | None = None) -> Any:
        """Run a coroutine on the proxy's event loop from another thread (e.g. ``pool.drain(url)``)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.service_loop())
        return fut.result(timeout)

    def service_loop(self) -> asyncio.AbstractEventLoop:
        loop = getattr(self.service, "loop", None)
        if loop is None:
            raise RuntimeError("proxy not started")
        return loop

    def drain(self, engine_url: str, timeout: float | None = None) -> int:
        return self.call(self.service.pool.drain(engine_url), timeout)

    def add_engine(self, engine_url: str) -> None:
        self.call(self.service.pool.add(engine_url))

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
