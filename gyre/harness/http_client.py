"""A stdlib OpenAI chat-completions client with the shape the reference agent uses.

``client.chat.completions.create(**kw).choices[0].message`` with ``content`` and
``tool_calls`` (``id``, ``function.name``, ``function.arguments``). Importing the
official SDK costs ~1.5 s of CPU per harness process; for short executions run by
the hundred (the quickstart) that start-up, not the model, was the bottleneck. The
wire format is the same, so the proxy sees identical requests either way.

An ``http://`` endpoint (the proxy, the sandbox's bridge) is spoken to over a plain
socket: one ``POST`` per call with ``Connection: close``, as ``urllib`` sends it, and the
answer read by its ``Content-Length`` (or chunks, or to the end). ``urllib.request``
pulls in ``http.client``, ``email`` and ``ssl`` -- ~60 ms of each agent's start on a
loaded 2-core machine, before its first call (docs/measurements.md, "Around each
execution"). ``https://`` goes through ``http.client``, imported only then.
"""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace

TYPE_CHECKING = False  # typing is not imported at run time: the agent starts without it
if TYPE_CHECKING:
    from typing import Any

CONNECT_RETRY_S = 7.0
"""How long a refused or cut connection is retried (backoff 0.5, 1, 2, 4 s)."""
_MAX_HEAD = 64 * 1024  # status line + headers of an answer


class APIError(RuntimeError):
    """The endpoint answered an error or could not be reached after the retries."""


class _HTTPStatus(Exception):
    def __init__(self, code: int, body: bytes) -> None:
        super().__init__(code)
        self.code, self.body = code, body


class _Cut(OSError):
    """The connection ended before a whole answer came (not a timeout)."""


def _ns(x: Any) -> Any:
    if isinstance(x, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in x.items()})
    if isinstance(x, list):
        return [_ns(v) for v in x]
    return x


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an ``http(s)://`` URL; ValueError otherwise."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    netloc, slash, path = rest.partition("/")
    path = slash + path if slash else "/"
    netloc = netloc.rpartition("@")[2]
    if netloc.startswith("["):  # [v6]:port
        host, _, tail = netloc[1:].partition("]")
        port_s = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_s = netloc.partition(":")
    if not host:
        raise ValueError(f"no host in URL {url!r}")
    port = int(port_s) if port_s else (443 if scheme == "https" else 80)
    return scheme, host, port, path


def _read_head(f: Any) -> tuple[int, dict[str, str]]:
    line = f.readline(_MAX_HEAD)
    if not line:
        raise _Cut("the connection closed before an answer")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP answer: {line[:80]!r}")
    code = int(parts[1])
    headers: dict[str, str] = {}
    size = len(line)
    while True:
        h = f.readline(_MAX_HEAD)
        size += len(h)
        if not h:
            raise _Cut("the connection closed inside the answer's headers")
        if size > _MAX_HEAD:
            raise ValueError("the answer's headers are too long")
        if h in (b"\r\n", b"\n"):
            return code, headers
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()


def _read_exact(f: Any, n: int) -> bytes:
    data = f.read(n)
    if len(data) < n:
        raise _Cut("the connection closed inside the answer")
    return data


def _read_body(f: Any, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out: list[bytes] = []
        while True:
            size_line = f.readline(_MAX_HEAD)
            if not size_line:
                raise _Cut("the connection closed inside a chunked answer")
            n = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if n == 0:
                while f.readline(_MAX_HEAD) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(out)
            out.append(_read_exact(f, n))
            _read_exact(f, 2)  # the chunk's CRLF
    if "content-length" in headers:
        return _read_exact(f, int(headers["content-length"]))
    return f.read()  # to the end of the connection


def _post_socket(
    host: str, port: int, path: str, headers: dict[str, str], data: bytes, timeout: float
) -> tuple[int, bytes]:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head += [f"Content-Length: {len(data)}", "Connection: close", "", ""]
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall("\r\n".join(head).encode("latin-1") + data)
        with s.makefile("rb") as f:
            code, hdrs = _read_head(f)
            return code, _read_body(f, hdrs)


def _post_https(
    host: str, port: int, path: str, headers: dict[str, str], data: bytes, timeout: float
) -> tuple[int, bytes]:
    import http.client  # only for https: it is most of urllib's import cost

    c = http.client.HTTPSConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, body=data, headers={**headers, "Connection": "close"})
        r = c.getresponse()
        return r.status, r.read()
    except http.client.HTTPException as e:  # a broken answer: as a cut connection
        raise _Cut(f"{type(e).__name__}: {e}") from None
    finally:
        c.close()


def post(url: str, headers: dict[str, str], data: bytes, timeout: float) -> tuple[int, bytes]:
    """One ``POST``: (status, body). OSError when the connection fails (TimeoutError for a
    timeout), ValueError for an answer that is not HTTP."""
    scheme, host, port, path = split_url(url)
    send = _post_https if scheme == "https" else _post_socket
    return send(host, port, path, headers, data, timeout)


class _Completions:
    def __init__(self, owner: StdlibClient) -> None:
        self._o = owner

    def create(self, **body: Any) -> Any:
        o = self._o
        data = json.dumps(body).encode()
        headers = {"content-type": "application/json", "authorization": f"Bearer {o.api_key}"}
        last = ""
        attempt, waited = 0, 0.0
        while True:
            cut = False  # no answer came: refused, reset, closed (not a timeout)
            try:
                code, raw = post(f"{o.base_url}/chat/completions", headers, data, o.timeout)
                if code >= 400:
                    raise _HTTPStatus(code, raw)
                out = json.loads(raw)
                msg = out["choices"][0]["message"]
                msg.setdefault("content", None)
                msg["tool_calls"] = msg.get("tool_calls") or None
                return _ns(out)
            except _HTTPStatus as e:
                last = f"HTTP {e.code}: {e.body[:300].decode(errors='replace')}"
                if e.code < 500 and e.code != 429:
                    break
            except TimeoutError as e:
                last = f"{type(e).__name__}: {e}"
            except OSError as e:
                last = f"{type(e).__name__}: {e}"
                cut = True
            except (ValueError, KeyError, IndexError, TypeError) as e:
                last = f"{type(e).__name__}: {e}"
            attempt += 1
            # a connection refused or cut is retried for CONNECT_RETRY_S, as the SDKs retry
            # it: a proxy restarting on its address is gone for a moment (a dead port costs
            # that long before the verdict)
            if attempt > o.max_retries and not (cut and waited < CONNECT_RETRY_S):
                break
            delay = 0.5 * 2 ** min(attempt - 1, 3)
            time.sleep(delay)
            waited += delay
        raise APIError(last)


class StdlibClient:
    def __init__(
        self, base_url: str, api_key: str, timeout: float = 3600.0, max_retries: int = 2
    ) -> None:
        self.base_url, self.api_key = base_url.rstrip("/"), api_key
        self.timeout, self.max_retries = timeout, max_retries
        self.chat = SimpleNamespace(completions=_Completions(self))
