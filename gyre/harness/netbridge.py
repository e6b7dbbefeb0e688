"""Proxy-only networking for sandboxed harnesses: TCP inside the sandbox -> unix socket -> proxy.

With ``--unshare-net`` a sandbox has its own, empty network namespace (only
its own loopback), so a harness cannot reach the host's engines, Ray, or
anything else -- and also not the proxy. This module bridges exactly one
endpoint through the filesystem:

- outside, :class:`UnixForwarder` (asyncio, in the executor) accepts
  connections on a unix socket and pipes each to the proxy's TCP address;
- inside, ``python -m gyre.harness.netbridge --listen 127.0.0.1:PORT --unix
  SOCK -- CMD...`` (stdlib only, started by bwrap) listens on the sandbox's
  loopback, pipes each connection to the unix socket, runs ``CMD`` as its
  child and exits with its status.

The harness keeps using ``http://127.0.0.1:PORT`` and can reach nothing else.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

_BUF = 64 * 1024


# ---- outside the sandbox (executor side) ------------------------------------------
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

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path, self.host, self.port = Path(path), host, port
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
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


# ---- inside the sandbox (stdlib only, threads) -----------------------------------------
def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        try:
            c, _ = listener.accept()
        except OSError:
            return
        try:
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(unix_path)
        except OSError:
            c.close()
            continue
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=_copy, args=(a, b), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(
            "usage: python -m gyre.harness.netbridge --listen HOST:PORT --unix PATH -- CMD...",
            file=sys.stderr,
        )
        return 2
    i = args.index("--")
    opts, cmd = args[:i], args[i + 1 :]
    o = dict(zip(opts[::2], opts[1::2]))
    host, _, port = o["--listen"].rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    threading.Thread(target=_serve, args=(listener, o["--unix"]), daemon=True).start()
    try:
        return subprocess.call(cmd)
    except FileNotFoundError as e:
        print(f"netbridge: cannot start {cmd[:1]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    os.environ.pop("PYTHONINSPECT", None)
    sys.exit(main())
