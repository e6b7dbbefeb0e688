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

``restart()`` brings a proxy back after it died (or after ``kill()``, which stops it the way a
crash does): same address, admin socket, token, trace directory and engines, with the run's
registrations carried over (:mod:`gyre.proxy.restart`), so harnesses whose SDKs retry a refused
connection go on where they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from gyre.proxy.app import build_admin_app, build_app
from gyre.proxy.config import ProxyConfig
from gyre.proxy.heartbeat import EngineListener
from gyre.proxy.listeners import Listeners, bind_admin_socket, bind_tcp, remove_admin_socket
from gyre.proxy.restart import carry_over
from gyre.proxy.service import ProxyService

KEEP_ALIVE_S = 75
"""Idle keep-alive before the proxy closes a client connection. Longer than SDK connection pools
keep idle connections (httpx: 5 s), so a client never sends on a connection being closed."""


class ProxyServer:
    def __init__(self, config: ProxyConfig, tokenizer: Any = None) -> None:
        if not config.admin_token:
            config = config.model_copy(update={"admin_token": secrets.token_urlsafe(24)})
        self.config = config
        self._tokenizer = tokenizer
        self.service = ProxyService(config, tokenizer)
        self.app = build_app(config, service=self.service)
        self.admin_app = build_admin_app(config, self.service)
        self.restarts = 0
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
            admin_sock, self._admin_path, made = bind_admin_socket(self.config.admin_socket)
            self._admin_dir = self._admin_dir or made  # a restart binds in the first start's dir
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

    def kill(self) -> None:
        """Stop at once, the way a crash does: every client connection is cut mid-answer (an SDK
        sees a broken connection and retries), nothing is drained, the admin socket's directory
        is kept for :meth:`restart`. For fault tests and the runtime's fault injection."""
        lst = self._listeners
        if lst is not None and self._thread is not None and self._thread.is_alive():
            loop = self.service.loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop may end meanwhile
                    loop.call_soon_threadsafe(lst.cut_connections)
            lst.request_exit(force=True)
            self._thread.join(10.0)
        self._thread = None
        self._listeners = None

    @property
    def alive(self) -> bool:
        """Serving: started, and its thread has not ended (stopped, killed or crashed)."""
        return self._thread is not None and self._thread.is_alive()

    def restart(self, timeout: float = 60.0) -> ProxyServer:
        """A fresh proxy on the same address (port, admin socket and token), trace directory and
        engines, carrying over what the run registered (keys, call tallies, execution states:
        see :mod:`gyre.proxy.restart`). The old one is killed first if it still runs."""
        if self.alive:
            self.kill()
        self._thread = None
        old = self.service
        with contextlib.suppress(Exception):  # a crash skips the service's own close: its files
            old.writer.close()
        engines = old.pool.active_urls() if old.loop is not None else list(self.config.engines)
        self.config = self.config.model_copy(
            update={
                "port": self.port or self.config.port,
                "admin_socket": str(self._admin_path) if self._admin_path else None,
                "engines": engines,
            }
        )
        if self._admin_dir is not None and not self._admin_dir.exists():  # a clean stop removed it
            self._admin_dir.mkdir(mode=0o700)  # same path: the run's admin clients still reach it
        self.service = ProxyService(self.config, old.tokenizer)
        carry_over(old, self.service)
        self.app = build_app(self.config, service=self.service)
        self.admin_app = build_admin_app(self.config, self.service)
        self.restarts += 1
        return self.start(timeout)

    def on_engine_event(self, listener: EngineListener) -> None:
        """Call ``listener`` with every :class:`~gyre.proxy.heartbeat.EngineEvent` (an engine
        lost or back). It runs on the proxy's event loop thread: hand the event over to another
        loop with ``call_soon_threadsafe``. Kept across :meth:`restart`."""
        self.service.pool.listeners.append(listener)

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

    def remove_engine(
        self, engine_url: str, timeout: float | None = None, lost: str | None = None
    ) -> None:
        """Take an engine out of the pool (drained first: the calls it holds move elsewhere); no
        call is routed there again. ``lost``: why it is known dead or hung (its calls move at
        once, :meth:`gyre.proxy.pool.EnginePool.remove`)."""
        self.call(self.service.pool.remove(engine_url, lost), timeout)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
