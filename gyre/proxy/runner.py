"""Start/stop a proxy on 127.0.0.1 from Python (tests, the harness executor, the runtime).

    server = ProxyServer(ProxyConfig(model_dir=..., engines=[url], mode="managed",
                                     trace_dir=...)).start()
    key = server.admin_client().register("exec-1", label="main")
    ... harness uses base_url=server.url (+"/v1" for OpenAI clients), api key = key ...
    server.stop()

The API listens on ``server.url``; the admin routes only on the unix socket
``server.admin_socket`` (0600, private directory; see :mod:`gyre.proxy.listeners`),
with a token that lives in this process's memory only (generated when the
config has none). Both run in one thread with its own event loop; ``drain``
and friends are forwarded to that loop, so a sync caller (or a Ray actor) can
drive the pool directly.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from gyre.proxy.app import build_admin_app, build_app
from gyre.proxy.config import ProxyConfig
from gyre.proxy.listeners import Listeners, bind_admin_socket, bind_tcp, remove_admin_socket
from gyre.proxy.service import ProxyService

KEEP_ALIVE_S = 75
"""Idle keep-alive before the proxy closes a client connection. Longer than SDK connection pools
keep idle connections (httpx: 5 s), so a client never sends on a connection being closed."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, tokenizer: Any = None) -> None:
        if not config.admin_token:
            config = config.model_copy(update={"admin_token": secrets.token_urlsafe(24)})
        self.config = config
        self.service = ProxyService(config, tokenizer)
        self.app = build_app(config, service=self.service)
        self.admin_app = build_admin_app(config, self.service)
        self._listeners: Listeners | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._admin_path: Path | None = None
        self._admin_dir: Path | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "proxy not started"
        return f"http://{self.config.host}:{self.port}"

    @property
    def admin_socket(self) -> str:
        """Path of the admin routes' unix socket (``ProxyAdminClient(server.admin_socket, token)``)."""
        assert self._admin_path is not None, "proxy not started"
        return str(self._admin_path)

    @property
    def admin_token(self) -> str:
        assert self.config.admin_token
        return self.config.admin_token

    def admin_client(self, timeout: float = 30.0):
        """A :class:`~gyre.proxy.admin.ProxyAdminClient` on this proxy's admin socket."""
        from gyre.proxy.admin import ProxyAdminClient

        return ProxyAdminClient(self.admin_socket, self.admin_token, timeout=timeout)

    def set_engine_api_key(self, key: str | None) -> None:
        """The API key the pool sends every engine (``None``: ``$GYRE_ENGINE_API_KEY``, or none).
        ``gyre run`` passes the run's secret here, so it never enters the environment harnesses
        inherit. Before :meth:`start`: the pool connects its engines with it as it adds them."""
        if self._thread is not None:
            raise RuntimeError("set the engine API key before the proxy starts")
        self.service.pool.api_key = key

    def start(self, timeout: float = 60.0) -> ProxyServer:
        """Bind both listeners, serve in a daemon thread, return once both accept connections."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        api_sock = bind_tcp(self.config.host, self.config.port)
        try:
            admin_sock, self._admin_path, self._admin_dir = bind_admin_socket(
                self.config.admin_socket
            )
        except BaseException:
            api_sock.close()
            raise
        self.port = api_sock.getsockname()[1]
        self._listeners = lst = Listeners(
            self.app,
            self.admin_app,
            api_sock,
            admin_sock,
            read_timeout_s=self.config.client_read_timeout_s,
            keep_alive_s=KEEP_ALIVE_S,
            max_connections=self.config.max_client_connections,
        )

        def run() -> None:
            try:
                asyncio.run(lst.serve())
            except BaseException as e:  # surfaced by start()
                self._error = e
            finally:
                api_sock.close()
                admin_sock.close()

        self._thread = threading.Thread(target=run, name=f"gyre-proxy:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not lst.started:
            if not self._thread.is_alive():
                self._thread = None
                remove_admin_socket(self._admin_path, self._admin_dir)
                why = getattr(self.app.state, "startup_error", None) or self._error
                raise RuntimeError(f"proxy failed to start: {type(why).__name__}: {why}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"proxy did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._listeners is not None:
            self._listeners.request_exit()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._listeners is not None:
                self._listeners.request_exit(force=True)  # an endless stream: stop anyway
                self._thread.join(5.0)
            self._thread = None
        remove_admin_socket(self._admin_path, self._admin_dir)
        self._listeners = None

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

    def remove_engine(self, engine_url: str, timeout: float | None = None) -> None:
        """Take an engine out of the pool (drained first: the calls it holds move elsewhere); no
        call is routed there again."""
        self.call(self.service.pool.remove(engine_url), timeout)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
