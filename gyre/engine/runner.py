"""Serve any ASGI app with uvicorn on 127.0.0.1 in a background thread.

Tests (engine's and proxy's) and benchmarks start engines and proxies with it:

    server = ServerRunner(app).start()      # blocks until it accepts connections
    ... server.url ...                      # e.g. http://127.0.0.1:43121
    server.stop()

The socket is bound before uvicorn starts (port 0 -> a free port chosen by the
OS, no race between "find a free port" and "bind it"). The server runs its own
event loop in its own thread, so it works from sync code, from an asyncio test
(its loop is never blocked by the server) and from a Ray actor. The app's
lifespan (startup/shutdown) runs, so an engine app starts and stops its engine
with the server.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class ServerRunner:
    """One uvicorn server in a daemon thread; explicit :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        name: str = "gyre-asgi",
        **uvicorn_kwargs: Any,
    ):
        self.app = app
        self.host = host
        self.requested_port = port
        self.log_level = log_level
        self.name = name
        self.uvicorn_kwargs = uvicorn_kwargs
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._error: BaseException | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> ServerRunner:
        """Bind, start serving, and return once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.requested_port))
        sock.set_inheritable(True)
        self._sock = sock
        self.port = sock.getsockname()[1]
        kwargs: dict[str, Any] = dict(
            log_level=self.log_level, lifespan="on", access_log=False, timeout_graceful_shutdown=5
        )
        kwargs.update(self.uvicorn_kwargs)
        config = uvicorn.Config(self.app, host=self.host, port=self.port, **kwargs)
        server = self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as e:  # surfaced by start()/stop()
                self._error = e

        self._thread = threading.Thread(target=run, name=f"{self.name}:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive():
                self._close_sock()
                state = getattr(self.app, "state", None)
                why = getattr(state, "startup_error", None) or self._error
                raise RuntimeError(
                    f"server {self.name} failed to start: {type(why).__name__}: {why}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server {self.name} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Ask uvicorn to exit (runs lifespan shutdown) and join the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # graceful shutdown stuck (e.g. an endless stream): force
                assert self._server is not None  # the thread serves it
                self._server.force_exit = True
                self._thread.join(5.0)
        self._close_sock()
        self._thread = None

    def _close_sock(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    async def astart(self, timeout: float = 30.0) -> ServerRunner:
        """:meth:`start` without blocking the caller's event loop."""
        import asyncio

        return await asyncio.to_thread(self.start, timeout)

    async def astop(self, timeout: float = 15.0) -> None:
        import asyncio

        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self) -> ServerRunner:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def __aenter__(self) -> ServerRunner:
        return await self.astart()

    async def __aexit__(self, *exc: Any) -> None:
        await self.astop()
