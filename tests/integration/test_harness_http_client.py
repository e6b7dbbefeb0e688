"""The reference agent's stdlib client over a plain socket: answers by length, by chunks and
to the end; errors, retries and refused connections as the urllib client had them; and what
the agent imports before its first call (the start-up Gyre pays in every execution)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from gyre.harness import http_client as hc
from gyre.harness.hostguard import GYRE_ROOT
from gyre.harness.profiles import REFERENCE_AGENT_MAIN

REPLY = {"choices": [{"message": {"role": "assistant", "content": "Answer: 7"}}]}


class RawServer:
    """A loopback server answering each connection with the next of ``answers`` (raw bytes,
    or a callable given the request), recording every request's bytes."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.answers:
            c, _ = self.sock.accept()
            with c:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += c.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                n = int(
                    next(
                        h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                    ).split(b":")[1]
                )
                while len(body) < n:
                    body += c.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                a = self.answers.pop(0)
                c.sendall(a(data) if callable(a) else a)


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(hc.time, "sleep", lambda s: None)


def client(url: str, retries: int = 2) -> hc.StdlibClient:
    return hc.StdlibClient(url, "sk-1", timeout=5.0, max_retries=retries)


def test_a_call_sends_the_chat_request_and_reads_the_answer_by_its_length():
    srv = RawServer([ok(json.dumps(REPLY).encode(), "Content-Type: application/json\r\n")])
    msg = (
        client(srv.url)
        .chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+6"}])
        .choices[0]
        .message
    )
    assert msg.content == "Answer: 7" and msg.tool_calls is None
    head, _, body = srv.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"authorization: Bearer sk-1" in lines and b"content-type: application/json" in lines
    assert json.loads(body) == {"model": "policy", "messages": [{"role": "user", "content": "1+6"}]}


def test_chunked_and_read_to_the_end_answers():
    body = json.dumps(REPLY).encode()
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
            for i in range(0, len(body), 7)
        )
        + b"0\r\n\r\n"
    )
    to_end = b"HTTP/1.0 200 OK\r\n\r\n" + body
    srv = RawServer([chunked, to_end])
    c = client(srv.url)
    for _ in range(2):
        assert (
            c.chat.completions.create(model="m", messages=[]).choices[0].message.content
            == "Answer: 7"
        )


def test_a_server_error_is_retried_and_a_client_error_is_not():
    body = json.dumps(REPLY).encode()
    err = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"
    srv = RawServer([err, ok(body)])
    assert (
        client(srv.url).chat.completions.create(model="m", messages=[]).choices[0].message.content
    )
    assert len(srv.requests) == 2
    srv = RawServer([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 7\r\n\r\nno such", ok(body)])
    with pytest.raises(hc.APIError, match="HTTP 400: no such"):
        client(srv.url).chat.completions.create(model="m", messages=[])
    assert len(srv.requests) == 1


def test_an_answer_cut_short_is_retried_and_reported():
    half = b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choi'
    srv = RawServer([half] * 5)
    with pytest.raises(hc.APIError, match="closed inside the answer"):
        client(srv.url).chat.completions.create(model="m", messages=[])
    # a cut connection, like a refused one, is retried until CONNECT_RETRY_S is spent
    assert len(srv.requests) == 5


def test_a_refused_connection_is_retried_for_the_connect_window(monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    tries = []
    real = hc._post_socket
    monkeypatch.setattr(hc, "_post_socket", lambda *a: tries.append(1) or real(*a))
    with pytest.raises(hc.APIError, match="ConnectionRefusedError"):
        client(f"http://127.0.0.1:{port}/v1", retries=0).chat.completions.create(
            model="m", messages=[]
        )
    # retried (backoff 0.5, 1, 2, 4 s) until CONNECT_RETRY_S is spent, though max_retries is 0
    assert len(tries) == 5


def test_split_url():
    assert hc.split_url("http://127.0.0.1:8000/v1") == ("http", "127.0.0.1", 8000, "/v1")
    assert hc.split_url("https://h.example/v1?x=1") == ("https", "h.example", 443, "/v1?x=1")
    assert hc.split_url("http://[::1]:9/") == ("http", "::1", 9, "/")
    assert hc.split_url("http://u:p@h") == ("http", "h", 80, "/")
    for bad in ("ftp://h/", "h:80/v1", "http:///v1"):
        with pytest.raises(ValueError):
            hc.split_url(bad)


def agent_cmd(*args: str) -> list[str]:
    """The reference agent as its built-in profile starts it (python -S -P -c ...)."""
    return [sys.executable, "-S", "-P", "-c", REFERENCE_AGENT_MAIN, *args]


def agent_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": GYRE_ROOT}


def test_the_agent_starts_without_the_heavy_modules(tmp_path):
    """What the agent imports before its first call, as the profile starts it: none of the
    modules that cost tens of ms each on a loaded machine (the SDK's, urllib's, runpy's...)."""
    probe = (
        "import sys; from gyre.harness import reference_agent, http_client; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-P", "-c", probe],
        env=agent_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    heavy = {
        "site",
        "runpy",
        "pathlib",
        "dataclasses",
        "typing",
        "urllib.request",
        "http.client",
        "email",
        "ssl",
        "subprocess",
        "shutil",
        "openai",
        "httpx",
        "pydantic",
    }
    assert heavy.isdisjoint(out), heavy & set(out)


@pytest.mark.parametrize("which", ["stdlib", "openai"])
def test_the_agent_as_the_profile_starts_it_answers_with_either_client(tmp_path, which):
    """-S leaves site-packages out: the openai client runs site itself before importing it."""
    if which == "openai":
        pytest.importorskip("openai")
    srv = RawServer(
        [
            ok(
                json.dumps(
                    {**REPLY, "id": "c", "object": "chat.completion", "created": 0, "model": "m"}
                ).encode(),
                "Content-Type: application/json\r\n",
            )
        ]
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    r = subprocess.run(
        agent_cmd(
            "--base-url",
            srv.url,
            "--workspace",
            str(ws),
            "--instruction",
            "1+6?",
            "--answer-file",
            "answer.txt",
            "--no-tools",
            "--max-turns",
            "1",
            "--client",
            which,
        ),
        env=agent_env(),
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (ws / "answer.txt").read_text() == "Answer: 7"


def test_https_goes_through_http_client(monkeypatch):
    """https:// is the one path through http.client (TLS, certificate checks): same request."""
    import http.client

    seen = {}

    class FakeConn:
        def __init__(self, host, port, timeout):
            seen["where"] = (host, port, timeout)

        def request(self, method, path, body, headers):
            seen["req"] = (method, path, json.loads(body), headers)

        def getresponse(self):
            return type("R", (), {"status": 200, "read": lambda self: json.dumps(REPLY).encode()})()

        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(http.client, "HTTPSConnection", FakeConn)
    msg = client("https://api.example/v1").chat.completions.create(model="m", messages=[])
    assert msg.choices[0].message.content == "Answer: 7"
    assert seen["where"] == ("api.example", 443, 5.0) and seen["closed"]
    method, path, body, headers = seen["req"]
    assert (method, path, body) == ("POST", "/v1/chat/completions", {"model": "m", "messages": []})
    assert headers["authorization"] == "Bearer sk-1" and headers["Connection"] == "close"
