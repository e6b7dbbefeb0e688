"""The executor's side of the proxy-only sandbox network: a unix socket piped to the proxy.

Each proxy-only sandbox sees this socket (bind-mounted into it); the stdlib
bridge inside (:mod:`gyre.harness.netbridge`) turns it back into a loopback TCP
port for the harness. Kept apart from the bridge so the bridge's start inside
every sandbox does not pay for importing asyncio.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

_BUF = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(_BUF)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


class UnixForwarder:
    """Accepts on a unix socket, forwards each connection to ``host:port`` (explicit start/stop)."""

    def __init__(self, path: Path, host: str, port: int, max_connections: int = 64) -> None:
        self.path, self.host, self.port = Path(path), host, port
        # One execution's share of the proxy: without a cap, 1100 idle connections from one
        # harness take every file descriptor the proxy has (every other execution times out).
        self.max_connections = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if len(self._conns) >= self.max_connections:
            w.close()  # past this execution's share: closed at once, the proxy never sees it
            return
        me = asyncio.current_task()
        if me is not None:
            self._conns.add(me)
        try:
            ur, uw = await asyncio.open_connection(self.host, self.port)
        except OSError:
            w.close()
            return
        try:
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
        except asyncio.CancelledError:
            # stop() cancels open connections. This task is the root of its connection (the
            # server's, awaited by no one but stop()), and Python 3.11's stream callback
            # calls .exception() on it, which re-raises a cancellation as an "Exception in
            # callback" traceback in the run's log: end it normally instead.
            pass
        finally:
            for x in (w, uw):
                x.close()
            if me is not None:
                self._conns.discard(me)

    async def start(self) -> UnixForwarder:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            self._server = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
