"""Proxy-only networking for sandboxed harnesses: TCP inside the sandbox -> unix socket -> proxy.

With ``--unshare-net`` a sandbox has its own, empty network namespace (only
its own loopback), so a harness cannot reach the host's engines, Ray, or
anything else -- and also not the proxy. This module bridges exactly one
endpoint through the filesystem:

- outside, :class:`gyre.harness.forwarder.UnixForwarder` (asyncio, in the
  executor) accepts connections on a unix socket and pipes each to the
  proxy's TCP address;
- inside, ``python -m gyre.harness.netbridge --listen 127.0.0.1:PORT --unix
  SOCK -- CMD...`` (stdlib only, started by bwrap) listens on the sandbox's
  loopback, pipes each connection to the unix socket, runs ``CMD`` as its
  child and exits with its status.

The harness keeps using ``http://127.0.0.1:PORT`` and can reach nothing else.
This module runs first in every proxy-only sandbox, before the harness, so it
imports only what it needs (no asyncio: that import alone was ~0.1-0.2 s of each
execution's start on a loaded 2-core machine; no subprocess, and the C modules under
socket, threading and signal rather than those). The sandbox runs
it inside :mod:`gyre.harness.confine`'s interpreter (``confine.py --bridge-listen
HOST:PORT --bridge-unix SOCK -- CMD``: :func:`bridge_and_run`), not as a Python process of
its own: one interpreter start less per execution (docs/measurements.md, "Around each
execution"). ``python -m gyre.harness.netbridge`` runs it alone.
"""

# (no `from __future__ import annotations`: importing __future__ is a few ms of every start)
# The C modules under socket, threading and signal: their Python wrappers import enum,
# functools, selectors (~25-40 ms of every proxy-only launch on a loaded 2-core machine).
import _signal  # type: ignore[import-not-found]
import _socket
import _thread
import os
import sys

_BUF = 64 * 1024


# ---- inside the sandbox (stdlib only, threads) -----------------------------------------
def _copy(src: _socket.socket, dst: _socket.socket) -> None:
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
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener: _socket.socket, unix_path: str) -> None:
    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]  # accept4(SOCK_CLOEXEC)
        except OSError:
            return
        c = _socket.socket(fileno=fd)
        try:
            u = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec
            u.connect(unix_path)
        except OSError:
            c.close()
            continue
        for a, b in ((c, u), (u, c)):
            _thread.start_new_thread(_copy, (a, b))  # not joined at exit, like daemons


def listen(address: str, unix_path: str) -> None:
    """Listen on ``HOST:PORT`` and pipe each connection to ``unix_path``, on a daemon thread."""
    host, _, port = address.rpartition(":")
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)  # close-on-exec
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    _thread.start_new_thread(_serve, (listener, unix_path))


def _which(name: str, env: dict[str, str]) -> str:
    """``name`` looked up on ``env``'s PATH (not this process's), as ``execvpe`` does."""
    if "/" in name:
        return name
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError(2, "No such file or directory", name)


def run(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` as a child and return its status as ``subprocess.call`` does (-N: killed
    by signal N). SIGPIPE and SIGXFSZ are reset to their defaults in the child, as
    ``subprocess`` resets them (Python ignores both)."""
    try:
        pid = os.posix_spawn(
            _which(cmd[0], env), cmd, env, setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ)
        )
    except OSError as e:
        print(f"netbridge: cannot start {cmd[:1]}: {e}", file=sys.stderr)
        return 127
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def bridge_and_run(address: str, unix_path: str, cmd: list[str], env: dict[str, str]) -> int:
    """The bridge on ``address``, then ``cmd`` with ``env``; ``cmd``'s exit status."""
    listen(address, unix_path)
    return run(cmd, env)


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
    if not cmd:
        return 0
    return bridge_and_run(o["--listen"], o["--unix"], cmd, dict(os.environ))


if __name__ == "__main__":
    os.environ.pop("PYTHONINSPECT", None)
    sys.exit(main())
