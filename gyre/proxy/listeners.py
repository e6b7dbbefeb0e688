"""The proxy's two listeners: the API on a TCP port, the admin routes on a private unix socket.

Why two: harnesses reach the API port (directly, or through the sandbox's
network bridge, which forwards exactly that port). Admin routes (register a
key, drain an engine) on that same port would be one leaked token away from a
harness. On a unix socket created 0600 inside a 0700 directory they are
reachable only by the proxy's own user through the file system, never through
the bridge, and still need the bearer token. Both servers run on one event
loop, so admin handlers touch the service without locks.

Both also close client connections that stall mid-request (headers or body not
completed within ``read_timeout_s`` of silence): uvicorn only times out idle
keep-alive connections, so a client sending half a request held its socket
(and, for a body, a task) forever. Silence is not enough for the headers: a
slowloris client sends one header line now and then and is never silent, and
200 such connections stayed open for as long as they liked. So a request's
headers must also be complete within ``read_timeout_s`` of its first byte, and
within ``MAX_HEADER_BYTES`` (httptools has no limit of its own; h11's is 16 KiB).
A body is only held to the silence bound: an upload of tens of MB may take a
while, and once the headers are in it is a request the app reads.

File descriptors: one harness holding 1100 idle connections exhausts a proxy at
the common soft limit of 1024 -- every accept fails (every other client times
out) and asyncio logs each failure with a traceback (64 MB of log in 25 s). So the soft limit is raised to the hard one at start
(:func:`raise_nofile`), and the API port keeps at most ``max_connections``
client connections (held below that limit with room for traces and engine
connections): one more is closed at once, and that is logged once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gyre.proxy.listeners")

ADMIN_SOCKET_NAME = "admin.sock"


FD_RESERVE = 256  # descriptors kept for trace files, engine connections, the admin socket
MAX_HEADER_BYTES = 64 << 10  # a request's line and headers (431 above); real ones are < 8 KiB
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)
_REFUSAL_LOG_EVERY_S = 60.0


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(wanted: int, nofile: int) -> int:
    """Client connections one server may hold: ``wanted``, below the file limit with a reserve
    (``FD_RESERVE``, or a quarter of a small limit) for everything else (pure)."""
    return max(16, min(wanted, nofile - min(FD_RESERVE, nofile // 4)))


class _ReadTimeout:
    """Closes a connection silent for ``read_timeout_s`` mid-request (mixed into uvicorn's
    protocols, which say when a request is incomplete), and one past ``max_connections``."""

    read_timeout_s: float = 60.0
    max_connections: int = 1 << 30
    _read_timer: asyncio.TimerHandle | None = None
    _header_timer: asyncio.TimerHandle | None = None  # armed from a request's first byte
    _header_bytes = 0  # of the request whose headers are incomplete
    _last_refusal_log: float = -1e9  # class-wide: one log line a minute for every refusal
    # set by the uvicorn protocol this is mixed into
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: FlowControl
    server_state: Any

    def _over_cap(self) -> bool:
        """After connection_made: close this connection at once if one too many are open."""
        if len(self.server_state.connections) <= self.max_connections:
            return False
        self.transport.abort()
        now = time.monotonic()
        if now - _ReadTimeout._last_refusal_log >= _REFUSAL_LOG_EVERY_S:
            _ReadTimeout._last_refusal_log = now
            log.warning(
                "client connections at the limit (%d): new ones are closed at once",
                self.max_connections,
            )
        return True

    def _owes_bytes(self) -> bool:
        """After data arrived: is the request still incomplete?"""
        raise NotImplementedError

    def _mid_request(self) -> bool:
        """When the timer fires: is the connection stalled (not idle between requests)?"""
        raise NotImplementedError

    def _arm(self) -> None:
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _arm_headers(self) -> None:
        """A request began: its headers must be complete within ``read_timeout_s``, however
        the bytes trickle in (idempotent while armed)."""
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.read_timeout_s, self._headers_late)

    def _disarm_headers(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _in_headers(self) -> bool:
        """Has a request begun whose headers are not complete yet?"""
        raise NotImplementedError

    def _count_header_bytes(self, n: int) -> bool:
        """Count ``n`` bytes received while headers are incomplete; past ``MAX_HEADER_BYTES``
        answer 431 and close (True)."""
        if not self._in_headers():
            return False
        self._header_bytes += n
        if self._header_bytes <= MAX_HEADER_BYTES:
            return False
        self.transport.write(_TOO_LARGE)
        self.transport.close()
        return True

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and self._in_headers():
            log.warning(
                "closing a client connection whose request headers took over %.0fs",
                self.read_timeout_s,
            )
            self.transport.close()

    def _read_timed_out(self) -> None:
        self._read_timer = None
        transport, flow = self.transport, self.flow
        if transport.is_closing():
            return
        if flow is not None and flow.read_paused:
            self._arm()  # we stopped reading (back-pressure), the client did not stall
            return
        if self._mid_request():
            log.warning(
                "closing a client connection silent for %.0fs mid-request", self.read_timeout_s
            )
            transport.close()


class _H11ReadTimeout(_ReadTimeout, H11Protocol):
    # uvicorn narrows asyncio.Protocol's BaseTransport to Transport (and ignores it too)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._over_cap():
            self._arm()  # a connection that never sends a byte is stalled too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._disarm()
        if self.transport.is_closing():
            return
        if self._in_headers():  # h11 refuses headers past h11_max_incomplete_event_size itself
            self._arm_headers()
        else:
            self._disarm_headers()
        if self._owes_bytes():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_headers()
        super().connection_lost(exc)

    def _in_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

    def _owes_bytes(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY or self._in_headers()

    def _mid_request(self) -> bool:
        st = self.conn.their_state
        between = self.cycle is None or self.cycle.response_complete  # no request running
        return st is h11.SEND_BODY or (st is h11.IDLE and between)


def read_timeout_protocol(read_timeout_s: float, max_connections: int = 1 << 30) -> type[Any]:
    """uvicorn's HTTP protocol closing a connection silent for ``read_timeout_s`` mid-request,
    and any connection past ``max_connections`` open ones.

    httptools (C parser) when installed: on multi-MB agent bodies h11's pure-Python receive
    buffer tripled the proxy's CPU per call (3x at 510K tokens of context); h11 otherwise.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extras
        return type(
            "ReadTimeoutH11Protocol",
            (_H11ReadTimeout,),
            {"read_timeout_s": read_timeout_s, "max_connections": max_connections},
        )

    class ReadTimeoutHttpToolsProtocol(_ReadTimeout, HttpToolsProtocol):
        _in_message = False
        _got_bytes = False
        _headers_pending = False  # a request began, its headers are not complete

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not self._over_cap():
                self._arm()  # a connection that never sends a byte is stalled too

        def data_received(self, data: bytes) -> None:
            self._got_bytes = True
            super().data_received(data)
            self._disarm()
            if self.transport.is_closing():
                return
            if self._count_header_bytes(len(data)):
                return
            if self._owes_bytes():
                self._arm()

        def on_message_begin(self) -> None:
            self._in_message = True
            self._headers_pending = True
            self._header_bytes = 0
            self._arm_headers()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._headers_pending = False
            self._disarm_headers()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_message = False
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._disarm_headers()
            super().connection_lost(exc)

        def _in_headers(self) -> bool:
            return self._headers_pending

        def _owes_bytes(self) -> bool:
            return self._in_message  # a request begun (first byte parsed) and not complete

        def _mid_request(self) -> bool:
            # ... or a fresh connection that has sent nothing yet
            return self._in_message or not self._got_bytes

    ReadTimeoutHttpToolsProtocol.read_timeout_s = read_timeout_s
    ReadTimeoutHttpToolsProtocol.max_connections = max_connections
    return ReadTimeoutHttpToolsProtocol


def bind_tcp(host: str, port: int) -> socket.socket:
    """The API socket, bound here so port 0 can be reported before serving."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


def bind_admin_socket(path: str | None) -> tuple[socket.socket, Path, Path | None]:
    """The admin unix socket (mode 0600); returns (socket, path, private dir to remove or None).

    ``path`` None: a fresh 0700 directory under the temp dir. A given path must lie
    in a directory only this user can enter (refused otherwise: anyone who can
    reach the socket can try the token); a stale socket there is replaced.
    """
    made: Path | None = None
    if path is None:
        made = Path(tempfile.mkdtemp(prefix="gyre-admin-"))  # created 0700
        sock_path = made / ADMIN_SOCKET_NAME
    else:
        sock_path = Path(path).absolute()
        st = os.stat(sock_path.parent)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(
                f"admin socket directory {sock_path.parent} must be owned by this user and "
                f"closed to others (chmod 700); it is {stat.filemode(st.st_mode)}"
            )
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(sock_path).st_mode):
                sock_path.unlink()
    if len(os.fsencode(sock_path)) > 107:
        raise ValueError(f"admin socket path too long for AF_UNIX: {sock_path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # born 0600: no window in which another user could connect
    try:
        sock.bind(str(sock_path))
    finally:
        os.umask(old)
    os.chmod(sock_path, 0o600)
    sock.set_inheritable(False)
    return sock, sock_path, made


def remove_admin_socket(path: Path | None, made: Path | None) -> None:
    with contextlib.suppress(OSError):
        if path is not None:
            path.unlink()
        if made is not None:
            made.rmdir()


class Listeners:
    """Two uvicorn servers (API app with the lifespan, admin app without) on one event loop."""

    def __init__(
        self,
        api_app: Any,
        admin_app: Any,
        api_sock: socket.socket,
        admin_sock: socket.socket,
        *,
        read_timeout_s: float,
        keep_alive_s: float,
        log_level: str = "warning",
        max_connections: int = 4096,
    ) -> None:
        self.max_connections = connection_cap(max_connections, raise_nofile())
        proto = read_timeout_protocol(read_timeout_s, self.max_connections)
        common: dict[str, Any] = dict(
            log_level=log_level,
            access_log=False,
            timeout_keep_alive=keep_alive_s,
            timeout_graceful_shutdown=5,
            http=proto,
        )
        host, port = api_sock.getsockname()[:2]
        self.api = uvicorn.Server(
            uvicorn.Config(api_app, host=host, port=port, lifespan="on", **common)
        )
        self.admin = uvicorn.Server(uvicorn.Config(admin_app, lifespan="off", **common))
        self._socks = (api_sock, admin_sock)

    @property
    def started(self) -> bool:
        return self.api.started and self.admin.started

    def cut_connections(self) -> None:
        """Abort every client connection now (a crash's effect on clients; on the serving loop)."""
        for s in (self.api, self.admin):
            for conn in list(getattr(s, "server_state", None) and s.server_state.connections or ()):
                transport = getattr(conn, "transport", None)
                if transport is not None:
                    transport.abort()

    def request_exit(self, force: bool = False) -> None:
        for s in (self.admin, self.api):
            s.should_exit = True
            s.force_exit = s.force_exit or force

    async def serve(self) -> None:
        """Serve until asked to exit (or either server stops); admin stops first, API last."""
        api_sock, admin_sock = self._socks
        api = asyncio.ensure_future(self.api.serve(sockets=[api_sock]))
        while not self.api.started:  # the service (pool, traces) is up before any admin call
            if api.done():
                await api
                return
            await asyncio.sleep(0.01)
        admin = asyncio.ensure_future(self.admin.serve(sockets=[admin_sock]))
        await asyncio.wait({api, admin}, return_when=asyncio.FIRST_COMPLETED)
        self.admin.should_exit = True
        with contextlib.suppress(Exception):
            await admin
        self.api.should_exit = True
        await api
